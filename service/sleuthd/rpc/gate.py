"""The RPC gate: the one server interceptor every RPC passes, health and reflection included.

In order, for each call:
  request id      the client's ``x-request-id`` if sane, else a fresh one; put on every log line of the call
                  and sent back: by a call with one answer in its trailing metadata (in the one write that
                  carries the answer and the status), by a streaming call in its initial metadata at once.
                  Why not a header first on every call: a client's channel retries a call (UNAVAILABLE: a
                  replica killed or restarted under it) only while it has received nothing from the server,
                  and a header sent in a write of its own commits the call; a replica killed between that
                  write and the answer's left the client with UNAVAILABLE instead of an answer from another
                  replica (a batch of answers finishing together made that window real: tests/test_replicas.py)
  -> access       the bearer token (UNAUTHENTICATED; health stays open), draining (after SIGTERM new work
                  gets UNAVAILABLE)
  -> client       who the call's audio counts against: its connection (peer) and, with tokens, its token
                  (sleuthd.engine.admission.current_client; a stream's session reads it)
  -> admission    before a byte of the request is read: a StreamDialogue when every stream slot is taken,
                  a unary call whose usual size the audio budget (or this client's share of it) would
                  refuse, or whose usual cost the engine's work queue could not finish before this call's
                  deadline: RESOURCE_EXHAUSTED at once (under overload, reading requests that are then
                  refused is most of the cost of refusing them)
  -> shape        each message's bytes checked (size, field counts, at most a bounded number of fields
                  walked per message and per second: sleuthd.rpc.limits) and parsed as gRPC reads them (in
                  the deserializer: parsed later, the raw bytes of every request stayed alive longer and the
                  server's memory after a burst grew by half); bytes over a limit or not the method's
                  protobuf type are INVALID_ARGUMENT, never half-parsed
  -> hold         a unary request's bytes held in the audio budget (under its client's share) while it
                  runs; a stream holds a slot
  -> the handler  (sleuthd.rpc.servicer; the engine admits the work itself by its estimated cost)
  -> outcome      labelled truthfully (a passed deadline is DEADLINE_EXCEEDED, a client that went away
                  CANCELLED) -> ``sleuthd_rpc_total`` and one access-log line; refused calls included;
                  then ``after_work`` (the heap trimmer).

The servicer trusts all of this: it converts, calls the engine and maps errors to status codes.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import re
import time
import uuid
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from google.protobuf.message import DecodeError

from sleuthd.engine.admission import AudioBudget, Client, RefusalPacer, Slots, WorkQueue, current_client
from sleuthd.errors import InvalidRequest, Overloaded
from sleuthd.ops.logs import clip, printable, request_id
from sleuthd.ops.metrics import ServiceMetrics
from sleuthd.rpc.auth import TokenSet, authorization_of
from sleuthd.rpc.limits import RequestLimits, WalkPace
from sleuthd.rpc.status import status_of

logger = logging.getLogger(__name__)
access_logger = logging.getLogger("sleuthd.access")

REQUEST_ID_KEY = "x-request-id"
_SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
OPEN_METHODS = ("/grpc.health.v1.Health/",)  # probes never need the token
INFRASTRUCTURE = "/grpc."  # health and reflection: not work, not drained, logged at debug when OK
SERVICE_PREFIX = "/sleuthd.v1.Sleuth/"
# A stream whose client vanishes looks at first like a half-close (the request iterator just ends) and
# the cancellation follows a moment later; once the handler has answered, gRPC no longer delivers it. So
# when a stream's requests end, the handler waits this long before it goes on, and a vanished client
# is seen as CANCELLED instead of, say, FAILED_PRECONDITION for the turns it left open.
VANISH_WINDOW_SECONDS = 0.05
# The client's deadline passes before the server's (the server counts the timeout from the request's
# arrival), so the client's cancel for its deadline reaches the server a little before the server's own
# deadline: a cancellation (or a stream cut off) this close to the deadline is the deadline.
DEADLINE_SLACK_SECONDS = 0.25
_RECENT = 32  # request sizes remembered per method, for the before-reading estimate


@dataclass(frozen=True)
class EdgeLimits:
    """What the gate enforces, built once by the server from its config."""

    request: RequestLimits  # size and field counts of every message
    budget: AudioBudget  # request audio bytes held across all RPCs
    streams: Slots  # concurrent StreamDialogue calls
    walk_pace: WalkPace | None = None  # fields the wire checks of our methods may walk per second, all together
    work: WorkQueue | None = None  # the engine's admission by cost and deadline, asked before a request is read
    pacer: RefusalPacer | None = None  # holds refusals of clients that do not back off (None: all at once)


@dataclass(frozen=True)
class _Refusal:
    """Stands in for a message that failed its checks or did not parse, so the gate (or, inside a
    stream, the servicer) answers it instead of gRPC."""

    error: InvalidRequest | Overloaded


@dataclass
class _Call:
    method: str
    label: str
    request_id: str
    peer: str
    work: bool
    refusal: tuple[grpc.StatusCode, str] | None
    token: int | None = None  # which bearer token the call presented (its line), when tokens are on
    client: Client = ()  # the shares of the audio budget this call's audio counts against
    started: float = 0.0
    dialogue_id: str = ""
    requests_ended: bool = False
    attempt: int = 1  # a client retry (gRPC's retry policy) arrives with grpc-previous-rpc-attempts


def _dialogue_of(message: Any) -> str:
    value = getattr(message, "dialogue_id", None)
    if value is None and getattr(message, "DESCRIPTOR", None) is not None:
        if "open" in message.DESCRIPTOR.fields_by_name and message.HasField("open"):
            value = message.open.dialogue_id
    return value if isinstance(value, str) else ""


def _expired(context: grpc.aio.ServicerContext, slack: float = 0.0) -> bool:
    """Whether the call's deadline has passed, or will within ``slack`` seconds."""
    remaining = context.time_remaining()
    return remaining is not None and remaining <= slack


def _attempt(metadata: Any) -> int:
    """1 for a first attempt; n + 1 when the client's channel retried (grpc-previous-rpc-attempts: n)."""
    given = next((v for k, v in metadata or () if k == "grpc-previous-rpc-attempts"), "0")
    return 1 + int(given) if isinstance(given, str) and given.isdigit() and len(given) < 4 else 1


def _code_after(exc: BaseException, context: grpc.aio.ServicerContext) -> grpc.StatusCode:
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):  # the call was cancelled under the handler
        deadline = _expired(context, DEADLINE_SLACK_SECONDS)
        return grpc.StatusCode.DEADLINE_EXCEEDED if deadline else grpc.StatusCode.CANCELLED
    return context.code() or grpc.StatusCode.UNKNOWN


def _unwound(exc: BaseException) -> None:
    """Cut an abort's traceback and context before it goes back to gRPC. gRPC's handler keeps the exception
    it catches in a reference cycle, and through its traceback (and the refusal it was raised while handling)
    every frame below the gate stayed alive with the request in it, parsed and converted, its audio included,
    until a full collection: 179 refused requests, each held, after 8 s of overload. The status is already
    set on the context; the traceback says nothing gRPC uses (unexpected errors are logged with theirs by
    the servicer before it aborts)."""
    if isinstance(exc, grpc.aio.AbortError):
        _cut(exc)


def _cut(exc: BaseException) -> None:
    """Drop the frames an exception keeps: its traceback's, and those of the errors it was raised from."""
    exc.__traceback__ = exc.__context__ = exc.__cause__ = None


# How long a refused call's request stream is given to show its end (a client sends it with its message).
_END_READ_S = 0.05


async def _abort(context: Any, error: BaseException) -> NoReturn:
    known = status_of(error)
    code, details = known if known is not None else (grpc.StatusCode.INTERNAL, "internal error")
    await context.abort(code, details)
    raise AssertionError("unreachable: context.abort raises")


class RpcGate(grpc.aio.ServerInterceptor):
    def __init__(
        self,
        metrics: ServiceMetrics,
        limits: EdgeLimits,
        tokens: TokenSet | None = None,
        after_work: Callable[[bool], None] | None = None,
    ) -> None:
        """``after_work(idle)``: called when a work RPC ends (refused ones included), ``idle`` when it was
        the last in flight; it must not block."""
        self.metrics = metrics
        self.limits = limits
        self.tokens = tokens
        self.after_work = after_work
        self.draining = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._recent: defaultdict[str, deque[int]] = defaultdict(lambda: deque(maxlen=_RECENT))

    # ------------------------------------------------------------------ draining

    @property
    def in_flight(self) -> int:
        """Work RPCs (not health or reflection) running now."""
        return self._in_flight

    def start_draining(self) -> None:
        """From now on new work RPCs get UNAVAILABLE; running ones continue."""
        self.draining = True

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no work RPC runs, at most ``timeout`` seconds; whether that happened."""
        if self._idle.is_set():
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    # ------------------------------------------------------------------ the interceptor

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]], details: Any
    ) -> Any:
        handler = await continuation(details)
        if handler is None:  # not a method of this server: gRPC answers UNIMPLEMENTED
            return None
        method: str = details.method
        metadata = details.invocation_metadata
        given = next((v for k, v in metadata or () if k == REQUEST_ID_KEY), "")
        rid = given if isinstance(given, str) and _SANE_REQUEST_ID.fullmatch(given) else uuid.uuid4().hex[:16]
        work = not method.startswith(INFRASTRUCTURE)
        call = _Call(
            method=method,
            label=method.rsplit("/", 1)[-1] if method.startswith(SERVICE_PREFIX) else method.lstrip("/"),
            request_id=rid,
            peer="",
            work=work,
            refusal=self._refusal(method, metadata, work),
            attempt=_attempt(metadata),
            token=self.tokens.which(authorization_of(metadata)) if self.tokens is not None else None,
        )
        message_class = getattr(getattr(handler, "request_deserializer", None), "__self__", None)
        if getattr(message_class, "DESCRIPTOR", None) is None:
            return handler  # not a generated protobuf deserializer: nothing to check (not one of ours)
        out = handler.response_serializer
        parse = self._parser(message_class, method.startswith(SERVICE_PREFIX))
        if method.startswith(SERVICE_PREFIX) and handler.unary_unary:
            # Served as stream-unary: a streaming handler gets the call before asking for its message
            # (the wire format is the same), so it can refuse without reading it.
            sized = self._sized(message_class)
            return grpc.stream_unary_rpc_method_handler(self._unary(handler.unary_unary, call), sized, out)
        if method.startswith(SERVICE_PREFIX) and handler.stream_stream:
            return grpc.stream_stream_rpc_method_handler(self._stream(handler.stream_stream, call), parse, out)
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(self._other(handler.unary_unary, call, False), parse, out)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(self._other(handler.unary_stream, call, False), parse, out)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(self._other(handler.stream_unary, call, True), parse, out)
        return grpc.stream_stream_rpc_method_handler(self._other(handler.stream_stream, call, True), parse, out)

    def _refusal(self, method: str, metadata: Any, work: bool) -> tuple[grpc.StatusCode, str] | None:
        if self.tokens is not None and not method.startswith(OPEN_METHODS):
            if not self.tokens.accepts(authorization_of(metadata)):
                return grpc.StatusCode.UNAUTHENTICATED, "send a valid token as `authorization: Bearer <token>`"
        if self.draining and work:
            return grpc.StatusCode.UNAVAILABLE, "the server is shutting down: retry on another replica"
        return None

    # ------------------------------------------------------------------ shape: size, counts, parse

    def _check_and_parse(self, data: bytes, message_class: Any, paced: bool) -> Any:
        """The parsed message, or a :class:`_Refusal` (never raises). ``paced``: the walk counts against
        the process's walking pace (our methods; not health or reflection, which must always answer)."""
        descriptor = message_class.DESCRIPTOR
        try:
            self.limits.request.check_wire(data, descriptor, self.limits.walk_pace if paced else None)
            return message_class.FromString(data)
        except (InvalidRequest, Overloaded) as exc:
            return _Refusal(exc)
        except DecodeError as exc:
            # Raised from a deserializer, gRPC would log a traceback per request and answer UNKNOWN.
            return _Refusal(
                InvalidRequest(
                    f"the request is not a valid {descriptor.name} message ({clip(str(exc), 200)}): "
                    "build it with stubs generated from this server's sleuthd/v1/sleuthd.proto"
                )
            )

    def _sized(self, message_class: Any) -> Callable[[bytes], tuple[Any, int]]:
        """The parsed message (or refusal) with its size on the wire, which the audio budget counts."""
        return lambda data: (self._check_and_parse(data, message_class, True), len(data))

    def _parser(self, message_class: Any, paced: bool) -> Callable[[bytes], Any]:
        return lambda data: self._check_and_parse(data, message_class, paced)

    # ------------------------------------------------------------------ per-call books

    async def _begin(self, call: _Call, context: Any, one_answer: bool) -> None:
        """Start the books for a call and refuse it when access says no (before its request is read).
        ``one_answer``: the request id goes out with the answer and status (trailing metadata), else as
        initial metadata now (module docstring, "request id")."""
        call.started = time.perf_counter()
        call.peer = printable(context.peer() or "", 64)
        # One connection (its peer address and port) and one token each have a share of the audio budget.
        call.client = (("peer", call.peer),) + ((("token", f"#{call.token}"),) if call.token is not None else ())
        current_client.set(call.client)
        request_id.set(call.request_id)
        if call.work:
            self._in_flight += 1
            self._idle.clear()
            self.metrics.rpcs_in_flight.set(self._in_flight)
        if one_answer:  # every way the call ends sends it: an answer, context.abort, an exception
            context.set_trailing_metadata(((REQUEST_ID_KEY, call.request_id),))
        else:
            await context.send_initial_metadata(((REQUEST_ID_KEY, call.request_id),))
        if call.refusal is not None:
            await context.abort(*call.refusal)

    def _settle(self, call: _Call, exc: BaseException, context: grpc.aio.ServicerContext) -> grpc.StatusCode:
        """The true outcome of a call that raised ``exc``. Once the deadline has passed the client has
        DEADLINE_EXCEEDED whatever the handler said last (a stream's requests also just end at its deadline,
        and its handler may then fail on the cut-off dialogue)."""
        cut_off = call.requests_ended and _expired(context, DEADLINE_SLACK_SECONDS)
        return grpc.StatusCode.DEADLINE_EXCEEDED if cut_off or _expired(context) else _code_after(exc, context)

    def _succeeded(self, call: _Call, context: grpc.aio.ServicerContext) -> None:
        code = context.code() or grpc.StatusCode.OK
        self._finish(call, grpc.StatusCode.DEADLINE_EXCEEDED if _expired(context) else code)

    def _finish(self, call: _Call, code: grpc.StatusCode) -> None:
        seconds = time.perf_counter() - call.started
        self.metrics.rpc_finished(call.label, code.name, seconds)
        if call.work:
            self._in_flight -= 1
            self.metrics.rpcs_in_flight.set(self._in_flight)
            if self._in_flight == 0:
                self._idle.set()
            if self.after_work is not None:
                self.after_work(self._in_flight == 0)
        level = logging.DEBUG if not call.work and code == grpc.StatusCode.OK else logging.INFO
        dialogue = printable(call.dialogue_id, 128)
        fields = {"method": call.label, "code": code.name, "ms": round(seconds * 1000, 1), "dialogue_id": dialogue,
                  "peer": call.peer, "attempt": call.attempt}  # fmt: skip
        access_logger.log(
            level,
            "rpc %s %s %.1f ms dialogue=%s peer=%s%s",
            call.label,
            code.name,
            seconds * 1000,
            dialogue or "-",
            call.peer or "-",
            f" attempt={call.attempt}" if call.attempt > 1 else "",
            extra={"fields": fields},
        )

    async def _refuse(
        self, call: _Call, context: grpc.aio.ServicerContext, busy: Overloaded, reader: Any = None
    ) -> NoReturn:
        """Answer a unary call "busy" (RESOURCE_EXHAUSTED), all of them here, the engine's too: first waiting as
        long as the pacer says when its client came straight back after its last refusal
        (sleuthd.engine.admission.RefusalPacer). The wait comes before the abort (gRPC sends a status the
        moment a handler aborts) and after the request's audio has left the budget (the caller drops it).
        ``reader``: the call's request stream when its message was read."""
        pacer = self.limits.pacer
        if reader is not None:
            # Read the request stream's end (the client's half-close) first: gRPC keeps a finished call whose end
            # was never read alive for a while, its AbortError, handler frames and buffers with it; with refusals
            # held that was 100-170 calls and +300-400 MB at the peak under CI's overload, read it was none.
            with contextlib.suppress(Exception):  # not there yet, or the client is gone: it is refused anyway
                await asyncio.wait_for(anext(reader, None), _END_READ_S)
        if pacer is not None and await pacer.pace(call.client, context.time_remaining()):
            self.metrics.refusals_held.inc()
        await _abort(context, busy)

    # ------------------------------------------------------------------ our unary methods

    def _unary(self, inner: Any, call: _Call) -> Callable[..., Awaitable[Any]]:
        """A unary method of ours, read lazily: access, admission, one message checked and parsed, its bytes
        held in the audio budget while the method runs."""
        recent = self._recent[call.label]
        budget = self.limits.budget
        work = self.limits.work

        async def behaviour(requests: AsyncIterator[tuple[Any, int]], context: grpc.aio.ServicerContext) -> Any:
            try:
                await self._begin(call, context, one_answer=True)
                # The smallest recent request of this method: refusing on it wrongs no request of usual size.
                expected = min(recent) if recent else 0
                busy = budget.refusal(expected, f"a {call.label} request (about {expected} bytes, as lately)",
                                      call.client, borrow=True)  # fmt: skip
                if busy is None and work is not None:
                    busy = work.usual_refusal(call.label, context.time_remaining())
                if busy is not None:
                    await self._refuse(call, context, busy)
                reader = aiter(requests)
                got = await anext(reader, None)  # a unary call carries exactly one message
                if got is None:  # the client went away before sending it, or sent none (not a gRPC client)
                    await _abort(context, InvalidRequest("the call carried no request message"))
                request, size = got
                recent.append(size)
                if isinstance(request, _Refusal):
                    error = request.error
                    got = request = None
                    if isinstance(error, Overloaded):
                        await self._refuse(call, context, error, reader)
                    await _abort(context, error)
                call.dialogue_id = _dialogue_of(request)
                try:
                    budget.acquire(size, "this request", call.client, borrow=True)  # held until its verdict
                except Overloaded as refused:
                    got = request = None  # a held refusal must not keep the request alive
                    await self._refuse(call, context, refused, reader)
                try:
                    response = await inner(request, context)
                except Overloaded as refused:  # the engine's "busy": the servicer leaves it to the gate
                    busy = refused
                finally:
                    budget.release(size, call.client)
                if busy is not None:
                    _cut(busy)  # its frames hold the request
                    got = request = None
                    await self._refuse(call, context, busy, reader)
            except BaseException as exc:
                self._finish(call, self._settle(call, exc, context))
                got = request = None  # see _unwound: nothing the exception keeps may hold the request
                _unwound(exc)
                raise
            self._succeeded(call, context)
            return response

        return behaviour

    # ------------------------------------------------------------------ our streaming method

    def _stream(self, inner: Any, call: _Call) -> Callable[..., AsyncIterator[Any]]:
        """StreamDialogue: access, a stream slot (refused unread when none is free), every message checked
        and parsed (one over a limit raises its error where the servicer reads it)."""
        slots = self.limits.streams

        async def generator(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                await self._begin(call, context, one_answer=False)
                if slots.full:
                    await _abort(context, slots.busy())
                with slots.take():
                    async for response in inner(self._messages(requests, call, context), context):
                        yield response
            except BaseException as exc:
                self._finish(call, self._settle(call, exc, context))
                _unwound(exc)
                raise
            self._succeeded(call, context)

        return generator

    async def _messages(
        self, requests: AsyncIterator[Any], call: _Call, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        async for message in requests:
            if isinstance(message, _Refusal):
                raise message.error
            if not call.dialogue_id:
                call.dialogue_id = _dialogue_of(message)
            yield message
        call.requests_ended = True
        if not _expired(context):
            # See VANISH_WINDOW_SECONDS: a cancellation arriving now halts the handler before it answers.
            await asyncio.sleep(VANISH_WINDOW_SECONDS)

    # ------------------------------------------------------------------ health and reflection

    def _other(self, inner: Any, call: _Call, streamed: bool) -> Callable[..., Any]:
        """Infrastructure methods: access, books and outcome; messages parsed by :meth:`_parser`."""

        async def refused_or(request: Any, context: grpc.aio.ServicerContext, one_answer: bool) -> Any:
            await self._begin(call, context, one_answer)
            if isinstance(request, _Refusal):
                await _abort(context, request.error)
            return self._checked(request) if streamed else request

        if inspect.isasyncgenfunction(inner):

            async def generator(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                try:
                    request = await refused_or(request, context, one_answer=False)
                    try:
                        async for response in inner(request, context):
                            yield response
                    except (InvalidRequest, Overloaded) as exc:  # a message of the request stream was refused
                        await _abort(context, exc)
                except BaseException as exc:
                    self._finish(call, self._settle(call, exc, context))
                    _unwound(exc)
                    raise
                self._succeeded(call, context)

            return generator

        async def behaviour(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                request = await refused_or(request, context, one_answer=True)
                try:
                    response = await inner(request, context)
                except (InvalidRequest, Overloaded) as exc:  # a message of the request stream was refused
                    await _abort(context, exc)
            except BaseException as exc:
                self._finish(call, self._settle(call, exc, context))
                _unwound(exc)
                raise
            self._succeeded(call, context)
            return response

        return behaviour

    @staticmethod
    async def _checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for message in requests:
            if isinstance(message, _Refusal):
                raise message.error
            yield message
