"""The WavLM-SV exporter on a small random WavLMForXVector saved as the folder a transformers user would supply."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from sleuthd.encoders.manifest import EncoderManifest, load_encoder_manifest, sha256_of
from sleuthd.encoders.runner import OnnxEncoder
from sleuthd.export import parity as par
from sleuthd.export import wavlm
from sleuthd.export.models import export_wavlm_model

from .support import FSDD_SUBSET, Speech


def write_random_wavlm(folder: Path, do_normalize: bool = True, seed: int = 0) -> None:
    """A randomly initialised, small WavLMForXVector and its feature extractor, saved by transformers."""
    import torch
    from transformers import Wav2Vec2FeatureExtractor, WavLMConfig, WavLMForXVector

    config = WavLMConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        conv_dim=(32,) * 7,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
        tdnn_dim=(32, 32, 32, 32, 64),
        xvector_output_dim=24,
        num_buckets=40,
        use_weighted_layer_sum=True,
        architectures=["WavLMForXVector"],
    )
    torch.manual_seed(seed)
    WavLMForXVector(config).save_pretrained(folder)
    extractor = Wav2Vec2FeatureExtractor(
        feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=do_normalize, return_attention_mask=True
    )
    extractor.save_pretrained(folder)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wavlm-sv-small")
    write_random_wavlm(folder)
    return folder


@pytest.fixture(scope="module")
def exported(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> EncoderManifest:
    models = tmp_path_factory.mktemp("models")
    export_wavlm_model(models, checkpoint, FSDD_SUBSET)
    return load_encoder_manifest(models / "wavlm_sv")


def test_export_records_parity_with_transformers(exported: EncoderManifest, checkpoint: Path) -> None:
    raw = exported.raw
    assert raw["parity"]["measured"] and raw["parity"]["min_cosine"] >= 0.999
    assert raw["source"]["do_normalize"] is True
    assert raw["source"]["file_sha256"] == sha256_of(checkpoint / "model.safetensors")
    assert exported.embedding_size == 24 and exported.window.window_samples == 48080


def test_served_encoder_matches_transformers_on_real_and_synthetic_speech(
    exported: EncoderManifest, checkpoint: Path, speech: Speech
) -> None:
    encoder = OnnxEncoder(exported, device="cpu")
    real = par.fsdd_turns(FSDD_SUBSET, per_turn=7)[::2]
    synthetic = [sf.read(p, dtype="float32")[0] for paths in speech.clips.values() for p in paths[:3]]
    windows = par.cut_windows(real + synthetic, exported.window)
    reference = wavlm.TransformersReference(checkpoint)
    result = par.compare(encoder.embed, reference.embed_windows, windows, len(windows))
    assert result.min_cosine >= 0.999, f"min cosine {result.min_cosine:.6f} over {result.windows} windows"
    emb = encoder.embed(windows[:4])
    assert float((emb @ emb.T)[np.triu_indices(4, 1)].min()) < 0.999


def test_graph_is_not_tied_to_the_traced_length(exported: EncoderManifest, checkpoint: Path) -> None:
    run = par.onnx_runner(exported.path, exported.input_name)
    reference = wavlm.TransformersReference(checkpoint)
    clips = [c[: 2 * 16_000] for c in par.fsdd_turns(FSDD_SUBSET, per_turn=6)[:3]]  # 2 s, not the 3 s window
    result = par.compare(run, reference.embed_windows, np.stack(clips), len(clips))
    assert result.min_cosine >= 0.999


def test_incomplete_or_wrong_folder_is_refused_with_what_is_missing(checkpoint: Path, tmp_path: Path) -> None:
    missing = r"lacks config\.json, preprocessor_config\.json, model\.safetensors or pytorch_model\.bin"
    with pytest.raises(wavlm.CheckpointError, match=missing):
        wavlm.check_folder(tmp_path)
    (tmp_path / "config.json").write_text((checkpoint / "config.json").read_text())
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(wavlm.CheckpointError, match=r"lacks preprocessor_config\.json \("):
        export_wavlm_model(tmp_path / "models", tmp_path, FSDD_SUBSET)
    assert not (tmp_path / "models").exists()
    (tmp_path / "preprocessor_config.json").write_text("{}")
    (tmp_path / "config.json").write_text('{"model_type": "wav2vec2", "architectures": ["Wav2Vec2ForXVector"]}')
    with pytest.raises(wavlm.CheckpointError, match="is not a WavLMForXVector checkpoint"):
        wavlm.check_folder(tmp_path)
