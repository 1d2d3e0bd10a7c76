"""Overload bounded in memory (issue 17, finding 2): many clients with large requests against a real server
process get RESOURCE_EXHAUSTED at once while its RSS stays under a stated bound; and the pieces that keep
it there: withdrawn work gives up its buffers at once, one failed clip stops its siblings, and a shared
computation that fails after its callers left is not reported as an unretrieved task exception."""

from __future__ import annotations

import asyncio
import gc
import io
import threading
import time
import weakref
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import soundfile as sf
from sleuthd.config import ServerConfig
from sleuthd.domain import AudioInput
from sleuthd.encoders.batcher import BatcherConfig, MicroBatcher
from sleuthd.encoders.clips import ClipEmbedding
from sleuthd.encoders.embedder import ClipEmbedder, _retrieving
from sleuthd.encoders.single_flight import SingleFlight
from sleuthd.engine.facade import Engine
from sleuthd.errors import Overloaded
from sleuthd.ops.metrics import ServiceMetrics
from sleuthd.ops.observe import NullObserver
from sleuthd.rpc.server import create_server
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

from loadtest import overload

from .support import VOICE_A, Speech
from .test_serving import fresh_pcm

# ---------------------------------------------------------------------------------------------- the batcher


class GatedModel:
    """Stands in for the encoder: every call waits for ``gate``, then answers zeros."""

    def __init__(self, manifest: Any, gate: threading.Event) -> None:
        self.manifest = manifest
        self.provider = "fake"
        self.gate = gate
        self.entered = threading.Event()

    def embed(self, windows: np.ndarray) -> np.ndarray:
        self.entered.set()
        self.gate.wait(10)
        return np.zeros((len(windows), self.manifest.embedding_size), np.float32)


async def test_cancelled_request_gives_up_its_windows_at_once(engine: Engine) -> None:
    manifest = engine.entries["ge2e"].encoder.manifest
    width = manifest.window.window_samples
    gate = threading.Event()
    model = GatedModel(manifest, gate)
    pool = ThreadPoolExecutor(max_workers=1)
    batcher = MicroBatcher(model, pool, BatcherConfig(max_wait_ms=0))  # type: ignore[arg-type]
    try:
        busy = asyncio.ensure_future(batcher.encode(np.zeros((2, width), np.float32)))
        assert await asyncio.to_thread(model.entered.wait, 10)  # the only model slot is taken
        big = np.zeros((500, width), np.float32)  # 500 windows, ~100 MB in a real overload
        alive = weakref.ref(big)
        waiting = asyncio.ensure_future(batcher.encode(big))
        del big
        for _ in range(5):
            await asyncio.sleep(0)
        assert batcher.queued_windows == 500
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        del waiting
        gc.collect()
        # Still behind a batch that has not finished: before, the queue kept the array until it
        # reached the head, so cancelled requests' windows piled up under overload.
        assert batcher.queued_windows == 0
        assert alive() is None, "the cancelled request's windows are still held"
        gate.set()
        assert (await busy).shape == (2, manifest.embedding_size)
    finally:
        gate.set()
        await batcher.close()
        pool.shutdown(wait=True)


# ---------------------------------------------------------------------------------------------- the embedder


class FailFirstEncoder:
    """The first encode call fails at once (a full queue); the others wait until cancelled."""

    def __init__(self, manifest: Any) -> None:
        self.manifest = manifest
        self.calls = 0
        self.cancelled = 0

    async def encode(self, windows: np.ndarray, deadline: float | None = None) -> np.ndarray:
        self.calls += 1
        if self.calls == 1:
            raise Overloaded("queue full")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        raise AssertionError("a sibling of a failed clip ran to the end")


async def test_a_failed_clip_stops_its_siblings(engine: Engine, speech: Speech) -> None:
    encoder = FailFirstEncoder(engine.entries["ge2e"].encoder.manifest)
    embedder = ClipEmbedder(engine.models.vad, engine.models.prep_pool, NullObserver(), 300.0, cache_entries=0)
    audio = AudioInput(speech.wav_bytes(VOICE_A, 0))
    dense = replace(encoder.manifest.window, rate_per_second=4.0)
    # One clip under two placements: one decode, then two encoder calls side by side.
    with pytest.raises(Overloaded):
        await asyncio.wait_for(embedder.embed(encoder, [(audio, "turn")], placements=(None, dense)), 30)  # type: ignore[arg-type]
    assert encoder.calls == 2
    assert encoder.cancelled == 1, "the other placement kept waiting for the encoder after the clip failed"


@pytest.mark.parametrize("retrieved", [True, False], ids=["fixed", "bare task (the bug)"])
async def test_shared_computation_failing_after_its_caller_left(retrieved: bool) -> None:
    # The race: the caller's deadline passes (or its RPC is cancelled) and, while it is unwinding, the
    # shared computation fails (the batcher refused its windows). Nobody is left to read the error,
    # and asyncio logs "Task exception was never retrieved" for every such request under overload.
    # The second case shows the race is real (with Python 3.11's asyncio.wait_for, which the project uses).
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        flight: SingleFlight[str, list[ClipEmbedding]] = SingleFlight()
        release = asyncio.Event()

        async def work() -> list[ClipEmbedding]:
            await release.wait()
            raise Overloaded("queue full")

        def start() -> asyncio.Task[list[ClipEmbedding]]:
            task = asyncio.ensure_future(work())
            return _retrieving(task) if retrieved else task

        caller = asyncio.ensure_future(flight.run("clip", start, timeout=60))
        await asyncio.sleep(0.01)
        caller.cancel()
        await asyncio.sleep(0)  # the caller starts unwinding ...
        release.set()  # ... and the computation fails meanwhile
        with pytest.raises(asyncio.CancelledError):
            await caller
        for _ in range(3):
            await asyncio.sleep(0)
        del caller
        gc.collect()
    finally:
        loop.set_exception_handler(previous)
    never_retrieved = [c for c in reported if "never retrieved" in str(c.get("message"))]
    assert bool(never_retrieved) is not retrieved


# ---------------------------------------------------------------------------------------------- the server

# The run: 48 clients, each on its own connection, sending dialogues of 2 turns x 20 s (1.2 MiB) back to back
# with 5 s deadlines for 10 s, against `sleuthd serve`, while one stream holds 12 MiB of a turn it never
# finishes: far more than two cores can score, so most calls must be refused. (24 clients were overload
# before the fused default got faster; at 7 OK/s unloaded they queue 3.4 s of work, inside the deadline,
# and every call was answered: 48 queue about 7 s, still overload on a machine twice as fast.) The same payload is
# first sent by two clients without deadline pressure for 8 s: the server's unloaded capacity.
# Before issue 17 no call was refused and almost every call ran into its deadline; before issue 33 the
# hoarding stream's bytes counted as work ahead (the pace said hours) and every call was refused, and
# without a hoarder the admitted calls shared the CPU and many finished after their deadline.
CLIENTS, SECONDS, DEADLINE, TURNS, TURN_SECONDS = 48, 10.0, 5.0, 2, 20.0
CAPACITY_CLIENTS, CAPACITY_SECONDS, HOARD_MIB = 2, 8.0, 12.0
# Goodput under overload as a share of the unloaded capacity (issue 33 asks for 40 %; measured here ...).
MIN_GOODPUT = 0.4
# The bound on growth over idle RSS. What remains under overload: one request per client in transport
# buffers and being refused (48 x 1.2 MiB, a few copies each), the hoarding stream's 12 MiB, the few admitted
# requests' audio, decoded samples and windows, ONNX Runtime's arena growing to full batches, and the
# allocator's slack. Measured 250-300 MB here on a 2-core machine shared with other jobs (1.9 GB before the
# RPC gate cut the traceback of the abort that refuses a request: gRPC keeps it in a reference cycle, and
# every refused request, parsed and converted, stayed alive until a full collection).
# With refusals held (--refusal-hold-seconds) the gate reads a refused call's half-close before it answers: gRPC
# otherwise kept ~100-170 finished calls alive and the growth here was 349-394 MB (227 MB with the read).
RSS_BOUND_MB = 500.0


@pytest.fixture(scope="module")
def overload_run(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[overload.OverloadResult, str]:
    """The run's result and the server's log."""
    log = tmp_path_factory.mktemp("overload") / "server.log"
    result = overload.run(
        clients=CLIENTS,
        seconds=SECONDS,
        deadline_s=DEADLINE,
        turns=TURNS,
        turn_seconds=TURN_SECONDS,
        serve_args=["--models-dir", str(models_dir)],
        log=log,
        kill_rss_mb=4000.0,
        settle_s=1.0,
        after=_valid_request_after,
        capacity_clients=CAPACITY_CLIENTS,
        capacity_seconds=CAPACITY_SECONDS,
        hoarders=1,
        hoard_mib=HOARD_MIB,
    )
    return result, log.read_text()


def _valid_request_after(target: str) -> str:
    """One small dialogue once the clients have stopped: the server still scores (returns the status)."""

    async def go() -> str:
        turns = overload.long_turns(2, 3.0)
        async with grpc.aio.insecure_channel(target) as ch:
            req = overload.make_request(turns, 10**9)
            v = await pb_grpc.SleuthStub(ch).CheckDialogue(req, timeout=60)
            return "OK" if len(v.turns) == 2 else "wrong"

    return asyncio.run(go())


def test_overload_is_refused_fast_within_a_memory_bound(overload_run: tuple[overload.OverloadResult, str]) -> None:
    r, log = overload_run
    print(overload.table(r))  # shown when an assertion fails
    assert not r.killed_by_watchdog
    assert r.rss_before_mb is not None and r.rss_peak_mb is not None
    grown = r.rss_peak_mb - r.rss_before_mb
    assert grown < RSS_BOUND_MB, f"server RSS grew {grown:.0f} MB under overload (bound {RSS_BOUND_MB:.0f})"
    assert set(r.codes) <= {"OK", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "UNAVAILABLE"}, r.codes
    # The load is overload: on average every client was refused at least once. (How large a share is refused
    # depends on the machine's capacity, not on the server: at ~5 answers a second unloaded more than half of the
    # requests were refused; at ~10, measured here on 2026-11-27 with the same code, about a third. The bounds
    # that are the server's, refusing fast and finishing what it admits, are asserted below.)
    assert r.codes.get("RESOURCE_EXHAUSTED", 0) >= r.clients, r.codes
    assert r.codes.get("OK", 0) > 0, r.codes  # goodput: admitted work is done, not starved
    # Issue 33, findings 2 and 3: near the unloaded capacity although a stream hoards a turn, and what is
    # admitted finishes (work admitted and then cut by its deadline is CPU taken from the rest).
    assert r.goodput_of_capacity is not None and r.goodput_of_capacity >= MIN_GOODPUT, (
        r.codes,
        r.capacity_ok_per_s,
        r.server_cores,
        r.capacity_server_cores,
        r.goodput_per_cpu_of_capacity,
    )
    # Some admitted calls still finish late: measured 11-14 late to 46-51 answered at 48 clients here (the
    # pace is learnt from the model's work while the event loop also receives ~300 refused calls a second).
    assert r.codes.get("DEADLINE_EXCEEDED", 0) <= max(2, r.codes["OK"] // 2), r.codes
    assert r.hoarders_ended == {"held to the end": 1}, r.hoarders_ended
    # "Busy" comes before the work, not after it: a client's first refusal (not straight after another) takes a
    # fraction of what scoring one takes. These clients resend the moment they are refused: the next refusal is
    # held --refusal-hold-seconds (1 s by default), so most refusals take that long and they send fewer.
    assert r.exhausted_first_latency_p50_s is not None and r.ok_latency_p50_s is not None
    assert r.exhausted_first_latency_p50_s < r.ok_latency_p50_s / 4, (
        r.exhausted_first_latency_p50_s,
        r.ok_latency_p50_s,
    )
    assert r.exhausted_latency_p50_s is not None and r.exhausted_latency_p50_s >= 0.9, r.exhausted_latency_p50_s
    assert r.after_status == "OK"
    assert "never retrieved" not in log, log[-2000:]


# ---------------------------------------------------------------------------------------------- dear to decode


def _long_silent_flac(seconds: float) -> bytes:
    """``seconds`` of 48 kHz stereo near-silence as FLAC: a few tens of KiB that decode to 2 x 48,000 samples
    a second (resampled, trimmed: seconds of CPU for the server, nothing for the sender)."""
    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", 48_000, 2, format="FLAC", subtype="PCM_16") as f:
        for _ in range(int(seconds)):
            f.write(np.zeros((48_000, 2), np.int16))
    return buf.getvalue()


async def test_requests_dear_to_decode_do_not_starve_another_client(engine: Engine, speech: Speech) -> None:
    # Issue 33, finding 5: 16 clients sending 2 x 300 s of 48 kHz stereo FLAC (70 KiB each) were all
    # admitted (their bytes are few), and a fresh valid request from another client took 15-33 s. Now each
    # is admitted by its cost from the headers, one or two at a time, and the queue serves the client served
    # least first: here 16 connections flood, and another client's small requests wait for a unit or two.
    flac = _long_silent_flac(300.0)
    assert len(flac) < 200_000
    uncached = replace(engine.config, embedding_cache_entries=0)  # every request decoded, as distinct ones are
    server = ServerConfig(port=0, metrics_port=-1)
    running = await create_server(Engine(engine.models, uncached), server, ServiceMetrics())
    target = f"127.0.0.1:{running.port}"
    own = [("grpc.use_local_subchannel_pool", 1)]
    stop = asyncio.Event()
    flood_codes: Counter[str] = Counter()

    async def flood() -> None:
        async with grpc.aio.insecure_channel(target, options=own) as ch:
            stub = pb_grpc.SleuthStub(ch)
            req = pb.CheckDialogueRequest(dialogue_id="dear")
            for k in range(2):
                req.turns.add(turn_id=f"t{k}", speaker="A", audio=pb.Audio(encoded=flac))
            while not stop.is_set():
                try:
                    await stub.CheckDialogue(req, timeout=60)
                    flood_codes["OK"] += 1
                except grpc.aio.AioRpcError as err:
                    flood_codes[err.code().name] += 1
                    await asyncio.sleep(0.05)

    flooders = [asyncio.ensure_future(flood()) for _ in range(16)]
    waits = []
    try:
        await asyncio.sleep(3.0)  # the flood is in full swing
        async with grpc.aio.insecure_channel(target, options=own) as ch:
            stub = pb_grpc.SleuthStub(ch)
            for k in range(3):
                req = pb.CheckDialogueRequest(dialogue_id="fresh")
                req.turns.add(turn_id="t", speaker="A", audio=fresh_pcm(speech, VOICE_A, k, 4242 + k))
                started = time.perf_counter()
                verdict = await stub.CheckDialogue(req, timeout=120)
                waits.append(time.perf_counter() - started)
                assert verdict.turns[0].speech_seconds > 1
    finally:
        stop.set()
        await asyncio.gather(*flooders)
        await running.stop(1.0)
    assert flood_codes["OK"] > 0, flood_codes  # the flood is served too, a unit at a time
    # One of the flood's units (a second of decoding here, two on a busy machine) and its own.
    assert max(waits) < 4.0, (waits, flood_codes)
