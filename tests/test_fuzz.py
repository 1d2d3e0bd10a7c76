"""A bounded, seeded fuzz run through the real in-process server: thousands of malformed and adversarial
requests over CheckDialogue, RankCandidates and StreamDialogue (cases: loadtest/fuzz.py).

Asserts that no request ever gets INTERNAL, UNKNOWN or UNAVAILABLE, that gRPC health answers within
its 1 s deadline throughout, that the process's memory stays bounded, and that a valid request is
answered correctly afterwards. The longer run against a `sleuthd serve` process is
``python -m loadtest.fuzz --requests 10000 --clients 64``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

from loadtest.abuse import wire_walk_request
from loadtest.fuzz import BROKEN, CHANNEL_OPTIONS, CaseFactory, HealthProbe, Seeds, run_cases, start_server
from loadtest.fuzz import rss_mib as server_rss_mib

from .support import TEST_MAX_MESSAGE_BYTES, VOICE_A, VOICE_B, VOICE_C, VOICE_F, Speech, enc

REQUESTS = 2500
CLIENTS = 16
SEED = 17
# Every case is cheap (the slowest take about 2 s here), so a call that runs into this deadline lost
# its answer: the server never sent a status.
CALL_TIMEOUT_S = 30.0
# The server runs in a process of its own. Measured with this seed and 16 clients (issue 33): it peaks
# 100-170 MiB above its idle size and, once it has gone idle, ends 60 MiB below to 100 MiB above it. Before,
# it peaked at +525 and ended at +350 (+350..+530 in CI runs, against the bound of 350, so the test failed
# now and then): every refused request stayed alive, parsed and converted with its audio, in a reference
# cycle gRPC's handler keeps with the abort exception, until a full collection that came late or never;
# and ONNX Runtime's arena and the allocator's thread arenas kept their peak. Now the gate cuts the abort's
# traceback, and when the server goes idle the heap trimmer collects cycles, shrinks the ONNX Runtime
# arenas and trims the heap (sleuthd.engine.memory.HeapTrimmer), with one malloc arena per core.
# Decompression bombs are refused from their headers (tests/test_audio_limits.py); before that, the fuzz
# cases drove this process 1,744 MiB up.
MAX_PEAK_GROWTH_MIB = 500
MAX_GROWTH_MIB = 200


@pytest.fixture(scope="module")
def seeds(speech: Speech) -> Seeds:
    paths: list[Path] = [speech.clips[v][k] for v in (VOICE_A, VOICE_B, VOICE_F, VOICE_C) for k in (0, 1)]
    return Seeds.from_wavs(paths)


def test_cases_are_seeded_and_cover_every_rpc(seeds: Seeds) -> None:
    a = list(CaseFactory(seeds, SEED).cases(300))
    b = list(CaseFactory(seeds, SEED).cases(300))
    assert [c.name for c in a] == [c.name for c in b]
    assert {c.rpc for c in a} == {"CheckDialogue", "RankCandidates", "StreamDialogue"}
    kinds = {c.name.split("/")[0] for c in a}
    assert {"audio", "pcm", "dialogue", "rank", "stream"} <= kinds
    formats = {c.name.split("/")[1] for c in a if c.name.startswith("audio/")}
    assert {"wav", "flac", "ogg", "opus", "mp3"} <= formats


async def test_fuzz_every_rpc(models_dir: Path, tmp_path: Path, seeds: Seeds, speech: Speech) -> None:
    # A server process of its own, so its memory is measured alone (not the test process's heap, which
    # other tests leave in different states) and the run cannot disturb the session's server.
    limit_mb = str(TEST_MAX_MESSAGE_BYTES / 2**20)
    proc, target = start_server(models_dir, tmp_path / "server.log", "--max-message-mb", limit_mb)
    try:
        async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
            await _fuzz_and_check(channel, target, proc.pid, seeds, speech)
    finally:
        proc.terminate()
        proc.wait(30)


async def _fuzz_and_check(channel: grpc.aio.Channel, target: str, pid: int, seeds: Seeds, speech: Speech) -> None:
    cases = CaseFactory(seeds, SEED).cases(REQUESTS)  # built as they are sent
    before = server_rss_mib(pid)
    result = await run_cases(channel, target, cases, CLIENTS, CALL_TIMEOUT_S, rss=lambda: server_rss_mib(pid))
    await asyncio.sleep(12.0)  # cancelled work drains and the heap trimmer (at most every 10 s) runs
    growth = server_rss_mib(pid) - before
    peak = result.peak_rss_mib - before
    summary = (
        f"{dict(result.counts)} in {result.seconds:.1f} s; RSS {before:.0f} MiB, peak +{peak:.0f}, after "
        f"+{growth:.0f}; health slowest {result.health_slowest_s:.2f} s"
    )
    assert sum(result.counts.values()) == REQUESTS
    assert not result.broken, f"{result.broken[:10]} ({summary})"
    assert not set(result.counts) & BROKEN
    assert "DEADLINE_EXCEEDED" not in result.counts, (result.slowest[:5], summary)
    assert result.health_checks > 0 and not result.health_misses, (result.health_misses[:5], summary)
    assert result.counts["OK"] > 0 and result.counts["INVALID_ARGUMENT"] > 0, summary
    assert peak < MAX_PEAK_GROWTH_MIB, summary
    assert growth < MAX_GROWTH_MIB, summary

    stub = pb_grpc.SleuthStub(channel)
    req = pb.CheckDialogueRequest(dialogue_id="after-fuzz")
    for k in range(3):
        req.turns.add(turn_id=f"t{k}", speaker="A", audio=enc(speech.wav_bytes(VOICE_A, k)))
    req.turns.add(turn_id="odd", speaker="A", audio=enc(speech.wav_bytes(VOICE_C, 0)))
    v = await stub.CheckDialogue(req, timeout=60)
    assert [t.status for t in v.turns] == [pb.CONSISTENT] * 3 + [pb.INCONSISTENT]


async def test_huge_repeated_field_is_refused_without_stalling_health(channel: grpc.aio.Channel) -> None:
    stub = pb_grpc.SleuthStub(channel)
    request = pb.CheckDialogueRequest(dialogue_id="huge", turns=[pb.Turn()] * 400_000)  # the limit is 1000 turns
    probe = HealthProbe(channel, interval=0.05)
    stop = asyncio.Event()
    watcher = asyncio.create_task(probe.run(stop))
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.CheckDialogue(request, timeout=60)
    finally:
        stop.set()
        await watcher
    assert err.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert probe.checks > 0 and not probe.misses, probe.misses


async def test_requests_costly_to_walk_never_stall_health(channel: grpc.aio.Channel) -> None:
    # Issue 33, finding 1: requests inside every count limit whose every nested message carries 256 unknown
    # fields (every submessage sent 16 times). Before, each was walked in full on the event loop (4 MiB: 2 M
    # fields, seconds each) and health waited; now each walk stops at the request's field cap, and all walks
    # together at the process's walking pace.
    call = channel.unary_unary("/sleuthd.v1.Sleuth/CheckDialogue", request_serializer=None, response_deserializer=None)
    data = wire_walk_request(TEST_MAX_MESSAGE_BYTES - 4096)
    probe = HealthProbe(channel, interval=0.05)
    stop = asyncio.Event()
    watcher = asyncio.create_task(probe.run(stop))

    async def one() -> grpc.StatusCode:
        try:
            await call(data, timeout=60)
        except grpc.aio.AioRpcError as err:
            return err.code()
        return grpc.StatusCode.OK

    try:
        await asyncio.sleep(0.2)
        codes = await asyncio.gather(*(one() for _ in range(8)))
        await asyncio.sleep(0.2)
    finally:
        stop.set()
        await watcher
    assert set(codes) <= {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
    assert grpc.StatusCode.INVALID_ARGUMENT in codes
    assert probe.checks > 0 and not probe.misses, (probe.misses, probe.slowest)
