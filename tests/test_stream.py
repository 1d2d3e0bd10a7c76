"""StreamDialogue through the real server: chunked turns, early verdicts, revisions, misuse, vanishing clients."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import replace

import grpc
import numpy as np
import pytest
import pytest_asyncio
import soundfile as sf
from sleuthd.config import ServerConfig
from sleuthd.engine.facade import Engine
from sleuthd.ops.metrics import ServiceMetrics
from sleuthd.rpc.server import RunningServer, create_server
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

from .support import VOICE_A, VOICE_F, Speech, enc

Req = pb.StreamDialogueRequest


def open_msg(method: int = pb.METHOD_PAIRWISE, references: dict[str, bytes] | None = None) -> Req:
    o = pb.StreamOpen(dialogue_id="live", options=pb.CheckOptions(method=method))  # type: ignore[arg-type]
    for speaker, data in (references or {}).items():
        o.references.add(speaker=speaker, audio=enc(data))
    return Req(open=o)


def start(turn_id: str, speaker: str, index: int, pcm: pb.PcmFormat | None = None) -> Req:
    ts = pb.TurnStart(turn_id=turn_id, speaker=speaker, index=index)
    if pcm is not None:
        ts.pcm.CopyFrom(pcm)
    return Req(turn_start=ts)


def chunks(turn_id: str, data: bytes, n: int) -> list[Req]:
    """``data`` split into ``n`` pieces, the last marked final."""
    cuts = np.linspace(0, len(data), n + 1).astype(int)
    return [
        Req(audio=pb.TurnAudio(turn_id=turn_id, data=data[a:b], final=(k == n - 1)))
        for k, (a, b) in enumerate(itertools.pairwise(cuts))
    ]


async def send_turn(call: grpc.aio.StreamStreamCall, turn_id: str, speaker: str, index: int, data: bytes) -> None:
    await call.write(start(turn_id, speaker, index))
    for m in chunks(turn_id, data, 3):
        await call.write(m)


async def test_chunked_turns_get_verdicts_before_close_and_final_matches_check(
    stub: pb_grpc.SleuthStub, speech: Speech
) -> None:
    call = stub.StreamDialogue(timeout=120)
    await call.write(open_msg(pb.METHOD_REFERENCE, {"A": speech.wav_bytes(VOICE_A, 5)}))
    order = [("t0", VOICE_A, 0), ("t1", VOICE_A, 1), ("t2", VOICE_F, 0), ("t3", VOICE_A, 2)]
    for index, (turn_id, voice, k) in enumerate(order):
        await send_turn(call, turn_id, "A", index * 10, speech.wav_bytes(voice, k))
        # The verdict for this turn arrives while the stream is still open.
        msg = await asyncio.wait_for(call.read(), 60)
        assert msg.turn.verdict.turn_id == turn_id and not msg.turn.revision
        expected = pb.INCONSISTENT if voice == VOICE_F else pb.CONSISTENT
        assert msg.turn.verdict.status == expected, msg.turn.verdict.detail
        assert msg.turn.trigger_turn_id == turn_id
    await call.done_writing()
    final = (await asyncio.wait_for(call.read(), 60)).final
    assert await call.read() == grpc.aio.EOF
    assert (await call.code()) == grpc.StatusCode.OK
    assert list(final.speakers[0].inconsistent_turn_ids) == ["t2"]

    # The same dialogue through CheckDialogue gives the same verdict.
    req = pb.CheckDialogueRequest(dialogue_id="live", options=pb.CheckOptions(method=pb.METHOD_REFERENCE))
    req.references.add(speaker="A", audio=enc(speech.wav_bytes(VOICE_A, 5)))
    for turn_id, voice, k in order:
        req.turns.add(turn_id=turn_id, speaker="A", audio=enc(speech.wav_bytes(voice, k)))
    unary = await stub.CheckDialogue(req, timeout=60)
    assert [(t.turn_id, t.status, round(t.score, 6)) for t in final.turns] == [
        (t.turn_id, t.status, round(t.score, 6)) for t in unary.turns
    ]


async def test_first_turn_turns_out_to_be_the_odd_one(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    """Auto, no reference: the first turn (another voice) cannot be judged alone; with the second turn
    both look suspect; once the true voice has a majority the second is revised to consistent and the
    first stays the odd one out."""
    call = stub.StreamDialogue(timeout=120)
    await call.write(open_msg(pb.METHOD_AUTO))
    turns = [("t0", VOICE_F, 0)] + [(f"t{k}", VOICE_A, k) for k in range(1, 5)]
    for index, (turn_id, voice, k) in enumerate(turns):
        await send_turn(call, turn_id, "B", index, speech.wav_bytes(voice, k))
    await call.done_writing()
    messages = [m async for m in call]
    final = messages[-1].final
    history: dict[str, list[tuple[int, bool]]] = {}
    for m in messages[:-1]:
        history.setdefault(m.turn.verdict.turn_id, []).append((m.turn.verdict.status, m.turn.revision))
    assert list(final.speakers[0].inconsistent_turn_ids) == ["t0"]
    # t0 started unjudgeable and was revised once evidence arrived; it ends INCONSISTENT.
    assert history["t0"][0] == (pb.INSUFFICIENT_CONTEXT, False)
    assert history["t0"][-1] == (pb.INCONSISTENT, True)
    # Every status change of an earlier turn came as a revision, none as a duplicate first verdict.
    for turn_id, events in history.items():
        assert events[0][1] is False and all(rev for _, rev in events[1:]), (turn_id, events)
    assert all(status == pb.CONSISTENT for status, _ in [history[t][-1] for t in ("t1", "t2", "t3", "t4")])


async def test_pcm_chunks_across_turns(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    call = stub.StreamDialogue(timeout=120)
    await call.write(open_msg(pb.METHOD_CENTROID))
    fmt = pb.PcmFormat(encoding=pb.PCM_S16LE, sample_rate_hz=16000, channels=1)
    for index in range(3):
        samples, _ = sf.read(speech.clips[VOICE_A][index], dtype="int16")
        await call.write(start(f"p{index}", "A", index, fmt))
        for m in chunks(f"p{index}", samples.astype("<i2").tobytes(), 5):
            await call.write(m)
    await call.done_writing()
    messages = [m async for m in call]
    updates, final = [m.turn for m in messages[:-1]], messages[-1].final
    assert [t.turn_id for t in final.turns] == ["p0", "p1", "p2"]
    assert all(t.status == pb.CONSISTENT for t in final.turns)
    # p0 alone had nothing to compare with; p1's arrival revised it.
    assert [(u.verdict.turn_id, u.revision) for u in updates] == [
        ("p0", False),
        ("p1", False),
        ("p0", True),
        ("p2", False),
    ]
    assert updates[0].verdict.status == pb.INSUFFICIENT_CONTEXT


MISUSE = {
    "no open first": ([start("a", "A", 0)], grpc.StatusCode.FAILED_PRECONDITION, "must be `open`"),
    "second open": ([open_msg(), open_msg()], grpc.StatusCode.FAILED_PRECONDITION, "already open"),
    "duplicate turn id": (
        [open_msg(), start("a", "A", 0), start("a", "A", 1)],
        grpc.StatusCode.ALREADY_EXISTS,
        "'a' was already started",
    ),
    "out-of-order index": (
        [open_msg(), start("a", "A", 5), start("b", "A", 3)],
        grpc.StatusCode.INVALID_ARGUMENT,
        "start turns in dialogue order",
    ),
    "chunk for unknown turn": (
        [open_msg(), Req(audio=pb.TurnAudio(turn_id="ghost", data=b"x"))],
        grpc.StatusCode.NOT_FOUND,
        "never started",
    ),
    "empty message": ([open_msg(), Req()], grpc.StatusCode.INVALID_ARGUMENT, "empty stream message"),
    "unknown encoder": (
        [Req(open=pb.StreamOpen(options=pb.CheckOptions(encoder="ecapa")))],
        grpc.StatusCode.NOT_FOUND,
        "unknown encoder",
    ),
}


@pytest.mark.parametrize("case", list(MISUSE))
async def test_stream_misuse_status_codes(stub: pb_grpc.SleuthStub, case: str) -> None:
    messages, code, text = MISUSE[case]

    async def requests() -> AsyncIterator[Req]:
        for m in messages:
            yield m

    call = stub.StreamDialogue(requests(), timeout=60)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in call:
            pass
    assert err.value.code() == code and text in err.value.details(), err.value.details()


async def test_audio_after_final_and_close_with_open_turns(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    call = stub.StreamDialogue(timeout=60)
    await call.write(open_msg())
    await send_turn(call, "a", "A", 0, speech.wav_bytes(VOICE_A, 0))
    await asyncio.wait_for(call.read(), 60)
    await call.write(Req(audio=pb.TurnAudio(turn_id="a", data=b"late")))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(call.read(), 60)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "already complete" in err.value.details()

    call = stub.StreamDialogue(timeout=60)
    await call.write(open_msg())
    await call.write(start("half", "A", 0))
    await call.write(Req(audio=pb.TurnAudio(turn_id="half", data=speech.wav_bytes(VOICE_A, 0)[:1000])))
    await call.done_writing()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(call.read(), 60)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "'half'" in err.value.details()


async def test_bad_audio_in_stream_names_the_turn(stub: pb_grpc.SleuthStub) -> None:
    call = stub.StreamDialogue(timeout=60)
    await call.write(open_msg())
    await call.write(start("junk", "A", 0))
    await call.write(Req(audio=pb.TurnAudio(turn_id="junk", data=b"definitely not audio" * 30, final=True)))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(call.read(), 60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "turn 'junk'" in err.value.details()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def small_limits_server(engine: Engine) -> AsyncIterator[RunningServer]:
    # The same loaded models behind an engine with small per-stream bounds.
    small = Engine(engine.models, replace(engine.config, max_stream_buffer_mb=100_000 / 2**20, max_turns=3))
    running = await create_server(small, ServerConfig(port=0, metrics_port=-1), ServiceMetrics())
    yield running
    await running.stop(grace=1.0)


async def test_per_stream_memory_and_turn_bounds(small_limits_server: RunningServer, speech: Speech) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{small_limits_server.port}") as ch:
        stub = pb_grpc.SleuthStub(ch)
        call = stub.StreamDialogue(timeout=60)
        await call.write(open_msg())
        await call.write(start("big", "A", 0))
        for _ in range(3):  # 3 x 40 kB of an unfinished turn: over the 100 kB bound
            await call.write(Req(audio=pb.TurnAudio(turn_id="big", data=b"\x00" * 40_000)))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await asyncio.wait_for(call.read(), 60)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "100000" in err.value.details()

        call = stub.StreamDialogue(timeout=60)
        await call.write(open_msg())
        for k in range(4):
            await call.write(start(f"t{k}", "A", k))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await asyncio.wait_for(call.read(), 60)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "turns" in err.value.details()


async def test_vanishing_client_frees_the_stream(
    stub: pb_grpc.SleuthStub, metrics: ServiceMetrics, speech: Speech
) -> None:
    def active_streams() -> float:
        return metrics.registry.get_sample_value("sleuthd_streams_active") or 0.0

    before = active_streams()
    call = stub.StreamDialogue(timeout=60)
    await call.write(open_msg())
    await call.write(start("gone", "A", 0))
    await call.write(Req(audio=pb.TurnAudio(turn_id="gone", data=speech.wav_bytes(VOICE_A, 0)[:50_000])))
    for _ in range(100):  # the server has the stream open
        if active_streams() > before:
            break
        await asyncio.sleep(0.05)
    assert active_streams() == before + 1
    call.cancel()  # the client disappears mid-turn
    for _ in range(200):
        if active_streams() == before:
            break
        await asyncio.sleep(0.05)
    assert active_streams() == before
