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

from sleuthd.encoders.manifest import EncoderManifest
from sleuthd.errors import DeadlineExceeded, EngineFailure

logger = logging.getLogger(__name__)


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


def session_providers(device: str, tf32: bool = False) -> list[str | tuple[str, dict[str, str]]]:
    """:func:`choose_providers` with their options: on CUDA, TF32 as asked (see :class:`OnnxEncoder`)."""
    return [
        (p, {"use_tf32": "1" if tf32 else "0"}) if p == "CUDAExecutionProvider" else p for p in choose_providers(device)
    ]


class OnnxEncoder:
    """One ONNX Runtime session for an encoder manifest."""

    def __init__(
        self,
        manifest: EncoderManifest,
        device: str = "auto",
        intra_op_threads: int = 0,
        gpu_batch: int = 64,
        tf32: bool = False,
        gpu_light_batch: int = 0,
    ) -> None:
        """``tf32``: let the CUDA provider's convolutions and matrix products round to TensorFloat-32 (ONNX
        Runtime's default). Off here: with it, CAM++'s embeddings through the server's padded 64-window calls
        on an H200 were at least 0.988 cosine to the CPU's (docs/research/gpu/), a drift that moves verdicts
        near a threshold; the embeddings must not depend on which machine answered.

        ``gpu_batch``: on the CUDA provider, every call of fewer windows is padded to this many.

        Why: ONNX Runtime's CUDA convolutions redo their algorithm search whenever the input shape differs
        from the previous call's, cached or not. Measured on an H200 (docs/research/gpu/README.md): each
        change of batch size cost CAM++ about 2.2 s, so through the micro-batcher, whose batches vary from 1
        to max_batch_windows, it served 2.3 windows/s to one client and 29 to 32 clients, against 126 and
        2,600 at a fixed batch. One shape per session removes the search; padding a 64-row call costs CAM++
        about 19 ms on that GPU. The server passes its max_batch_windows.

        ``gpu_light_batch``: on the CUDA provider, a call of at most this many windows is padded to this many on a
        second session (its own one shape) instead (0, or not under ``gpu_batch``: one session). Why: padded to 64,
        light load pays for 64 windows a call: on an H200 one client got 148 audio-s/s at 64 against 393 at 16, and
        a streamed 3 s turn 60 ms against 23 at turn 10 (docs/research/gpu/README.md, runs 9-10), while 16 alone
        caps the model at about a third of 64's rate under full load. The server passes its gpu_light_windows."""
        so = ort.SessionOptions()
        so.intra_op_num_threads = intra_op_threads or (os.cpu_count() or 1)
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Idle intra-op threads would otherwise spin for more work, burning the CPU that decoding and
        # VAD on the other threads need between model calls.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.manifest = manifest
        self._session = ort.InferenceSession(str(manifest.path), so, providers=session_providers(device, tf32))
        self.provider = self._session.get_providers()[0]
        self.fixed_batch = gpu_batch if self.provider == "CUDAExecutionProvider" else 0
        self.light_batch = 0
        self._light: ort.InferenceSession | None = None
        if self.fixed_batch and 0 < gpu_light_batch < self.fixed_batch:
            self.light_batch = gpu_light_batch
            self._light = ort.InferenceSession(str(manifest.path), so, providers=session_providers(device, tf32))
        shapes = f", padded to {self.light_batch} and {self.fixed_batch} windows" if self.light_batch else ""
        logger.info("encoder %s runs on %s%s", manifest.name, self.provider, shapes)

    def embed(self, windows: np.ndarray) -> np.ndarray:
        """(batch, window_samples) float32 -> (batch, embedding_size) float32 unit vectors."""
        if windows.ndim != 2 or windows.shape[1] != self.manifest.window.window_samples:
            raise ValueError(f"expected (batch, {self.manifest.window.window_samples}) windows, got {windows.shape}")
        if len(windows) == 0:
            return np.zeros((0, self.manifest.embedding_size), np.float32)
        n = len(windows)
        session, shape = self._session, self.fixed_batch
        if self._light is not None and n <= self.light_batch:
            session, shape = self._light, self.light_batch
        if n < shape:
            # Repeats of the last window, not zeros: the padding rows are computed and dropped.
            windows = np.concatenate([windows, np.repeat(windows[-1:], shape - n, axis=0)])
        try:
            (out,) = session.run([self.manifest.output_name], {self.manifest.input_name: windows})
        except Exception as exc:  # onnxruntime raises its own exception types
            raise EngineFailure(f"encoder {self.manifest.name} failed: {exc}") from exc
        result: np.ndarray = out[:n]
        return result

    def shrink_arena(self) -> None:
        """Hand back what ONNX Runtime's CPU arena holds beyond what it uses now: one model call of a single
        window with arena shrinkage on (about 20 ms for GE2E, 80 ms for CAM++ here). The arena keeps the
        memory of the largest batch for good (about 180 MB after batches of 64 GE2E and 8 CAM++ windows);
        without the arena every call is 3-18 % slower, so it is shrunk when the server goes idle instead.
        Not on a GPU, where a batch of another shape costs an algorithm search."""
        if self.provider != "CPUExecutionProvider":
            return
        options = ort.RunOptions()
        options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        window = np.zeros((1, self.manifest.window.window_samples), np.float32)
        self._session.run([self.manifest.output_name], {self.manifest.input_name: window}, options)

    def warm_up(self) -> None:
        """One model call at each padded shape on a GPU: its kernels are chosen here, not in a request."""
        for n in {max(self.fixed_batch, 2), self.light_batch} - {0}:
            self.embed(np.zeros((n, self.manifest.window.window_samples), np.float32))


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
