"""How well `auto`'s probabilities behave like probabilities: reliability table and calibration error.

Input: per-turn (probability that the turn does not belong, whether it really was replaced) pairs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

BINS = 10


def expected_calibration_error(p: np.ndarray, y: np.ndarray, bins: int = BINS) -> float:
    """Mean |observed rate - mean predicted probability| over equal-width bins, weighted by bin size."""
    table = reliability_table(p, y, bins)
    return float(sum(row["count"] * abs(row["observed"] - row["predicted"]) for row in table) / max(len(p), 1))


def reliability_table(p: np.ndarray, y: np.ndarray, bins: int = BINS) -> list[dict[str, float]]:
    """Per non-empty bin of predicted probability: bounds, count, mean predicted and observed rate."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    idx = np.clip(np.digitize(p, edges[1:-1]), 0, bins - 1)
    rows = []
    for b in range(bins):
        m = idx == b
        if m.any():
            rows.append(
                {
                    "low": float(edges[b]),
                    "high": float(edges[b + 1]),
                    "count": float(m.sum()),
                    "predicted": float(p[m].mean()),
                    "observed": float(y[m].mean()),
                }
            )
    return rows


def turn_pairs(predictions: Iterable[Mapping[str, Any]], run: str = "auto") -> tuple[np.ndarray, np.ndarray]:
    """(probabilities, labels) of every scored turn of ``run`` in replay predictions."""
    probs: list[float] = []
    labels: list[float] = []
    for rec in predictions:
        if rec.get("run") != run or "turns" not in rec:
            continue
        gold = set(rec.get("gold_turns", []))
        for k, turn in enumerate(rec["turns"]):
            if turn.get("score") is not None:
                probs.append(float(turn["score"]))
                labels.append(1.0 if k in gold else 0.0)
    return np.array(probs), np.array(labels)


def summary(p: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    return {
        "turns": len(p),
        "inconsistent_share": round(float(y.mean()), 4) if len(y) else None,
        "ece": round(expected_calibration_error(p, y), 4),
        "brier": round(float(np.mean((p - y) ** 2)), 4) if len(p) else None,
        "bins": reliability_table(p, y),
    }
