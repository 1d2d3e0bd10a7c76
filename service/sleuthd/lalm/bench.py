"""Judge throughput at several batch sizes, measured side by side in one run (``python -m sleuthd.lalm bench``).

Prompts are detection prompts over synthetic voices (reference + one context turn + the turn, 3 s each),
so the numbers measure the model call, not the content. Each batch size runs the same prompts; the encoder
cache is off so every call encodes its clips, as a stream of distinct dialogues would.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sleuthd.lalm import prompts
from sleuthd.lalm.local import LocalModel
from sleuthd.lalm.tiny import synthetic_voice
from sleuthd.lalm.types import Clip


@dataclass(frozen=True)
class BenchRow:
    batch: int
    prompts_per_second: float
    padded_tokens: int  # per call
    peak_memory_mb: float  # CUDA peak during the calls; 0 on CPU


def throughput(
    folder: Path,
    device: str = "auto",
    dtype: str = "auto",
    batches: Sequence[int] = (1, 2, 4, 8, 16, 32),
    repeats: int = 3,
) -> list[BenchRow]:
    """prompts/s of ``folder``'s model per batch size (after one warm-up call per size)."""
    model = LocalModel.load(folder, device=device, dtype=dtype, encoder_cache_entries=0)
    return model_throughput(model, batches, repeats)


def model_throughput(
    model: LocalModel, batches: Sequence[int] = (1, 2, 4, 8, 16, 32), repeats: int = 3
) -> list[BenchRow]:
    """prompts/s of a loaded judge per batch size (after one warm-up call per size)."""
    import torch

    n = max(batches)
    voices = [Clip.of(synthetic_voice(100.0 + 7 * i, 3.0, i)) for i in range(n + 2)]
    batch = [model.prepare(prompts.detection(voices[i + 2], voices[0], [voices[1]])) for i in range(n)]
    rows = []
    for size in batches:
        calls = [batch[i : i + size] for i in range(0, n, size)]
        model.run(calls[0])  # warm-up (kernels, allocator)
        if model.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        for _ in range(repeats):
            for call in calls:
                model.run(call)
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        peak = torch.cuda.max_memory_allocated() / 2**20 if model.device.type == "cuda" else 0.0
        width = max(p.tokens for p in calls[0])
        rows.append(BenchRow(size, repeats * n / seconds, size * width, peak))
    return rows
