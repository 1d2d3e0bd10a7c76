"""The ONNX model alone: windows per second at a batch size, the ceiling a serving measurement is compared
with (no decoding, VAD, queueing or gRPC). Used by `sleuthd-bench throughput` and scripts/gpu_encoders.py."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from sleuthd.config import default_models_dir
from sleuthd.encoders.manifest import load_encoder_manifest
from sleuthd.encoders.runner import OnnxEncoder


def windows_per_second(runner: OnnxEncoder, batch: int, seconds: float, rng: np.random.Generator) -> float:
    """The model alone at one batch size: windows of noise at speech level (its cost does not depend on
    the content), two warm-up calls, then as many calls as fit in ``seconds``."""
    windows = (0.1 * rng.standard_normal((batch, runner.manifest.window.window_samples))).astype(np.float32)
    runner.embed(windows)
    runner.embed(windows)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        runner.embed(windows)
        done += batch
    return done / (time.perf_counter() - start)


def model_rate(
    encoder: str = "ge2e",
    batches: Sequence[int] = (1, 4, 8, 16, 32, 64),
    seconds: float = 2.0,
    models_dir: Path | None = None,
    device: str = "cpu",
) -> dict[int, float]:
    """Windows per second of one encoder's ONNX model alone at each batch size."""
    runner = OnnxEncoder(
        load_encoder_manifest((models_dir or default_models_dir()) / encoder), device=device, gpu_batch=0
    )
    rng = np.random.default_rng(0)
    return {batch: windows_per_second(runner, batch, seconds, rng) for batch in batches}
