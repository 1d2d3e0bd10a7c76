"""Encoder figures on a CUDA machine: ONNX Runtime's CUDA execution provider against its CPU provider,
and the micro-batcher against no batching, in one run (numbers for the note, not a test).

    python scripts/gpu_encoders.py --models models --windows real_windows.npz --out gpu.json

1. Parity: every encoder's embeddings of real speech windows (``--windows``, from
   ``scripts/gpu_encoders.py --save-windows FILE`` on a machine with the dev data) on CUDA against CPU
   (cosine, min over windows).
2. Raw model rate: windows/s of ``OnnxEncoder.embed`` per batch size (1-256) on CUDA, and on the CPU at a
   few sizes; audio-s/s = windows/s / the manifest's window rate (windows per second of audio).
3. Serving path: ``--clients`` closed-loop asyncio clients, each sending one dialogue turn's windows
   (2-6 s of audio) at a time through the micro-batcher (the server's defaults, two model calls in flight
   as on a GPU), against the same clients with no batching (one window per model call, as many calls in
   flight as there are cores). The ratio batched/unbatched and serving/raw-best are printed.
Needs onnxruntime-gpu and NumPy only (the serving path's own imports); no audio decoding.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from sleuthd.config import BatcherConfig
from sleuthd.encoders.batcher import MicroBatcher
from sleuthd.encoders.manifest import load_encoder_manifest
from sleuthd.encoders.runner import OnnxEncoder
from sleuthd_bench.model_rate import windows_per_second


async def serve_rate(enc: OnnxEncoder, config: BatcherConfig, threads: int, clients: int, seconds: float) -> float:
    """Windows per second through the micro-batcher with ``clients`` closed-loop clients."""
    pool = ThreadPoolExecutor(max_workers=threads)
    batcher = MicroBatcher(enc, pool, config)
    spec = enc.manifest.window
    rng = np.random.default_rng(1)
    # A turn of 2-6 s: as many windows as the manifest's placement cuts from it.
    turns = [
        (0.1 * rng.standard_normal((max(1, round(s * spec.rate_per_second)), spec.window_samples))).astype(np.float32)
        for s in rng.uniform(2, 6, 64)
    ]
    done = 0
    stop = time.perf_counter() + seconds

    async def client(k: int) -> None:
        nonlocal done
        i = k
        while time.perf_counter() < stop:
            w = turns[i % len(turns)]
            await batcher.encode(w)
            done += len(w)
            i += clients

    await asyncio.gather(*(client(k) for k in range(clients)))  # warm-up round is part of the first second
    await batcher.close()
    pool.shutdown()
    return done / seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=Path("models"))
    ap.add_argument("--encoders", default="ge2e,campplus")
    ap.add_argument("--windows", type=Path, help="real speech windows for the parity check (.npz)")
    ap.add_argument("--save-windows", type=Path, help="write real windows from FSDD for --windows, then exit")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--cpu-batches", default="1,8,32")
    ap.add_argument("--seconds", type=float, default=1.5, help="timing budget per cell")
    ap.add_argument("--clients", default="1,32,128")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--device", default="cuda", help="cpu only to try the script on a machine without a GPU")
    args = ap.parse_args()
    names = args.encoders.split(",")
    manifests = {n: load_encoder_manifest(args.models / n) for n in names}
    if args.save_windows:
        return save_windows(manifests, args.save_windows)
    rng = np.random.default_rng(0)
    result: dict[str, dict[str, object]] = {}
    for name, manifest in manifests.items():
        gpu = OnnxEncoder(manifest, device=args.device, gpu_batch=0)  # raw: every batch size as it is
        served = OnnxEncoder(manifest, device=args.device)  # as the server loads it (batches padded to 64)
        unpadded = OnnxEncoder(manifest, device=args.device, gpu_batch=1)  # unbatched: one window per call
        cpu = OnnxEncoder(manifest, device="cpu")
        print(f"== {name}: providers {gpu.provider} / {cpu.provider}", flush=True)
        row: dict[str, object] = {"provider": gpu.provider}
        if args.windows:
            real = np.load(args.windows)[name]
            a, b = gpu.embed(real), cpu.embed(real)
            cos = (a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
            row["parity_min_cosine"] = float(cos.min())
            print(f"parity CUDA vs CPU on {len(real)} real windows: min cosine {cos.min():.7f}", flush=True)
        per_window = 1.0 / manifest.window.rate_per_second  # audio seconds per window
        cuda_rates = {b: windows_per_second(gpu, int(b), args.seconds, rng) for b in args.batches.split(",")}
        cpu_rates = {b: windows_per_second(cpu, int(b), args.seconds, rng) for b in args.cpu_batches.split(",")}
        print("batch  CUDA windows/s  CUDA audio-s/s  CPU windows/s", flush=True)
        for b, r in cuda_rates.items():
            c = f"{cpu_rates[b]:13.1f}" if b in cpu_rates else "            -"
            print(f"{b:>5}  {r:14.1f}  {r * per_window:14.1f}  {c}")
        row["cuda_windows_per_s"] = cuda_rates
        row["cpu_windows_per_s"] = cpu_rates
        best = max(cuda_rates.values())
        cpus = os.cpu_count() or 1
        serving: dict[str, dict[str, float]] = {}
        print("clients  batched w/s  unbatched w/s  batched/unbatched  batched/raw-best", flush=True)
        for c in (int(x) for x in args.clients.split(",")):
            batched = asyncio.run(serve_rate(served, BatcherConfig(max_concurrent_batches=2), 2, c, args.seconds * 2))
            unbatched = asyncio.run(
                serve_rate(unpadded, BatcherConfig(max_batch_windows=1, max_wait_ms=0, max_concurrent_batches=cpus),
                           cpus, c, args.seconds * 2)
            )  # fmt: skip
            serving[str(c)] = {"batched": batched, "unbatched": unbatched}
            print(f"{c:7d}  {batched:11.1f}  {unbatched:13.1f}  {batched / unbatched:17.2f}  {batched / best:16.2f}")
        row["serving_windows_per_s"] = serving
        row["audio_seconds_per_window"] = per_window
        result[name] = row
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


def save_windows(manifests: dict, out: Path, per_encoder: int = 16) -> int:
    """Real speech windows (FSDD takes joined per speaker) for the parity check on another machine."""
    import soundfile as sf
    from sleuthd.audio.decode import Waveform, to_model_rate
    from sleuthd.audio.windows import make_windows

    root = Path("/work/shared/data/fsdd/recordings")
    files = sorted(root.glob("*.wav"))[::37][:40]
    wave = np.concatenate([sf.read(f, dtype="float32")[0] for f in files])
    samples = to_model_rate(Waveform(wave, 8000)).samples
    arrays = {}
    for name, m in manifests.items():
        windows, _ = make_windows(samples, m.window)
        arrays[name] = windows[:: max(1, len(windows) // per_encoder)][:per_encoder]
    np.savez_compressed(out, **arrays)
    print({k: v.shape for k, v in arrays.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
