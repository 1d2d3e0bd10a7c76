"""Paired comparison of two replay runs over the same dialogues: how sure is "A beats B"?

On a dev split of a couple of hundred dialogues one dialogue moves balanced detection accuracy by
about 0.3 points (an S1 instance counts twice as much as an S2 or S3 one), so a table of point
estimates cannot say whether a 0.3-point lead is a lead. This module gives the difference
``run − baseline`` in Bal accuracy and Bal localization F1 with a percentile bootstrap interval.

The resampling unit is the dialogue: its S1, S2 and S3 instances share every unaltered turn, so they
are not independent, and both runs are resampled with the same dialogues (paired), which cancels the
variation that comes from which dialogues happened to be drawn. Only dialogues that both runs
answered in all three scenarios take part; their number is reported.

Where dialogues share more than their own turns (the robustness matrix draws each voice's dialogues from a few
clips of that voice, so two dialogues of one voice carry mostly the same clips), ``groups`` names each dialogue's
cluster (its voice) and whole clusters are resampled instead: each resample draws as many clusters as there are,
with replacement, and weighs every dialogue by how often its cluster was drawn. The interval then says how sure
the difference is over voices, not over dialogues that repeat the same few clips.

Scale: differences and interval bounds are in percentage points (0–100 scale, like the report);
``p_ahead`` is the share of resamples (0–1) in which the run is strictly ahead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from sleuthd_bench.metrics import SCENARIOS, DetectionRecord, balanced, localization_prf

DEFAULT_RESAMPLES = 2000
DEFAULT_LEVEL = 0.95
#: Measures compared, with their report.json names: detection and localization, both balanced.
MEASURES = ("bal", "bal_f1")


@dataclass(frozen=True)
class Difference:
    """``run − baseline`` for one measure, in percentage points, with its bootstrap interval."""

    difference: float
    low: float
    high: float
    p_ahead: float  # share of resamples with run strictly ahead (0–1)


@dataclass(frozen=True)
class PairedComparison:
    run: str
    baseline: str
    n_dialogues: int  # dialogues both runs answered in S1, S2 and S3
    resamples: int
    seed: int
    level: float
    bal: Difference
    bal_f1: Difference
    # Per scenario: (instances only the run gets right, instances only the baseline gets right), detection.
    discordant: dict[str, tuple[int, int]]
    clusters: int = 0  # how many clusters were resampled (0: the dialogues themselves)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["discordant"] = {s: {"run_only": a, "baseline_only": b} for s, (a, b) in self.discordant.items()}
        return out


def _per_dialogue(records: Iterable[DetectionRecord]) -> dict[str, dict[str, tuple[float, float]]]:
    """dialogue_id -> scenario -> (detection correct 0/1, localization F1 0–1)."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for rec in records:
        f1 = localization_prf(rec.gold_turns, rec.pred_turns)[2]
        out.setdefault(rec.dialogue_id, {})[rec.scenario] = (float(rec.pred_inconsistent == rec.gold_inconsistent), f1)
    return out


def _balanced(per_scenario_means: np.ndarray) -> np.ndarray:
    """(..., 3) scenario means (0–1) -> (...) balanced value in percent."""
    m = per_scenario_means
    return 100.0 * balanced(m[..., 0], m[..., 1], m[..., 2])


def _difference(run: np.ndarray, base: np.ndarray, samples: np.ndarray, level: float) -> Difference:
    """run/base: (n, 3) per-dialogue values per scenario; samples: (R, n) resampled dialogue indices, or (R, n) float
    weights of the dialogues (clusters resampled)."""
    point = float(_balanced(run.mean(axis=0)) - _balanced(base.mean(axis=0)))
    if samples.dtype.kind == "f":
        total = samples.sum(axis=1, keepdims=True)
        boot = _balanced(samples @ run / total) - _balanced(samples @ base / total)
    else:
        boot = _balanced(run[samples].mean(axis=1)) - _balanced(base[samples].mean(axis=1))
    tail = 100.0 * (1.0 - level) / 2.0
    low, high = np.percentile(boot, [tail, 100.0 - tail])
    return Difference(point, float(low), float(high), float(np.mean(boot > 1e-12)))


def compare(
    run_name: str,
    run_records: Sequence[DetectionRecord],
    baseline_name: str,
    baseline_records: Sequence[DetectionRecord],
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    level: float = DEFAULT_LEVEL,
    groups: Mapping[str, str] | None = None,
) -> PairedComparison:
    """Paired bootstrap of ``run − baseline`` over the dialogues both answered in every scenario; with ``groups``
    (dialogue id -> cluster, e.g. its voice; every shared dialogue needs one), over those clusters.

    Raises ValueError when no dialogue is shared, one has no cluster, or the settings make no sense."""
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie between 0 and 1, got {level}")
    run_by, base_by = _per_dialogue(run_records), _per_dialogue(baseline_records)
    shared = sorted(
        d for d in run_by.keys() & base_by.keys() if all(s in run_by[d] and s in base_by[d] for s in SCENARIOS)
    )
    if not shared:
        raise ValueError(f"{run_name} and {baseline_name} share no dialogue answered in S1, S2 and S3")
    # (n, 3, 2): dialogue x scenario x (detection correct, localization F1)
    run = np.array([[run_by[d][s] for s in SCENARIOS] for d in shared], dtype=np.float64)
    base = np.array([[base_by[d][s] for s in SCENARIOS] for d in shared], dtype=np.float64)
    rng = np.random.default_rng(seed)
    clusters = 0
    samples: np.ndarray
    if groups is None:
        samples = rng.integers(0, len(shared), size=(resamples, len(shared)))
    else:
        missing = [d for d in shared if d not in groups]
        if missing:
            raise ValueError(f"no cluster for dialogue {missing[0]!r} ({len(missing)} in all)")
        names = sorted({groups[d] for d in shared})
        clusters = len(names)
        of = np.array([names.index(groups[d]) for d in shared])
        counts = np.zeros((resamples, clusters))
        np.add.at(counts, (np.arange(resamples)[:, None], rng.integers(0, clusters, size=(resamples, clusters))), 1.0)
        samples = counts[:, of]  # (R, n) float: each dialogue weighed by its cluster's draws
    right_run, right_base = run[:, :, 0] == 1.0, base[:, :, 0] == 1.0
    discordant: dict[str, tuple[int, int]] = {
        s: (int((right_run[:, k] & ~right_base[:, k]).sum()), int((right_base[:, k] & ~right_run[:, k]).sum()))
        for k, s in enumerate(SCENARIOS)
    }
    return PairedComparison(
        run=run_name,
        baseline=baseline_name,
        n_dialogues=len(shared),
        resamples=resamples,
        seed=seed,
        level=level,
        bal=_difference(run[:, :, 0], base[:, :, 0], samples, level),
        bal_f1=_difference(run[:, :, 1], base[:, :, 1], samples, level),
        discordant=discordant,
        clusters=clusters,
    )


def compare_with_all(
    records_by_run: Mapping[str, Sequence[DetectionRecord]],
    focus: str,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    level: float = DEFAULT_LEVEL,
    groups: Mapping[str, str] | None = None,
) -> list[PairedComparison]:
    """``focus`` against every other run, in the given order (each with the same resampled dialogues
    when the runs answered the same dialogues, because the generator restarts from ``seed``); ``groups``
    as in :func:`compare`."""
    if focus not in records_by_run:
        raise ValueError(f"no run named {focus!r}; runs: {', '.join(records_by_run)}")
    return [
        compare(focus, records_by_run[focus], name, records, resamples, seed, level, groups)
        for name, records in records_by_run.items()
        if name != focus
    ]


def detection_records(predictions: Iterable[Mapping[str, Any]]) -> dict[str, list[DetectionRecord]]:
    """Detection records by run from the rows of a replay's ``predictions.jsonl`` (the
    discrimination rows are skipped), in the order the runs first appear."""
    out: dict[str, list[DetectionRecord]] = {}
    for row in predictions:
        if row.get("scenario") not in SCENARIOS:
            continue
        out.setdefault(row["run"], []).append(
            DetectionRecord(
                dialogue_id=row["dialogue_id"],
                source=row["source"],
                scenario=row["scenario"],
                gold_turns=frozenset(row["gold_turns"]),
                pred_turns=frozenset(row["pred_turns"]),
                pred_inconsistent=row["pred_inconsistent"],
            )
        )
    return out


def _signed(value: float) -> str:
    return f"{value:+.2f}"


def markdown_table(comparisons: Sequence[PairedComparison]) -> str:
    """One row per baseline: the differences with their intervals and who gets which instances right."""
    if not comparisons:
        return ""
    first = comparisons[0]
    pct = f"{100 * first.level:g} %"
    lines = [
        f"| {first.run} vs | n | Δ Bal acc [{pct} CI] | P(ahead) | Δ Bal F1 [{pct} CI] | P(ahead) "
        f"| right only for {first.run} / only for the other: S1 · S2 · S3 |",
        "| :--- | ---: | ---: | ---: | ---: | ---: | :--- |",
    ]
    for c in comparisons:
        disc = " · ".join(f"{a}/{b}" for a, b in c.discordant.values())
        lines.append(
            f"| {c.baseline} | {c.n_dialogues} "
            f"| {_signed(c.bal.difference)} [{_signed(c.bal.low)}, {_signed(c.bal.high)}] | {c.bal.p_ahead:.2f} "
            f"| {_signed(c.bal_f1.difference)} [{_signed(c.bal_f1.low)}, {_signed(c.bal_f1.high)}] "
            f"| {c.bal_f1.p_ahead:.2f} | {disc} |"
        )
    return "\n".join(lines) + "\n"


def explanation(comparisons: Sequence[PairedComparison]) -> str:
    """The sentence that says how to read :func:`markdown_table`."""
    if not comparisons:
        return ""
    c = comparisons[0]
    unit = f"{c.clusters} clusters of dialogues, each drawn whole" if c.clusters else "dialogues"
    return (
        f"Paired bootstrap over {unit} ({c.resamples} resamples, seed {c.seed}; each dialogue's S1, S2 "
        f"and S3 instances are drawn together). Δ = {c.run} − the other run, in percentage points; "
        f"P(ahead) = share of resamples in which {c.run} is strictly ahead; the last column counts "
        "detection instances. An interval that contains 0 means this split cannot tell the two apart."
    )
