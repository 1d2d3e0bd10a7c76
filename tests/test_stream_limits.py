"""Stream limits (issue 17, finding 6): a stream that goes quiet or stays open too long is ended, every audio
message costs something against the buffer bound, open streams are bounded per server and per connection,
and connections whose peer vanished are found by keepalive pings."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

import grpc
import pytest
import pytest_asyncio
from sleuthd.config import AdmissionConfig, ServerConfig
from sleuthd.engine.facade import Engine
from sleuthd.errors import LimitExceeded
from sleuthd.ops.metrics import ServiceMetrics
from sleuthd.rpc import status
from sleuthd.rpc.server import RunningServer, create_server
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

from .support import VOICE_A, Speech

Req = pb.StreamDialogueRequest
HANG = 30.0  # only there so a missing limit fails the test instead of hanging it


def over_limit_code() -> grpc.StatusCode:
    """The status of a request over a per-request bound (LimitExceeded), as the servicer maps it."""
    return next(code for kind, code in status.STATUS_OF if issubclass(LimitExceeded, kind))


def open_msg() -> pb.StreamDialogueRequest:
    return Req(open=pb.StreamOpen(dialogue_id="live", options=pb.CheckOptions(method=pb.METHOD_PAIRWISE)))


def start(turn_id: str, index: int = 0) -> pb.StreamDialogueRequest:
    return Req(turn_start=pb.TurnStart(turn_id=turn_id, speaker="A", index=index))


def chunk(turn_id: str, data: bytes, final: bool = False) -> pb.StreamDialogueRequest:
    return Req(audio=pb.TurnAudio(turn_id=turn_id, data=data, final=final))


Serve = Callable[..., Awaitable[RunningServer]]


@pytest_asyncio.fixture(loop_scope="session")
async def serve(engine: Engine) -> AsyncIterator[Serve]:
    """Starts servers on the shared models with other limits; stops them after the test."""
    started: list[RunningServer] = []

    async def make(server: ServerConfig | None = None, buffer_bytes: int = 0, **admission: float) -> RunningServer:
        config = replace(engine.config, admission=replace(engine.config.admission, **admission))
        if buffer_bytes:
            config = replace(config, max_stream_buffer_mb=buffer_bytes / 2**20)
        running = await create_server(
            Engine(engine.models, config), server or ServerConfig(port=0, metrics_port=-1), ServiceMetrics()
        )
        started.append(running)
        return running

    yield make
    for running in started:
        await running.stop(grace=0.5)


def active_streams(running: RunningServer) -> float:
    return running.metrics.registry.get_sample_value("sleuthd_streams_active") or 0.0


async def wait_until(condition: Callable[[], bool], seconds: float = HANG) -> bool:
    for _ in range(int(seconds / 0.05)):
        if condition():
            return True
        await asyncio.sleep(0.05)
    return condition()


async def test_a_quiet_stream_is_ended(serve: Serve) -> None:
    running = await serve(stream_idle_seconds=0.5)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as ch:
        call = pb_grpc.SleuthStub(ch).StreamDialogue(timeout=120)
        await call.write(open_msg())
        await call.write(start("t"))  # ... and then nothing, with the turn open
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await asyncio.wait_for(call.read(), HANG)
    assert err.value.code() == over_limit_code()
    assert "no message for 0.5 s" in err.value.details()
    assert active_streams(running) == 0


async def test_a_stream_that_never_closes_is_ended(serve: Serve) -> None:
    running = await serve(stream_idle_seconds=10.0, stream_lifetime_seconds=1.5)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as ch:
        call = pb_grpc.SleuthStub(ch).StreamDialogue(timeout=120)
        await call.write(open_msg())
        await call.write(start("t"))

        async def trickle() -> None:  # a message every 0.2 s: never quiet for long, never done
            for _ in range(int(HANG / 0.2)):
                await call.write(chunk("t", b"\x00\x00"))
                await asyncio.sleep(0.2)

        writer = asyncio.ensure_future(trickle())
        try:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await asyncio.wait_for(call.read(), HANG)
        finally:
            writer.cancel()
            # A write that races the server's end of the call fails on the client's side: AioRpcError,
            # UsageError, or InvalidStateError ("RPC already finished") when the status is already in.
            errors = (asyncio.CancelledError, asyncio.InvalidStateError, grpc.aio.AioRpcError, grpc.aio.UsageError)
            with contextlib.suppress(*errors):
                await writer
    assert err.value.code() == over_limit_code()
    assert "has been open 1.5 s" in err.value.details()


async def test_empty_chunks_are_not_free(serve: Serve) -> None:
    # 100 kB of buffer, 1 KiB counted per message: about 97 empty chunks fit. They used to cost nothing,
    # so a client could send them for ever (each one still costs the server a message to handle).
    running = await serve(buffer_bytes=100_000, stream_message_overhead_bytes=1024)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as ch:
        call = pb_grpc.SleuthStub(ch).StreamDialogue(timeout=HANG)
        await call.write(open_msg())
        await call.write(start("t"))
        # The 98th crosses the bound (97 x 1024 < 100000 < 98 x 1024). No more are sent: a write after
        # the server has ended the call fails on the client's side (INTERNAL) and may hide its status.
        for _ in range(98):
            await call.write(chunk("t", b""))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await asyncio.wait_for(call.read(), HANG)
    assert err.value.code() == over_limit_code()
    assert "counts 1024 bytes on top of its data" in err.value.details()
    assert "the limit is 100000" in err.value.details()


async def test_a_turn_left_unfinished_is_ended(serve: Serve) -> None:
    # Issue 33, finding 2: a turn trickled two bytes at a time kept its buffer for the stream's whole lifetime.
    running = await serve(stream_idle_seconds=10.0, stream_turn_seconds=1.0)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as ch:
        call = pb_grpc.SleuthStub(ch).StreamDialogue(timeout=120)
        await call.write(open_msg())
        await call.write(start("t"))

        async def trickle() -> None:
            for _ in range(int(HANG / 0.2)):
                await call.write(chunk("t", b"\x00\x00"))
                await asyncio.sleep(0.2)

        writer = asyncio.ensure_future(trickle())
        try:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await asyncio.wait_for(call.read(), HANG)
        finally:
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, asyncio.InvalidStateError, grpc.aio.AioRpcError,
                                     grpc.aio.UsageError):  # fmt: skip
                await writer
    assert err.value.code() == over_limit_code()
    assert "turn 't' has been open 1 s without its final chunk" in err.value.details()
    assert await wait_until(lambda: running.gate.limits.budget.held == 0)


async def test_streams_hoarding_turns_cannot_starve_other_clients(serve: Serve, speech: Speech) -> None:
    # Issue 33, finding 2: streams that buffer turns they never finish (a chunk now and then keeps them under
    # the idle timeout) held the whole audio budget, and every other client's CheckDialogue was refused for
    # as long as they stayed (60 of 60 probes over 99 s). Four connections here each buffer 1.99 MiB of an
    # 8 MiB budget; now each connection holds at most its share (2 MiB) and all streams together half the
    # budget (two of them), so the other client's requests always find room.
    running = await serve(max_audio_in_flight_mb=8.0)
    budget = running.gate.limits.budget
    target = f"127.0.0.1:{running.port}"
    piece = bytes(290 * 1024)  # 7 of them and their overhead: just under a connection's 2 MiB share
    one_stream = 7 * (len(piece) + 1024)  # 7 chunks, each counting 1 KiB of overhead

    def refused() -> float:
        return (
            running.metrics.registry.get_sample_value(
                "sleuthd_rpc_total", {"method": "StreamDialogue", "code": "RESOURCE_EXHAUSTED"}
            )
            or 0.0
        )

    async def hoard(ch: grpc.aio.Channel, stop: asyncio.Event) -> None:
        call = pb_grpc.SleuthStub(ch).StreamDialogue(timeout=120)
        # A write after the server has refused the stream fails on the client's side (the asyncio client then
        # reports INTERNAL, grpc/grpc#36066): the server's own counts say what happened.
        with contextlib.suppress(grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
            await call.write(open_msg())
            await call.write(start("t"))
            for _ in range(7):
                await call.write(chunk("t", piece))
            await stop.wait()
        call.cancel()

    stop = asyncio.Event()
    # Each on a connection of its own (channels in one process share one by default).
    channels = [grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(4)]
    hoarders = []
    try:
        for n, ch in enumerate(channels, 1):  # one after the other, so the shares decide, not a race
            hoarders.append(asyncio.ensure_future(hoard(ch, stop)))
            assert await wait_until(lambda n=n: budget.held // one_stream + refused() == n, 20.0)
        request = pb.CheckDialogueRequest(dialogue_id="probe", options=pb.CheckOptions(method=pb.METHOD_PAIRWISE))
        for k in range(4):  # about 0.4 MiB of speech
            request.turns.add(turn_id=f"t{k}", speaker="A", audio=pb.Audio(encoded=speech.wav_bytes(VOICE_A, k)))
        assert request.ByteSize() > 300_000
        async with grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]) as probe:
            stub = pb_grpc.SleuthStub(probe)
            for _ in range(3):
                verdict = await stub.CheckDialogue(request, timeout=60)
                assert len(verdict.turns) == 4
        assert budget.buffered == 2 * one_stream and refused() == 2  # two hoarders held on throughout
    finally:
        stop.set()
        await asyncio.gather(*hoarders)
        for ch in channels:
            await ch.close()
    assert await wait_until(lambda: budget.held == 0)


async def test_streams_beyond_the_server_bound_are_refused_at_once(serve: Serve, speech: Speech) -> None:
    running = await serve(max_streams=2)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as ch:
        stub = pb_grpc.SleuthStub(ch)
        held = [stub.StreamDialogue(timeout=120) for _ in range(2)]
        for call in held:
            await call.write(open_msg())
        assert await wait_until(lambda: active_streams(running) == 2)
        extra = stub.StreamDialogue(timeout=120)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await extra.write(open_msg())
            await asyncio.wait_for(extra.read(), HANG)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "2 streams are open" in err.value.details()
        # A slot frees when a stream ends, and the next stream is served.
        await held[0].done_writing()
        with pytest.raises(grpc.aio.AioRpcError):
            await asyncio.wait_for(held[0].read(), HANG)  # no turn: "nothing to judge"
        assert await wait_until(lambda: active_streams(running) == 1)
        again = stub.StreamDialogue(timeout=120)
        await again.write(open_msg())
        await again.write(start("t"))
        await again.write(chunk("t", speech.wav_bytes(VOICE_A, 0), final=True))
        update = await asyncio.wait_for(again.read(), HANG)
        assert update.turn.verdict.turn_id == "t"
        for call in (*held, again):
            call.cancel()


async def test_one_connection_gets_a_bounded_number_of_streams(serve: Serve) -> None:
    running = await serve(ServerConfig(port=0, metrics_port=-1, max_streams_per_connection=3))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as ch:
        stub = pb_grpc.SleuthStub(ch)
        calls = [stub.StreamDialogue(timeout=120) for _ in range(5)]
        writes = [asyncio.ensure_future(call.write(open_msg())) for call in calls]
        assert await wait_until(lambda: active_streams(running) >= 3)
        await asyncio.sleep(0.5)
        # The other two wait on the client's side for a free stream; the server never sees them.
        assert active_streams(running) == 3
        for call in calls:
            call.cancel()
        for w in writes:  # the two never started never resolve: stop waiting for them
            w.cancel()
        await asyncio.gather(*writes, return_exceptions=True)
    assert await wait_until(lambda: active_streams(running) == 0)


class Blackhole:
    """A TCP proxy that can stop forwarding in both directions while keeping both sockets open: a peer
    that vanished without closing its connection (a crashed host, a dropped NAT mapping)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.silent = False
        self.upstream_closed = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, upstream: bool) -> None:
            while data := await r.read(65536):
                if not self.silent:
                    w.write(data)
            if upstream:
                self.upstream_closed.set()  # the server closed its end

        for coro in (pipe(client_r, up_w, False), pipe(up_r, client_w, True)):
            task = asyncio.ensure_future(coro)
            self._tasks.add(task)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._server is not None:
            self._server.close()


async def test_a_vanished_peer_is_dropped_by_keepalive(serve: Serve) -> None:
    running = await serve(ServerConfig(port=0, metrics_port=-1, keepalive_seconds=0.5, keepalive_timeout_seconds=0.5))
    proxy = Blackhole(running.port)
    port = await proxy.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = pb_grpc.SleuthStub(ch).StreamDialogue()  # no deadline: it would stay open for ever
            await call.write(open_msg())
            await call.write(start("t"))
            assert await wait_until(lambda: active_streams(running) == 1)
            proxy.silent = True  # the client is gone; its socket is not closed
            # The server's pings go unanswered: it closes the connection and cancels the stream.
            assert await wait_until(lambda: active_streams(running) == 0, 15.0)
            assert await asyncio.wait_for(proxy.upstream_closed.wait(), 15.0)
            call.cancel()
    finally:
        await proxy.close()


async def test_a_client_that_pings_too_often_is_disconnected(serve: Serve) -> None:
    # gRPC's own policy (two strikes, then GOAWAY too_many_pings), now set explicitly: a client may
    # ping an idle connection at most once per min_client_ping_seconds.
    running = await serve(ServerConfig(port=0, metrics_port=-1, min_client_ping_seconds=5.0))
    options = [
        ("grpc.keepalive_time_ms", 100),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}", options=options) as ch:
        call = pb_grpc.SleuthStub(ch).StreamDialogue(timeout=HANG)
        await call.write(open_msg())
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await asyncio.wait_for(call.read(), HANG)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "ping" in (err.value.details() or "").lower() or "goaway" in str(err.value).lower()


def test_stream_limits_are_config_fields_with_flags() -> None:
    import argparse

    from sleuthd.config import EngineConfig, add_cli_args

    parser = argparse.ArgumentParser()
    add_cli_args(parser, EngineConfig, env={})
    add_cli_args(parser, ServerConfig, env={})
    flags = parser.format_help()
    for flag in (
        "--max-audio-in-flight-mb",
        "--max-queued-decodes",
        "--max-streams",
        "--stream-idle-seconds",
        "--stream-lifetime-seconds",
        "--stream-message-overhead-bytes",
        "--max-references",
        "--max-streams-per-connection",
        "--keepalive-seconds",
        "--keepalive-timeout-seconds",
        "--min-client-ping-seconds",
    ):
        assert flag in flags
    assert AdmissionConfig().max_streams == 64


async def test_a_client_that_resends_at_once_after_busy_gets_its_next_refusal_late(
    serve: Serve, speech: Speech
) -> None:
    # Issue 33, finding 3: clients that resend the moment they are refused kept the server reading and refusing
    # ~150 requests of 3.66 MiB a second, CPU taken from the admitted work. A client that comes straight back
    # now waits --refusal-hold-seconds for its next "busy"; one that backed off (or its first) is told at once.
    hold = 1.0
    running = await serve(max_audio_in_flight_mb=1.0, refusal_hold_seconds=hold)
    budget = running.gate.limits.budget
    target = f"127.0.0.1:{running.port}"

    def held() -> float:
        return running.metrics.registry.get_sample_value("sleuthd_refusals_held_total") or 0.0

    request = pb.CheckDialogueRequest(dialogue_id="probe", options=pb.CheckOptions(method=pb.METHOD_PAIRWISE))
    for k in range(4):  # about 0.4 MiB of speech: over what a stream leaves of the 1 MiB budget
        request.turns.add(turn_id=f"t{k}", speaker="A", audio=pb.Audio(encoded=speech.wav_bytes(VOICE_A, k)))
    options = [("grpc.use_local_subchannel_pool", 1)]  # each channel on a connection of its own
    async with (
        grpc.aio.insecure_channel(target, options=options) as hoarder,
        grpc.aio.insecure_channel(target, options=options) as probe,
    ):
        stream = pb_grpc.SleuthStub(hoarder).StreamDialogue(timeout=120)
        await stream.write(open_msg())
        await stream.write(start("t"))
        await stream.write(chunk("t", bytes(900 * 1024)))  # a lone client's first audio is always let in
        assert await wait_until(lambda: budget.held >= 900 * 1024)
        stub = pb_grpc.SleuthStub(probe)

        async def refused_after(timeout: float = 30.0) -> float:
            t0 = asyncio.get_running_loop().time()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.CheckDialogue(request, timeout=timeout)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value
            return asyncio.get_running_loop().time() - t0

        first = await refused_after()
        straight_back = await refused_after()
        assert held() == 1
        await asyncio.sleep(1.2)  # backing off (over the pacer's 1 s window) is answered at once again
        after_backoff = await refused_after()
        # Straight back with a short deadline: held only until shortly before it, still told "busy".
        short = await refused_after(timeout=0.6)
        assert held() == 2
        stream.cancel()
    assert first < hold * 0.7 and after_backoff < hold * 0.7, (first, after_backoff)
    assert straight_back >= hold * 0.95, straight_back
    assert 0.3 <= short < 0.6, short
    assert await wait_until(lambda: budget.held == 0)
