"""Building and running the gRPC server: servicer, RPC gate, health, reflection, TLS, ports, graceful stop."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sleuthd.config import ServerConfig
from sleuthd.engine.admission import AudioBudget, RefusalPacer, Slots
from sleuthd.engine.facade import Engine
from sleuthd.engine.memory import HeapTrimmer
from sleuthd.ops.metrics import ServiceMetrics
from sleuthd.rpc.auth import TokenSet, server_credentials, warn_if_exposed
from sleuthd.rpc.encoder_health import EncoderHealthPublisher
from sleuthd.rpc.gate import EdgeLimits, RpcGate
from sleuthd.rpc.limits import RequestLimits, WalkPace
from sleuthd.rpc.ops_http import OpsHttpServer
from sleuthd.rpc.servicer import SleuthServicer
from sleuthd.threads import lower_own_priority
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
    gate: RpcGate
    stopping: asyncio.Event = field(default_factory=asyncio.Event)  # streams end (verdicts sent) when set
    metrics_port: int | None = None
    http: OpsHttpServer | None = None
    serving: bool = False  # what gRPC health says, mirrored for /readyz
    engine_failed: bool = False  # for /healthz: the process should be restarted
    trimmer: HeapTrimmer | None = None  # hands memory back after work (closed before the engine is)

    async def set_serving(self, serving: bool) -> None:
        self.serving = serving
        for name in ("", SERVICE_NAME):
            await self.health.set(name, _SERVING if serving else _NOT_SERVING)

    async def drain(self, grace: float, hurry: asyncio.Event | None = None) -> bool:
        """Health says NOT_SERVING (and keeps answering), new work RPCs get UNAVAILABLE, and running ones get
        up to ``grace`` seconds (or until ``hurry`` is set) to finish. Returns whether they all finished.

        The grace is sized from the work queue: queued requests that would not be done within it are
        refused now (UNAVAILABLE: retry elsewhere) instead of being cut at its end; open streams keep going
        until the time one streamed turn takes (at the recent pace) is left, then stop reading and end
        (UNAVAILABLE) once the turns they are finishing have their verdicts."""
        self.serving = False
        await self.health.enter_graceful_shutdown()
        self.gate.start_draining()
        work = self.gate.limits.work
        if work is not None:
            shed = work.shed(grace)
            left = work.seconds_left()
            logger.info(
                "draining: %d RPCs in flight, about %s s of admitted work left; %d queued requests refused (they "
                "could not finish within the %.0f s grace)",
                self.gate.in_flight, "?" if left is None else f"{left:.1f}", shed, grace,
            )  # fmt: skip
        turn = (work.usual_seconds("StreamTurn") if work is not None else None) or 0.0
        margin = min(grace / 2, max(1.0, 2 * turn))
        tell_streams = asyncio.get_running_loop().call_later(max(0.0, grace - margin), self.stopping.set)
        idle = asyncio.ensure_future(self.gate.wait_idle(grace))
        waiters: set[asyncio.Future[Any]] = {idle}
        if hurry is not None:
            waiters.add(asyncio.ensure_future(hurry.wait()))
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        tell_streams.cancel()
        for w in waiters:
            w.cancel()
        return idle.done() and not idle.cancelled() and bool(idle.result())

    async def close(self) -> None:
        """Cancel whatever still runs and release both ports."""
        await self.server.stop(0)
        if self.http is not None:
            self.http.close()
        if self.trimmer is not None:  # before the engine closes: no trim may be inside a model call then
            await asyncio.to_thread(self.trimmer.close)

    async def stop(self, grace: float) -> None:
        """Drain for up to ``grace`` seconds, then close."""
        await self.drain(grace)
        await self.close()


def _ensure_free(host: str, port: int, what: str, advice: str) -> None:
    """Refuse a port another process listens on, with a message that says what to do.

    gRPC would fail too (SO_REUSEPORT is off), but only after logging a core error line of its own.
    """
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(f"cannot resolve {what} host {host!r}: {exc.strerror}") from None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers are fine
            try:
                probe.bind(address)
            except OSError as exc:
                raise OSError(f"cannot listen on {host}:{port} for {what}: {exc.strerror} ({advice})") from None


def check_ports(config: ServerConfig) -> None:
    """Refuse ports in use before anything binds (`serve` calls it before loading models, too)."""
    _ensure_free(config.host, config.port, "gRPC", "another sleuthd? pick another --port, or --port 0 for any free one")
    if config.metrics_port >= 0:
        _ensure_free(config.metrics_host, config.metrics_port, "metrics",
                     "another sleuthd? --metrics-port 0 picks a free port, -1 serves none")  # fmt: skip


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
        # gRPC turns SO_REUSEPORT on by default: a second server on the same port would start silently and
        # take part of the traffic. Off, the second one fails to bind.
        ("grpc.so_reuseport", 0),
        *_connection_age(config),
    ]


def _connection_age(config: ServerConfig) -> list[tuple[str, int]]:
    """GOAWAY to each connection after max_connection_age_seconds: clients balancing over a DNS name (a
    headless Service) re-resolve it when they reconnect, and so reach replicas added since."""
    if config.max_connection_age_seconds <= 0:
        return []
    return [("grpc.max_connection_age_ms", int(config.max_connection_age_seconds * 1000)),
            ("grpc.max_connection_age_grace_ms", int(config.max_connection_age_grace_seconds * 1000))]  # fmt: skip


async def create_server(engine: Engine, config: ServerConfig, metrics: ServiceMetrics | None = None) -> RunningServer:
    """Start a server for ``engine`` on ``config.host:config.port``; returns it with its bound port.

    ``metrics`` should be the observer the engine was loaded with, so batch and verdict metrics land in
    the same registry as RPC metrics. Health reports NOT_SERVING until this returns (the engine is
    loaded and warmed up by then). ``config.metrics_port`` -1 serves no HTTP port. Raises OSError with
    advice when a port is taken, ConfigError when a TLS or token file is unusable.
    """
    metrics = metrics or ServiceMetrics()
    tokens = TokenSet.from_file(config.auth_token_file) if config.auth_token_file else None
    credentials = server_credentials(config) if config.tls else None
    warn_if_exposed(config)
    # One set of limits, enforced by the gate before any handler runs (sleuthd.rpc.gate).
    bounds = engine.config.admission
    request_limits = RequestLimits.from_config(engine.config, config.max_message_bytes)
    limits = EdgeLimits(
        request=request_limits,
        budget=AudioBudget(
            bounds.max_audio_in_flight_bytes,
            shares=bounds.audio_shares,
            buffer_limit=bounds.max_stream_buffers_bytes,
        ),
        streams=Slots(bounds.max_streams, "streams"),
        # The burst holds two requests of the most fields allowed, so valid requests never wait on it.
        walk_pace=WalkPace(bounds.wire_fields_per_second, 2 * request_limits.largest_max_fields()),
        work=engine.work,
        pacer=RefusalPacer(bounds.refusal_hold_seconds) if bounds.refusal_hold_seconds > 0 else None,
    )
    # Freed heap pages go back to the system after work (at most every 10 s, on a thread): after refused
    # requests too (a burst of 60 MiB requests refused unparsed left 450 MB behind), and while a stream
    # that never ends keeps the audio budget from ever being empty.
    trimmer = HeapTrimmer(when_idle=[engine.models.shrink_arenas])
    gate = RpcGate(metrics, limits, tokens, after_work=trimmer)
    pending: set[asyncio.Task[None]] = set()  # keeps the health update alive until it has run

    def on_engine_failure() -> None:
        running.engine_failed = True
        task = asyncio.ensure_future(running.set_serving(False))
        pending.add(task)
        task.add_done_callback(pending.discard)

    stopping = asyncio.Event()
    servicer = SleuthServicer(engine, config.max_message_bytes, on_engine_failure, metrics, limits.budget, stopping)
    # A request a little over the size limit is read and answered with advice (INVALID_ARGUMENT); one far
    # over it (the transport limit) is refused by gRPC itself, unread.
    server = grpc.aio.server(interceptors=[gate], options=server_options(config))
    health_servicer = health.aio.HealthServicer()
    running = RunningServer(
        server=server, port=0, health=health_servicer, metrics=metrics, gate=gate, stopping=stopping, trimmer=trimmer
    )
    await running.set_serving(False)
    pb_grpc.add_SleuthServicer_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if config.reflection == "on":
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            server,
        )
    address = f"{config.host}:{config.port}"
    check_ports(config)
    try:
        port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    except RuntimeError:  # raised by gRPC when the address cannot be bound
        port = 0
    if port == 0:
        raise OSError(f"cannot listen on {address}: the address is taken or not on this machine")
    running.port = port
    try:  # health says NOT_SERVING while the LALM judge (when configured) loads
        await engine.start(metrics.judge)
    except BaseException:
        await server.stop(0)
        raise
    if config.metrics_port >= 0:
        http = OpsHttpServer(
            metrics.registry,
            ready=lambda: running.serving,
            live=lambda: not running.engine_failed,
            tokens=tokens if config.metrics_auth == "token" else None,
        )
        try:
            running.metrics_port = http.start(config.metrics_host, config.metrics_port)
        except OSError:
            await server.stop(None)  # never started, but bound: release it so nothing lingers
            raise
        running.http = http
    await server.start()
    await running.set_serving(True)
    await EncoderHealthPublisher(health_servicer, engine.encoders).start()  # sleuthd.encoder.<name>
    return running


async def serve_forever(engine: Engine, config: ServerConfig, metrics: ServiceMetrics) -> None:
    """Run until SIGTERM/SIGINT, then drain (see RunningServer.drain), stop and close the engine.

    A second signal during the drain cuts it short.
    """
    try:
        running = await create_server(engine, config, metrics)
    except BaseException:
        await engine.aclose()
        raise
    # The workers started at the process's priority while the engine loaded; from here this thread (gRPC,
    # admission, refusals) and the threads it starts run below them (sleuthd.threads). Here, not in
    # create_server: a process that embeds the server keeps its own priorities.
    niceness = lower_own_priority(config.intake_niceness)
    scheme = "TLS" if config.tls else "plaintext"
    # Printed (not logged) so scripts can read the port when --port 0 picked it.
    print(f"sleuthd listening on {config.host}:{running.port}", flush=True)
    if running.metrics_port is not None:
        print(f"sleuthd metrics on http://{config.metrics_host}:{running.metrics_port}/metrics", flush=True)
    logger.info(
        "serving gRPC (%s, auth %s, intake at nice %s)",
        scheme,
        "on" if config.auth_token_file else "off",
        "unchanged" if niceness is None else niceness,
    )
    stop, hurry = asyncio.Event(), asyncio.Event()

    def on_signal() -> None:
        (hurry if stop.is_set() else stop).set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    await stop.wait()
    logger.info(
        "shutting down: health NOT_SERVING, new RPCs refused; %d in flight get up to %.0f s",
        running.gate.in_flight,
        config.shutdown_grace_seconds,
    )
    if not await running.drain(config.shutdown_grace_seconds, hurry):
        logger.warning("drain over: cancelling %d RPCs still running", running.gate.in_flight)
    await running.close()
    await engine.aclose()
