"""Loading what the engine serves: encoder runners behind the micro-batcher, the VAD, the worker pools,
and the voice registry's store.

The composition root shared by the server's engine and the public in-process API (sleuthd.api), so both
embed through exactly the same objects.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sleuthd.audio.decode import AudioProbe
from sleuthd.audio.vad import EnergyVad, SileroVad, Vad
from sleuthd.config import BatcherConfig, EngineConfig, JudgeConfig, RegistryConfig
from sleuthd.encoders.batcher import MicroBatcher
from sleuthd.encoders.fusion import FUSED, load_fusion
from sleuthd.encoders.manifest import ManifestError, find_encoders, load_encoder_manifest, vad_model_path
from sleuthd.encoders.runner import OnnxEncoder, PerClipEncoder, WindowEncoder
from sleuthd.encoders.triton import TritonEncoder, load_triton_encoder
from sleuthd.engine.admission import BoundedThreadPool
from sleuthd.ops.observe import EngineObserver
from sleuthd.registry.open import open_store
from sleuthd.registry.store import VoiceStore
from sleuthd.threads import start_threads

if TYPE_CHECKING:
    from sleuthd.lalm.judge import LalmJudge
    from sleuthd.ops.observe import JudgeObserver

logger = logging.getLogger(__name__)


@dataclass
class LoadedModels:
    """Every encoder found in the models folder (by manifest name), the VAD and the thread pools."""

    encoders: dict[str, WindowEncoder]
    vad: Vad
    prep_pool: ThreadPoolExecutor  # decoding, resampling, VAD, windowing (a BoundedThreadPool when loaded here)
    model_pool: ThreadPoolExecutor  # model calls
    probe_pool: ThreadPoolExecutor  # reading clips' headers before admission (a BoundedThreadPool when loaded here)
    default_encoder: str  # what a request that names no encoder gets (``--encoder``, ``auto`` resolved)
    # Seconds of model time one second of audio costs, by encoder (the fusion: its components' sum), timed
    # at load; what admission estimates a request's embedding by (sleuthd.engine.admission.WorkQueue).
    audio_cost: dict[str, float] = dataclasses.field(default_factory=dict)
    runners: list[OnnxEncoder] = dataclasses.field(default_factory=list)  # the ONNX sessions behind the encoders

    def shrink_arenas(self) -> None:
        """Give back what the encoders' ONNX Runtime CPU arenas hold beyond their use now (on an idle server)."""
        for runner in self.runners:
            runner.shrink_arena()

    def seconds_of_work(self, encoder: str, probes: Sequence[AudioProbe], placements: int = 1) -> float:
        """Estimated seconds of work for clips with these headers under ``encoder`` (and ``placements``
        window placements each): decoding on the prep threads plus the model's time for their audio."""
        per_audio_second = self.audio_cost.get(encoder, max(self.audio_cost.values(), default=0.0))
        threads = max(1, self.prep_pool._max_workers)  # the decode threads work side by side
        return sum(p.decode_seconds / threads + p.seconds * per_audio_second * placements for p in probes)

    async def start(self) -> None:
        """In the server's event loop: encoders on Triton connect (and probe while Triton is down)."""
        for encoder in self.encoders.values():
            if isinstance(encoder, TritonEncoder):
                await encoder.start()

    async def aclose(self) -> None:
        for encoder in self.encoders.values():
            if isinstance(encoder, MicroBatcher | TritonEncoder):
                await encoder.close()
        for pool in (self.prep_pool, self.model_pool, self.probe_pool):
            pool.shutdown(wait=True, cancel_futures=True)


def load_models(config: EngineConfig, observer: EngineObserver | None = None) -> LoadedModels:
    """Load and warm up every encoder manifest under ``config.models_dir`` and the VAD.

    Raises ManifestError when there is no encoder (the message says how to export one) or a manifest
    is broken, EngineFailure when the requested device is unavailable.
    """
    # Two pools, so model calls never queue behind a backlog of decoding/VAD jobs: with one shared FIFO
    # pool a batch ready to run would wait for every clip queued before it.
    cpus = os.cpu_count() or 1
    model_dirs = find_encoders(config.models_dir)
    # The decode queue is bounded (a job beyond it fails its request with Overloaded at once): clips
    # waiting there hold their request's audio, and under overload they would wait past every deadline.
    prep_pool = BoundedThreadPool(
        config.workers or cpus, config.admission.max_queued_decodes, thread_name_prefix="prep"
    )
    batched = config.batching == "on"
    # Each encoder's batcher runs up to max_concurrent_batches calls, on threads of its own: with one thread
    # shared by all, a fused request's GE2E batch waited behind CAM++'s (4-8x longer) call. Requests that name
    # one encoder get exactly the concurrency they had. Measured on 2 cores: docs/serving.md, "Threads".
    model_threads = config.batcher.max_concurrent_batches * max(len(model_dirs), 1) if batched else cpus
    model_pool = ThreadPoolExecutor(max_workers=model_threads, thread_name_prefix="model")
    # Headers are read before admission on a thread of their own: under overload most requests whose headers
    # are read are then refused, and in the decode pool their reads would queue ahead of admitted work.
    probe_pool = BoundedThreadPool(1, config.admission.max_queued_decodes, thread_name_prefix="probe")
    try:
        # Decoding and model threads start now, at the loading thread's priority, above the serving loop's
        # (sleuthd.threads); the probe pool reads headers for the intake and starts, lazily, at its priority.
        for pool in (prep_pool, model_pool):
            start_threads(pool)
        vad: Vad = SileroVad(vad_model_path(config.models_dir)) if config.vad == "silero" else EnergyVad()
        encoders: dict[str, WindowEncoder] = {}
        audio_cost: dict[str, float] = {}
        runners: list[OnnxEncoder] = []
        for model_dir in model_dirs:
            manifest = load_encoder_manifest(model_dir)
            if config.backend.encoder_backend == "triton":  # Triton batches across replicas: no batcher here
                watch = observer.batcher(manifest.name) if observer is not None else None
                encoders[manifest.name] = load_triton_encoder(manifest, config.backend, config.batcher, watch)
                continue
            runner = OnnxEncoder(
                manifest,
                device=config.device,
                intra_op_threads=config.intra_op_threads,
                gpu_batch=config.batcher.max_batch_windows,
                gpu_light_batch=config.batcher.gpu_light_windows,
            )
            runner.warm_up()
            audio_cost[runner.manifest.name] = model_seconds_per_audio_second(runner)
            runners.append(runner)
            if batched:
                batcher_config = encoder_batcher_config(config.batcher, runner)
                watch = observer.batcher(runner.manifest.name) if observer is not None else None
                encoders[runner.manifest.name] = MicroBatcher(runner, model_pool, batcher_config, watch)
            else:
                encoders[runner.manifest.name] = PerClipEncoder(runner, model_pool)
            logger.info("encoder %s on %s, batching %s", runner.manifest.name, runner.provider, config.batching)
        fused = load_fusion(encoders)
        if fused is not None:
            encoders[FUSED] = fused
            if all(name in audio_cost for name in fused.component_names):  # Triton's model time is not ours
                audio_cost[FUSED] = sum(audio_cost[name] for name in fused.component_names)
            logger.info("encoder fused = %s", " + ".join(fused.component_names))
        if not encoders:
            raise ManifestError(
                f"no encoder manifests under {config.models_dir}: run `sleuthd models export all --models-dir "
                f"{config.models_dir}` (`make models` in a checkout), or point --models-dir / $SLEUTHD_MODELS_DIR at "
                "a folder that has them"
            )
        default = pick_default_encoder(encoders) if config.default_encoder == "auto" else config.default_encoder
        if default not in encoders:
            raise ManifestError(
                f"default encoder {config.default_encoder!r} is not in {config.models_dir} "
                f"(found: {', '.join(sorted(encoders))})"
            )
    except BaseException:
        for pool in (prep_pool, model_pool, probe_pool):
            pool.shutdown(wait=False)
        raise
    logger.info("model seconds per audio second: %s", ", ".join(f"{k} {v:.4f}" for k, v in sorted(audio_cost.items())))
    return LoadedModels(encoders, vad, prep_pool, model_pool, probe_pool, default, audio_cost, runners)


def model_seconds_per_audio_second(runner: OnnxEncoder, windows: int = 4, tries: int = 3) -> float:
    """Seconds one model call spends per second of audio (the best of ``tries`` calls of ``windows``
    windows, times the windows an audio second makes): the encoder's relative cost, for admission."""
    batch = np.zeros((windows, runner.manifest.window.window_samples), np.float32)
    best = float("inf")
    for _ in range(tries):
        started = time.perf_counter()
        runner.embed(batch)
        best = min(best, time.perf_counter() - started)
    return best / windows * runner.manifest.window.rate_per_second


def encoder_batcher_config(config: BatcherConfig, runner: OnnxEncoder) -> BatcherConfig:
    """The micro-batcher's settings for one encoder: on the CPU, a card may cap the batch below
    ``--max-batch-windows`` where bigger calls are slower per window (CAM++: compute-bound convolutions,
    measured in its card's ``batching.how``). GPUs keep the configured size."""
    cap = runner.manifest.raw.get("batching", {}).get("cpu_max_batch_windows")
    if cap is None or runner.provider != "CPUExecutionProvider" or cap >= config.max_batch_windows:
        return config
    return dataclasses.replace(config, max_batch_windows=int(cap))


# `--encoder auto` picks the first of these that is loaded: the fusion when GE2E and CAM++ are both there,
# chosen by the dev benchmark's real-speech split (docs/encoders.md, "Fusion").
DEFAULT_PREFERENCE = (FUSED, "ge2e")


def pick_default_encoder(encoders: Mapping[str, WindowEncoder]) -> str:
    """The encoder a request that names none gets under ``--encoder auto``."""
    for name in DEFAULT_PREFERENCE:
        if name in encoders:
            return name
    return sorted(encoders)[0]


def open_registry(config: RegistryConfig) -> VoiceStore | None:
    """The voice store ``--registry`` names (None when it names none), its tables created on first use.

    Raises ConfigError for a location that cannot work (no such folder, not a SQLite file, an unknown
    scheme, PostgreSQL without the postgres extra) and RegistryUnavailable (an EngineFailure) when the
    database does not answer: both end ``sleuthd serve`` with one line.
    """
    store = open_store(config)
    if store is not None:
        logger.info("voice registry: %s, %d voices", store.backend, store.count())
    return store


async def start_judge(config: JudgeConfig, observer: JudgeObserver | None = None) -> LalmJudge | None:
    """The LALM judge ``config`` names (None when it names none), ready to serve.

    The weights load on a thread (minutes for a 7B model; the server answers health checks with
    NOT_SERVING meanwhile); a remote judge must list its model at ``/models``; both must pass the judge's
    self-test (sleuthd.lalm.selftest). torch, transformers and httpx are imported only here, and only for the
    backend configured. Raises ConfigError when the judge cannot work (a missing extra, an unsupported
    folder, a calibration for other weights, a remote that does not serve the model or renders no audio
    placeholder, a self-test answer under the answer-mass floor), which ends ``sleuthd serve`` with one line.
    """
    if not config.enabled:
        return None
    from sleuthd.lalm.judge import load_judge

    judge = await asyncio.to_thread(load_judge, config, observer)
    try:
        found = await judge.start()  # a remote one lists its model; both answer a self-test prompt
    except BaseException:
        await judge.aclose()
        raise
    info = judge.info
    logger.info(
        "LALM judge %s (%s, %s %s), %s, answer-mass floor %.2f; self-test: %s",
        info.model_name,
        info.backend,
        info.device,
        info.dtype or "-",
        "calibrated" if info.calibrated_detection else "uncalibrated",
        info.min_answer_mass,
        found,
    )
    return judge
