"""Summarise screen.py's output: per manifest, discrimination top-1 accuracy and exact-match rate under three
orders of the same RankCandidates answers, and the paired differences from today's order with 95 % bootstrap
intervals over instances (2000 resamples):

- today: auto's score, the cosine to the context centroid;
- fit: the candidate's fit probability (the verdict CheckDialogue's auto gives it in the slot), ties by that cosine;
- tiers: candidates the gate would pass (fit status consistent) first, each tier by that cosine;
- tiers3: consistent, then uncertain, then inconsistent, each tier by that cosine (what is served).

    PYTHONPATH=service:tools:. python docs/research/ranking-fit/summarise.py OUT.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from sleuthd_bench.metrics import rank_candidates


def orders(row: dict) -> dict[str, list[str]]:
    labels, scores = row["labels"], row["scores"]
    fit = [f + 1e-6 * s for f, s in zip(row["fits"], scores, strict=True)]
    tiers = [(st == "consistent") + 0.5 * (1 + s) / 2 for st, s in zip(row["statuses"], scores, strict=True)]
    rank3 = {"consistent": 2, "uncertain": 1}
    tiers3 = [rank3.get(st, 0) + 0.5 * (1 + s) / 2 for st, s in zip(row["statuses"], scores, strict=True)]
    return {
        "today": rank_candidates(labels, scores, True),
        "fit": rank_candidates(labels, fit, True),
        "tiers": rank_candidates(labels, tiers, True),
        "tiers3": rank_candidates(labels, tiers3, True),
    }


def interval(d: np.ndarray, rng: np.random.Generator) -> str:
    boots = [d[rng.integers(0, len(d), len(d))].mean() * 100 for _ in range(2000)]
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return f"{d.mean() * 100:+.2f} [{lo:+.2f}, {hi:+.2f}]"


def main(path: str) -> None:
    rows = [json.loads(x) for x in Path(path).read_text().splitlines()]
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        stem = Path(r["manifest"]).stem
        name = stem.removeprefix("eval-").removeprefix("train-") + (" (train)" if stem.startswith("train-") else "")
        groups[name].append(r)
    print(
        "| manifest | n | top-1 acc today | fit: acc, Δ [95 % CI] | tiers: acc, Δ [95 % CI] | tiers3 = tiers "
        "| exact match today / fit / tiers |"
    )
    print("| :--- | ---: | ---: | :--- | :--- | :--- | :--- |")
    rng = np.random.default_rng(0)
    for name, rs in groups.items():
        o = [orders(r) for r in rs]
        top = {k: np.array([x[k][0] == "S1" for x in o], float) for k in ("today", "fit", "tiers")}
        same3 = sum(x["tiers3"] == x["tiers"] for x in o)
        exact = {k: np.mean([x[k] == ["S1", "S3", "S2"] for x in o]) * 100 for k in ("today", "fit", "tiers")}
        print(
            f"| {name} | {len(rs)} | {top['today'].mean() * 100:.1f} | {top['fit'].mean() * 100:.1f}, "
            f"{interval(top['fit'] - top['today'], rng)} | {top['tiers'].mean() * 100:.1f}, "
            f"{interval(top['tiers'] - top['today'], rng)} | {same3}/{len(o)} | {exact['today']:.1f} / {exact['fit']:.1f} / "
            f"{exact['tiers']:.1f} |"
        )


if __name__ == "__main__":
    main(sys.argv[1])
