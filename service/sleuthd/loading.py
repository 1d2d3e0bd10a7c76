"""Loading what the engine serves: encoder runners behind the micro-batcher, the VAD, the worker pools.

The composition root shared by the server's engine and the public in-process API (sleuthd.api), so both
embed through exactly the same objects.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from sleuthd.admission import BoundedThreadPool
from sleuthd.batcher import MicroBatcher
from sleuthd.config import EngineConfig
from sleuthd.encoder import OnnxEncoder, PerClipEncoder, WindowEncoder
from sleuthd.manifest import ManifestError, find_encoders, load_encoder_manifest, vad_model_path
from sleuthd.observe import BatchObserver
from sleuthd.vad import EnergyVad, SileroVad, Vad

logger = logging.getLogger(__name__)


@dataclass
class LoadedModels:
    """Every encoder found in the models folder (by manifest name), the VAD and the thread pools."""

    encoders: dict[str, WindowEncoder]
    vad: Vad
    prep_pool: ThreadPoolExecutor  # decoding, resampling, VAD, windowing (a BoundedThreadPool when loaded here)
    model_pool: ThreadPoolExecutor  # model calls

    async def aclose(self) -> None:
        for encoder in self.encoders.values():
            if isinstance(encoder, MicroBatcher):
                await encoder.close()
        for pool in (self.prep_pool, self.model_pool):
            pool.shutdown(wait=True, cancel_futures=True)


def load_models(config: EngineConfig, observer: BatchObserver | None = None) -> LoadedModels:
    """Load and warm up every encoder manifest under ``config.models_dir`` and the VAD.

    Raises ManifestError when there is no encoder (the message says how to export one) or a manifest
    is broken, EngineFailure when the requested device is unavailable.
    """
    # Two pools, so model calls never queue behind a backlog of decoding/VAD jobs: with one shared FIFO
    # pool a batch ready to run would wait for every clip queued before it.
    cpus = os.cpu_count() or 1
    # The decode queue is bounded (a job beyond it fails its request with Overloaded at once): clips
    # waiting there hold their request's audio, and under overload they would wait past every deadline.
    prep_pool = BoundedThreadPool(
        config.workers or cpus, config.admission.max_queued_decodes, thread_name_prefix="prep"
    )
    batched = config.batching == "on"
    model_threads = config.batcher.max_concurrent_batches if batched else cpus
    model_pool = ThreadPoolExecutor(max_workers=model_threads, thread_name_prefix="model")
    try:
        vad: Vad = SileroVad(vad_model_path(config.models_dir)) if config.vad == "silero" else EnergyVad()
        encoders: dict[str, WindowEncoder] = {}
        for model_dir in find_encoders(config.models_dir):
            runner = OnnxEncoder(load_encoder_manifest(model_dir), device=config.device)
            runner.warm_up()
            if batched:
                encoders[runner.manifest.name] = MicroBatcher(runner, model_pool, config.batcher, observer)
            else:
                encoders[runner.manifest.name] = PerClipEncoder(runner, model_pool)
            logger.info("encoder %s on %s, batching %s", runner.manifest.name, runner.provider, config.batching)
        if not encoders:
            raise ManifestError(
                f"no encoder manifests under {config.models_dir}: run `sleuthd models export ge2e` "
                "(or point --models-dir / $SLEUTHD_MODELS_DIR at a folder that has them)"
            )
        if config.default_encoder not in encoders:
            raise ManifestError(
                f"default encoder {config.default_encoder!r} is not in {config.models_dir} "
                f"(found: {', '.join(sorted(encoders))})"
            )
    except BaseException:
        prep_pool.shutdown(wait=False)
        model_pool.shutdown(wait=False)
        raise
    return LoadedModels(encoders, vad, prep_pool, model_pool)
