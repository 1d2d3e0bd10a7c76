"""Per-encoder batch caps on the CPU (a card's batching.cpu_max_batch_windows) and the server's own size."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

from sleuthd.config import BatcherConfig, EngineConfig
from sleuthd.encoders.batcher import MicroBatcher
from sleuthd.engine.loading import encoder_batcher_config, load_models


def test_campplus_is_capped_on_the_cpu_and_ge2e_is_not(models_dir: Path) -> None:
    models = load_models(EngineConfig(models_dir=models_dir, device="cpu"))
    try:
        campplus, ge2e = models.encoders["campplus"], models.encoders["ge2e"]
        assert isinstance(campplus, MicroBatcher) and isinstance(ge2e, MicroBatcher)
        assert campplus.config.max_batch_windows == 8  # models/campplus card: batching.cpu_max_batch_windows
        assert ge2e.config.max_batch_windows == BatcherConfig().max_batch_windows == 64
        # Each encoder's calls run on threads of their own: a fused request's GE2E batch never waits behind a
        # CAM++ call (one shared thread made it wait; issue 30), and each batcher keeps its own concurrency.
        assert models.model_pool._max_workers == 2 * BatcherConfig().max_concurrent_batches
        assert campplus.config.max_concurrent_batches == ge2e.config.max_concurrent_batches == 1
    finally:
        models.prep_pool.shutdown()
        models.model_pool.shutdown()


def test_the_cap_never_raises_the_size_and_gpus_keep_theirs() -> None:
    card = {"batching": {"cpu_max_batch_windows": 8}}
    manifest = SimpleNamespace(raw=card)
    small = BatcherConfig(max_batch_windows=4)
    cpu = SimpleNamespace(manifest=manifest, provider="CPUExecutionProvider")
    gpu = SimpleNamespace(manifest=manifest, provider="CUDAExecutionProvider")
    assert encoder_batcher_config(small, cpu) is small  # type: ignore[arg-type]
    assert encoder_batcher_config(BatcherConfig(), gpu).max_batch_windows == 64  # type: ignore[arg-type]
    assert encoder_batcher_config(BatcherConfig(), cpu) == dataclasses.replace(BatcherConfig(), max_batch_windows=8)  # type: ignore[arg-type]
