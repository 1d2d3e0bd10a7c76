"""The RPC gate: one server interceptor that every RPC passes, health and reflection included.

In order, for each call: a request id (the client's ``x-request-id`` if sane, else a fresh one; sent back
as initial metadata and put on every log line of the call) -> the bearer token (UNAUTHENTICATED; health
stays open) -> draining (after SIGTERM new work gets UNAVAILABLE) -> malformed protobuf (INVALID_ARGUMENT,
instead of gRPC's UNKNOWN with a DecodeError) -> the handler -> the outcome, labelled truthfully
(a passed deadline is DEADLINE_EXCEEDED, a client that went away CANCELLED) -> ``sleuthd_rpc_total`` and
one access-log line. Rejected calls are counted and logged like any other.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from sleuthd.auth import TokenSet, authorization_of
from sleuthd.errors import InvalidRequest
from sleuthd.logs import clip, printable, request_id
from sleuthd.metrics import ServiceMetrics

logger = logging.getLogger(__name__)
access_logger = logging.getLogger("sleuthd.access")

REQUEST_ID_KEY = "x-request-id"
_SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
OPEN_METHODS = ("/grpc.health.v1.Health/",)  # probes never need the token
INFRASTRUCTURE = "/grpc."  # health and reflection: not work, not drained, logged at debug when OK
# A stream whose client vanishes looks at first like a half-close (the request iterator just ends) and
# the cancellation follows a moment later; once the handler has answered, gRPC no longer delivers it. So
# when a stream's requests end, the handler waits this long before it goes on, and a vanished client
# is seen as CANCELLED instead of, say, FAILED_PRECONDITION for the turns it left open.
VANISH_WINDOW_SECONDS = 0.05
# The client's deadline passes before the server's (the server counts the timeout from the request's
# arrival), so the client's cancel for its deadline reaches the server a little before the server's own
# deadline: a cancellation (or a stream cut off) this close to the deadline is the deadline.
DEADLINE_SLACK_SECONDS = 0.25


class MalformedMessage(InvalidRequest):
    """A request message that does not parse as the method's protobuf type (INVALID_ARGUMENT)."""


@dataclass(frozen=True)
class _Malformed:
    """Stands in for a request that failed to parse, so the gate can answer it instead of gRPC."""

    details: str


@dataclass
class _Call:
    method: str
    label: str
    request_id: str
    peer: str
    work: bool
    refusal: tuple[grpc.StatusCode, str] | None
    started: float = 0.0
    dialogue_id: str = ""
    requests_ended: bool = False
    attempt: int = 1  # a client retry (gRPC's retry policy) arrives with grpc-previous-rpc-attempts


def _tolerant(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None
    owner = getattr(getattr(deserialize, "__self__", None), "DESCRIPTOR", None)
    type_name = getattr(owner, "full_name", "request")

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except DecodeError as exc:
            return _Malformed(
                f"the request is not a valid {type_name} message ({clip(str(exc), 200)}): "
                "build it with stubs generated from this server's sleuthd/v1/sleuthd.proto"
            )

    return parse


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


class _AnswerHeader:
    """A unary call's context that sends the ``x-request-id`` header with the answer (or the error), not when
    the call starts. Why: a client's channel retries a call (UNAVAILABLE: a replica killed or restarted
    under it) only while it has received no header from the server; a header sent at once would commit the
    call to the dead replica, and the caller would see UNAVAILABLE instead of the answer from another one."""

    def __init__(self, context: grpc.aio.ServicerContext, request_id: str) -> None:
        self._context = context
        self._header = ((REQUEST_ID_KEY, request_id),)
        self._sent = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    async def send_header(self) -> None:
        if not self._sent:
            self._sent = True
            await self._context.send_initial_metadata(self._header)

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        await self.send_header()
        await self._context.abort(code, details, trailing_metadata)


class RpcGate(grpc.aio.ServerInterceptor):
    def __init__(self, metrics: ServiceMetrics, tokens: TokenSet | None = None) -> None:
        self.metrics = metrics
        self.tokens = tokens
        self.draining = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

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
        self, continuation: Callable[[grpc.HandlerCallDetails], Any], details: grpc.HandlerCallDetails
    ) -> Any:
        handler = await continuation(details)
        if handler is None:  # not a method of this server: gRPC answers UNIMPLEMENTED
            return None
        method: str = details.method  # type: ignore[attr-defined]
        metadata = details.invocation_metadata  # type: ignore[attr-defined]
        given = next((v for k, v in metadata or () if k == REQUEST_ID_KEY), "")
        rid = given if isinstance(given, str) and _SANE_REQUEST_ID.fullmatch(given) else uuid.uuid4().hex[:16]
        work = not method.startswith(INFRASTRUCTURE)
        call = _Call(
            method=method,
            label=method.rsplit("/", 1)[-1] if method.startswith("/sleuthd.") else method.lstrip("/"),
            request_id=rid,
            peer="",
            work=work,
            refusal=self._refusal(method, metadata, work),
            attempt=_attempt(metadata),
        )
        return self._wrap(handler, call)

    def _refusal(self, method: str, metadata: Any, work: bool) -> tuple[grpc.StatusCode, str] | None:
        if self.tokens is not None and not method.startswith(OPEN_METHODS):
            if not self.tokens.accepts(authorization_of(metadata)):
                return grpc.StatusCode.UNAUTHENTICATED, "send a valid token as `authorization: Bearer <token>`"
        if self.draining and work:
            return grpc.StatusCode.UNAVAILABLE, "the server is shutting down: retry on another replica"
        return None

    def _wrap(self, handler: grpc.RpcMethodHandler, call: _Call) -> grpc.RpcMethodHandler:
        parse = _tolerant(handler.request_deserializer)
        out = handler.response_serializer
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(self._unary(handler.unary_unary, call), parse, out)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(self._streaming(handler.unary_stream, call, False), parse, out)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(self._unary(handler.stream_unary, call, True), parse, out)
        return grpc.stream_stream_rpc_method_handler(self._streaming(handler.stream_stream, call, True), parse, out)

    # ------------------------------------------------------------------ per-call plumbing

    async def _begin(self, call: _Call, request: Any, context: grpc.aio.ServicerContext, header: bool = True) -> Any:
        """Start the books for a call and answer refused or malformed ones; returns the request to hand on.
        ``header``: send the request id now (streams); unary calls send it with their answer (_AnswerHeader)."""
        call.started = time.perf_counter()
        call.peer = printable(context.peer() or "", 64)
        request_id.set(call.request_id)
        if call.work:
            self._in_flight += 1
            self._idle.clear()
            self.metrics.rpcs_in_flight.set(self._in_flight)
        if header:
            await context.send_initial_metadata(((REQUEST_ID_KEY, call.request_id),))
        if call.refusal is not None:
            await context.abort(*call.refusal)
        if isinstance(request, _Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.details)
        call.dialogue_id = _dialogue_of(request)
        return request

    async def _watched(
        self, requests: AsyncIterator[Any], call: _Call, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        async for message in requests:
            if isinstance(message, _Malformed):
                raise MalformedMessage(message.details)
            if not call.dialogue_id:
                call.dialogue_id = _dialogue_of(message)
            yield message
        call.requests_ended = True
        if not _expired(context):
            # See VANISH_WINDOW_SECONDS: a cancellation arriving now halts the handler before it answers.
            await asyncio.sleep(VANISH_WINDOW_SECONDS)

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

    def _unary(self, inner: Any, call: _Call, streamed: bool = False, eager: bool = False) -> Callable[..., Any]:
        """Wraps unary-response handlers (request: one message, or a stream when ``streamed``). ``eager``: send
        the header at once (a handler that writes responses itself), else with the answer (_AnswerHeader)."""

        async def behaviour(request: Any, raw_context: grpc.aio.ServicerContext) -> Any:
            context: Any = raw_context if eager else _AnswerHeader(raw_context, call.request_id)
            try:
                request = await self._begin(call, request, context, header=eager)
                if streamed:
                    request = self._watched(request, call, context)
                try:
                    response = await inner(request, context)
                except MalformedMessage as exc:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                if not eager:
                    await context.send_header()
            except BaseException as exc:
                self._finish(call, self._settle(call, exc, context))
                raise
            self._succeeded(call, context)
            return response

        return behaviour

    def _streaming(self, inner: Any, call: _Call, streamed: bool) -> Callable[..., Any]:
        """Wraps streaming-response handlers, as async generators or as coroutines using context.write."""
        if not inspect.isasyncgenfunction(inner):

            async def writer(request: Any, context: grpc.aio.ServicerContext) -> None:
                await self._unary(inner, call, streamed, eager=True)(request, context)

            return writer

        async def generator(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                request = await self._begin(call, request, context)
                if streamed:
                    request = self._watched(request, call, context)
                try:
                    async for response in inner(request, context):
                        yield response
                except MalformedMessage as exc:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            except BaseException as exc:
                self._finish(call, self._settle(call, exc, context))
                raise
            self._succeeded(call, context)

        return generator
