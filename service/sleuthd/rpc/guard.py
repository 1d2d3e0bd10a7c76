"""Refusing a request before it is read or parsed: a server interceptor in front of every method.

gRPC reads a unary request in full and parses it on the event loop before any servicer code runs, and
parsing is where a small request can become a large one (sleuthd.rpc.limits); under overload, reading
the requests that are then refused as "busy" is most of the cost of refusing them. :class:`RequestGuard`
acts at both points:

- **before reading** (methods of the Sleuth service): a unary method is served by a streaming handler,
  which gets the call's deadline before asking for its message (the wire format is the same). When the
  audio budget would refuse a request of the size this method has recently received, with this deadline,
  or every stream slot is taken, the call is answered RESOURCE_EXHAUSTED at once and its message is never
  read (the bytes already in flight are dropped by the transport). The servicer still makes the exact
  check on the requests that get through;
- **before parsing** (every method whose request is a protobuf message): the bytes are checked (size,
  field counts) and parsed only when they pass; bytes that do not parse are INVALID_ARGUMENT. A refused
  request reaches the method as a :class:`Refused` marker, never as a half-parsed message: unary methods
  are answered here, streaming methods get the error raised from their request iterator, inside the
  servicer's own error handling.

Every refusal gets the status the servicer gives the same error, and is counted in the RPC metrics.
"""

from __future__ import annotations

import logging
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from sleuthd.engine.admission import AudioBudget, Slots
from sleuthd.errors import InvalidRequest
from sleuthd.ops.metrics import ServiceMetrics
from sleuthd.rpc.limits import RequestLimits

logger = logging.getLogger(__name__)

StatusOf = Callable[[BaseException], tuple[grpc.StatusCode, str]]
SERVICE_PREFIX = "/sleuthd.v1.Sleuth/"
_RECENT = 32  # request sizes remembered per method, for the before-reading estimate


class Refused:
    """What the guarded deserializer returns for bytes that fail the checks."""

    __slots__ = ("error",)

    def __init__(self, error: InvalidRequest) -> None:
        self.error = error


class RequestGuard(grpc.aio.ServerInterceptor):
    def __init__(
        self,
        limits: RequestLimits,
        status_of: StatusOf,
        metrics: ServiceMetrics | None = None,
        budget: AudioBudget | None = None,
        streams: Slots | None = None,
    ) -> None:
        self.limits = limits
        self._status_of = status_of
        self._metrics = metrics
        self._budget = budget
        self._streams = streams
        self._recent: defaultdict[str, deque[int]] = defaultdict(lambda: deque(maxlen=_RECENT))

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        message_class = getattr(getattr(handler, "request_deserializer", None), "__self__", None)
        if handler is None or getattr(message_class, "DESCRIPTOR", None) is None:
            return handler  # not a generated protobuf deserializer: nothing to check
        full_method: str = handler_call_details.method  # type: ignore[attr-defined]
        method = full_method.rsplit("/", 1)[-1]
        deserialize = self._deserializer(method, message_class)
        ours = full_method.startswith(SERVICE_PREFIX)
        if ours and handler.stream_stream is not None and self._streams is not None and self._streams.full:
            return self._unread(method, self._streams.busy(), handler)
        if ours and handler.unary_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._admitted(method, handler.unary_unary),
                request_deserializer=deserialize,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_unary is not None:
            return handler._replace(  # type: ignore[attr-defined, no-any-return]
                request_deserializer=deserialize, unary_unary=self._unary(method, handler.unary_unary)
            )
        if handler.unary_stream is not None:
            return handler._replace(  # type: ignore[attr-defined, no-any-return]
                request_deserializer=deserialize, unary_stream=self._unary_stream(method, handler.unary_stream)
            )
        if handler.stream_unary is not None:
            behavior = handler.stream_unary

            async def stream_unary(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
                return await behavior(_raise_refused(requests), context)

            return handler._replace(request_deserializer=deserialize, stream_unary=stream_unary)  # type: ignore[attr-defined, no-any-return]
        stream_behavior = handler.stream_stream

        async def stream_stream(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for response in stream_behavior(_raise_refused(requests), context):
                yield response

        return handler._replace(request_deserializer=deserialize, stream_stream=stream_stream)  # type: ignore[attr-defined, no-any-return]

    # ------------------------------------------------------------------ before reading

    def _admitted(self, method: str, behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        """A unary method as a stream-unary handler: admission first, then read the one message, then the method."""

        async def unary(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            if self._budget is not None:
                recent = self._recent.get(method)
                # The smallest recent request of this method: refusing on it wrongs no request of usual size.
                expected = min(recent) if recent else 0
                what = f"a {method} request (about {expected} bytes, as lately)"
                busy = self._budget.refusal(expected, what, context.time_remaining())
                if busy is not None:
                    await self._abort(method, busy, context)
            request = None
            async for message in requests:  # a unary call carries exactly one message
                request = message
                break
            if request is None:
                # The client went away before sending it, or sent none (not a gRPC client).
                await self._abort(method, InvalidRequest("the call carried no request message"), context)
            if isinstance(request, Refused):
                await self._abort(method, request.error, context)
            return await behavior(request, context)

        return unary

    def _unread(self, method: str, error: BaseException, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """A handler that ends the call with ``error``'s status without reading its request. A streaming
        request handler reads nothing until asked; the wire format of a unary call is the same."""

        async def refuse(_requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:
            await self._abort(method, error, context)

        async def refuse_stream(_requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await self._abort(method, error, context)
            yield  # pragma: no cover - abort raises; this makes the function an async generator

        if handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(refuse_stream, response_serializer=handler.response_serializer)
        return grpc.stream_unary_rpc_method_handler(refuse, response_serializer=handler.response_serializer)

    # ------------------------------------------------------------------ before parsing

    def _deserializer(self, method: str, message_class: Any) -> Callable[[bytes], Any]:
        descriptor = message_class.DESCRIPTOR
        parse = message_class.FromString
        limits = self.limits
        recent = self._recent[method]

        def deserialize(data: bytes) -> Any:
            recent.append(len(data))
            try:
                limits.check_wire(data, descriptor)
                return parse(data)
            except InvalidRequest as exc:
                return Refused(exc)
            except DecodeError as exc:
                # Raised from here, gRPC would log a traceback per request and answer UNKNOWN.
                return Refused(InvalidRequest(f"the request is not a valid {descriptor.name} message: {exc}"))

        return deserialize

    async def _abort(self, method: str, error: BaseException, context: grpc.aio.ServicerContext) -> None:
        code, details = self._status_of(error)
        if self._metrics is not None:
            self._metrics.rpc_finished(method, code.name, 0.0)
        logger.debug("%s refused by the guard: %s", method, details)
        await context.abort(code, details)

    def _unary(self, method: str, behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, Refused):
                await self._abort(method, request.error, context)  # raises: the call ends here
            return await behavior(request, context)

        return unary_unary

    def _unary_stream(self, method: str, behavior: Callable[..., AsyncIterator[Any]]) -> Callable[..., Any]:
        async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if isinstance(request, Refused):
                await self._abort(method, request.error, context)
            async for response in behavior(request, context):
                yield response

        return unary_stream


async def _raise_refused(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """The stream's messages; a refused one raises its error where the servicer reads it."""
    async for message in requests:
        if isinstance(message, Refused):
            raise message.error
        yield message
