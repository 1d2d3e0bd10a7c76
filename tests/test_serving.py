"""Serving behaviour through the real server: shared batching across RPCs, metrics, deadlines."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import soundfile as sf
from sleuthd.config import EngineConfig
from sleuthd.domain import AudioInput
from sleuthd.encoders.batcher import MicroBatcher
from sleuthd.encoders.runner import PerClipEncoder
from sleuthd.engine.facade import Engine
from sleuthd.rpc.server import RunningServer
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

from .support import VOICE_A, VOICE_B, VOICE_C, VOICE_F, Speech


def fresh_pcm(speech: Speech, voice: str, k: int, salt: int) -> pb.Audio:
    """A clip as PCM with an inaudible per-request change, so the embedding cache cannot answer it."""
    samples, rate = sf.read(speech.clips[voice][k], dtype="int16")
    samples = samples.copy()
    samples[0] = salt  # one sample out of ~80 000
    return pb.Audio(pcm=pb.PcmAudio(data=samples.astype("<i2").tobytes(), encoding=pb.PCM_S16LE,
                                    sample_rate_hz=rate, channels=1))  # fmt: skip


async def test_concurrent_rpcs_share_model_calls(stub: pb_grpc.SleuthStub, engine: Engine, speech: Speech) -> None:
    batcher = engine.encoders["ge2e"]
    assert isinstance(batcher, MicroBatcher)
    n = 16
    requests = []
    for r in range(n):
        req = pb.CheckDialogueRequest(dialogue_id=f"c{r}")
        for k, voice in enumerate((VOICE_A, VOICE_B, VOICE_C)):
            req.turns.add(turn_id=f"t{k}", speaker="S", audio=fresh_pcm(speech, voice, k, 1000 + r))
        requests.append(req)
    # The work queue starts a unit only while the work running has less than overlap_s left at the pace it
    # learnt, and this session's server learnt its pace from whatever ran before (in the full suite it ran
    # these 16 one at a time: 16 calls). This test is about the batcher, so the queue lets them all start;
    # the queue's pacing has tests of its own (test_admission, test_overload).
    saved, engine.work.overlap_s = engine.work.overlap_s, 3600.0
    before = batcher.stats()
    try:
        verdicts = await asyncio.gather(*(stub.CheckDialogue(q, timeout=120) for q in requests))
    finally:
        engine.work.overlap_s = saved
    after = batcher.stats()
    assert all(len(v.turns) == 3 and all(t.HasField("score") for t in v.turns) for v in verdicts)
    calls = after.batches - before.batches
    clips = 3 * n
    assert after.requests - before.requests == clips  # every clip went through the batcher...
    assert calls < n, f"{n} concurrent RPCs ({clips} clips) took {calls} model calls"  # ...in fewer calls than RPCs
    # Batched scoring gives the same numbers as scoring one request alone.
    alone = await stub.CheckDialogue(requests[0], timeout=60)
    assert [round(t.score, 5) for t in alone.turns] == [round(t.score, 5) for t in verdicts[0].turns]


async def test_metrics_endpoint_reports_rpcs_batches_and_verdicts(
    stub: pb_grpc.SleuthStub, server: RunningServer, speech: Speech
) -> None:
    req = pb.CheckDialogueRequest(dialogue_id="m")
    for k in range(3):
        req.turns.add(turn_id=f"t{k}", speaker="A", audio=fresh_pcm(speech, VOICE_A, k, 7))
    req.turns.add(turn_id="odd", speaker="A", audio=fresh_pcm(speech, VOICE_F, 0, 7))
    flagged = await stub.CheckDialogue(req, timeout=60)
    assert [t.turn_id for t in flagged.turns if t.status == pb.INCONSISTENT] == ["odd"]
    # The fused encoder runs two micro-batchers (GE2E's and CAM++'s): each has its own series.
    fused = pb.CheckDialogueRequest(dialogue_id="f", options=pb.CheckOptions(encoder="fused"))
    for k in range(2):
        fused.turns.add(turn_id=f"t{k}", speaker="A", audio=fresh_pcm(speech, VOICE_A, k, 8))
    await stub.CheckDialogue(fused, timeout=60)
    # Ann's fifth turn is spoken by Fay's voice: speaker confusion (auto, two speakers).
    confused = pb.CheckDialogueRequest(dialogue_id="c")
    for k, (speaker, voice, clip) in enumerate(
        [("Ann", VOICE_A, 0), ("Fay", VOICE_F, 0), ("Ann", VOICE_A, 1), ("Fay", VOICE_F, 1),
         ("Ann", VOICE_F, 2), ("Fay", VOICE_F, 3), ("Ann", VOICE_A, 3), ("Fay", VOICE_F, 4)]
    ):  # fmt: skip
        confused.turns.add(turn_id=f"t{k}", speaker=speaker, audio=fresh_pcm(speech, voice, clip, 9))
    swapped = (await stub.CheckDialogue(confused, timeout=60)).turns[4]
    assert swapped.reason == pb.SPEAKER_CONFUSION
    try:
        await stub.CheckDialogue(pb.CheckDialogueRequest(), timeout=10)
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert server.metrics_port
    body = await asyncio.to_thread(
        lambda: urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
    )

    def value(pattern: str) -> float:
        m = re.search(rf"^{pattern} ([0-9.e+-]+)$", body, re.MULTILINE)
        assert m, f"{pattern} missing from /metrics"
        return float(m.group(1))

    assert value(r'sleuthd_rpc_total\{code="OK",method="CheckDialogue"\}') >= 2
    assert value(r'sleuthd_rpc_total\{code="INVALID_ARGUMENT",method="CheckDialogue"\}') >= 1
    assert value(r'sleuthd_rpc_latency_seconds_count\{code="OK",method="CheckDialogue"\}') >= 1
    for encoder in ("ge2e", "campplus"):
        assert value(rf'sleuthd_batch_execution_seconds_count\{{encoder="{encoder}"\}}') >= 1
        assert value(rf'sleuthd_batch_windows_sum\{{encoder="{encoder}"\}}') >= 2
        assert value(rf'sleuthd_batch_queue_wait_seconds_count\{{encoder="{encoder}"\}}') >= 1
        assert value(rf'sleuthd_batch_queue_windows\{{encoder="{encoder}"\}}') == 0
    assert 'encoder="fused"' not in body  # the fusion is no batcher of its own: its two encoders are
    assert value(r'sleuthd_audio_seconds_total\{cached="false"\}') > 3.0
    assert value(r'sleuthd_verdicts_total\{reason="none",status="consistent"\}') >= 3
    assert value(r'sleuthd_verdicts_total\{reason="score_threshold",status="inconsistent"\}') >= 1
    assert value(r'sleuthd_verdicts_total\{reason="speaker_confusion",status="inconsistent"\}') >= 1
    assert value(r"sleuthd_streams_active") == 0
    # The process itself (prometheus_client's ProcessCollector on the server's registry).
    assert value(r"process_resident_memory_bytes") > 50e6  # bytes; the models alone take more
    assert value(r"process_cpu_seconds_total") > 0
    assert 0 < value(r"process_open_fds") <= value(r"process_max_fds")


async def test_deadline_exceeded_is_reported(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    req = pb.CheckDialogueRequest(dialogue_id="late")
    for k in range(5):
        req.turns.add(turn_id=f"t{k}", speaker="A", audio=fresh_pcm(speech, VOICE_F, k, 31))
    try:
        await stub.CheckDialogue(req, timeout=0.001)
        raise AssertionError("a 1 ms deadline cannot be met")
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # The server is fine afterwards.
    v = await stub.CheckDialogue(req, timeout=60)
    assert len(v.turns) == 5 and np.all([t.HasField("score") for t in v.turns])


async def test_batching_off_makes_one_model_call_per_clip(models_dir: Path, speech: Speech) -> None:
    """`--batching off` (the throughput benchmark's per-clip baseline): each clip's windows in one call."""
    engine = Engine.load(EngineConfig(models_dir=models_dir, device="cpu", batching="off", embedding_cache_entries=0))
    try:
        encoder = engine.encoders["ge2e"]
        assert isinstance(encoder, PerClipEncoder)
        calls: list[int] = []
        real = encoder.encoder.embed

        def counting(windows: np.ndarray) -> np.ndarray:
            calls.append(len(windows))
            return real(windows)

        encoder.encoder.embed = counting  # type: ignore[method-assign]
        audios = [(AudioInput(speech.wav_bytes(VOICE_A, k)), f"c{k}") for k in range(2)]
        clips = await engine.embedder.embed_audio(encoder, audios)
        windows = [len(c.window_embeddings) for c in clips if c.window_embeddings is not None]
        assert len(windows) == 2 and min(windows) >= 3
        assert sorted(calls) == sorted(windows)
    finally:
        await engine.aclose()
