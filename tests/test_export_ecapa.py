"""The ECAPA exporter on a small random ECAPA-TDNN saved as the folder a SpeechBrain user would supply."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from sleuthd.encoders.manifest import EncoderManifest, load_encoder_manifest, sha256_of
from sleuthd.encoders.runner import OnnxEncoder
from sleuthd.export import ecapa
from sleuthd.export import parity as par
from sleuthd.export.models import export_ecapa_model
from sleuthd.export.speechbrain_ref import SpeechBrainReference, load_hparams

from .support import FSDD_SUBSET, Speech

# Laid out as spkrec-ecapa-voxceleb's hyperparams.yaml (pretrained_path names the hub repository, as in a
# download), with a small network: 24 mel bands, 32 channels, 48-d embeddings.
HPARAMS = """\
n_mels: 24
pretrained_path: speechbrain/spkrec-ecapa-voxceleb
out_n_neurons: 11
compute_features: !new:speechbrain.lobes.features.Fbank
    n_mels: !ref <n_mels>
mean_var_norm: !new:speechbrain.processing.features.InputNormalization
    norm_type: sentence
    std_norm: False
embedding_model: !new:speechbrain.lobes.models.ECAPA_TDNN.ECAPA_TDNN
    input_size: !ref <n_mels>
    channels: [32, 32, 32, 32, 96]
    kernel_sizes: [5, 3, 3, 3, 1]
    dilations: [1, 2, 3, 4, 1]
    attention_channels: 16
    se_channels: 16
    lin_neurons: 48
classifier: !new:speechbrain.lobes.models.ECAPA_TDNN.Classifier
    input_size: 48
    out_neurons: !ref <out_n_neurons>
mean_var_norm_emb: !new:speechbrain.processing.features.InputNormalization
    norm_type: global
    std_norm: False
modules:
    compute_features: !ref <compute_features>
    mean_var_norm: !ref <mean_var_norm>
    embedding_model: !ref <embedding_model>
    mean_var_norm_emb: !ref <mean_var_norm_emb>
    classifier: !ref <classifier>
label_encoder: !new:speechbrain.dataio.encoder.CategoricalEncoder
pretrainer: !new:speechbrain.utils.parameter_transfer.Pretrainer
    loadables:
        embedding_model: !ref <embedding_model>
        mean_var_norm_emb: !ref <mean_var_norm_emb>
        classifier: !ref <classifier>
        label_encoder: !ref <label_encoder>
    paths:
        embedding_model: !ref <pretrained_path>/embedding_model.ckpt
        mean_var_norm_emb: !ref <pretrained_path>/mean_var_norm_emb.ckpt
        classifier: !ref <pretrained_path>/classifier.ckpt
        label_encoder: !ref <pretrained_path>/label_encoder.txt
"""


def write_random_ecapa(folder: Path, seed: int = 0) -> None:
    """A randomly initialised ECAPA_TDNN built by SpeechBrain from HPARAMS, saved as SpeechBrain saves it."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hyperparams.yaml").write_text(HPARAMS)
    torch.manual_seed(seed)
    model = load_hparams(HPARAMS, {})["embedding_model"]
    for m in model.modules():  # trained-looking batch-norm statistics, so the export must carry them over
        if isinstance(m, torch.nn.BatchNorm1d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    torch.save(model.state_dict(), folder / "embedding_model.ckpt")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("spkrec-ecapa-small")
    write_random_ecapa(folder)
    return folder


@pytest.fixture(scope="module")
def exported(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> EncoderManifest:
    models = tmp_path_factory.mktemp("models")
    export_ecapa_model(models, checkpoint, FSDD_SUBSET)
    return load_encoder_manifest(models / "ecapa")


def test_export_records_parity_with_encode_batch(exported: EncoderManifest, checkpoint: Path) -> None:
    raw = exported.raw
    assert raw["parity"]["measured"] and raw["parity"]["min_cosine"] >= 0.999
    assert "encode_batch" in raw["parity"]["against"]
    assert raw["source"]["file_sha256"] == sha256_of(checkpoint / "embedding_model.ckpt")
    assert exported.embedding_size == 48 and exported.window.window_samples == 47840


def test_served_encoder_matches_encode_batch_on_real_and_synthetic_speech(
    exported: EncoderManifest, checkpoint: Path, speech: Speech
) -> None:
    encoder = OnnxEncoder(exported, device="cpu")
    real = par.fsdd_turns(FSDD_SUBSET, per_turn=7)[::2]
    synthetic = [sf.read(p, dtype="float32")[0] for paths in speech.clips.values() for p in paths[:3]]
    windows = par.cut_windows(real + synthetic, exported.window)
    result = par.compare(encoder.embed, SpeechBrainReference(checkpoint).embed_windows, windows, len(windows))
    assert result.min_cosine >= 0.999, f"min cosine {result.min_cosine:.6f} over {result.windows} windows"
    # A random network is still a function of its input: different clips do not embed alike.
    emb = encoder.embed(windows[:4])
    assert float((emb @ emb.T)[np.triu_indices(4, 1)].min()) < 0.999


def test_incomplete_or_wrong_folder_is_refused_with_what_is_missing(checkpoint: Path, tmp_path: Path) -> None:
    with pytest.raises(ecapa.CheckpointError, match=r"lacks hyperparams\.yaml and embedding_model\.ckpt"):
        ecapa.read_checkpoint(tmp_path)
    partial = tmp_path / "partial"
    partial.mkdir()
    shutil.copy(checkpoint / "hyperparams.yaml", partial)
    with pytest.raises(ecapa.CheckpointError, match=r"lacks embedding_model\.ckpt"):
        export_ecapa_model(tmp_path / "models", partial, FSDD_SUBSET)
    assert not (tmp_path / "models").exists()  # refused before anything was written
    (partial / "embedding_model.ckpt").write_bytes(b"not a checkpoint")
    (partial / "hyperparams.yaml").write_text(HPARAMS.replace("ECAPA_TDNN.ECAPA_TDNN", "Xvector.Xvector"))
    with pytest.raises(ecapa.CheckpointError, match=r"`embedding_model` must be `!new:speechbrain\.lobes\.models"):
        ecapa.read_checkpoint(partial)
    (partial / "hyperparams.yaml").write_text(HPARAMS)
    with pytest.raises(ecapa.CheckpointError, match="not a readable torch state dict"):
        ecapa.read_checkpoint(partial)
