"""Running an exported speaker encoder with ONNX Runtime.

:class:`OnnxEncoder` is synchronous and thread-safe (ONNX Runtime sessions may be run from several
threads). :class:`WindowEncoder` is what the engine awaits; :class:`ThreadedEncoder` runs each call
on a worker thread so the event loop never blocks on a model call.
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import Executor
from typing import Protocol

import numpy as np
import onnxruntime as ort

from sleuthd.errors import DeadlineExceeded, EngineFailure
from sleuthd.manifest import EncoderManifest

logger = logging.getLogger(__name__)


def padded_batch_size(n: int) -> int:
    """The batch size a batch of ``n`` windows is padded to on a GPU: the next power of two.

    The CUDA provider prepares a graph's kernels (cuDNN's algorithm search, memory plans) for each input
    shape it has not seen, and the micro-batcher sends batches of every size from 1 to max_batch_windows.
    Measured on an H200 (docs/serving.md, GPU): CAM++ through the micro-batcher served 2.3 windows/s to one
    client and 29 to 32 clients, against 126 and 2,592 for the same model at a fixed batch size, because
    nearly every call met a new shape. Powers of two bound the shapes to log2(max) + 1, all prepared at
    warm-up; the padding costs at most 2x the rows on a device with compute to spare."""
    return 1 << max(n - 1, 0).bit_length()


def choose_providers(device: str) -> list[str]:
    """ONNX Runtime providers for ``device``: "cpu", "cuda" or "auto" (CUDA when available)."""
    available = ort.get_available_providers()
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in available:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    if device == "cuda":
        raise EngineFailure(
            "device 'cuda' was asked for but this onnxruntime has no CUDA provider "
            f"(available: {', '.join(available)}); install the gpu extra (onnxruntime-gpu)"
        )
    return ["CPUExecutionProvider"]


class OnnxEncoder:
    """One ONNX Runtime session for an encoder manifest."""

    def __init__(self, manifest: EncoderManifest, device: str = "auto", intra_op_threads: int = 0) -> None:
        so = ort.SessionOptions()
        so.intra_op_num_threads = intra_op_threads or (os.cpu_count() or 1)
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Idle intra-op threads would otherwise spin for more work, burning the CPU that decoding and
        # VAD on the other threads need between model calls.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.manifest = manifest
        self._session = ort.InferenceSession(str(manifest.path), so, providers=choose_providers(device))
        self.provider = self._session.get_providers()[0]
        self.pads_batches = self.provider == "CUDAExecutionProvider"
        logger.info("encoder %s runs on %s", manifest.name, self.provider)

    def embed(self, windows: np.ndarray) -> np.ndarray:
        """(batch, window_samples) float32 -> (batch, embedding_size) float32 unit vectors."""
        if windows.ndim != 2 or windows.shape[1] != self.manifest.window.window_samples:
            raise ValueError(f"expected (batch, {self.manifest.window.window_samples}) windows, got {windows.shape}")
        if len(windows) == 0:
            return np.zeros((0, self.manifest.embedding_size), np.float32)
        n = len(windows)
        if self.pads_batches and padded_batch_size(n) > n:
            # Repeats of the last window, not zeros: padding rows are computed and dropped, and real audio
            # keeps every row's arithmetic ordinary.
            windows = np.concatenate([windows, np.repeat(windows[-1:], padded_batch_size(n) - n, axis=0)])
        try:
            (out,) = self._session.run([self.manifest.output_name], {self.manifest.input_name: windows})
        except Exception as exc:  # onnxruntime raises its own exception types
            raise EngineFailure(f"encoder {self.manifest.name} failed: {exc}") from exc
        result: np.ndarray = out[:n]
        return result

    def warm_up(self, max_batch: int = 2) -> None:
        """Run the model once; on a GPU once per padded batch size up to ``max_batch`` (each shape's kernels
        are prepared on first use, which must not happen inside a request)."""
        sizes = [2]
        if self.pads_batches:
            sizes = sorted({padded_batch_size(b) for b in range(1, max_batch + 1)})
        rng = np.random.default_rng(0)
        for size in sizes:
            self.embed((0.05 * rng.standard_normal((size, self.manifest.window.window_samples))).astype(np.float32))


class WindowEncoder(Protocol):
    """What the engine needs from an encoder: embeddings for a stack of windows, awaited."""

    manifest: EncoderManifest
    provider: str  # ONNX Runtime execution provider in use

    async def encode(self, windows: np.ndarray, deadline: float | None = None) -> np.ndarray:
        """Embeddings for (n, window_samples) windows; ``deadline`` is on the event loop's clock."""
        ...


class PerClipEncoder:
    """Each clip's windows in one model call of its own, on a worker thread; nothing is shared across
    clips or requests (``--batching off``: the micro-batcher's baseline, and lowest latency when idle)."""

    def __init__(self, encoder: OnnxEncoder, executor: Executor) -> None:
        self.encoder = encoder
        self.manifest = encoder.manifest
        self.provider = encoder.provider
        self._executor = executor

    async def encode(self, windows: np.ndarray, deadline: float | None = None) -> np.ndarray:
        loop = asyncio.get_running_loop()
        if deadline is not None and loop.time() >= deadline:
            raise DeadlineExceeded("the deadline passed before the model call")
        return await loop.run_in_executor(self._executor, self.encoder.embed, windows)
