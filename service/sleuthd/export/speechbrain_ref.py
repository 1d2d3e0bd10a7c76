"""SpeechBrain's own ``EncoderClassifier.encode_batch`` as the parity reference for the ECAPA export.

``import speechbrain`` imports torchaudio at package import time (``speechbrain.utils.torch_audio_backend``
asks it for its version), although Fbank, InputNormalization, ECAPA_TDNN and ``encode_batch`` are plain
torch and never call it. Where no torchaudio works with the installed torch (as here: there is no CPU
torchaudio for torch 2.13), :func:`import_speechbrain` registers a stand-in ``torchaudio`` module whose
every attribute access fails, so any real use of torchaudio still raises instead of doing something else.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from sleuthd.export.graph import trim_and_wrap_reference

logger = logging.getLogger(__name__)


class _AbsentTorchaudio(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # the import machinery and hasattr() probe dunders
        raise ImportError(f"torchaudio is not installed; speechbrain tried to use torchaudio.{name}")


@contextlib.contextmanager
def _torchaudio_stand_in() -> Iterator[None]:
    """While speechbrain modules are imported: a ``torchaudio`` that fails on use if the real one cannot
    load. It is taken out of ``sys.modules`` afterwards so other libraries (transformers) still see
    torchaudio as absent; speechbrain's modules keep their reference to it."""
    try:
        importlib.import_module("torchaudio")
    except (ImportError, OSError) as exc:
        logger.info("torchaudio unavailable (%s); importing speechbrain with a stand-in that fails on use", exc)
    else:
        yield
        return
    for name in [m for m in sys.modules if m == "torchaudio" or m.startswith("torchaudio.")]:
        del sys.modules[name]
    sys.modules["torchaudio"] = _AbsentTorchaudio("torchaudio")
    try:
        yield
    finally:
        if isinstance(sys.modules.get("torchaudio"), _AbsentTorchaudio):
            del sys.modules["torchaudio"]


def import_speechbrain() -> types.ModuleType:
    """``speechbrain.inference.classifiers``, imported with the torchaudio stand-in where needed."""
    try:
        with _torchaudio_stand_in():
            return importlib.import_module("speechbrain.inference.classifiers")
    except ImportError as exc:
        raise RuntimeError(
            "the ECAPA parity check needs speechbrain: `pip install --no-deps speechbrain==1.1.2` plus the export "
            f"extra (make setup does this): {exc}"
        ) from exc


def load_hparams(text: str, overrides: dict[str, str]) -> dict[str, Any]:
    """hyperpyyaml's loader (it imports the speechbrain classes the YAML names)."""
    from hyperpyyaml import load_hyperpyyaml

    import_speechbrain()
    with _torchaudio_stand_in():
        hparams: dict[str, Any] = load_hyperpyyaml(text, overrides)
    return hparams


class SpeechBrainReference:
    """An ``EncoderClassifier`` built from a checkpoint folder's hyperparams.yaml and embedding_model.ckpt."""

    def __init__(self, folder: Path) -> None:
        import torch

        classifiers = import_speechbrain()
        text = (folder / "hyperparams.yaml").read_text()
        # A downloaded folder's pretrained_path names the hub repository; point it at the folder instead.
        overrides = {"pretrained_path": str(folder)} if "pretrained_path:" in text else {}
        hparams = load_hparams(text, overrides)
        modules = {k: hparams[k] for k in ("compute_features", "mean_var_norm", "embedding_model")}
        state = torch.load(folder / "embedding_model.ckpt", map_location="cpu", weights_only=True)
        modules["embedding_model"].load_state_dict(state)
        self._classifier = classifiers.EncoderClassifier(modules=modules, hparams=hparams, run_opts={"device": "cpu"})
        self._classifier.eval()

    def embed(self, wavs: np.ndarray) -> np.ndarray:
        """``encode_batch`` of (batch, samples) waveforms, L2-normalised (batch, D)."""
        import torch

        with torch.no_grad():
            emb = self._classifier.encode_batch(torch.from_numpy(np.ascontiguousarray(wavs, np.float32)))
        out = emb[:, 0, :].numpy()
        return (out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)).astype(np.float32)

    def embed_windows(self, windows: np.ndarray) -> np.ndarray:
        """What the graph computes for each window: its zero padding refilled as the graph does, then
        ``encode_batch``."""
        return self.embed(np.stack([trim_and_wrap_reference(w) for w in windows]))
