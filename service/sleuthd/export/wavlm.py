"""Export a transformers ``WavLMForXVector`` checkpoint folder (WavLM-SV) to one ONNX graph.

The folder is what ``WavLMForXVector.from_pretrained`` and ``Wav2Vec2FeatureExtractor.from_pretrained``
read (e.g. a download of microsoft/wavlm-base-plus-sv): ``config.json``, the weights
(``model.safetensors`` or ``pytorch_model.bin``) and ``preprocessor_config.json``. A transformer with
gated relative position bias is too much to write out by hand, so this exporter traces it with
``torch.onnx.export`` (TorchScript exporter, fixed opset); the wrapper around it does the rest:

    audio_windows (batch, samples) float32, 16 kHz
      -> exact-zero padding at either end refilled with the window's audio (as graph.trim_and_wrap)
      -> per-window zero-mean unit-variance normalisation when the feature extractor has do_normalize
      -> WavLMForXVector (CNN feature encoder, transformer, weighted layer sum, TDNN x-vector head,
         statistics pooling, feature_extractor linear layer) -> its ``embeddings`` -> L2 normalise
    embeddings (batch, xvector_output_dim) float32
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from sleuthd.encoders.manifest import sha256_of
from sleuthd.export.graph import OPSET, trim_and_wrap_reference

logger = logging.getLogger(__name__)

INPUT_NAME = "audio_windows"
OUTPUT_NAME = "embeddings"
CONFIG = "config.json"
PREPROCESSOR = "preprocessor_config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
NORM_EPS = 1e-7  # Wav2Vec2FeatureExtractor.zero_mean_unit_var_norm
TRACE_SAMPLES = 48_080  # length of the example input used for tracing (the sample axis stays dynamic)


class CheckpointError(RuntimeError):
    """The checkpoint folder is missing a file or is not a WavLMForXVector checkpoint."""


def check_folder(folder: Path) -> tuple[dict[str, Any], dict[str, Any], Path]:
    """(config, preprocessor config, weights file); one message names everything that is missing."""
    if not folder.is_dir():
        raise CheckpointError(f"WavLM-SV checkpoint folder {folder} does not exist")
    weights = next((folder / w for w in WEIGHT_FILES if (folder / w).is_file()), None)
    missing = [n for n in (CONFIG, PREPROCESSOR) if not (folder / n).is_file()]
    if weights is None:
        missing.append(" or ".join(WEIGHT_FILES))
    if missing:
        raise CheckpointError(
            f"WavLM-SV checkpoint folder {folder} lacks {', '.join(missing)} (a transformers WavLMForXVector "
            f"folder such as wavlm-base-plus-sv has {CONFIG}, {PREPROCESSOR} and the weights)"
        )
    assert weights is not None
    config = json.loads((folder / CONFIG).read_text())
    pre = json.loads((folder / PREPROCESSOR).read_text())
    if config.get("model_type") != "wavlm" or "WavLMForXVector" not in config.get("architectures", []):
        raise CheckpointError(
            f"{folder / CONFIG} is not a WavLMForXVector checkpoint (model_type {config.get('model_type')!r}, "
            f"architectures {config.get('architectures')})"
        )
    if pre.get("sampling_rate", 16000) != 16000:
        raise CheckpointError(f"{folder / PREPROCESSOR}: sampling_rate {pre['sampling_rate']} (sleuthd feeds 16000 Hz)")
    return config, pre, weights


def load_model(folder: Path) -> Any:
    from transformers import WavLMForXVector

    model = WavLMForXVector.from_pretrained(str(folder), attn_implementation="eager")
    return model.eval()


def _wrapper(model: Any, do_normalize: bool) -> Any:
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, audio: torch.Tensor) -> torch.Tensor:
            n = audio.shape[1]
            nonzero = (audio.abs() > 0).float()
            first = nonzero.argmax(dim=1, keepdim=True)
            last = n - 1 - nonzero.flip(1).argmax(dim=1, keepdim=True)
            positions = torch.arange(n, device=audio.device).unsqueeze(0)
            audio = audio.gather(1, first + positions % (last - first + 1))
            if do_normalize:
                mean = audio.mean(dim=1, keepdim=True)
                var = ((audio - mean) ** 2).mean(dim=1, keepdim=True)
                audio = (audio - mean) / torch.sqrt(var + NORM_EPS)
            emb = self.model(input_values=audio).embeddings
            return emb / emb.norm(dim=1, keepdim=True).clamp_min(1e-12)

    return Wrapped().eval()


def export(folder: Path, out_path: Path) -> dict[str, Any]:
    """Write the graph for a checkpoint folder; returns facts for the manifest."""
    import onnx
    import torch

    config, pre, weights = check_folder(folder)
    wrapped = _wrapper(load_model(folder), bool(pre.get("do_normalize", False)))
    example = torch.from_numpy(np.random.default_rng(0).standard_normal((2, TRACE_SAMPLES)).astype(np.float32) * 0.1)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    # The tracer warns about shapes it records as constants inside attention; the exported graph is
    # checked at other lengths than the traced one (tests/test_export_wavlm.py), so the warnings are noise.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(
            wrapped,
            (example,),
            str(out_path),
            dynamo=False,
            opset_version=OPSET,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {0: "batch", 1: "samples"}, OUTPUT_NAME: {0: "batch"}},
            do_constant_folding=True,
        )
    onnx.checker.check_model(str(out_path))
    from importlib.metadata import version

    logger.info("wrote %s from %s", out_path, folder)
    return {
        "checkpoint": str(folder.resolve()),
        "file": weights.name,
        "file_sha256": sha256_of(weights),
        "config_sha256": sha256_of(folder / CONFIG),
        "embedding_size": int(config.get("xvector_output_dim", 512)),
        "do_normalize": bool(pre.get("do_normalize", False)),
        "exporter": f"torch.onnx.export (TorchScript), torch {version('torch')}, transformers "
        f"{version('transformers')}, opset {OPSET}",
    }


class TransformersReference:
    """transformers' own path: ``Wav2Vec2FeatureExtractor`` then ``WavLMForXVector`` forward, embeddings."""

    def __init__(self, folder: Path) -> None:
        from transformers import Wav2Vec2FeatureExtractor

        check_folder(folder)
        self._extractor = Wav2Vec2FeatureExtractor.from_pretrained(str(folder))
        self._model = load_model(folder)

    def embed_windows(self, windows: np.ndarray) -> np.ndarray:
        import torch

        wavs = [trim_and_wrap_reference(w) for w in windows]
        inputs = self._extractor(wavs, sampling_rate=16000, return_tensors="pt")
        with torch.no_grad():
            emb = self._model(input_values=inputs["input_values"]).embeddings.numpy()
        return (emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)).astype(np.float32)
