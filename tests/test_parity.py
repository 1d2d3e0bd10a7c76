"""The exported ONNX encoder, as the server runs it, agrees with resemblyzer's own VoiceEncoder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from resemblyzer import preprocess_wav
from sleuthd.encoders.manifest import load_encoder_manifest
from sleuthd.encoders.runner import OnnxEncoder
from sleuthd.export.models import fsdd_parity_turns, parity_cosines

from .support import FSDD_SUBSET, Speech


def test_onnx_matches_resemblyzer_on_real_and_synthetic_speech(models_dir: Path, speech: Speech) -> None:
    runner = OnnxEncoder(load_encoder_manifest(models_dir / "ge2e"), device="cpu")
    real = fsdd_parity_turns(FSDD_SUBSET)  # 24 turns of real human speech (FSDD, 8 kHz)
    synthetic = [preprocess_wav(p) for paths in speech.clips.values() for p in paths]  # 28 clips, 4 voices
    assert len(real) == 24 and len(synthetic) == 28
    cos = parity_cosines(runner.embed, real + synthetic)
    assert min(cos) >= 0.999, f"min cosine {min(cos):.6f}"
    # And it is an encoder, not a constant: different speakers are not parity-level alike.
    a, b = runner.embed(np.stack([np.zeros(25840, np.float32), np.ones(25840, np.float32) * 0.1]))
    assert float(a @ b) < 0.999


def test_manifest_records_parity_and_hash(models_dir: Path) -> None:
    m = load_encoder_manifest(models_dir / "ge2e")
    assert m.raw["parity"]["measured"] and m.raw["parity"]["min_cosine"] >= 0.999
    assert m.raw["source"]["package"] == "resemblyzer" and len(m.raw["source"]["file_sha256"]) == 64
    assert m.embedding_size == 256 and m.window.window_samples == 25840


def test_gpu_fixed_batch_padding_returns_the_unpadded_rows(models_dir: Path) -> None:
    """On a GPU every call is padded to one batch size (sleuthd.encoders.runner.OnnxEncoder): the caller still gets
    exactly its own rows, equal to an unpadded call's. The padding is exercised here on the CPU provider."""
    manifest = load_encoder_manifest(models_dir / "campplus")
    plain = OnnxEncoder(manifest, device="cpu")
    assert plain.fixed_batch == 0  # the CPU provider never pads
    padded = OnnxEncoder(manifest, device="cpu")
    padded.fixed_batch = 8
    rng = np.random.default_rng(3)
    windows = (0.1 * rng.standard_normal((3, manifest.window.window_samples))).astype(np.float32)
    out = padded.embed(windows)
    assert out.shape == (3, manifest.embedding_size)
    np.testing.assert_allclose(out, plain.embed(windows), atol=1e-5)
    assert padded.embed(np.concatenate([windows] * 4)).shape == (12, manifest.embedding_size)  # over: as is


def test_gpu_light_shape_pads_a_small_call_to_its_own_session(models_dir: Path) -> None:
    """With a light shape (sleuthd.encoders.runner.OnnxEncoder's gpu_light_batch), a call of at most that many
    windows runs on its own session padded to it, a larger one on the main session padded to the full shape, and
    either gives exactly the caller's rows. Exercised on the CPU provider, which itself never pads."""
    manifest = load_encoder_manifest(models_dir / "campplus")
    plain = OnnxEncoder(manifest, device="cpu")
    assert OnnxEncoder(manifest, device="cpu", gpu_light_batch=4).light_batch == 0  # no padding on the CPU
    two = OnnxEncoder(manifest, device="cpu")
    calls: list[tuple[str, int]] = []

    class Recorded:
        def __init__(self, name: str, session: Any) -> None:
            self.name, self.session = name, session

        def run(self, outputs: list[str], feeds: dict[str, np.ndarray]) -> Any:
            calls.append((self.name, len(next(iter(feeds.values())))))
            return self.session.run(outputs, feeds)

    two.fixed_batch, two.light_batch = 8, 4
    two._light = Recorded("light", two._session)  # type: ignore[assignment]
    two._session = Recorded("full", two._session)  # type: ignore[assignment]
    rng = np.random.default_rng(4)
    windows = (0.1 * rng.standard_normal((12, manifest.window.window_samples))).astype(np.float32)
    expected = plain.embed(windows)
    for n, call in ((3, ("light", 4)), (4, ("light", 4)), (5, ("full", 8)), (12, ("full", 12))):
        out = two.embed(windows[:n])
        assert calls[-1] == call and out.shape == (n, manifest.embedding_size)
        np.testing.assert_allclose(out, expected[:n], atol=1e-5)
