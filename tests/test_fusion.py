"""The fused encoder (sleuthd.encoders.fusion): GE2E and CAM++ heard as one, through the real server."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
from sleuthd.audio.decode import Waveform
from sleuthd.client.results import TurnVerdict
from sleuthd.config import EngineConfig
from sleuthd.domain import AudioInput, CheckOptions
from sleuthd.encoders import clips
from sleuthd.encoders.clips import ClipEmbedding
from sleuthd.encoders.embedder import ClipEmbedder, embed_prepared
from sleuthd.encoders.fusion import FusedEncoder, load_fusion
from sleuthd.engine.facade import Engine
from sleuthd.engine.loading import load_models
from sleuthd.errors import Unsupported
from sleuthd.judgment.calibration import CalibrationError
from sleuthd.judgment.dialogue import EncoderDialogue
from sleuthd.judgment.options import EncoderEntry, resolve
from sleuthd.judgment.scoring import Method
from sleuthd.ops.observe import NullObserver
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

from .support import VOICE_A, VOICE_B, VOICE_F, Speech, enc, encode_wav


def dialogue(speech: Speech, encoder: str, method: int, replace: str | None = None) -> pb.CheckDialogueRequest:
    """Five turns of A (clips 0-4), turn t2 replaced by ``replace``'s clip 0; A's clip 5 as reference."""
    options = pb.CheckOptions(encoder=encoder, method=method)  # type: ignore[arg-type]
    req = pb.CheckDialogueRequest(dialogue_id=f"fusion-{encoder}", options=options)
    for k in range(5):
        data = speech.wav_bytes(replace, 0) if (replace and k == 2) else speech.wav_bytes(VOICE_A, k)
        req.turns.add(turn_id=f"t{k}", speaker="A", audio=enc(data))
    req.references.add(speaker="A", audio=enc(speech.wav_bytes(VOICE_A, 5)))
    return req


async def test_server_info_lists_the_fusion(stub: pb_grpc.SleuthStub) -> None:
    info = await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
    by_name = {e.name: e for e in info.encoders}
    fused = by_name["fused"]
    assert list(fused.components) == ["ge2e", "campplus"]
    assert fused.embedding_size == by_name["ge2e"].embedding_size + by_name["campplus"].embedding_size == 448
    assert fused.min_speech_seconds == max(by_name["ge2e"].min_speech_seconds, by_name["campplus"].min_speech_seconds)
    assert fused.default_method == "auto"
    assert not by_name["ge2e"].components and not by_name["campplus"].components


async def test_fused_cosines_are_the_mean_of_the_two_encoders(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    """Each part of a fused embedding is a unit vector scaled by 1/sqrt(2): the fused cosine of two clips is
    exactly the mean of GE2E's and CAM++'s, so every cosine-linear score is the mean of the two encoders'."""
    verdicts = {
        name: await stub.CheckDialogue(dialogue(speech, name, pb.METHOD_PAIRWISE, VOICE_B), timeout=120)
        for name in ("ge2e", "campplus", "fused")
    }
    assert verdicts["fused"].encoder == "fused"
    for field in ("pairwise_mean_cosine", "reference_cosine"):
        got = np.array([getattr(t, field) for t in verdicts["fused"].turns])
        parts = [np.array([getattr(t, field) for t in verdicts[n].turns]) for n in ("ge2e", "campplus")]
        np.testing.assert_allclose(got, (parts[0] + parts[1]) / 2, atol=2e-4, err_msg=field)
        assert not np.allclose(parts[0], parts[1], atol=0.01)  # the encoders do disagree
    # Every fused verdict also carries each encoder's own scores: those of a request to that encoder alone.
    for k, turn in enumerate(verdicts["fused"].turns):
        assert [e.encoder for e in turn.encoder_scores] == ["ge2e", "campplus"]
        for e in turn.encoder_scores:
            alone = verdicts[e.encoder].turns[k]
            for field in ("pairwise_mean_cosine", "centroid_cosine_distance", "reference_cosine"):
                assert getattr(e, field) == pytest.approx(getattr(alone, field), abs=2e-5), (k, e.encoder, field)
    assert not verdicts["ge2e"].turns[0].encoder_scores  # a single encoder's verdict has none
    typed = TurnVerdict.from_pb(verdicts["fused"].turns[0])  # the client library's typed result
    assert [(e.encoder, e.reference_cosine) for e in typed.encoder_scores] == [
        (e.encoder, pytest.approx(e.reference_cosine)) for e in verdicts["fused"].turns[0].encoder_scores
    ]


async def test_fused_auto_leaves_s1_alone_and_finds_the_intruders(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    clean = await stub.CheckDialogue(dialogue(speech, "fused", pb.METHOD_AUTO), timeout=120)
    assert [t.status for t in clean.turns] == [pb.CONSISTENT] * 5, [t.detail for t in clean.turns]
    for other in (VOICE_F, VOICE_B):  # S2: other gender; S3: similar voice
        v = await stub.CheckDialogue(dialogue(speech, "fused", pb.METHOD_AUTO, other), timeout=120)
        assert list(v.speakers[0].inconsistent_turn_ids) == ["t2"], (other, [t.score for t in v.turns])
        assert v.turns[2].score_scale == "probability" and v.turns[2].score > 0.5 > max(t.score for t in clean.turns)


async def test_fused_ranking_puts_the_true_speaker_first(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    req = pb.RankCandidatesRequest(speaker="A", options=pb.CheckOptions(encoder="fused", method=pb.METHOD_AUTO))
    for k in range(4):
        req.context.append(enc(speech.wav_bytes(VOICE_A, k)))
    req.candidates.add(candidate_id="other-gender", audio=enc(speech.wav_bytes(VOICE_F, 1)))
    req.candidates.add(candidate_id="true", audio=enc(speech.wav_bytes(VOICE_A, 4)))
    req.candidates.add(candidate_id="similar", audio=enc(speech.wav_bytes(VOICE_B, 1)))
    r = await stub.RankCandidates(req, timeout=120)
    assert r.encoder == "fused"
    assert r.candidates[0].candidate_id == "true"
    assert r.candidates[-1].candidate_id == "other-gender"


async def test_fused_drift_uses_the_first_encoders_windows(stub: pb_grpc.SleuthStub, speech: Speech) -> None:
    """detect_drift under the fusion is GE2E's own drift finding (its dense windows and settings)."""
    parts = [sf.read(io.BytesIO(speech.wav_bytes(v, k)), dtype="float32") for v in (VOICE_A, VOICE_B) for k in range(3)]
    rate = parts[0][1]
    long_turn = encode_wav(np.concatenate([x for x, r in parts if r == rate]), rate)
    verdicts = {}
    for name in ("ge2e", "fused"):
        options = pb.CheckOptions(encoder=name, method=pb.METHOD_PAIRWISE, detect_drift=True)  # type: ignore[arg-type]
        req = pb.CheckDialogueRequest(dialogue_id="fused-drift", options=options)
        req.turns.add(turn_id="long", speaker="A", audio=enc(long_turn))
        req.turns.add(turn_id="short", speaker="A", audio=enc(speech.wav_bytes(VOICE_A, 4)))
        verdicts[name] = await stub.CheckDialogue(req, timeout=120)
    g, f = verdicts["ge2e"].turns[0], verdicts["fused"].turns[0]
    assert g.HasField("drift_score") and f.HasField("drift_score")
    assert (f.drift_score, list(f.drift_segments)) == (g.drift_score, list(g.drift_segments))


def test_a_calibration_is_refused_for_other_component_weights(models_dir: Path) -> None:
    """The fused calibration names the weights it was fitted for; CAM++ with other weights gets no auto."""
    models = load_models(EngineConfig(models_dir=models_dir, device="cpu"))
    try:
        fused = models.encoders["fused"]
        assert isinstance(fused, FusedEncoder)
        assert not isinstance(EncoderEntry.from_encoder(fused).calibration, CalibrationError)  # the shipped one
        campplus = models.encoders["campplus"].manifest
        raw = dict(campplus.raw, source=dict(campplus.raw["source"], file_sha256="0" * 64))
        other = SimpleNamespace(manifest=dataclasses.replace(campplus, raw=raw), provider="CPUExecutionProvider")
        refitted = load_fusion({"ge2e": models.encoders["ge2e"], "campplus": other})  # type: ignore[dict-item]
        assert refitted is not None
        entry = EncoderEntry.from_encoder(refitted)
        assert isinstance(entry.calibration, CalibrationError)
        assert "refit" in str(entry.calibration)
        with pytest.raises(Unsupported, match="fused"):
            resolve(CheckOptions(encoder="fused", method=Method.AUTO), {"fused": entry}, "fused")
    finally:
        models.prep_pool.shutdown()
        models.model_pool.shutdown()


def test_default_encoder_auto(models_dir: Path, tmp_path: Path) -> None:
    """--encoder auto: the fusion when GE2E and CAM++ are both loaded, GE2E alone otherwise."""
    both = load_models(EngineConfig(models_dir=models_dir, device="cpu", default_encoder="auto"))
    alone_dir = tmp_path / "models"
    alone_dir.mkdir()
    for name in ("ge2e", "silero_vad"):
        (alone_dir / name).symlink_to(models_dir / name)
    alone = load_models(EngineConfig(models_dir=alone_dir, device="cpu", default_encoder="auto"))
    try:
        assert both.default_encoder == "fused"
        assert (alone.default_encoder, sorted(alone.encoders)) == ("ge2e", ["ge2e"])
    finally:
        for m in (both, alone):
            m.prep_pool.shutdown()
            m.model_pool.shutdown()


def test_fused_streamed_verdicts_equal_check_dialogue(engine: Engine) -> None:
    """Each encoder's scores of a fused verdict are kept turn by turn (one pool per encoder); a stream's
    verdicts, per-encoder scores included, equal a one-shot judgment of the same turns, bit for bit."""
    opts = engine.resolve(CheckOptions(encoder="fused", method=Method.AUTO))
    assert [name for name, _, _ in opts.judgment.components] == ["ge2e", "campplus"]
    rng = np.random.default_rng(5)
    voices = [(rng.standard_normal(256), rng.standard_normal(192)) for _ in range(3)]

    def fused(voice: int) -> np.ndarray:
        parts = [v + rng.standard_normal(len(v)) * 0.8 for v in voices[voice]]
        return np.concatenate([p / np.linalg.norm(p) / np.sqrt(2) for p in parts]).astype(np.float32)

    turns = [(f"t{i}", f"s{i % 3}", fused(i % 3 if rng.random() > 0.1 else (i + 1) % 3)) for i in range(40)]
    streamed = EncoderDialogue("d", opts, {}, NullObserver())
    for position, (turn_id, speaker, e) in enumerate(turns):
        streamed.add_clip(turn_id, speaker, position, ClipEmbedding(3.0, 2.5, e, None, None))
        (first, *_) = streamed.updates(turn_id)
        assert [s.encoder for s in first.verdict.encoder_scores] == ["ge2e", "campplus"]
    once = EncoderDialogue("d", opts, {}, NullObserver())
    for position, (turn_id, speaker, e) in enumerate(turns):
        once.add_clip(turn_id, speaker, position, ClipEmbedding(3.0, 2.5, e, None, None))
    assert streamed.judge() == once.judge()
    got, _ = once.judge()
    assert all(len(t.encoder_scores) == 2 for t in got)


@pytest.mark.parametrize("cache_entries", [0, 64])
async def test_a_fused_clip_is_decoded_once_and_embeds_as_each_encoder_alone(
    models_dir: Path, speech: Speech, monkeypatch: pytest.MonkeyPatch, cache_entries: int
) -> None:
    """GE2E and CAM++ share one decode, loudness and VAD pass per clip (issue 30), and the fused embedding
    is bit for bit the join of what each encoder gives the clip through its own decode (the path before)."""
    decoded: list[int] = []
    real_decode = clips.decode

    def counting_decode(audio: AudioInput, max_seconds: float) -> Waveform:
        decoded.append(len(audio.data))
        return real_decode(audio, max_seconds)

    models = load_models(EngineConfig(models_dir=models_dir, device="cpu"))
    try:
        fused = models.encoders["fused"]
        assert isinstance(fused, FusedEncoder)
        audios = [AudioInput(data=speech.wav_bytes(v, k)) for v in (VOICE_A, VOICE_F) for k in (0, 3)]
        # A silent clip: unusable, with the first unusable component's reason.
        audios.append(AudioInput(data=encode_wav(np.zeros(16000, np.float32), 16000)))
        alone = []
        for audio in audios:
            parts = []
            for component in fused.components:
                (prepared,) = clips.prepare_placements(audio, component.manifest, models.vad, 600.0, (None,))
                parts.append(await embed_prepared(component, prepared))
            alone.append(fused.combine(parts))
        monkeypatch.setattr(clips, "decode", counting_decode)
        embedder = ClipEmbedder(models.vad, models.prep_pool, NullObserver(), 600.0, cache_entries)
        # One clip at a time, so each model call holds the same rows as above: a row's last bits depend on
        # the batch it is computed in (ONNX Runtime's kernels block by batch size), windows or not.
        got = [(await embedder.embed_audio(fused, [(a, f"clip {k}")]))[0] for k, a in enumerate(audios)]
        assert sorted(decoded) == sorted(len(a.data) for a in audios)  # one decode per clip, not one per encoder
        for mine, theirs in zip(got, alone, strict=True):
            assert mine.usable == theirs.usable and mine.detail == theirs.detail
            assert (mine.audio_seconds, mine.speech_seconds) == (theirs.audio_seconds, theirs.speech_seconds)
            if theirs.embedding is not None:
                assert mine.embedding is not None and np.array_equal(mine.embedding, theirs.embedding)
        assert not got[-1].usable and "s of speech" in got[-1].detail
    finally:
        await models.aclose()
