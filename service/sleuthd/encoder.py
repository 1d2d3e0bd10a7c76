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


# cuDNN convolution algorithm choice on the CUDA provider. ONNX Runtime's default, EXHAUSTIVE, benchmarks
# every algorithm the first time it sees an input shape; the micro-batcher sends batches of every size from
# 1 to max_batch_windows, so a convolutional encoder (CAM++) paid that search again and again: measured on an
# H200, CAM++ served 2.3 windows/s to one client and 29 to 32 clients while shapes were new, against 126 and
# 2,592 for the model at a fixed batch (docs/serving.md, GPU). HEURISTIC picks from cuDNN's heuristics.
CUDA_CONV_ALGO_SEARCH = os.environ.get("SLEUTHD_CUDNN_CONV_ALGO_SEARCH", "HEURISTIC")


def choose_providers(device: str) -> list[str | tuple[str, dict[str, str]]]:
    """ONNX Runtime providers for ``device``: "cpu", "cuda" or "auto" (CUDA when available)."""
    available = ort.get_available_providers()
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in available:
        return [("CUDAExecutionProvider", {"cudnn_conv_algo_search": CUDA_CONV_ALGO_SEARCH}), "CPUExecutionProvider"]
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
        logger.info("encoder %s runs on %s", manifest.name, self.provider)

    def embed(self, windows: np.ndarray) -> np.ndarray:
        """(batch, window_samples) float32 -> (batch, embedding_size) float32 unit vectors."""
        if windows.ndim != 2 or windows.shape[1] != self.manifest.window.window_samples:
            raise ValueError(f"expected (batch, {self.manifest.window.window_samples}) windows, got {windows.shape}")
        if len(windows) == 0:
            return np.zeros((0, self.manifest.embedding_size), np.float32)
        try:
            (out,) = self._session.run([self.manifest.output_name], {self.manifest.input_name: windows})
        except Exception as exc:  # onnxruntime raises its own exception types
            raise EngineFailure(f"encoder {self.manifest.name} failed: {exc}") from exc
        result: np.ndarray = out
        return result

    def warm_up(self) -> None:
        self.embed(np.zeros((2, self.manifest.window.window_samples), np.float32))


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
