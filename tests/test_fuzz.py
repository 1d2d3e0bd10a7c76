"""A bounded, seeded fuzz run through the real in-process server: thousands of malformed and adversarial
requests over CheckDialogue, RankCandidates and StreamDialogue (cases: loadtest/fuzz.py).

Asserts that no request ever gets INTERNAL, UNKNOWN or UNAVAILABLE, that gRPC health answers within
its 1 s deadline throughout, that the process's memory stays bounded, and that a valid request is
answered correctly afterwards. The longer run against a `sleuthd serve` process is
``python -m loadtest.fuzz --requests 10000 --clients 64``.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import os
from pathlib import Path

import grpc
import pytest
from sleuthd.server import RunningServer
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

from loadtest.fuzz import BROKEN, CaseFactory, HealthProbe, Seeds, run_cases

from .support import VOICE_A, VOICE_B, VOICE_C, VOICE_F, Speech, enc

REQUESTS = 2500
CLIENTS = 16
SEED = 17
# Every case is cheap (the slowest take about 2 s here), so a call that runs into this deadline lost
# its answer: the server never sent a status.
CALL_TIMEOUT_S = 30.0
# The server runs in this process, so its memory is this process's. Decodable cases are short and
# the embedding cache is bounded: measured, the process settles about 100 MiB above where it started
# (caches, ONNX Runtime's arena, thread stacks) and peaks about 200 MiB above it. One decompression
# bomb decoded in full would add 439 MiB on its own.
MAX_PEAK_GROWTH_MIB = 400
MAX_GROWTH_MIB = 250


def rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def settled_rss_mib() -> float:
    """RSS after handing freed heap back to the OS, so what is counted is what is still held."""
    gc.collect()
    ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
    return rss_mib()


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


async def test_fuzz_every_rpc(channel: grpc.aio.Channel, server: RunningServer, seeds: Seeds, speech: Speech) -> None:
    cases = CaseFactory(seeds, SEED).cases(REQUESTS)  # built as they are sent
    before = settled_rss_mib()
    result = await run_cases(channel, f"127.0.0.1:{server.port}", cases, CLIENTS, CALL_TIMEOUT_S, rss=rss_mib)
    growth = settled_rss_mib() - before
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
