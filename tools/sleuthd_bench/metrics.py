"""Pure metric functions for the SpeakerSleuth-style benchmark (no I/O).

The definitions follow ``docs/benchmark-format.md`` and Appendix B.3 of the
SpeakerSleuth paper (Lee et al., ACL 2026).

Scales
------
* Per-instance helpers (:func:`localization_prf`, :func:`dcg_at_k`,
  :func:`ndcg_at_k`) return plain fractions (precision/recall/F1/NDCG in
  ``[0, 1]``; DCG is an unnormalised sum).
* Aggregate helpers (:func:`detection_metrics`, :func:`localization_metrics`,
  :func:`discrimination_metrics`, :func:`threshold_sweep`) return percentages
  in ``[0, 100]`` at full float precision.
* Only :func:`method_report` rounds, to one decimal, when it builds the
  per-method object of ``report.json`` (see :func:`round_pct`).

Scores used by the embedding methods are cosine similarities (pairwise,
reference; higher = more alike) or cosine distances (centroid; lower = more
alike). Thresholds live on that same scale.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args

if TYPE_CHECKING:
    import numpy as np

Scenario = Literal["S1", "S2", "S3"]
FlagRule = Literal["below", "above"]

SCENARIOS: tuple[Scenario, ...] = get_args(Scenario)
#: Graded relevance of each candidate identity for the ranking formulation.
RELEVANCE: Mapping[str, int] = {"S1": 2, "S3": 1, "S2": 0}
#: Ground-truth ranking of the discrimination candidates, best first.
IDEAL_RANKING: tuple[str, ...] = ("S1", "S3", "S2")

# Float noise below this (in percent points) is ignored when rounding and when
# comparing sweep values for ties.
_NOISE = 1e-9


# --------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class DetectionRecord:
    """One detection/localization instance (a dialogue under one scenario).

    ``gold_turns`` and ``pred_turns`` are 0-based indices into the target
    speaker's turns. The gold label is *inconsistent* iff ``gold_turns`` is
    non-empty, so S1 records must have empty ``gold_turns`` and S2/S3 records
    a non-empty one. ``pred_inconsistent`` is the method's dialogue-level
    verdict; it is used for detection, while ``pred_turns`` is used for
    localization (the two are scored independently even if they disagree).
    """

    dialogue_id: str
    source: str
    scenario: Scenario
    gold_turns: frozenset[int]
    pred_turns: frozenset[int]
    pred_inconsistent: bool

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ValueError(f"{self.dialogue_id}: scenario must be one of {SCENARIOS}, got {self.scenario!r}")
        gold = _as_turn_set(self.gold_turns, f"{self.dialogue_id}: gold_turns")
        pred = _as_turn_set(self.pred_turns, f"{self.dialogue_id}: pred_turns")
        if self.scenario == "S1" and gold:
            raise ValueError(f"{self.dialogue_id}: S1 is fully consistent, gold_turns must be empty")
        if self.scenario != "S1" and not gold:
            raise ValueError(f"{self.dialogue_id}: {self.scenario} has an altered turn, gold_turns must be non-empty")
        object.__setattr__(self, "gold_turns", gold)
        object.__setattr__(self, "pred_turns", pred)
        object.__setattr__(self, "pred_inconsistent", bool(self.pred_inconsistent))

    @property
    def gold_inconsistent(self) -> bool:
        """Ground-truth dialogue label: ``True`` when any turn is inconsistent."""
        return bool(self.gold_turns)


@dataclass(frozen=True)
class DiscriminationRecord:
    """One discrimination instance: three candidates for the masked slot.

    ``labels[k]`` is the true identity (``"S1"``, ``"S2"`` or ``"S3"``) of the
    k-th candidate in the order it was presented (shuffled), and ``scores[k]``
    the method's score for it: a similarity when ``higher_is_better`` is true,
    a distance otherwise. ``labels`` must be a permutation of S1, S2, S3.
    """

    dialogue_id: str
    source: str
    labels: tuple[str, ...]
    scores: tuple[float, ...]
    higher_is_better: bool

    def __post_init__(self) -> None:
        labels = tuple(self.labels)
        scores = tuple(float(s) for s in self.scores)
        if sorted(labels) != sorted(IDEAL_RANKING):
            raise ValueError(f"{self.dialogue_id}: labels must be a permutation of S1, S2, S3, got {labels!r}")
        if len(scores) != len(labels):
            raise ValueError(f"{self.dialogue_id}: {len(labels)} labels but {len(scores)} scores")
        object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "scores", scores)
        object.__setattr__(self, "higher_is_better", bool(self.higher_is_better))


def _as_turn_set(turns: Iterable[int], what: str) -> frozenset[int]:
    out: set[int] = set()
    for t in turns:
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ValueError(f"{what}: turn indices must be non-negative ints, got {t!r}")
        out.add(t)
    return frozenset(out)


# --------------------------------------------------------------------------
# Per-instance metrics
# --------------------------------------------------------------------------


def localization_prf(gold: frozenset[int], pred: frozenset[int]) -> tuple[float, float, float]:
    """Per-instance precision, recall and F1 as fractions in ``[0, 1]``.

    ``P = |pred ∩ gold| / |pred|`` and ``R = |pred ∩ gold| / |gold|`` with the
    paper's conventions: P = 0 when ``pred`` is empty, R = 0 when ``gold`` is
    empty, F1 = 1 when both are empty, and F1 = 0 when P + R = 0 otherwise.
    (So both empty gives ``(0.0, 0.0, 1.0)``.)
    """
    hits = len(gold & pred)
    p = hits / len(pred) if pred else 0.0
    r = hits / len(gold) if gold else 0.0
    if not gold and not pred:
        return p, r, 1.0
    if p + r == 0.0:
        return p, r, 0.0
    return p, r, 2.0 * p * r / (p + r)


def rank_candidates(labels: Sequence[str], scores: Sequence[float], higher_is_better: bool) -> list[str]:
    """Order candidate labels best first by score.

    Descending score when ``higher_is_better`` (similarity), ascending
    otherwise (distance). Ties are broken *pessimistically*: among equal
    scores the candidate with the lower relevance (S2=0 < S3=1 < S1=2) comes
    first, so a method that cannot separate candidates earns no credit
    (all-equal scores give S2, S3, S1). Raises ``ValueError`` on NaN scores,
    on unknown labels or on a length mismatch.
    """
    if len(labels) != len(scores):
        raise ValueError(f"{len(labels)} labels but {len(scores)} scores")
    for label in labels:
        if label not in RELEVANCE:
            raise ValueError(f"unknown candidate label {label!r}; expected one of {sorted(RELEVANCE)}")
    values = [float(s) for s in scores]
    if any(math.isnan(v) for v in values):
        raise ValueError(f"NaN candidate score in {values!r}")
    sign = -1.0 if higher_is_better else 1.0
    order = sorted(range(len(labels)), key=lambda k: (sign * values[k], RELEVANCE[labels[k]]))
    return [labels[k] for k in order]


def dcg_at_k(ranking_labels: Sequence[str], k: int) -> float:
    """Discounted cumulative gain of a ranking (best first), unnormalised.

    ``DCG@k = Σ_{i=1..k} (2^rel_i − 1) / log2(i + 1)`` with relevance
    S1=2, S3=1, S2=0; positions beyond the ranking's length contribute 0.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    total = 0.0
    for i, label in enumerate(ranking_labels[:k], start=1):
        if label not in RELEVANCE:
            raise ValueError(f"unknown candidate label {label!r}")
        total += (2.0 ** RELEVANCE[label] - 1.0) / math.log2(i + 1)
    return total


def ndcg_at_k(ranking_labels: Sequence[str], k: int) -> float:
    """Normalised DCG@k as a fraction in ``[0, 1]``.

    The ideal DCG comes from the same labels sorted by relevance (for the
    three benchmark candidates: S1, S3, S2). Raises ``ValueError`` when the
    ideal DCG is zero (no relevant candidate).
    """
    ideal = sorted(ranking_labels, key=lambda lab: -RELEVANCE.get(lab, 0))
    idcg = dcg_at_k(ideal, k)
    if idcg <= 0.0:
        raise ValueError(f"ideal DCG@{k} is zero for {list(ranking_labels)!r}")
    return dcg_at_k(ranking_labels, k) / idcg


# --------------------------------------------------------------------------
# Aggregate metrics (percent, full precision)
# --------------------------------------------------------------------------


def _group_by_scenario(records: Iterable[DetectionRecord]) -> dict[Scenario, list[DetectionRecord]]:
    groups: dict[Scenario, list[DetectionRecord]] = {s: [] for s in SCENARIOS}
    seen: set[tuple[str, str]] = set()
    for rec in records:
        key = (rec.dialogue_id, rec.scenario)
        if key in seen:
            raise ValueError(f"duplicate detection record for {rec.dialogue_id} / {rec.scenario}")
        seen.add(key)
        groups[rec.scenario].append(rec)
    missing = [s for s in SCENARIOS if not groups[s]]
    if missing:
        raise ValueError(f"no detection records for scenario(s) {', '.join(missing)}")
    return groups


#: A per-scenario value, or an array of them (bootstrap resamples in sleuthd_bench.paired).
Value = TypeVar("Value", float, "np.ndarray")


def balanced(s1: Value, s2: Value, s3: Value) -> Value:
    """``½(S1 + (S2 + S3)/2)`` — S1 weighs as much as S2 and S3 together."""
    return 0.5 * (s1 + 0.5 * (s2 + s3))


def detection_metrics(records: Iterable[DetectionRecord]) -> dict[str, float]:
    """Detection accuracy per scenario and balanced accuracy, in percent.

    Returns ``{"S1", "S2", "S3", "bal"}`` with
    ``bal = ½(Acc_S1 + (Acc_S2 + Acc_S3)/2)``. A prediction is correct when
    ``pred_inconsistent`` equals the gold label. Raises ``ValueError`` when a
    scenario has no records or a (dialogue_id, scenario) pair repeats.
    """
    groups = _group_by_scenario(records)
    acc: dict[str, float] = {
        s: 100.0 * sum(r.pred_inconsistent == r.gold_inconsistent for r in recs) / len(recs)
        for s, recs in groups.items()
    }
    return {**acc, "bal": balanced(acc["S1"], acc["S2"], acc["S3"])}


def localization_metrics(records: Iterable[DetectionRecord]) -> dict[str, Any]:
    """Macro-averaged localization metrics per scenario, in percent.

    Returns ``{"S1": {"f1"}, "S2": {"p", "r", "f1"}, "S3": {"p", "r", "f1"},
    "bal_f1"}`` where each value is the mean of the per-instance
    :func:`localization_prf` over the scenario's records (S1 has P = R = 0 by
    convention, so only its F1 is reported) and
    ``bal_f1 = ½(F1_S1 + (F1_S2 + F1_S3)/2)``. Raises ``ValueError`` when a
    scenario has no records.
    """
    groups = _group_by_scenario(records)
    means: dict[Scenario, tuple[float, float, float]] = {}
    for s, recs in groups.items():
        prfs = [localization_prf(r.gold_turns, r.pred_turns) for r in recs]
        n = len(prfs)
        means[s] = (
            100.0 * sum(x[0] for x in prfs) / n,
            100.0 * sum(x[1] for x in prfs) / n,
            100.0 * sum(x[2] for x in prfs) / n,
        )
    out: dict[str, Any] = {"S1": {"f1": means["S1"][2]}}
    for s in ("S2", "S3"):
        p, r, f1 = means[s]
        out[s] = {"p": p, "r": r, "f1": f1}
    out["bal_f1"] = balanced(means["S1"][2], means["S2"][2], means["S3"][2])
    return out


def discrimination_metrics(records: Iterable[DiscriminationRecord]) -> dict[str, Any]:
    """Discrimination classification and ranking metrics, in percent.

    Returns ``{"accuracy": {<source>: .., "avg": ..}, "ndcg1", "ndcg2",
    "exact_match"}``. The predicted candidate is the first of
    :func:`rank_candidates` (pessimistic tie-break); it is correct when it is
    S1. ``accuracy["avg"]`` is pooled over *all* instances (not the mean of the
    per-source accuracies). Sources are listed in sorted order, ``"avg"``
    last. Exact match counts full rankings equal to S1, S3, S2. Raises
    ``ValueError`` on no records, a duplicate dialogue_id, a source named
    ``"avg"`` or a NaN score.
    """
    per_source: dict[str, list[bool]] = {}
    correct_all: list[bool] = []
    ndcg1: list[float] = []
    ndcg2: list[float] = []
    exact: list[bool] = []
    seen: set[str] = set()
    for rec in records:
        if rec.dialogue_id in seen:
            raise ValueError(f"duplicate discrimination record for {rec.dialogue_id}")
        seen.add(rec.dialogue_id)
        if rec.source == "avg":
            raise ValueError("a source may not be named 'avg' (reserved for the pooled accuracy)")
        try:
            ranking = rank_candidates(rec.labels, rec.scores, rec.higher_is_better)
        except ValueError as exc:
            raise ValueError(f"{rec.dialogue_id}: {exc}") from exc
        hit = ranking[0] == "S1"
        per_source.setdefault(rec.source, []).append(hit)
        correct_all.append(hit)
        ndcg1.append(ndcg_at_k(ranking, 1))
        ndcg2.append(ndcg_at_k(ranking, 2))
        exact.append(tuple(ranking) == IDEAL_RANKING)
    if not correct_all:
        raise ValueError("no discrimination records")
    n = len(correct_all)
    accuracy = {src: 100.0 * sum(h) / len(h) for src, h in sorted(per_source.items())}
    accuracy["avg"] = 100.0 * sum(correct_all) / n
    return {
        "accuracy": accuracy,
        "ndcg1": 100.0 * sum(ndcg1) / n,
        "ndcg2": 100.0 * sum(ndcg2) / n,
        "exact_match": 100.0 * sum(exact) / n,
    }


# --------------------------------------------------------------------------
# report.json per-method object
# --------------------------------------------------------------------------


def round_pct(value: float) -> float:
    """Round a percentage to one decimal, half away from zero ("half up").

    Float noise below 1e-9 is absorbed first, so a value whose exact rational
    is 6.25 rounds to 6.3 even if it was computed as 6.2499999999999999.
    Raises ``ValueError`` on NaN or infinities.
    """
    if not math.isfinite(value):
        raise ValueError(f"cannot round non-finite value {value!r}")
    d = Decimal(repr(float(value))).quantize(Decimal("1e-9"), rounding=ROUND_HALF_UP)
    return float(d.quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))


def _round_tree(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _round_tree(v) for k, v in obj.items()}
    if isinstance(obj, float):
        return round_pct(obj)
    return obj


def method_report(
    det_records: Iterable[DetectionRecord],
    disc_records: Iterable[DiscriminationRecord] | None,
) -> dict[str, Any]:
    """Build one run's object of ``report.json`` (percent, one decimal).

    Shape: ``{"detection": {"S1","S2","S3","bal"}, "localization": {"S1":
    {"f1"}, "S2": {"p","r","f1"}, "S3": {"p","r","f1"}, "bal_f1"},
    "discrimination": {"accuracy": {<source>..., "avg"}, "ndcg1", "ndcg2",
    "exact_match"}}``. Everything is computed at full precision and rounded
    with :func:`round_pct` only here. Pass ``disc_records=None`` to omit the
    ``"discrimination"`` key; an empty iterable raises ``ValueError``.
    """
    det = list(det_records)
    out: dict[str, Any] = {
        "detection": detection_metrics(det),
        "localization": localization_metrics(det),
    }
    if disc_records is not None:
        out["discrimination"] = discrimination_metrics(disc_records)
    rounded: dict[str, Any] = _round_tree(out)
    return rounded


# --------------------------------------------------------------------------
# Threshold sweep (Figure 7)
# --------------------------------------------------------------------------


def flag_turns(scores: Sequence[float], threshold: float, flag_if: FlagRule) -> frozenset[int]:
    """Indices of the turns a thresholded method flags as inconsistent.

    ``flag_if="below"`` (cosine similarity methods) flags ``score < threshold``;
    ``"above"`` (cosine distance) flags ``score > threshold``. Comparisons are
    strict. NaN scores mean "turn not judged" and are never flagged.
    """
    if flag_if not in ("below", "above"):
        raise ValueError(f"flag_if must be 'below' or 'above', got {flag_if!r}")
    flagged: set[int] = set()
    for i, raw in enumerate(scores):
        s = float(raw)
        if math.isnan(s):
            continue
        if (s < threshold) if flag_if == "below" else (s > threshold):
            flagged.add(i)
    return frozenset(flagged)


def threshold_sweep(
    turn_scores_by_instance: Mapping[str, Sequence[float]],
    scenarios: Mapping[str, Scenario],
    gold: Mapping[str, Iterable[int]],
    thresholds: Sequence[float],
    flag_if: FlagRule,
) -> list[dict[str, float]]:
    """Balanced detection accuracy and balanced localization F1 per threshold.

    The three mappings are keyed by the same instance id (one per dialogue
    *and* scenario, e.g. ``"d0017/S2"``): per-turn scores (cosine similarity or
    distance, NaN = not judged), the instance's scenario and its gold turn
    indices. For each threshold τ, turns are flagged with :func:`flag_turns`,
    the instance is predicted inconsistent iff any turn is flagged, and the
    flagged set is the localization output.

    Returns one ``{"threshold": τ, "bal": .., "bal_f1": ..}`` per threshold in
    the given order; ``bal`` and ``bal_f1`` are percentages at full precision.
    Raises ``ValueError`` when the key sets differ, a scenario is missing,
    ``thresholds`` is empty or contains NaN or duplicates.
    """
    keys = set(turn_scores_by_instance)
    if keys != set(scenarios) or keys != set(gold):
        raise ValueError("turn_scores_by_instance, scenarios and gold must have the same keys")
    taus = [float(t) for t in thresholds]
    if not taus:
        raise ValueError("no thresholds given")
    if any(math.isnan(t) for t in taus) or len(set(taus)) != len(taus):
        raise ValueError(f"thresholds must be distinct and not NaN: {taus!r}")
    if flag_if not in ("below", "above"):
        raise ValueError(f"flag_if must be 'below' or 'above', got {flag_if!r}")
    ordered = sorted(keys)
    gold_sets = {k: frozenset(gold[k]) for k in ordered}
    sweep: list[dict[str, float]] = []
    for tau in taus:
        records = []
        for key in ordered:
            pred = flag_turns(turn_scores_by_instance[key], tau, flag_if)
            records.append(
                DetectionRecord(
                    dialogue_id=key,
                    source="",
                    scenario=scenarios[key],
                    gold_turns=gold_sets[key],
                    pred_turns=pred,
                    pred_inconsistent=bool(pred),
                )
            )
        det = detection_metrics(records)
        loc = localization_metrics(records)
        sweep.append({"threshold": tau, "bal": det["bal"], "bal_f1": float(loc["bal_f1"])})
    return sweep


def best_threshold(sweep: Sequence[Mapping[str, float]], key: str = "bal") -> float:
    """The threshold whose ``sweep`` entry maximises ``key``.

    Values within 1e-9 percent points of the maximum count as tied. Among
    tied thresholds the one closest to the median of the tied thresholds is
    returned (for an even count both middle values are equally close; the
    smaller one wins, i.e. the lower median), which prefers the middle of a
    plateau over its edges.
    Raises ``ValueError`` on an empty sweep and ``KeyError`` on a missing key.
    """
    if not sweep:
        raise ValueError("empty sweep")
    best = max(float(entry[key]) for entry in sweep)
    tied = sorted(float(e["threshold"]) for e in sweep if best - float(e[key]) <= _NOISE)
    # The element closest to the median of a sorted set is its middle element;
    # with an even count the two middle ones tie and the lower is taken. Index
    # arithmetic avoids float noise in a computed midpoint.
    return tied[(len(tied) - 1) // 2]
