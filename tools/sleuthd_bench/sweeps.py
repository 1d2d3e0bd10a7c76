"""Threshold sweeps over the per-turn paper scores returned by the server (the paper's Figure 7).

The server returns all three paper scores for every scored turn whatever method was asked for, so
one replay is enough to see how every method would do at every threshold. The grids suit GE2E,
whose cosines are non-negative and whose centroid distances stay small: cosine similarity
0.00-1.00 in steps of 0.01, cosine distance 0.00-0.60 in steps of 0.005.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sleuthd_bench.metrics import FlagRule, Scenario, best_threshold, threshold_sweep


@dataclass(frozen=True)
class SweepSpec:
    """How a method's per-turn score is read and swept."""

    score_field: str  # TurnVerdict field holding the score
    scale: str
    flag_if: FlagRule
    start: float
    stop: float
    step: float

    def grid(self) -> list[float]:
        n = round((self.stop - self.start) / self.step)
        # Rounded so that grid points print and compare as the decimals they stand for.
        return [round(self.start + i * self.step, 6) for i in range(n + 1)]


SWEEPS: Mapping[str, SweepSpec] = {
    "pairwise": SweepSpec("pairwise_mean_cosine", "cosine_similarity", "below", 0.0, 1.0, 0.01),
    "centroid": SweepSpec("centroid_cosine_distance", "cosine_distance", "above", 0.0, 0.6, 0.005),
    "reference": SweepSpec("reference_cosine", "cosine_similarity", "below", 0.0, 1.0, 0.01),
}


@dataclass(frozen=True)
class SweepInstance:
    """One detection instance's per-turn scores for every method (NaN = turn not scored)."""

    key: str  # unique per dialogue and scenario, e.g. "fit-espeak-m1-000/S2"
    scenario: Scenario
    gold: frozenset[int]
    scores: Mapping[str, Sequence[float]]  # score_field -> one value per turn


def sweep_method(method: str, instances: Sequence[SweepInstance]) -> dict[str, Any]:
    """The sweep of one method with its best thresholds by balanced accuracy and by balanced F1.

    Returns ``{"scale", "flag_if", "grid": {start, stop, step}, "best_by_bal": {threshold, bal,
    bal_f1}, "best_by_bal_f1": {...}, "curve": [{threshold, bal, bal_f1}, ...]}`` (percentages at
    full precision). Raises ``ValueError`` when a scenario has no instance.
    """
    spec = SWEEPS[method]
    curve = threshold_sweep(
        {i.key: i.scores[spec.score_field] for i in instances},
        {i.key: i.scenario for i in instances},
        {i.key: i.gold for i in instances},
        spec.grid(),
        spec.flag_if,
    )
    by_tau = {entry["threshold"]: entry for entry in curve}
    best = {key: by_tau[best_threshold(curve, key)] for key in ("bal", "bal_f1")}
    return {
        "scale": spec.scale,
        "flag_if": spec.flag_if,
        "grid": {"start": spec.start, "stop": spec.stop, "step": spec.step},
        "best_by_bal": dict(best["bal"]),
        "best_by_bal_f1": dict(best["bal_f1"]),
        "curve": curve,
    }


def best_table(sweeps: Mapping[str, Mapping[str, Any]], marks: Mapping[str, Mapping[str, float]]) -> str:
    """Markdown table of the best thresholds per method, next to named reference thresholds.

    ``marks`` maps a label (``"paper"``, ``"default"``) to thresholds by method.
    """
    labels = list(marks)
    header = ["Method", "Scale", "Best τ by Bal acc", "Bal acc (%)", "Best τ by Bal F1", "Bal F1 (%)"]
    header += [f"{label} τ" for label in labels]
    rows = ["| " + " | ".join(header) + " |", "| " + " | ".join([":---", ":---"] + ["---:"] * (len(header) - 2)) + " |"]
    for method, sweep in sweeps.items():
        acc, f1 = sweep["best_by_bal"], sweep["best_by_bal_f1"]
        cells = [
            method,
            str(sweep["scale"]).replace("_", " "),
            f"{acc['threshold']:g}",
            f"{acc['bal']:.1f}",
            f"{f1['threshold']:g}",
            f"{f1['bal_f1']:.1f}",
        ]
        cells += [f"{marks[label][method]:g}" if method in marks[label] else "–" for label in labels]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def held_out(
    method: str, instances: Sequence[SweepInstance], speakers: Mapping[str, str], splits: int = 20, seed: int = 0
) -> dict[str, Any] | None:
    """How the best threshold by balanced accuracy carries to speakers it was not chosen on.

    ``speakers`` maps an instance key to its target speaker. Over ``splits`` seeded random halvings of the speakers,
    the threshold is chosen on one half (as :func:`sweep_method` chooses it) and balanced accuracy is measured at it
    on the other half, beside that half's own best. The sweep over all instances is a maximum in hindsight; the gap
    between the two is how much of it a threshold tuned on other speakers keeps. None with fewer than 4 speakers.

    Returns ``{"speakers", "splits", "threshold": {"low", "high"}, "bal": {"mean", "low", "high"}, "own_best_bal"}``:
    the chosen thresholds' range, the held-out balanced accuracy's mean and 2.5-97.5 percentiles over the halvings,
    and the mean of the held-out halves' own best balanced accuracy (percent, full precision). A halving whose half
    lacks a scenario is skipped.
    """
    names = sorted(set(speakers[i.key] for i in instances))
    if len(names) < 4:
        return None
    rng = np.random.default_rng(seed)
    taus, held, own = [], [], []
    for _ in range(splits):
        order = rng.permutation(len(names))
        chosen_on = {names[k] for k in order[: len(names) // 2]}
        a = [i for i in instances if speakers[i.key] in chosen_on]
        b = [i for i in instances if speakers[i.key] not in chosen_on]
        try:
            tau = sweep_method(method, a)["best_by_bal"]["threshold"]
            other = sweep_method(method, b)
        except ValueError:
            continue
        taus.append(tau)
        held.append(next(e["bal"] for e in other["curve"] if e["threshold"] == tau))
        own.append(other["best_by_bal"]["bal"])
    if not held:
        return None
    return {
        "speakers": len(names),
        "splits": len(held),
        "threshold": {"low": min(taus), "high": max(taus)},
        "bal": {
            "mean": float(np.mean(held)),
            "low": float(np.percentile(held, 2.5)),
            "high": float(np.percentile(held, 97.5)),
        },
        "own_best_bal": float(np.mean(own)),
    }


def held_out_table(sweeps: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown table of each method's :func:`held_out` entry (``sweeps[method]["held_out"]``), or "" when none."""
    rows = [
        "| Method | τ chosen on half the speakers | Bal acc on the other half (%): mean [2.5-97.5 %] "
        "| that half's own best Bal acc (%) | speakers, halvings |",
        "| :--- | :--- | :--- | ---: | :--- |",
    ]
    for method, sweep in sweeps.items():
        h = sweep.get("held_out")
        if not h:
            continue
        tau = h["threshold"]
        span = f"{tau['low']:g}" if tau["low"] == tau["high"] else f"{tau['low']:g}-{tau['high']:g}"
        rows.append(
            f"| {method} | {span} | {h['bal']['mean']:.1f} [{h['bal']['low']:.1f}, {h['bal']['high']:.1f}] "
            f"| {h['own_best_bal']:.1f} | {h['speakers']}, {h['splits']} |"
        )
    return "\n".join(rows) + "\n" if len(rows) > 2 else ""
