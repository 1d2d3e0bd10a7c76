"""Per-encoder gRPC health: ``sleuthd.encoder.<name>`` says whether that encoder can answer now.

The server's own entries ("" and ``sleuthd.v1.Sleuth``) say whether this replica works; an encoder served by
Triton can be down while the replica is fine (its requests get UNAVAILABLE, other encoders and the voice RPCs
still answer), so each encoder has an entry of its own: SERVING, or NOT_SERVING while its Triton server cannot
serve it (sleuthd.encoders.triton). In-process encoders are SERVING as long as the server is (a failing
ONNX Runtime session takes the whole server NOT_SERVING). The fusion is SERVING when every component is.

    grpc_health_probe -addr=sleuthd:50051 -service=sleuthd.encoder.campplus
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from grpc_health.v1 import health, health_pb2

from sleuthd.encoders.fusion import FusedEncoder
from sleuthd.encoders.runner import WindowEncoder
from sleuthd.encoders.triton import EncoderHealth, TritonEncoder

PREFIX = "sleuthd.encoder."
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def health_name(encoder: str) -> str:
    return PREFIX + encoder


def _parts(encoder: WindowEncoder) -> list[EncoderHealth]:
    """The health states an encoder depends on (none: in-process, SERVING with the server)."""
    members = encoder.components if isinstance(encoder, FusedEncoder) else (encoder,)
    return [m.health for m in members if isinstance(m, TritonEncoder)]


class EncoderHealthPublisher:
    """Mirrors every encoder's health into the gRPC health service, now and on every change."""

    def __init__(self, servicer: health.aio.HealthServicer, encoders: Mapping[str, WindowEncoder]) -> None:
        self._servicer = servicer
        self._parts = {name: _parts(enc) for name, enc in encoders.items()}
        self._pending: set[asyncio.Task[None]] = set()  # keeps each update alive until it has run

    async def start(self) -> None:
        for name in self._parts:
            await self._publish(name)
        for name, parts in self._parts.items():
            for part in parts:
                part.subscribe(lambda _serving, name=name: self._schedule(name))  # type: ignore[misc]

    def serving(self, name: str) -> bool:
        return all(p.serving for p in self._parts[name])

    def _schedule(self, name: str) -> None:
        task = asyncio.ensure_future(self._publish(name))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _publish(self, name: str) -> None:
        # After enter_graceful_shutdown the servicer ignores set(): a draining server stays NOT_SERVING.
        await self._servicer.set(health_name(name), _SERVING if self.serving(name) else _NOT_SERVING)
