"""The auto method: speaker-confusion attribution, calibration files, and refusing to run uncalibrated."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import pytest_asyncio
from sleuthd.config import EngineConfig, ServerConfig
from sleuthd.encoders.manifest import load_encoder_manifest
from sleuthd.engine.facade import Engine
from sleuthd.judgment.calibration import (
    FEATURES,
    Calibration,
    CalibrationError,
    LogisticModel,
    inconsistency_probability,
    turn_features,
)
from sleuthd.ops.metrics import ServiceMetrics
from sleuthd.rpc.server import RunningServer, create_server
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

from .support import VOICE_A, VOICE_B, VOICE_C, VOICE_F, Speech, enc


def dialogue(
    speech: Speech, script: list[tuple[str, str, int]], method: int = pb.METHOD_AUTO
) -> pb.CheckDialogueRequest:
    """script: (speaker label, voice that actually speaks, clip index) per turn."""
    req = pb.CheckDialogueRequest(dialogue_id="attr", options=pb.CheckOptions(method=method))  # type: ignore[arg-type]
    for k, (speaker, voice, clip) in enumerate(script):
        req.turns.add(turn_id=f"t{k}", speaker=speaker, audio=enc(speech.wav_bytes(voice, clip)))
    return req


async def test_two_speakers_swapped_turn_is_speaker_confusion(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    script = [("Ann", VOICE_A, 0), ("Fay", VOICE_F, 0), ("Ann", VOICE_A, 1), ("Fay", VOICE_F, 1),
              ("Ann", VOICE_F, 2), ("Fay", VOICE_F, 3), ("Ann", VOICE_A, 3), ("Fay", VOICE_F, 4)]  # fmt: skip
    v = await stub.CheckDialogue(dialogue(speech, script), timeout=60)
    swapped = v.turns[4]
    assert swapped.status == pb.INCONSISTENT and swapped.reason == pb.SPEAKER_CONFUSION
    assert swapped.closest_speaker == "Fay" and swapped.closest_speaker_margin < 0
    assert "closer to speaker 'Fay'" in swapped.detail
    for t in v.turns:
        if t.turn_id != "t4":
            assert t.status == pb.CONSISTENT, t.detail
            assert t.closest_speaker == t.speaker and t.closest_speaker_margin > 0
    assert [list(s.inconsistent_turn_ids) for s in v.speakers] == [["t4"], []]


async def test_three_speakers_names_the_right_one(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    script = [("Ann", VOICE_A, 0), ("Fay", VOICE_F, 0), ("Cat", VOICE_C, 0),
              ("Ann", VOICE_A, 1), ("Fay", VOICE_F, 1), ("Cat", VOICE_C, 1),
              ("Ann", VOICE_C, 2), ("Fay", VOICE_F, 2), ("Cat", VOICE_C, 3), ("Ann", VOICE_A, 3)]  # fmt: skip
    v = await stub.CheckDialogue(dialogue(speech, script), timeout=60)
    swapped = next(t for t in v.turns if t.turn_id == "t6")
    assert swapped.reason == pb.SPEAKER_CONFUSION and swapped.closest_speaker == "Cat"
    assert [t.turn_id for t in v.turns if t.status == pb.INCONSISTENT] == ["t6"]


async def test_other_speakers_are_the_cohort_of_auto(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    # Ann's third turn is spoken by a similar man who is not in the dialogue (no confusion to find).
    ann = [("Ann", VOICE_A, 0), ("Ann", VOICE_A, 1), ("Ann", VOICE_B, 2), ("Ann", VOICE_A, 3), ("Ann", VOICE_A, 4)]
    fay = [("Fay", VOICE_F, 0), ("Fay", VOICE_F, 1)]
    interleaved = [ann[0], fay[0], ann[1], fay[1], ann[2], ann[3], ann[4]]
    with_cohort = await stub.CheckDialogue(dialogue(speech, interleaved), timeout=60)
    alone = await stub.CheckDialogue(dialogue(speech, ann), timeout=60)
    by_id = {t.turn_id: t for t in with_cohort.turns}
    ann_ids = [t.turn_id for t in with_cohort.turns if t.speaker == "Ann"]
    assert [by_id[i].status for i in ann_ids] == [pb.CONSISTENT, pb.CONSISTENT, pb.INCONSISTENT] + [pb.CONSISTENT] * 2
    stranger = by_id[ann_ids[2]]
    assert stranger.reason == pb.SCORE_THRESHOLD and stranger.closest_speaker == "Ann"  # not a confusion
    assert all("(context_cohort model)" in by_id[i].detail for i in ann_ids)
    assert all("(context model)" in t.detail for t in alone.turns)
    # The same turns, judged with and without the other voice, get different probabilities.
    assert [by_id[i].inconsistency_probability for i in ann_ids] != [t.inconsistency_probability for t in alone.turns]
    fay_turns = [t for t in with_cohort.turns if t.speaker == "Fay"]
    assert all(t.status == pb.CONSISTENT and "(pair_cohort model)" in t.detail for t in fay_turns)


DIM = 256


def _unit(x: np.ndarray) -> np.ndarray:
    return np.asarray(x / np.linalg.norm(x, axis=-1, keepdims=True))


class ConstructedVoices:
    """Two voices as unit centres at cosine 0.6 (``a``, ``b``) and noisy turns around a centre."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.a = _unit(self.rng.normal(size=DIM))
        r = _unit(self.rng.normal(size=DIM))
        self.b = 0.6 * self.a + 0.8 * _unit(r - (r @ self.a) * self.a)

    def voice(self, centre: np.ndarray, k: int) -> np.ndarray:
        return _unit(centre + self.rng.normal(0, 0.25 / np.sqrt(DIM), (k, DIM)))


def test_cohort_features_measure_a_turn_against_the_distance_to_other_voices() -> None:
    v = ConstructedVoices()
    voice, a, b = v.voice, v.a, v.b
    turns = voice(a, 5)
    turns[2] = voice(b, 1)[0]
    reference = voice(a, 1)[0]
    seconds = np.full(5, 3.0)
    plain_variant, plain = turn_features(turns, reference, seconds)
    variant, x = turn_features(turns, reference, seconds, _unit(voice(b, 3).mean(axis=0))[None, :])
    assert (plain_variant, variant) == ("context_reference", "context_reference_cohort")
    assert np.array_equal(x[:, : plain.shape[1]], plain)
    gap = x[:, FEATURES[variant].index("cohort_gap")]
    position = x[:, FEATURES[variant].index("cohort_position")]
    genuine = [0, 1, 3, 4]
    assert gap[2] > 0.8 and max(gap[genuine]) < 0.3  # fallen about the whole way to the other voice
    assert position[2] == -1.0 and min(position[genuine]) > 0.5  # clipped: it IS the other voice
    # An empty cohort is no cohort.
    assert turn_features(turns, reference, seconds, np.zeros((0, DIM)))[0] == "context_reference"


def test_spread_reference_and_farthest_features_on_constructed_voices() -> None:
    """reference_z, context_robust_z and farthest_gap on six turns of one voice, then with turn 2
    replaced by a voice at cosine 0.6."""
    v = ConstructedVoices()
    voice, a, b = v.voice, v.a, v.b
    clean = voice(a, 6)
    replaced = clean.copy()
    replaced[2] = voice(b, 1)[0]
    reference = voice(a, 1)[0]
    seconds = np.full(6, 3.0)

    def features(turns: np.ndarray) -> dict[str, np.ndarray]:
        variant, x = turn_features(turns, reference, seconds)
        assert variant == "context_reference"
        return {name: x[:, k] for k, name in enumerate(FEATURES[variant])}

    one_voice, other = features(clean), features(replaced)
    assert np.abs(one_voice["reference_z"]).max() < 1.0 and np.abs(one_voice["context_robust_z"]).max() < 1.0
    assert one_voice["farthest_gap"].max() < 0.5
    genuine = [0, 1, 3, 4, 5]
    # The replaced turn is far below the others' typical similarity to the reference, in units of its
    # spread; a genuine turn's yardstick contains the replaced turn's low similarity, so it stays small.
    assert other["reference_z"][2] > 10.0 and np.abs(other["reference_z"][genuine]).max() < 1.0
    assert other["context_robust_z"][2] > 5 * other["context_robust_z"][genuine].max()
    # The least similar other evidence of every genuine turn is the replaced one: a dialogue-wide sign.
    assert other["farthest_gap"][genuine].min() > 3.0
    assert np.all(other["farthest_gap"] >= other["nearest_gap"])


async def test_paper_methods_report_but_do_not_flag_confusion(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    script = [("Ann", VOICE_A, 0), ("Fay", VOICE_F, 0), ("Ann", VOICE_A, 1), ("Fay", VOICE_F, 1), ("Ann", VOICE_F, 2)]
    v = await stub.CheckDialogue(dialogue(speech, script, pb.METHOD_PAIRWISE), timeout=60)
    swapped = v.turns[4]
    assert swapped.closest_speaker == "Fay"  # attribution is reported whatever the method...
    assert swapped.reason != pb.SPEAKER_CONFUSION  # ...but only auto flags it as confusion


async def test_auto_with_paper_thresholds_is_refused(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    req = dialogue(speech, [("Ann", VOICE_A, 0), ("Ann", VOICE_A, 1)])
    req.options.threshold_set = pb.THRESHOLD_SET_PAPER
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.CheckDialogue(req, timeout=60)
    assert (
        err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "no threshold for method auto" in err.value.details()
    )


async def test_auto_ranking_puts_true_speaker_first(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    req = pb.RankCandidatesRequest(speaker="A", options=pb.CheckOptions(method=pb.METHOD_AUTO))
    for k in range(3):
        req.context.append(enc(speech.wav_bytes(VOICE_A, k)))
    req.reference.CopyFrom(enc(speech.wav_bytes(VOICE_A, 5)))
    for cid, voice, k in (("similar", VOICE_B, 3), ("true", VOICE_A, 4), ("other-gender", VOICE_F, 3)):
        req.candidates.add(candidate_id=cid, audio=enc(speech.wav_bytes(voice, k)))
    r = await stub.RankCandidates(req, timeout=60)
    assert r.candidates[0].candidate_id == "true"
    assert all(c.score_scale == "cosine_similarity" and c.higher_is_better for c in r.candidates)
    fit = {c.candidate_id: c.fit_probability for c in r.candidates}
    assert fit["true"] > 0.5 > max(fit["similar"], fit["other-gender"])


# ------------------------------------------------------------------------------------------ calibration files


def test_calibration_round_trips_and_is_versioned_with_the_encoder(models_dir: Path) -> None:
    manifest = load_encoder_manifest(models_dir / "ge2e")
    cal = Calibration.from_manifest(manifest.raw, "ge2e")
    assert cal.raw["encoder_weights_sha256"] == manifest.raw["source"]["file_sha256"]
    assert cal.decision_threshold == 0.5 and "espeak" in cal.raw["how"]
    # JSON round trip gives the same model, and the same probabilities.
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(5, 256))
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    seconds = np.array([3.0, 4.0, 2.5, 5.0, 3.5])
    again = json.loads(json.dumps(manifest.raw))
    cal2 = Calibration.from_manifest(again, "ge2e")
    for model in cal.models.values():
        restored = LogisticModel.from_json(model.to_json())
        assert restored.features == model.features and np.array_equal(restored.weights, model.weights)
    assert np.array_equal(
        inconsistency_probability(cal, emb, emb[0], seconds)[1],
        inconsistency_probability(cal2, emb, emb[0], seconds)[1],
    )
    # A calibration fitted for other weights is refused, not used.
    again["source"]["file_sha256"] = "0" * 64
    with pytest.raises(CalibrationError, match="fitted for weights"):
        Calibration.from_manifest(again, "ge2e")
    # The shipped models were fitted on cosines as measured; one fitted with the (removed) turn-length
    # correction would give wrong probabilities on them, so it is refused.
    corrected = json.loads(json.dumps(manifest.raw))
    corrected["calibration"]["length_correction"] = "attenuation-v1"
    with pytest.raises(CalibrationError, match="'attenuation-v1', which sleuthd no longer serves"):
        Calibration.from_manifest(corrected, "ge2e")
    # A calibration from before the cohort models existed is refused, naming what it lacks.
    older = json.loads(json.dumps(manifest.raw))
    del older["calibration"]["models"]["context_cohort"]
    with pytest.raises(CalibrationError, match="lacks models for: context_cohort"):
        Calibration.from_manifest(older, "ge2e")
    del again["calibration"]
    with pytest.raises(CalibrationError, match="no calibration"):
        Calibration.from_manifest(again, "ge2e")


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def two_encoder_server(
    models_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[RunningServer]:
    """A server with ge2e and a second encoder, 'plain', whose manifest has no calibration."""
    root = tmp_path_factory.mktemp("models")
    for name in ("ge2e", "silero_vad"):
        shutil.copytree(models_dir / name, root / name)
    plain = root / "plain"
    plain.mkdir()
    shutil.copy(models_dir / "ge2e" / "ge2e.onnx", plain / "ge2e.onnx")
    m = json.loads((models_dir / "ge2e" / "manifest.json").read_text())
    m["name"] = "plain"
    del m["calibration"]
    m["default_method"] = "pairwise"
    (plain / "manifest.json").write_text(json.dumps(m))
    engine = Engine.load(EngineConfig(models_dir=root, device="cpu"))
    running = await create_server(engine, ServerConfig(port=0, metrics_port=-1), ServiceMetrics())
    yield running
    await running.stop(grace=1.0)
    await engine.aclose()


async def test_auto_on_an_uncalibrated_encoder_fails_clearly(two_encoder_server: RunningServer, speech: Speech) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{two_encoder_server.port}") as ch:
        stub = pb_grpc.SleuthStub(ch)
        req = dialogue(speech, [("Ann", VOICE_A, 0), ("Ann", VOICE_A, 1), ("Ann", VOICE_F, 2)])
        req.options.encoder = "plain"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.CheckDialogue(req, timeout=60)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "encoder 'plain' has no calibration" in err.value.details()
        # The same encoder still serves the paper methods, and ge2e still serves auto.
        req.options.method = pb.METHOD_PAIRWISE
        v = await stub.CheckDialogue(req, timeout=60)
        assert v.encoder == "plain" and v.method == pb.METHOD_PAIRWISE
        assert not any(t.HasField("inconsistency_probability") for t in v.turns)
        req.options.encoder, req.options.method = "ge2e", pb.METHOD_AUTO
        v = await stub.CheckDialogue(req, timeout=60)
        assert list(v.speakers[0].inconsistent_turn_ids) == ["t2"]
