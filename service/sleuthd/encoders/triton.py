"""Encoders served by an NVIDIA Triton Inference Server, awaited like the in-process runner.

:class:`TritonEncoder` is a :class:`~sleuthd.encoder.WindowEncoder`: the same windows go in, the same
embeddings come out (the repository that ``sleuthd models triton-repo`` writes serves the very ONNX file
of the manifest, and the client checks its SHA-256 before trusting a single answer). What changes is who
batches: every sleuthd replica sends each clip's windows as one Triton request and Triton's dynamic
batcher merges the requests of all replicas into model calls (``max_batch_size`` rows at most; a request
with more windows is split into several and stitched back in order, as the micro-batcher does).

The contract, as the micro-batcher's (sleuthd.batcher):

- windows in flight to Triton from this process are bounded (``--max-queue-windows``): over it a request
  is refused at once with :class:`~sleuthd.errors.Overloaded`, as is one Triton refuses for its full queue;
- the RPC's deadline travels with each Triton call, both as the gRPC deadline and as Triton's own request
  timeout, so Triton drops a request whose caller has given up before it reaches the model; a call past its
  deadline raises :class:`~sleuthd.errors.DeadlineExceeded`;
- a cancelled RPC cancels its Triton calls (the awaiting task's cancellation cancels the gRPC call);
- Triton unreachable, or failing the call, is :class:`EncoderUnavailable` (UNAVAILABLE through the
  servicer's table, as for the registry's database): never an embedding made up. The encoder's health goes
  NOT_SERVING (gRPC health service ``sleuthd.encoder.<name>``, see sleuthd.rpc.encoder_health) and a probe
  asks Triton's readiness every ``--triton-probe-interval-s`` until the model is ready again.

One gRPC channel per encoder and event loop (grpc.aio channels belong to the loop that made them). Its
reconnect backoff is capped at the probe interval: gRPC's default grows to two minutes, which would keep
an encoder down long after Triton came back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sleuthd.config import BatcherConfig, ConfigError, EncoderBackendConfig
from sleuthd.encoders.manifest import EncoderManifest
from sleuthd.errors import DeadlineExceeded, DependencyUnavailable, Overloaded
from sleuthd.ops.observe import BatchObserver, NullObserver

logger = logging.getLogger(__name__)

# The model config parameter holding the SHA-256 of the ONNX file the model serves (written by
# sleuthd.export.triton_repo). Embeddings of other weights are never mixed with the manifest's: the
# registry keys stored embeddings by exactly this hash.
SHA256_PARAMETER = "sleuthd_onnx_sha256"
MAX_MESSAGE_BYTES = 2**31 - 1  # Triton's own client default: a batch of CAM++ windows is 12 MB at 64 rows


class EncoderUnavailable(DependencyUnavailable):
    """The Triton server behind an encoder cannot be reached, does not serve the model, or failed the call;
    retry later (UNAVAILABLE). This replica is healthy: only that encoder's health says NOT_SERVING."""


@dataclass
class EncoderHealth:
    """Whether an encoder can answer now, with listeners (the server's health service) told of changes."""

    serving: bool = True
    detail: str = ""

    def __post_init__(self) -> None:
        self._listeners: list[Callable[[bool], None]] = []

    def subscribe(self, listener: Callable[[bool], None]) -> None:
        self._listeners.append(listener)

    def set(self, serving: bool, detail: str = "") -> None:
        changed = serving != self.serving
        self.serving, self.detail = serving, detail
        if changed:
            for listener in self._listeners:
                listener(serving)


@dataclass(frozen=True)
class ServedModel:
    """What Triton says about the model, once checked against the manifest."""

    max_batch_size: int  # rows per request Triton accepts (requests with more windows are split)


def triton_model_name(manifest: EncoderManifest, prefix: str = "") -> str:
    return prefix + manifest.name


def check_served_model(manifest: EncoderManifest, config: Any, model: str) -> ServedModel:
    """Compare Triton's model config (a ``ModelConfig`` message) with the manifest; raise ConfigError naming
    the difference and the fix. Input (batch, window_samples) FP32 and output (batch, embedding_size) FP32,
    batched by Triton, serving the manifest's ONNX file."""
    fix = f"regenerate the repository with `sleuthd models triton-repo` from the models folder holding {manifest.name}"
    where = f"Triton model {model!r}"
    if config.max_batch_size < 1:
        raise ConfigError(f"{where} has max_batch_size {config.max_batch_size}; it must batch (>= 1): {fix}")
    tensors = {"input": (config.input, manifest.input_name, manifest.window.window_samples),
               "output": (config.output, manifest.output_name, manifest.embedding_size)}  # fmt: skip
    for kind, (found, name, width) in tensors.items():
        match = [t for t in found if t.name == name]
        if not match:
            raise ConfigError(f"{where} has no {kind} named {name!r} (it has {[t.name for t in found]}): {fix}")
        dims = list(match[0].dims)
        if dims != [width] or match[0].data_type != 11:  # 11 = TYPE_FP32 in model_config.proto
            raise ConfigError(f"{where}: {kind} {name!r} is {dims} of type {match[0].data_type}, expected [{width}] "
                              f"FP32 (11): {fix}")  # fmt: skip
    served = config.parameters[SHA256_PARAMETER].string_value if SHA256_PARAMETER in config.parameters else ""
    if served != manifest.sha256:
        raise ConfigError(
            f"{where} serves ONNX sha256 {served[:12] or '(not recorded)'}…, "
            f"the manifest's is {manifest.sha256[:12]}…: "
            f"its embeddings would not be comparable with this server's (or the registry's): {fix}"
        )
    return ServedModel(int(config.max_batch_size))


def check_at_start(manifest: EncoderManifest, config: EncoderBackendConfig) -> ServedModel | None:
    """Before the server starts: wait up to ``triton_connect_timeout_s`` for Triton to serve the model and
    check it (ConfigError on a mismatch: a wrong repository is a mistake to fix, not an outage to ride out).
    None when Triton did not answer in time: the encoder starts NOT_SERVING and recovers when it does."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    model = triton_model_name(manifest, config.triton_model_prefix)
    client = grpcclient.InferenceServerClient(config.triton_url)
    give_up = time.monotonic() + config.triton_connect_timeout_s
    last = ""
    try:
        while True:
            try:
                left = max(give_up - time.monotonic(), 0.05)
                if client.is_model_ready(model, client_timeout=min(left, 5.0)):
                    response = client.get_model_config(model, client_timeout=min(left, 5.0))
                    return check_served_model(manifest, response.config, model)
                last = f"model {model!r} is not ready"
            except InferenceServerException as exc:
                last = exc.message() or str(exc)
            if time.monotonic() >= give_up:
                logger.warning(
                    "encoder %s: Triton at %s did not serve %r within %.0f s (%s); starting with its health "
                    "NOT_SERVING, it recovers when Triton does",
                    manifest.name, config.triton_url, model, config.triton_connect_timeout_s, last,
                )  # fmt: skip
                return None
            time.sleep(min(0.5, config.triton_probe_interval_s))
    finally:
        client.close()


class TritonEncoder:
    """A :class:`~sleuthd.encoder.WindowEncoder` whose model calls go to Triton (see the module docstring)."""

    def __init__(
        self,
        manifest: EncoderManifest,
        config: EncoderBackendConfig,
        batcher: BatcherConfig,
        served: ServedModel | None,
        observer: BatchObserver | None = None,
    ) -> None:
        """``served``: what :func:`check_at_start` found (None: Triton was not reachable; the encoder starts
        NOT_SERVING and the first probe that finds the model checks it)."""
        self.manifest = manifest
        self.config = config
        self.model = triton_model_name(manifest, config.triton_model_prefix)
        self.provider = f"triton({config.triton_url})"
        self.max_queue_windows = batcher.max_queue_windows
        self.health = EncoderHealth(served is not None, "" if served else "Triton has not answered yet")
        self._served = served
        self._observer: BatchObserver = observer or NullObserver()
        self._in_flight = 0  # windows sent to Triton and not answered yet
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._probe: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Bind to the running loop; while the encoder is down, probe Triton until it serves the model."""
        self._connect()
        if not self.health.serving:
            self._start_probe()

    async def close(self) -> None:
        if self._probe is not None and not self._probe.done():
            self._probe.cancel()
            await asyncio.wait([self._probe])
        if self._client is not None and self._loop is asyncio.get_running_loop():
            await self._client.close()
        self._client = None

    def _connect(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            import tritonclient.grpc.aio as aioclient

            backoff_ms = int(self.config.triton_probe_interval_s * 1000)
            self._client = aioclient.InferenceServerClient(
                self.config.triton_url,
                channel_args=[
                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.initial_reconnect_backoff_ms", min(backoff_ms, 1000)),
                    ("grpc.max_reconnect_backoff_ms", backoff_ms),
                    ("grpc.keepalive_time_ms", 30_000),
                    ("grpc.keepalive_timeout_ms", 10_000),
                ],
            )
            self._loop = loop
        return self._client

    # ------------------------------------------------------------------ the WindowEncoder contract

    async def encode(self, windows: np.ndarray, deadline: float | None = None) -> np.ndarray:
        """(n, window_samples) float32 windows -> (n, embedding_size) float32 unit vectors, row for row.

        Raises Overloaded (this process has --max-queue-windows in flight, or Triton's queue is full),
        DeadlineExceeded, EncoderUnavailable; ValueError for a malformed stack (a bug upstream)."""
        windows = np.ascontiguousarray(windows, dtype=np.float32)
        width = self.manifest.window.window_samples
        if windows.ndim != 2 or windows.shape[1] != width:
            raise ValueError(f"expected (n, {width}) windows, got {windows.shape}")
        n = len(windows)
        if n == 0:
            return np.zeros((0, self.manifest.embedding_size), np.float32)
        if self._served is None or not self.health.serving:
            # Down: fail fast with the reason instead of queueing behind a dead connection; the probe (not
            # requests) decides when it is back, so a recovering Triton is not hit by every waiting RPC.
            self._start_probe()
            raise EncoderUnavailable(self._down_message(self.health.detail))
        loop = asyncio.get_running_loop()
        if deadline is not None and deadline <= loop.time():
            raise DeadlineExceeded("the request's deadline had passed before its windows were sent to Triton")
        # As the micro-batcher: a request larger than the whole bound is let in when nothing is in flight.
        if self._in_flight + n > self.max_queue_windows and self._in_flight > 0:
            self._observer.rejected()
            raise Overloaded(
                f"encoder {self.manifest.name}: {self._in_flight} windows already in flight to Triton "
                f"(limit {self.max_queue_windows}); retry with backoff"
            )
        size = self._served.max_batch_size
        self._in_flight += n
        self._observer.queue_depth(self._in_flight)
        try:
            if n <= size:
                return await self._infer(windows, deadline)
            parts = [asyncio.ensure_future(self._infer(windows[i : i + size], deadline)) for i in range(0, n, size)]
            try:
                return np.concatenate(await asyncio.gather(*parts))
            except BaseException:
                for p in parts:  # one part failed or the RPC was cancelled: the rest leave Triton too
                    p.cancel()
                await asyncio.gather(*parts, return_exceptions=True)
                raise
        finally:
            self._in_flight -= n
            self._observer.queue_depth(self._in_flight)

    async def _infer(self, windows: np.ndarray, deadline: float | None) -> np.ndarray:
        from tritonclient.grpc import InferInput, InferRequestedOutput
        from tritonclient.utils import InferenceServerException

        client = self._connect()
        loop = asyncio.get_running_loop()
        left = self.config.triton_call_timeout_s if deadline is None else deadline - loop.time()
        if left <= 0:
            raise DeadlineExceeded("the request's deadline passed before its windows were sent to Triton")
        tensor = InferInput(self.manifest.input_name, list(windows.shape), "FP32")
        tensor.set_data_from_numpy(windows)
        started = time.perf_counter()
        try:
            # timeout (microseconds): Triton drops the request from its queue once it expires, so a caller
            # that gave up costs no model time; client_timeout: the gRPC deadline of the call itself.
            result = await client.infer(
                self.model,
                [tensor],
                outputs=[InferRequestedOutput(self.manifest.output_name)],
                timeout=max(int(left * 1e6), 1),
                client_timeout=left,
            )
        except InferenceServerException as exc:
            self._observer.batch_failed(len(windows), 1)
            raise self._failure(exc) from None
        finally:
            self._observer.batch_executed(len(windows), 1, time.perf_counter() - started)
        out = result.as_numpy(self.manifest.output_name)
        expected = (len(windows), self.manifest.embedding_size)
        if out is None or out.shape != expected or out.dtype != np.float32 or not np.isfinite(out).all():
            shape = None if out is None else out.shape
            self._observer.batch_failed(len(windows), 1)
            raise self._down(f"Triton answered {shape} for {len(windows)} windows, expected {expected} finite FP32")
        return out

    # ------------------------------------------------------------------ failures and recovery

    def _failure(self, exc: Any) -> Exception:
        """A Triton error as the engine's kind of failure; only an outage or a broken model marks the
        encoder down (a deadline or a full queue says nothing about its health)."""
        status, message = exc.status() or "", exc.message() or str(exc)
        if status == "StatusCode.DEADLINE_EXCEEDED" or "timeout expired" in message.lower():
            return DeadlineExceeded(f"the deadline passed while encoder {self.manifest.name} waited for Triton")
        if status == "StatusCode.RESOURCE_EXHAUSTED" or "exceeds maximum queue size" in message.lower():
            self._observer.rejected()
            return Overloaded(f"encoder {self.manifest.name}: Triton's queue is full ({message}); retry with backoff")
        return self._down(f"{status.removeprefix('StatusCode.') or 'error'}: {message}")

    def _down(self, detail: str) -> EncoderUnavailable:
        if self.health.serving:
            logger.error("encoder %s is down: Triton at %s: %s", self.manifest.name, self.config.triton_url, detail)
        self.health.set(False, detail)
        self._start_probe()
        return EncoderUnavailable(self._down_message(detail))

    def _down_message(self, detail: str) -> str:
        return (
            f"encoder {self.manifest.name} is unavailable: its Triton server at {self.config.triton_url} "
            f"({detail}); retry later"
        )

    def _start_probe(self) -> None:
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._recover(), name=f"triton-probe-{self.model}")

    async def _recover(self) -> None:
        """Ask Triton every probe interval whether the model is ready; check it (the repository may have
        been replaced meanwhile) and mark the encoder serving again."""
        from tritonclient.utils import InferenceServerException

        interval = self.config.triton_probe_interval_s
        while not (self.health.serving and self._served is not None):
            client = self._connect()
            try:
                if await client.is_model_ready(self.model, client_timeout=interval):
                    response = await client.get_model_config(self.model, client_timeout=interval)
                    self._served = check_served_model(self.manifest, response.config, self.model)
                    self.health.set(True)
                    logger.info("encoder %s is back: Triton at %s serves %r", self.manifest.name,
                                self.config.triton_url, self.model)  # fmt: skip
                    return
                self.health.set(False, f"model {self.model!r} is not ready")
            except InferenceServerException as exc:
                self.health.set(False, f"{(exc.status() or '').removeprefix('StatusCode.')}: {exc.message()}")
            except ConfigError as exc:
                logger.error("encoder %s stays down: %s", self.manifest.name, exc)
                self.health.set(False, str(exc))
            await asyncio.sleep(interval)


def load_triton_encoder(
    manifest: EncoderManifest,
    config: EncoderBackendConfig,
    batcher: BatcherConfig,
    observer: BatchObserver | None = None,
) -> TritonEncoder:
    """The encoder of ``manifest`` on Triton, checked against the served model when Triton answers in time
    (ConfigError for a repository that does not match; needs the triton extra)."""
    try:
        served = check_at_start(manifest, config)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"--encoder-backend triton needs {exc.name!r}: pip install 'sleuthd[triton]' (tritonclient)"
        ) from None
    encoder = TritonEncoder(manifest, config, batcher, served, observer)
    logger.info("encoder %s on Triton at %s (model %r, %s)", manifest.name, config.triton_url, encoder.model,
                f"max {served.max_batch_size} windows per request" if served else "not reachable yet")  # fmt: skip
    return encoder
