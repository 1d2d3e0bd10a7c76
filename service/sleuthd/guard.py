"""Refusing a request before it is parsed: a server interceptor that checks the serialized bytes.

gRPC parses a request on the event loop before any servicer code runs, and parsing is where a small
request can become a large one (see sleuthd.request_limits). :class:`RequestGuard` wraps the deserializer
of every method whose request is a protobuf message: the bytes are checked first (size, field counts)
and parsed only when they pass. A refused request reaches the method as a :class:`Refused` marker, never
as a half-parsed message:

- unary methods are answered here with the status the servicer gives the same error (so every refusal
  is counted in the RPC metrics and carries the servicer's status mapping);
- streaming methods get the error raised from their request iterator, inside the servicer's own error
  handling, as if the message itself had been refused there.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from sleuthd.errors import InvalidRequest
from sleuthd.metrics import ServiceMetrics
from sleuthd.request_limits import RequestLimits

logger = logging.getLogger(__name__)

StatusOf = Callable[[BaseException], tuple[grpc.StatusCode, str]]


class Refused:
    """What the guarded deserializer returns for bytes that fail the checks."""

    __slots__ = ("error",)

    def __init__(self, error: InvalidRequest) -> None:
        self.error = error


class RequestGuard(grpc.aio.ServerInterceptor):
    def __init__(self, limits: RequestLimits, status_of: StatusOf, metrics: ServiceMetrics | None = None) -> None:
        self.limits = limits
        self._status_of = status_of
        self._metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        message_class = getattr(getattr(handler, "request_deserializer", None), "__self__", None)
        if handler is None or getattr(message_class, "DESCRIPTOR", None) is None:
            return handler  # not a generated protobuf deserializer: nothing to check
        method = handler_call_details.method.rsplit("/", 1)[-1]  # type: ignore[attr-defined]
        deserialize = self._deserializer(message_class)
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

    def _deserializer(self, message_class: Any) -> Callable[[bytes], Any]:
        descriptor = message_class.DESCRIPTOR
        parse = message_class.FromString
        limits = self.limits

        def deserialize(data: bytes) -> Any:
            try:
                limits.check_wire(data, descriptor)
            except InvalidRequest as exc:
                return Refused(exc)
            return parse(data)

        return deserialize

    async def _refuse(self, method: str, refused: Refused, context: grpc.aio.ServicerContext) -> None:
        code, details = self._status_of(refused.error)
        if self._metrics is not None:
            self._metrics.rpc_finished(method, code.name, 0.0)
        logger.info("%s refused before parsing: %s", method, details)
        await context.abort(code, details)

    def _unary(self, method: str, behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, Refused):
                await self._refuse(method, request, context)  # raises: the call ends here
            return await behavior(request, context)

        return unary_unary

    def _unary_stream(self, method: str, behavior: Callable[..., AsyncIterator[Any]]) -> Callable[..., Any]:
        async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if isinstance(request, Refused):
                await self._refuse(method, request, context)
            async for response in behavior(request, context):
                yield response

        return unary_stream


async def _raise_refused(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """The stream's messages; a refused one raises its error where the servicer reads it."""
    async for message in requests:
        if isinstance(message, Refused):
            raise message.error
        yield message
