"""Building and running the gRPC server: servicer, health, reflection, message limits, graceful stop."""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sleuthd.config import ServerConfig
from sleuthd.engine import Engine
from sleuthd.guard import RequestGuard
from sleuthd.metrics import ServiceMetrics
from sleuthd.servicer import SleuthServicer
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Sleuth"].full_name
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    metrics: ServiceMetrics
    metrics_port: int | None = None

    async def set_serving(self, serving: bool) -> None:
        for name in ("", SERVICE_NAME):
            await self.health.set(name, _SERVING if serving else _NOT_SERVING)

    async def stop(self, grace: float) -> None:
        """Health goes NOT_SERVING for good, new RPCs are refused, in-flight ones get ``grace`` seconds."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


def server_options(config: ServerConfig) -> list[tuple[str, int]]:
    """gRPC channel arguments: message size limits, keepalive both ways, streams per connection."""
    ms = 1000
    return [
        ("grpc.max_receive_message_length", config.transport_limit_bytes),
        ("grpc.max_send_message_length", config.transport_limit_bytes),
        # Calls beyond this on one connection wait on the client's side, holding nothing here.
        ("grpc.max_concurrent_streams", config.max_streams_per_connection),
        # Ping quiet connections (with calls open or not) and drop those whose peer stopped answering:
        # a client that vanished without closing its socket would otherwise hold its streams for hours.
        ("grpc.keepalive_time_ms", int(config.keepalive_seconds * ms)),
        ("grpc.keepalive_timeout_ms", int(config.keepalive_timeout_seconds * ms)),
        ("grpc.http2.ping_timeout_ms", int(config.keepalive_timeout_seconds * ms)),
        ("grpc.keepalive_permit_without_calls", 1),
        # Keep pinging a quiet connection: by default a server sends at most 2 pings without data, 5 min apart.
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_time_between_pings_ms", int(config.keepalive_seconds * ms)),
        # And the other way: a client pinging more often than this without sending data gets GOAWAY.
        ("grpc.http2.min_ping_interval_without_data_ms", int(config.min_client_ping_seconds * ms)),
        ("grpc.http2.max_ping_strikes", 2),
    ]


async def create_server(engine: Engine, config: ServerConfig, metrics: ServiceMetrics | None = None) -> RunningServer:
    """Start a server for ``engine`` on ``config.host:config.port``; returns it with its bound port.

    ``metrics`` should be the observer the engine was loaded with, so batch and verdict metrics land in
    the same registry as RPC metrics. Health reports NOT_SERVING until this returns (the engine is
    loaded and warmed up by then). ``config.metrics_port`` -1 serves no /metrics.
    """
    metrics = metrics or ServiceMetrics()
    pending: set[asyncio.Task[None]] = set()  # keeps the health update alive until it has run

    def on_engine_failure() -> None:
        task = asyncio.ensure_future(running.set_serving(False))
        pending.add(task)
        task.add_done_callback(pending.discard)

    servicer = SleuthServicer(engine, config.max_message_bytes, on_engine_failure, metrics)
    # Requests are refused before they are read when the server is busy, and checked (size, field counts)
    # before gRPC parses them; a request a little over the size limit is read and answered with advice
    # (INVALID_ARGUMENT), one far over it (transport limit) is refused by gRPC itself, unread.
    guard = RequestGuard(servicer.limits, servicer.status_of, metrics, servicer.audio_budget, servicer.stream_slots)
    server = grpc.aio.server(interceptors=[guard], options=server_options(config))
    health_servicer = health.aio.HealthServicer()
    running = RunningServer(server=server, port=0, health=health_servicer, metrics=metrics)
    await running.set_serving(False)
    pb_grpc.add_SleuthServicer_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server,
    )
    port = server.add_insecure_port(f"{config.host}:{config.port}")
    if port == 0:
        raise OSError(f"could not bind {config.host}:{config.port}")
    await server.start()
    running.port = port
    if config.metrics_port >= 0:
        running.metrics_port = metrics.serve_http(config.metrics_host, config.metrics_port)
    await running.set_serving(True)
    return running


async def serve_forever(engine: Engine, config: ServerConfig, metrics: ServiceMetrics) -> None:
    """Run until SIGTERM/SIGINT, then stop accepting, drain in-flight RPCs and close the engine."""
    running = await create_server(engine, config, metrics)
    # Printed (not logged) so scripts can read the port when --port 0 picked it.
    print(f"sleuthd listening on {config.host}:{running.port}", flush=True)
    if running.metrics_port is not None:
        print(f"sleuthd metrics on http://{config.metrics_host}:{running.metrics_port}/metrics", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    logger.info("shutting down: draining in-flight RPCs for up to %.0f s", config.shutdown_grace_seconds)
    await running.stop(config.shutdown_grace_seconds)
    await engine.aclose()
