"""Parity checks shared by the exporters: the ONNX graph against the framework model it came from.

Parity is measured per window, the unit the server embeds: each window goes through the exported graph
(ONNX Runtime, CPU) and through the reference (the original PyTorch model fed by its own front end),
and the two unit embeddings are compared by cosine.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sleuthd.audio.windows import WindowSpec, make_windows

logger = logging.getLogger(__name__)

MIN_COSINE = 0.999  # what every exporter here must reach


@dataclass(frozen=True)
class ParityResult:
    """Cosines between exported and reference embeddings of the same windows."""

    cosines: tuple[float, ...]
    windows: int
    clips: int

    @property
    def min_cosine(self) -> float:
        return min(self.cosines)

    def block(self, against: str, clips: str) -> dict[str, Any]:
        """The manifest's ``parity`` block."""
        return {
            "measured": True,
            "against": against,
            "clips": clips,
            "windows": self.windows,
            "min_cosine": round(self.min_cosine, 7),
            "mean_cosine": round(float(np.mean(self.cosines)), 7),
        }


def fsdd_turns(folder: Path, per_turn: int = 5) -> list[np.ndarray]:
    """Real-speech turns: each FSDD speaker's takes in ``folder`` (name ``digit_speaker_take.wav``) joined
    ``per_turn`` at a time, resampled to 16 kHz with soxr. No loudness change or trimming: the encoders'
    front ends are what is being checked."""
    import soundfile as sf
    import soxr

    by_speaker: dict[str, list[Path]] = {}
    for p in sorted(folder.glob("*.wav")):
        by_speaker.setdefault(p.stem.split("_")[1], []).append(p)
    if not by_speaker:
        raise RuntimeError(f"no FSDD WAV files in {folder}")
    turns = []
    for files in by_speaker.values():
        for i in range(0, len(files) - per_turn + 1, per_turn):
            parts = []
            for f in files[i : i + per_turn]:
                samples, rate = sf.read(f, dtype="float32", always_2d=False)
                parts.append(soxr.resample(samples, rate, 16_000, quality="HQ") if rate != 16_000 else samples)
            turns.append(np.concatenate(parts).astype(np.float32))
    return turns


def cut_windows(clips: Sequence[np.ndarray], spec: WindowSpec) -> np.ndarray:
    """All windows of all clips, stacked: (n, spec.window_samples)."""
    return np.concatenate([make_windows(c.astype(np.float32), spec)[0] for c in clips])


def onnx_runner(onnx_path: Path, input_name: str) -> Callable[[np.ndarray], np.ndarray]:
    """Batch embedding with ONNX Runtime on CPU, optimised as the server runs it."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])

    def run(windows: np.ndarray) -> np.ndarray:
        (out,) = session.run(None, {input_name: windows.astype(np.float32)})
        return np.asarray(out)

    return run


def compare(
    ours: Callable[[np.ndarray], np.ndarray],
    theirs: Callable[[np.ndarray], np.ndarray],
    windows: np.ndarray,
    clips: int,
    batch: int = 16,
) -> ParityResult:
    """Cosine per window between two unit-embedding functions of (batch, samples) windows."""
    cos: list[float] = []
    for start in range(0, len(windows), batch):
        part = windows[start : start + batch]
        a, b = ours(part), theirs(part)
        a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
        b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
        cos.extend(float(x) for x in np.sum(a * b, axis=1))
    return ParityResult(tuple(cos), len(windows), clips)


def require(result: ParityResult, what: str) -> None:
    """Refuse an export whose graph disagrees with its reference."""
    logger.info("parity of %s: min cosine %.7f over %d windows", what, result.min_cosine, result.windows)
    if result.min_cosine < MIN_COSINE:
        raise RuntimeError(
            f"exported {what} disagrees with its reference: min cosine {result.min_cosine:.5f} < {MIN_COSINE} "
            f"over {result.windows} windows"
        )
