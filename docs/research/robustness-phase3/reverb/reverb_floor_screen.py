"""Screen 6 (2026-11-27, session 20): telling a reverberant tail from a noise floor in the SNR estimate.

Noise matching (sleuthd.audio.noise) reads the mean of a clip's quietest tenth of 20 ms frames as its noise. Under
stationary noise those frames sit on a flat floor; under reverberation they are decaying tails after words, whose
powers spread over many dB. The rule screened: a clip whose quietest tenth spreads by more than F dB (its 90th
percentile over its 10th) counts as clean (SNR at the cap), so a reverberant clip neither triggers noise matching
nor lends its "noise" to copies. For each F, a variant of the matrix's cache whose SNRs follow the rule
(``<base>-reverbfloor-<F>``, sharing the base's audio and embeddings; the noisy copies of new targets embedded by
``sleuthd-bench robustness embed --clipped``), judged as the server judges (fused `auto`, band, clip and noise
matching at their defaults) against the served judgment, split by split and condition by condition, paired.
Run from the repository root:

    PYTHONPATH=service:tools:.:scripts python docs/research/robustness-phase3/reverb/reverb_floor_screen.py SPLIT F[,F...]
"""
import subprocess
import sys
from pathlib import Path

import numpy as np
from sleuthd.audio import noise
from sleuthd.domain import AudioInput
from sleuthd.encoders.clips import decode
from sleuthd_bench import paired
from sleuthd_bench.robustness import embed, judges

from campplus_dev_gate import judge  # scripts/

BASE = Path("data/robustness")


def floor_spread_db(samples: np.ndarray) -> float:
    """The spread in dB of the quietest tenth of a clip's live 20 ms frames (90th percentile over 10th)."""
    e = noise._frame_powers(samples)
    speech = e[len(e) // 2 :].mean()
    live = e[e > speech * noise.SILENCE]
    q = live[: max(1, len(live) // noise.QUIET_PARTS)]
    lo, hi = q[len(q) // 10], q[min(len(q) - 1, 9 * len(q) // 10)]
    return float(10 * np.log10(max(hi, 1e-30) / max(lo, 1e-30)))


def variant(floor_db: float) -> Path:
    out = BASE.with_name(f"{BASE.name}-reverbfloor-{floor_db:g}")
    out.mkdir(exist_ok=True)
    for entry in BASE.iterdir():
        if entry.name not in (embed.NARROW, embed.CLIPPED) and not (out / entry.name).exists():
            (out / entry.name).symlink_to(entry.resolve())
    (out / embed.NARROW).mkdir(exist_ok=True)
    if not (out / embed.NARROW / "emb").exists():
        (out / embed.NARROW / "emb").symlink_to((BASE / embed.NARROW / "emb").resolve())
    if not embed.cache_path(out / embed.CLIPPED, "campplus").is_file():
        (out / embed.CLIPPED / "emb").mkdir(parents=True, exist_ok=True)
        for e in embed.ENCODERS:
            embed.cache_path(out / embed.CLIPPED, e).write_bytes(embed.cache_path(BASE / embed.CLIPPED, e).read_bytes())
    if not embed.bandwidth_path(out).is_file():
        with np.load(embed.bandwidth_path(BASE)) as z:
            arrays = {k: z[k].copy() for k in z.files}
        snr = arrays["snr"]
        changed = 0
        for k, p in enumerate(arrays["paths"]):
            if np.isfinite(snr[k]) and snr[k] < noise.CAP_DB:
                spread = floor_spread_db(decode(AudioInput((BASE / str(p)).read_bytes()), embed.MAX_SECONDS).samples)
                if spread > floor_db:
                    snr[k] = noise.CAP_DB
                    changed += 1
        np.savez(embed.bandwidth_path(out), **arrays)
        print(f"F {floor_db:g} dB: {changed} of {int(np.sum(np.isfinite(snr)))} clips now count as clean", flush=True)
    return out


def main() -> int:
    split, floors = sys.argv[1], [float(x) for x in sys.argv[2].split(",")]
    conditions = sorted(f.name.removeprefix(f"{split}-").removesuffix(".jsonl") for f in BASE.glob(f"{split}-*.jsonl"))
    base = judge(BASE, Path("models"), conditions, split)
    for floor_db in floors:
        out = variant(floor_db)
        subprocess.run(
            [str(Path(sys.executable).parent / "sleuthd-bench"), "robustness", "embed", "--clipped", "--split", split, "--out", str(out), "--quiet"],
            check=True,
        )
        got = judge(out, Path("models"), conditions, split)
        print(f"\n{split}, F = {floor_db:g} dB\n| condition | served Bal (S1/S2/S3) | rule | Δ Bal [95 % CI] |")
        print("| :--- | :--- | :--- | :--- |")
        means = []
        for c in conditions:
            a, b = judges.metrics(base[c]), judges.metrics(got[c])
            means.append((a["bal"], b["bal"]))
            if a == b:
                continue
            d = paired.compare("rule", got[c], "served", base[c], resamples=2000).bal
            print(f"| {c} | {a['bal']:.1f} ({a['S1']:.0f}/{a['S2']:.0f}/{a['S3']:.0f}) | {b['bal']:.1f} "
                  f"({b['S1']:.0f}/{b['S2']:.0f}/{b['S3']:.0f}) | {d.difference:+.1f} [{d.low:+.1f}, {d.high:+.1f}] |")
        m = np.array(means).mean(axis=0)
        print(f"(the other conditions: identical) mean Bal over {len(conditions)}: {m[0]:.2f} -> {m[1]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
