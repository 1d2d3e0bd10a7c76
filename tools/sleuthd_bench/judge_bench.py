"""Judge throughput, the audio encoder's three ways side by side in one run (``sleuthd-bench judge bench``).

Prompts are detection prompts over synthetic voices (reference + one context turn + the turn, 3 s each by
default), so the numbers measure the model call, not the content; the encoder cache is off, so every call
encodes its distinct clips (batch + 2), as a stream of distinct dialogues would. Per batch size, one model
call per batch of prompts, timed in each mode:

- ``padded``: every clip padded to Whisper's 30 s window (3,000 mel frames, 1,500 encoder positions), 8
  clips per encoder pass: the judge before real-frame encoding;
- ``real, 8/pass``: the encoder on each clip's real frames, still 8 clips per pass;
- ``real``: real frames, clips batched by a frame budget (ENCODER_BATCH_FRAMES) into fewer passes — what
  the judge does now.

Modes alternate within each repeat, so load on a shared machine hits them alike; only the ratios mean much
there. ``encoder ms`` is the audio encoder's share of one model call. With ``--random-7b --device cuda``
the same is measured on Qwen2-Audio at the 7B checkpoint's sizes with random weights (a forward pass costs
the same whatever the weights' values), with the peak CUDA memory per mode.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sleuthd.lalm.audio_encoder import ENCODER_BATCH_FRAMES
from sleuthd.lalm.local import LocalModel
from sleuthd.lalm.prompts import detection
from sleuthd.lalm.tiny import synthetic_voice
from sleuthd.lalm.types import Clip

MODES = ("padded", "real, 8/pass", "real")


@dataclass(frozen=True)
class BenchRow:
    batch: int
    mode: str
    prompts_per_second: float
    encoder_ms_per_call: float  # the audio encoder's time in one model call (feature extraction included)
    encoder_passes_per_call: float
    padded_tokens: int  # language-model tokens per call: prompts × the longest prompt
    peak_memory_mb: float  # CUDA peak during the mode's calls; 0 on CPU


def _set_mode(model: LocalModel, mode: str, clip_frames: int) -> None:
    encoder = model.audio
    encoder.real_frames = mode != "padded"
    # 8 clips per pass: a frame budget of 8 clips of this length (3,000 frames each when padded).
    per_clip = 3000 if mode == "padded" else clip_frames
    encoder.batch_frames = 8 * per_clip if mode != "real" else ENCODER_BATCH_FRAMES


def measure(
    model: LocalModel,
    batches: Sequence[int] = (1, 2, 4, 8, 16, 32),
    repeats: int = 3,
    clip_seconds: float = 3.0,
    progress: Callable[[str], None] | None = None,
) -> list[BenchRow]:
    """prompts/s of a loaded judge per batch size and encoder mode (after one warm-up call per size and mode)."""
    import torch

    cuda = model.device.type == "cuda"
    n = max(batches)
    voices = [Clip.of(synthetic_voice(100.0 + 7 * i, clip_seconds, i)) for i in range(n + 2)]
    prepared = [model.prepare(detection(voices[i + 2], voices[0], [voices[1]])) for i in range(n)]
    model.audio.real_frames = True
    clip_frames = model.audio.log_mel(voices[0])[0].shape[1]  # a clip's encoder input on real frames
    encode = model.audio.encode
    spent = {"seconds": 0.0, "passes": 0}

    def timed_encode(clips: Sequence[Clip]) -> list[Any]:
        if cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        out = encode(clips)
        if cuda:
            torch.cuda.synchronize()
        spent["seconds"] += time.perf_counter() - started
        spent["passes"] += 1
        return out

    model.audio.encode = timed_encode  # type: ignore[method-assign]
    rows = []
    try:
        for size in batches:
            calls = [prepared[i : i + size] for i in range(0, n, size)]
            totals = {mode: [0.0, 0.0, 0, 0.0] for mode in MODES}  # seconds, encoder seconds, passes, peak MiB
            for mode in MODES:  # warm-up (kernels, allocator) in each mode
                _set_mode(model, mode, clip_frames)
                model.run(calls[0])
            for _ in range(repeats):
                for mode in MODES:
                    _set_mode(model, mode, clip_frames)
                    if cuda:
                        torch.cuda.synchronize()
                        torch.cuda.reset_peak_memory_stats()
                    spent["seconds"], spent["passes"] = 0.0, 0
                    started = time.perf_counter()
                    for call in calls:
                        model.run(call)
                    if cuda:
                        torch.cuda.synchronize()
                    t = totals[mode]
                    t[0] += time.perf_counter() - started
                    t[1] += spent["seconds"]
                    t[2] += spent["passes"]
                    t[3] = max(t[3], torch.cuda.max_memory_allocated() / 2**20 if cuda else 0.0)
            width = max(p.tokens for p in calls[0])
            for mode in MODES:
                seconds, enc, passes, peak = totals[mode]
                ncalls = repeats * len(calls)
                rate = repeats * n / seconds
                rows.append(BenchRow(size, mode, rate, 1000 * enc / ncalls, passes / ncalls, size * width, peak))
            if progress is not None:
                progress(f"batch {size}: done")
    finally:
        model.audio.encode = encode  # type: ignore[method-assign]
        _set_mode(model, "real", clip_frames)
    return rows


def table(rows: Sequence[BenchRow]) -> str:
    """One line per batch size: prompts/s per mode, the ratio to padded, encoder time per call."""
    by_batch: dict[int, dict[str, BenchRow]] = {}
    for r in rows:
        by_batch.setdefault(r.batch, {})[r.mode] = r
    head = (
        "batch  prompts/s: padded  real 8/pass  real  | real/padded | encoder ms/call: padded  real 8/pass  real"
        "  | passes/call padded real | LM tokens/call | peak CUDA MiB padded real"
    )
    lines = [head]
    for batch, modes in by_batch.items():
        p, r8, r = (modes[m] for m in MODES)
        lines.append(
            f"{batch:5d}  {p.prompts_per_second:17.2f}  {r8.prompts_per_second:11.2f}  {r.prompts_per_second:5.2f}  | "
            f"{r.prompts_per_second / p.prompts_per_second:10.2f}x | {p.encoder_ms_per_call:22.1f}  "
            f"{r8.encoder_ms_per_call:11.1f}  {r.encoder_ms_per_call:5.1f}  | {p.encoder_passes_per_call:11.1f} "
            f"{r.encoder_passes_per_call:4.1f} | {r.padded_tokens:14d} | "
            f"{p.peak_memory_mb:20.0f} {r.peak_memory_mb:4.0f}"
        )
    return "\n".join(lines)


def to_json(rows: Sequence[BenchRow], about: dict[str, Any]) -> dict[str, Any]:
    return {**about, "rows": [asdict(r) for r in rows]}
