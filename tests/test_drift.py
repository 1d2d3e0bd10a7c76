"""Drift inside a turn: detect_drift on constructed window sequences, then on real spliced speech.

The spliced utterances follow the speaker-drift paper's layout (three segments joined with 500 ms
of silence) and are built by the dev-set builder itself, from espeak-ng speech cached under
data/test-speech/drift/. The detector runs with the card's drift block when the card has one, else
with the block fitted by `sleuthd-bench drift --size large` (PROPOSED_BLOCK).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from sleuthd.api import SpeakerEncoder
from sleuthd.encoders.manifest import read_card
from sleuthd.engine.facade import Engine
from sleuthd.judgment.drift import DriftConfig, DriftResult, detect_drift
from sleuthd_bench import driftset, synth

from .support import REPO, VOICE_A, VOICE_B

# Fitted on the large dev set's fit split (espeak voices); see `sleuthd-bench drift`.
PROPOSED_BLOCK: dict[str, Any] = {
    "window_rate_per_second": 2.5,
    "threshold": 0.1119,
    "min_side_windows": 6,
    "transition_level": 0.15,
    "max_changes": 4,
}
DRIFT_CACHE = REPO / "data" / "test-speech" / "drift"
WINDOW_SECONDS = 1.6
DIM = 256


@pytest.fixture(scope="module")
def config() -> DriftConfig:
    card = read_card("ge2e")
    return DriftConfig.from_manifest(card.get("drift", PROPOSED_BLOCK))


# ---------------------------------------------------------------------------------------------- constructed


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _voices(rng: np.random.Generator, cosine: float = 0.6) -> tuple[np.ndarray, np.ndarray]:
    """Two unit 'voice' directions with the given cosine (a same-gender pair is about 0.6-0.8 under GE2E)."""
    a = _unit(rng.standard_normal(DIM))
    other = rng.standard_normal(DIM)
    other = _unit(other - np.dot(other, a) * a)  # orthogonal to a
    return a, cosine * a + np.sqrt(1 - cosine**2) * other


def _windows(seconds: float, rate: float, start: float = 0.0) -> np.ndarray:
    starts = start + np.arange(0.0, seconds - WINDOW_SECONDS + 1e-9, 1.0 / rate)
    return np.stack([starts, starts + WINDOW_SECONDS], axis=1)


def _embed(
    times: np.ndarray,
    share_of_b: Callable[[np.ndarray], np.ndarray],
    a: np.ndarray,
    b: np.ndarray,
    rng: np.random.Generator,
    noise: float = 0.03,
) -> np.ndarray:
    """Window embeddings mixing voices a and b by the window's average share of b, plus noise.

    ``noise`` 0.03 per dimension puts a window at cosine ~0.9 to its voice, like GE2E windows of one voice.
    """
    grid = np.linspace(0.0, 1.0, 33)
    out = []
    for start, end in times:
        w = float(np.mean(share_of_b(start + grid * (end - start))))
        out.append((1 - w) * a + w * b + noise * rng.standard_normal(DIM))
    return _unit(np.asarray(out))


def _step(at: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda t: (t >= at).astype(np.float64)


def _ramp(start: float, end: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda t: np.clip((t - start) / (end - start), 0.0, 1.0)


def test_abrupt_change_is_found_within_one_window_hop(config: DriftConfig) -> None:
    rng = np.random.default_rng(1)
    a, b = _voices(rng)
    hop = 1.0 / config.window_rate_per_second + 1e-6
    for change in (5.3, 8.0, 11.1):
        times = _windows(16.0, config.window_rate_per_second)
        result = detect_drift(_embed(times, _step(change), a, b, rng), times, config)
        assert len(result.segments) == 1, result
        (segment,) = result.segments
        assert abs(segment.change_seconds - change) <= hop, (change, segment)
        assert segment.start_seconds <= change <= segment.end_seconds
        assert result.score == pytest.approx(segment.score)
        assert result.score > config.threshold


def test_one_voice_gives_no_segment(config: DriftConfig) -> None:
    rng = np.random.default_rng(2)
    a, b = _voices(rng)
    times = _windows(16.0, config.window_rate_per_second)
    result = detect_drift(_embed(times, lambda t: np.zeros_like(t), a, b, rng), times, config)
    assert result.segments == ()
    assert 0.0 < result.score < config.threshold


def test_identical_windows_score_zero(config: DriftConfig) -> None:
    times = _windows(12.0, config.window_rate_per_second)
    same = np.tile(_unit(np.arange(1.0, DIM + 1)), (len(times), 1))
    result = detect_drift(same, times, config)
    assert result == DriftResult(score=pytest.approx(0.0, abs=1e-9), segments=())


def test_smooth_interpolation_gives_one_segment_over_the_transition(config: DriftConfig) -> None:
    rng = np.random.default_rng(3)
    a, b = _voices(rng)
    times = _windows(18.0, config.window_rate_per_second)
    fade = (7.0, 11.0)
    smooth = detect_drift(_embed(times, _ramp(*fade), a, b, rng), times, config)
    abrupt = detect_drift(_embed(times, _step(9.0), a, b, rng), times, config)
    assert len(smooth.segments) == 1, smooth
    (segment,) = smooth.segments
    assert fade[0] < segment.change_seconds < fade[1]
    # It spans most of the fade and is clearly wider than the segment of an abrupt change.
    covered = min(segment.end_seconds, fade[1]) - max(segment.start_seconds, fade[0])
    assert covered >= 0.6 * (fade[1] - fade[0]), segment
    (sharp,) = abrupt.segments
    assert segment.end_seconds - segment.start_seconds > 1.5 * (sharp.end_seconds - sharp.start_seconds)


def test_two_changes_give_two_segments(config: DriftConfig) -> None:
    rng = np.random.default_rng(4)
    a, b = _voices(rng)
    times = _windows(24.0, config.window_rate_per_second)
    result = detect_drift(_embed(times, lambda t: ((t >= 7.0) & (t < 15.0)).astype(float), a, b, rng), times, config)
    assert len(result.segments) == 2, result
    hop = 1.0 / config.window_rate_per_second + 1e-6
    assert all(abs(s.change_seconds - c) <= hop for s, c in zip(result.segments, (7.0, 15.0), strict=True))


def test_segment_times_follow_the_window_clock(config: DriftConfig) -> None:
    rng = np.random.default_rng(5)
    a, b = _voices(rng)
    times = _windows(16.0, config.window_rate_per_second)
    emb = _embed(times, _step(8.0), a, b, rng)
    here = detect_drift(emb, times, config).segments[0]
    later = detect_drift(emb, times + 3.0, config).segments[0]
    assert later.start_seconds == pytest.approx(here.start_seconds + 3.0)
    assert later.end_seconds == pytest.approx(here.end_seconds + 3.0)


def test_too_few_windows_is_not_judged(config: DriftConfig) -> None:
    rng = np.random.default_rng(6)
    a, b = _voices(rng, cosine=0.0)
    n = config.min_windows - 1
    times = _windows(WINDOW_SECONDS + (n - 1) / config.window_rate_per_second, config.window_rate_per_second)
    assert len(times) == n
    result = detect_drift(_embed(times, _step(float(times[n // 2, 0])), a, b, rng), times, config)
    assert result == DriftResult(score=0.0, segments=())


def test_bad_shapes_are_refused(config: DriftConfig) -> None:
    with pytest.raises(ValueError, match="expected"):
        detect_drift(np.zeros((5, DIM)), np.zeros((4, 2)), config)
    with pytest.raises(ValueError, match="finite"):
        detect_drift(np.full((12, DIM), np.nan), _windows(6.0, 2.5)[:12], config)


def test_config_from_manifest_block() -> None:
    cfg = DriftConfig.from_manifest({**PROPOSED_BLOCK, "scale": "cosine_distance", "how": "fitted"})
    assert cfg.window_rate_per_second == 2.5 and cfg.min_side_windows == 6 and cfg.threshold == 0.1119
    assert DriftConfig.from_manifest({}) == DriftConfig()
    with pytest.raises(ValueError, match="unknown"):
        DriftConfig.from_manifest({"treshold": 0.2})
    with pytest.raises(ValueError, match="whole number"):
        DriftConfig.from_manifest({"min_side_windows": 2.5})
    with pytest.raises(ValueError, match="cosine distance"):
        DriftConfig.from_manifest({"threshold": 3.0})


# ---------------------------------------------------------------------------------------------- real speech


def _plan(subtype: str, boundary: int, voice_b: str | None) -> driftset.UtterancePlan:
    texts = synth.sentences(8, seed=23)
    return driftset.UtterancePlan(
        uid=f"test-{subtype}-{boundary}",
        split="fit",
        subtype=subtype,
        voice_a=VOICE_A,
        voice_b=voice_b,
        texts=(texts[0], texts[1], texts[2]),
        texts_b=tuple(texts[3:6]) if voice_b else None,
        boundary=boundary,
        noise_seed=7,
        spare_texts=tuple(texts[6:8]),
    )


async def _drift_of(
    plan: driftset.UtterancePlan, encoder: SpeakerEncoder, config: DriftConfig, tmp_path: Path
) -> tuple[driftset.DriftLabel, DriftResult]:
    label = driftset.render_utterance(plan, tmp_path, driftset.SegmentCache(DRIFT_CACHE))
    samples = driftset.read_wav(tmp_path / label.path)
    clip = await encoder.embed_waveform(samples, encoder.windows_at(config.window_rate_per_second))
    assert clip.window_embeddings is not None and clip.window_times is not None, clip.detail
    return label, detect_drift(clip.window_embeddings, clip.window_times, config)


@pytest.mark.parametrize("boundary", [1, 2])
async def test_spliced_voice_change_lands_within_one_hop(
    boundary: int, speaker_encoder: SpeakerEncoder, config: DriftConfig, tmp_path: Path
) -> None:
    label, result = await _drift_of(_plan("abrupt", boundary, VOICE_B), speaker_encoder, config, tmp_path)
    assert label.segment_voices == tuple(VOICE_A if i < boundary else VOICE_B for i in range(3))
    assert len(result.segments) == 1, result
    (segment,) = result.segments
    # The voice changes somewhere in the 500 ms of silence before the new voice's segment.
    assert label.change_interval is not None
    gap_start, gap_end = label.change_interval
    assert gap_end == pytest.approx(label.change_seconds[0])
    hop = 1.0 / config.window_rate_per_second + 1e-6
    assert gap_start - hop <= segment.change_seconds <= gap_end + hop, (segment, label.change_interval)


@pytest.mark.parametrize("subtype", ["non_drift", "hard_negative_noise"])
async def test_one_voice_speech_has_no_segment(
    subtype: str, speaker_encoder: SpeakerEncoder, config: DriftConfig, tmp_path: Path
) -> None:
    label, result = await _drift_of(_plan(subtype, 1, None), speaker_encoder, config, tmp_path)
    assert set(label.segment_voices) == {VOICE_A}
    assert result.segments == (), result
    assert result.score < config.threshold


class _CountingVad:
    """The engine's VAD, counting its passes: each pass means the clip was decoded and trimmed again."""

    def __init__(self, vad: Any) -> None:
        self.vad, self.passes = vad, 0
        self.name = vad.name

    def speech_mask(self, samples: np.ndarray) -> Any:
        self.passes += 1
        return self.vad.speech_mask(samples)


async def test_drift_reuses_the_judging_decode_and_both_placements_are_cached(
    models_dir: Path, speech: Any, config: DriftConfig
) -> None:
    from sleuthd.config import EngineConfig
    from sleuthd.domain import AudioInput, CheckOptions, DialogueRequest, DialogueTurn
    from sleuthd.judgment.scoring import Method

    own = Engine.load(EngineConfig(models_dir=models_dir, device="cpu", default_encoder="ge2e"))  # own, empty cache
    counting = _CountingVad(own.embedder.vad)
    own.embedder.vad = counting  # type: ignore[assignment]
    try:
        turns = tuple(DialogueTurn(f"t{k}", "A", audio=AudioInput(speech.wav_bytes(VOICE_A, k))) for k in range(3))

        def request(drift: bool) -> DialogueRequest:
            return DialogueRequest("d", turns, options=CheckOptions(method=Method.AUTO, detect_drift=drift))

        with_drift = await own.check_dialogue(request(True))
        assert counting.passes == 3  # one decode and VAD pass per turn serves both window placements
        again = await own.check_dialogue(request(True))
        assert counting.passes == 3  # both placements came from the cache
        plain = await own.check_dialogue(request(False))
        assert counting.passes == 3
        # Asking for drift changes nothing else in the verdict.
        for a, b, c in zip(with_drift.turns, again.turns, plain.turns, strict=True):
            assert a.status == b.status == c.status and a.score == b.score == c.score
            assert a.drift == b.drift and c.drift is None
    finally:
        await own.aclose()


# ---------------------------------------------------------------------------------------------- through the API


async def test_check_dialogue_reports_drift_segments(
    stub: Any, speech: Any, config: DriftConfig, tmp_path: Path
) -> None:
    """detect_drift through the real server: a spliced turn gets a segment at the change, a one-voice
    turn gets a score and no segment, a short turn is reported as too short rather than drift-free."""
    from sleuthd.v1 import sleuthd_pb2 as pb

    from .support import enc

    spliced = driftset.render_utterance(_plan("abrupt", 1, VOICE_B), tmp_path, driftset.SegmentCache(DRIFT_CACHE))
    steady = driftset.render_utterance(_plan("non_drift", 1, None), tmp_path, driftset.SegmentCache(DRIFT_CACHE))
    req = pb.CheckDialogueRequest(
        dialogue_id="drift", options=pb.CheckOptions(method=pb.METHOD_AUTO, detect_drift=True)
    )
    req.turns.add(turn_id="spliced", speaker="A", audio=enc((tmp_path / spliced.path).read_bytes()))
    req.turns.add(turn_id="steady", speaker="A", audio=enc((tmp_path / steady.path).read_bytes()))
    req.turns.add(turn_id="short", speaker="A", audio=enc(speech.wav_bytes(VOICE_A, 0)))
    v = await stub.CheckDialogue(req, timeout=120)
    by_id = {t.turn_id: t for t in v.turns}
    (segment,) = by_id["spliced"].drift_segments
    assert spliced.change_interval is not None
    hop = 1.0 / config.window_rate_per_second + 1e-6
    middle = (segment.start_seconds + segment.end_seconds) / 2
    assert spliced.change_interval[0] - hop <= middle <= spliced.change_interval[1] + hop
    assert segment.score > config.threshold and by_id["spliced"].drift_score == pytest.approx(segment.score)
    assert not by_id["steady"].drift_segments and by_id["steady"].drift_score < config.threshold
    assert not by_id["short"].HasField("drift_score") and "too little speech to search" in by_id["short"].detail

    # The same turns streamed (StreamDialogue embeds each turn as it completes) give the same drift.
    call = stub.StreamDialogue(timeout=120)
    await call.write(
        pb.StreamDialogueRequest(
            open=pb.StreamOpen(
                dialogue_id="drift-live", options=pb.CheckOptions(method=pb.METHOD_AUTO, detect_drift=True)
            )
        )
    )
    for index, turn in enumerate(req.turns):
        await call.write(
            pb.StreamDialogueRequest(turn_start=pb.TurnStart(turn_id=turn.turn_id, speaker="A", index=index))
        )
        await call.write(
            pb.StreamDialogueRequest(audio=pb.TurnAudio(turn_id=turn.turn_id, data=turn.audio.encoded, final=True))
        )
    await call.done_writing()
    final = None
    async for msg in call:
        if msg.HasField("final"):
            final = msg.final
    assert final is not None and (await call.code()) == grpc.StatusCode.OK
    streamed = {t.turn_id: t for t in final.turns}
    for turn_id, unary in by_id.items():
        assert streamed[turn_id].HasField("drift_score") == unary.HasField("drift_score"), turn_id
        assert streamed[turn_id].drift_score == pytest.approx(unary.drift_score, abs=1e-6), turn_id
        assert list(streamed[turn_id].drift_segments) == list(unary.drift_segments), turn_id
    assert "too little speech to search" in streamed["short"].detail
