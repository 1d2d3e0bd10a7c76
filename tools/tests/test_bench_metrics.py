"""Hand-computed checks for sleuthd.bench (metrics, report, plots).

Relevance/gain table used in the ranking tests: S1 rel 2 → gain 2^2−1 = 3,
S3 rel 1 → gain 1, S2 rel 0 → gain 0. Discounts 1/log2(i+1): i=1 → 1,
i=2 → 1/log2(3) = 0.6309297535714575, i=3 → 1/2.
IDCG@1 = 3, IDCG@2 = 3 + 0.6309297535714575 = 3.6309297535714578.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from sleuthd_bench import metrics as m
from sleuthd_bench import plots, report
from sleuthd_bench.metrics import DetectionRecord, DiscriminationRecord

INV_LOG2_3 = 0.6309297535714575  # 1 / log2(3)
IDCG2 = 3.6309297535714578  # 3 + 1/log2(3)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def det(
    did: str,
    scenario: str,
    gold: set[int],
    pred: set[int],
    pred_inconsistent: bool | None = None,
    source: str = "src",
) -> DetectionRecord:
    return DetectionRecord(
        dialogue_id=did,
        source=source,
        scenario=scenario,  # type: ignore[arg-type]
        gold_turns=frozenset(gold),
        pred_turns=frozenset(pred),
        pred_inconsistent=bool(pred) if pred_inconsistent is None else pred_inconsistent,
    )


def disc(
    did: str, source: str, labels: tuple[str, ...], scores: tuple[float, ...], hib: bool = True
) -> DiscriminationRecord:
    return DiscriminationRecord(did, source, labels, scores, hib)


# --------------------------------------------------------------------------
# localization_prf
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gold", "pred", "expected"),
    [
        ({2}, {2}, (1.0, 1.0, 1.0)),
        # empty prediction: P = 0 by convention, R = 0/1 = 0, P+R = 0 → F1 = 0
        ({2}, set(), (0.0, 0.0, 0.0)),
        # empty gold: R = 0 by convention, P = 0/1 = 0 → F1 = 0
        (set(), {1}, (0.0, 0.0, 0.0)),
        # both empty: P = R = 0 by convention but F1 = 1
        (set(), set(), (0.0, 0.0, 1.0)),
        # both non-empty, disjoint: P = R = 0 → F1 = 0 (not a division by zero)
        ({2}, {3}, (0.0, 0.0, 0.0)),
        # P = 1/2, R = 1, F1 = 2·½·1/(3/2) = 2/3
        ({2}, {1, 2}, (0.5, 1.0, 2 / 3)),
        # P = 1/3, R = 1/2, F1 = 2·(1/6)/(5/6) = 0.4
        ({1, 2}, {2, 3, 4}, (1 / 3, 0.5, 0.4)),
    ],
)
def test_localization_prf(gold: set[int], pred: set[int], expected: tuple[float, float, float]) -> None:
    got = m.localization_prf(frozenset(gold), frozenset(pred))
    assert got == pytest.approx(expected)


# --------------------------------------------------------------------------
# rank_candidates
# --------------------------------------------------------------------------


def test_rank_similarity_descending() -> None:
    assert m.rank_candidates(("S2", "S1", "S3"), (0.1, 0.9, 0.5), True) == ["S1", "S3", "S2"]


def test_rank_distance_ascending() -> None:
    # same scores read as distances: smallest first
    assert m.rank_candidates(("S2", "S1", "S3"), (0.1, 0.9, 0.5), False) == ["S2", "S3", "S1"]
    assert m.rank_candidates(("S2", "S3", "S1"), (0.9, 0.4, 0.1), False) == ["S1", "S3", "S2"]


@pytest.mark.parametrize("hib", [True, False])
@pytest.mark.parametrize("labels", [("S1", "S2", "S3"), ("S3", "S1", "S2"), ("S2", "S3", "S1")])
def test_rank_all_equal_is_pessimistic(labels: tuple[str, ...], hib: bool) -> None:
    assert m.rank_candidates(labels, (0.5, 0.5, 0.5), hib) == ["S2", "S3", "S1"]


def test_rank_partial_tie_puts_less_relevant_first() -> None:
    # S1 and S3 tie for the top: S3 (rel 1) goes before S1 (rel 2)
    assert m.rank_candidates(("S1", "S3", "S2"), (0.8, 0.8, 0.1), True) == ["S3", "S1", "S2"]
    # S1 and S2 tie at the bottom (distance): S2 before S1
    assert m.rank_candidates(("S1", "S3", "S2"), (0.7, 0.2, 0.7), False) == ["S3", "S2", "S1"]


def test_rank_errors() -> None:
    with pytest.raises(ValueError, match="NaN"):
        m.rank_candidates(("S1", "S2", "S3"), (0.1, math.nan, 0.3), True)
    with pytest.raises(ValueError):
        m.rank_candidates(("S1", "S2"), (0.1, 0.2, 0.3), True)
    with pytest.raises(ValueError):
        m.rank_candidates(("S1", "S4", "S3"), (0.1, 0.2, 0.3), True)


# --------------------------------------------------------------------------
# DCG / NDCG
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ranking", "ndcg1", "ndcg2"),
    [
        # NDCG@1 = gain(first)/3; NDCG@2 = (gain1 + gain2/log2 3) / (3 + 1/log2 3)
        (("S1", "S3", "S2"), 1.0, 1.0),  # 3/3 ; (3 + 1·0.63093)/3.63093
        (("S1", "S2", "S3"), 1.0, 0.8262346571285599),  # 3/3 ; 3/3.63093
        (("S3", "S1", "S2"), 1 / 3, 0.7967075809905066),  # 1/3 ; (1 + 3·0.63093)/3.63093
        (("S3", "S2", "S1"), 1 / 3, 0.27541155237618664),  # 1/3 ; 1/3.63093
        (("S2", "S1", "S3"), 0.0, 0.52129602861432),  # 0/3 ; (0 + 3·0.63093)/3.63093
        (("S2", "S3", "S1"), 0.0, 0.17376534287144002),  # 0/3 ; (0 + 1·0.63093)/3.63093
    ],
)
def test_ndcg_all_permutations(ranking: tuple[str, ...], ndcg1: float, ndcg2: float) -> None:
    assert m.ndcg_at_k(ranking, 1) == pytest.approx(ndcg1, abs=1e-12)
    assert m.ndcg_at_k(ranking, 2) == pytest.approx(ndcg2, abs=1e-12)
    assert m.ndcg_at_k(ranking, 3) <= 1.0 + 1e-12


def test_dcg_values() -> None:
    assert m.dcg_at_k(["S1", "S3", "S2"], 1) == pytest.approx(3.0)
    assert m.dcg_at_k(["S1", "S3", "S2"], 2) == pytest.approx(IDCG2)
    # 3 + 1/log2 3 + 0/2
    assert m.dcg_at_k(["S1", "S3", "S2"], 3) == pytest.approx(IDCG2)
    # 0 + 1/log2 3 + 3/2
    assert m.dcg_at_k(["S2", "S3", "S1"], 3) == pytest.approx(INV_LOG2_3 + 1.5)
    # k beyond the ranking length adds nothing
    assert m.dcg_at_k(["S1"], 3) == pytest.approx(3.0)
    with pytest.raises(ValueError):
        m.dcg_at_k(["S1"], 0)
    with pytest.raises(ValueError):
        m.ndcg_at_k(["S2"], 1)  # ideal DCG is zero


# --------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------


def test_record_validation() -> None:
    with pytest.raises(ValueError):
        det("x", "S1", {0}, set())  # S1 must have no gold turn
    with pytest.raises(ValueError):
        det("x", "S2", set(), set())  # S2 must have a gold turn
    with pytest.raises(ValueError):
        det("x", "S4", {0}, set())
    with pytest.raises(ValueError):
        det("x", "S2", {-1}, set())
    with pytest.raises(ValueError):
        disc("x", "a", ("S1", "S1", "S2"), (0.1, 0.2, 0.3))
    with pytest.raises(ValueError):
        disc("x", "a", ("S1", "S2", "S3"), (0.1, 0.2))
    rec = det("x", "S2", {1}, set())
    assert rec.gold_inconsistent and not det("y", "S1", set(), set()).gold_inconsistent


# --------------------------------------------------------------------------
# detection_metrics / localization_metrics
# --------------------------------------------------------------------------


def _detection_case() -> list[DetectionRecord]:
    return [
        # S1: 3 of 4 correct → 75 %
        det("a", "S1", set(), set()),
        det("b", "S1", set(), set()),
        det("c", "S1", set(), set()),
        det("d", "S1", set(), {0}),
        # S2: 1 of 2 correct → 50 %
        det("a", "S2", {1}, {1}),
        det("b", "S2", {1}, set()),
        # S3: 0 of 2 correct → 0 %; "d" localizes but says consistent:
        # detection uses pred_inconsistent, not pred_turns
        det("c", "S3", {2}, set()),
        det("d", "S3", {2}, {2}, pred_inconsistent=False),
    ]


def test_detection_metrics_hand_case() -> None:
    got = m.detection_metrics(_detection_case())
    # bal = ½(75 + (50 + 0)/2) = ½(75 + 25) = 50
    assert got == pytest.approx({"S1": 75.0, "S2": 50.0, "S3": 0.0, "bal": 50.0})


def test_detection_missing_scenario_raises() -> None:
    recs = [r for r in _detection_case() if r.scenario != "S3"]
    with pytest.raises(ValueError, match="S3"):
        m.detection_metrics(recs)
    with pytest.raises(ValueError):
        m.localization_metrics(recs)
    with pytest.raises(ValueError):
        m.detection_metrics([])


def test_detection_duplicate_raises() -> None:
    recs = [*_detection_case(), det("a", "S1", set(), set())]
    with pytest.raises(ValueError, match="duplicate"):
        m.detection_metrics(recs)


def test_localization_metrics_hand_case() -> None:
    recs = [
        det("a", "S1", set(), set()),  # F1 1 (both empty)
        det("b", "S1", set(), {0}),  # F1 0
        det("a", "S2", {1}, {1}),  # P 1, R 1, F1 1
        det("b", "S2", {1}, {1, 2}),  # P ½, R 1, F1 2/3
        det("a", "S3", {0}, set()),  # P 0, R 0, F1 0
        det("b", "S3", {0}, {0, 1, 2, 3}),  # P ¼, R 1, F1 2·¼/(5/4) = 0.4
    ]
    got = m.localization_metrics(recs)
    assert set(got) == {"S1", "S2", "S3", "bal_f1"}
    assert set(got["S1"]) == {"f1"}
    assert got["S1"]["f1"] == pytest.approx(50.0)
    # S2: P (100+50)/2 = 75, R 100, F1 (100 + 66.67)/2 = 83.33
    assert got["S2"] == pytest.approx({"p": 75.0, "r": 100.0, "f1": 250 / 3})
    # S3: P (0+25)/2 = 12.5, R (0+100)/2 = 50, F1 (0+40)/2 = 20
    assert got["S3"] == pytest.approx({"p": 12.5, "r": 50.0, "f1": 20.0})
    # bal_f1 = ½(50 + (83.33 + 20)/2) = 50.8333
    assert got["bal_f1"] == pytest.approx(0.5 * (50 + (250 / 3 + 20) / 2))


# --------------------------------------------------------------------------
# discrimination_metrics
# --------------------------------------------------------------------------


def _discrimination_case() -> list[DiscriminationRecord]:
    return [
        # source "a", 3 instances, 1 correct
        disc("a1", "a", ("S2", "S1", "S3"), (0.1, 0.9, 0.5)),  # S1,S3,S2: hit, EM
        disc("a2", "a", ("S1", "S2", "S3"), (0.7, 0.1, 0.8)),  # S3,S1,S2: miss
        disc("a3", "a", ("S3", "S1", "S2"), (0.4, 0.4, 0.4)),  # tie → S2,S3,S1: miss
        # source "b", 1 instance, distance: ascending → S1,S3,S2: hit, EM
        disc("b1", "b", ("S2", "S3", "S1"), (0.9, 0.4, 0.1), hib=False),
    ]


def test_discrimination_metrics_hand_case() -> None:
    got = m.discrimination_metrics(_discrimination_case())
    acc = got["accuracy"]
    assert list(acc) == ["a", "b", "avg"]
    assert acc["a"] == pytest.approx(100 / 3)
    assert acc["b"] == pytest.approx(100.0)
    # pooled over all 4 instances: 2/4 = 50, not the mean of per-source (66.67)
    assert acc["avg"] == pytest.approx(50.0)
    assert acc["avg"] != pytest.approx((acc["a"] + acc["b"]) / 2)
    # NDCG@1: (1 + 1/3 + 0 + 1)/4 = 7/12
    assert got["ndcg1"] == pytest.approx(100 * 7 / 12)
    # NDCG@2: (1 + 0.7967075809905066 + 0.17376534287144002 + 1)/4
    assert got["ndcg2"] == pytest.approx(100 * (2 + 0.7967075809905066 + 0.17376534287144002) / 4)
    # exact match: a1 and b1 → 2/4
    assert got["exact_match"] == pytest.approx(50.0)


def test_discrimination_errors() -> None:
    with pytest.raises(ValueError):
        m.discrimination_metrics([])
    with pytest.raises(ValueError, match="NaN"):
        m.discrimination_metrics([disc("n", "a", ("S1", "S2", "S3"), (0.1, math.nan, 0.2))])
    with pytest.raises(ValueError, match="avg"):
        m.discrimination_metrics([disc("n", "avg", ("S1", "S2", "S3"), (0.3, 0.1, 0.2))])
    recs = _discrimination_case()
    with pytest.raises(ValueError, match="duplicate"):
        m.discrimination_metrics([*recs, recs[0]])


# --------------------------------------------------------------------------
# round_pct / method_report
# --------------------------------------------------------------------------


def test_round_pct() -> None:
    assert m.round_pct(200 / 3) == 66.7
    assert m.round_pct(6.25) == 6.3  # half up (Python's round() gives 6.2)
    assert m.round_pct(0.05) == 0.1
    assert m.round_pct(14.499999999999998) == 14.5  # float noise absorbed
    assert m.round_pct(100.0) == 100.0
    assert m.round_pct(0.0) == 0.0
    with pytest.raises(ValueError):
        m.round_pct(math.nan)


def test_method_report_rounds_only_at_the_end() -> None:
    recs = [det(f"s1-{i}", "S1", set(), {0} if i else set()) for i in range(16)]
    recs += [det("s2", "S2", {1}, set()), det("s3", "S3", {1}, set())]
    got = m.method_report(recs, None)
    assert "discrimination" not in got
    # S1: 1/16 correct = 6.25 → 6.3
    assert got["detection"]["S1"] == 6.3
    # bal = ½(6.25 + 0) = 3.125 → 3.1; rounding S1 first would give ½·6.3 = 3.15 → 3.2
    assert got["detection"]["bal"] == 3.1
    assert got["localization"]["S1"]["f1"] == 6.3
    assert got["localization"]["bal_f1"] == 3.1


def test_method_report_empty_discrimination_raises() -> None:
    with pytest.raises(ValueError):
        m.method_report(_detection_case(), [])


def test_method_report_reproduces_doc_example_numbers() -> None:
    # docs/benchmark-format.md: 300 dialogues, S1 100.0, S2 1.7 (5/300), S3 0.0, bal 50.4
    recs = [det(f"d{i}", "S1", set(), set()) for i in range(300)]
    recs += [det(f"d{i}", "S2", {2}, {2} if i < 5 else set()) for i in range(300)]
    recs += [det(f"d{i}", "S3", {2}, set()) for i in range(300)]
    got = m.method_report(recs, _discrimination_case())
    assert got["detection"] == {"S1": 100.0, "S2": 1.7, "S3": 0.0, "bal": 50.4}
    assert got["localization"] == {
        "S1": {"f1": 100.0},
        "S2": {"p": 1.7, "r": 1.7, "f1": 1.7},
        "S3": {"p": 0.0, "r": 0.0, "f1": 0.0},
        "bal_f1": 50.4,
    }
    assert got["discrimination"] == {
        "accuracy": {"a": 33.3, "b": 100.0, "avg": 50.0},
        "ndcg1": 58.3,  # 700/12 = 58.33
        "ndcg2": 74.3,  # 74.26
        "exact_match": 50.0,
    }


# --------------------------------------------------------------------------
# flag_turns / threshold_sweep / best_threshold
# --------------------------------------------------------------------------


def test_flag_turns_rules() -> None:
    assert m.flag_turns([0.3, 0.4, 0.5], 0.4, "below") == frozenset({0})  # strict <
    assert m.flag_turns([0.3, 0.4, 0.5], 0.4, "above") == frozenset({2})  # strict >
    assert m.flag_turns([math.nan, 0.1], 0.5, "below") == frozenset({1})  # NaN never flagged
    assert m.flag_turns([math.nan, 0.1], 0.05, "above") == frozenset({1})
    with pytest.raises(ValueError):
        m.flag_turns([0.1], 0.5, "under")  # type: ignore[arg-type]


SIMS = {
    "d1/S1": [0.8, 0.7, 0.6],
    "d1/S2": [0.8, 0.2, 0.7],
    "d1/S3": [0.75, 0.65, 0.45],
}
# the same instances as cosine distances (written out, not computed, to avoid float noise)
DISTS = {
    "d1/S1": [0.2, 0.3, 0.4],
    "d1/S2": [0.2, 0.8, 0.3],
    "d1/S3": [0.25, 0.35, 0.55],
}
SCEN = {"d1/S1": "S1", "d1/S2": "S2", "d1/S3": "S3"}
GOLD = {"d1/S1": set(), "d1/S2": {1}, "d1/S3": {2}}
# τ | S1 flags   | S2 flags  | S3 flags   | Acc S1,S2,S3 | bal | F1 S1,S2,S3      | bal_f1
# .1| {}         | {}        | {}         | 100, 0, 0    | 50  | 1, 0, 0          | 50
# .3| {}         | {1}       | {}         | 100,100, 0   | 75  | 1, 1, 0          | 75
# .5| {}         | {1}       | {2}        | 100,100,100  | 100 | 1, 1, 1          | 100
# .7| {2}        | {1}       | {1,2}      | 0,100,100    | 50  | 0, 1, 2/3        | ½(0+(100+66.7)/2)=41.67
# .9| {0,1,2}    | {0,1,2}   | {0,1,2}    | 0,100,100    | 50  | 0, ½, ½          | 25
EXPECTED_SWEEP = [
    (0.1, 50.0, 50.0),
    (0.3, 75.0, 75.0),
    (0.5, 100.0, 100.0),
    (0.7, 50.0, 125 / 3),
    (0.9, 50.0, 25.0),
]


def test_threshold_sweep_similarity() -> None:
    sweep = m.threshold_sweep(SIMS, SCEN, GOLD, [0.1, 0.3, 0.5, 0.7, 0.9], "below")  # type: ignore[arg-type]
    assert [e["threshold"] for e in sweep] == [0.1, 0.3, 0.5, 0.7, 0.9]
    for entry, (tau, bal, bal_f1) in zip(sweep, EXPECTED_SWEEP, strict=True):
        assert set(entry) == {"threshold", "bal", "bal_f1"}
        assert entry["threshold"] == tau
        assert entry["bal"] == pytest.approx(bal)
        assert entry["bal_f1"] == pytest.approx(bal_f1)
    assert m.best_threshold(sweep) == 0.5
    assert m.best_threshold(sweep, key="bal_f1") == 0.5


def test_threshold_sweep_distance_mirrors_similarity() -> None:
    # distance d = 1 − s, flag above 1 − τ: same decisions as the similarity sweep
    sweep = m.threshold_sweep(DISTS, SCEN, GOLD, [0.9, 0.7, 0.5, 0.3, 0.1], "above")  # type: ignore[arg-type]
    for entry, (_tau, bal, bal_f1) in zip(sweep, EXPECTED_SWEEP, strict=True):
        assert entry["bal"] == pytest.approx(bal)
        assert entry["bal_f1"] == pytest.approx(bal_f1)
    assert m.best_threshold(sweep) == 0.5


def test_threshold_sweep_monotonic_flagging() -> None:
    # the number of flagged turns can only grow with τ for "below" (shrink for "above")
    taus = [0.1, 0.3, 0.5, 0.7, 0.9]
    for scores in SIMS.values():
        counts = [len(m.flag_turns(scores, t, "below")) for t in taus]
        assert counts == sorted(counts)
    for scores in DISTS.values():
        counts = [len(m.flag_turns(scores, t, "above")) for t in taus]
        assert counts == sorted(counts, reverse=True)
    # S1 detection accuracy (part of bal) never rises with τ for "below"
    sweep = m.threshold_sweep(SIMS, SCEN, GOLD, taus, "below")  # type: ignore[arg-type]
    bals = [e["bal"] for e in sweep]
    peak = bals.index(max(bals))
    assert bals[: peak + 1] == sorted(bals[: peak + 1])
    assert bals[peak:] == sorted(bals[peak:], reverse=True)


def test_threshold_sweep_nan_turn_is_never_flagged() -> None:
    sims = {**SIMS, "d1/S1": [0.8, math.nan, 0.6]}
    sweep = m.threshold_sweep(sims, SCEN, GOLD, [0.5, 0.99], "below")  # type: ignore[arg-type]
    # τ = 0.99: S1 flags {0, 2} but not the NaN turn; still wrong → S1 acc 0
    assert sweep[1]["bal"] == pytest.approx(50.0)
    assert sweep[0]["bal"] == pytest.approx(100.0)


def test_threshold_sweep_errors() -> None:
    with pytest.raises(ValueError):
        m.threshold_sweep(SIMS, {"d1/S1": "S1"}, GOLD, [0.5], "below")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        m.threshold_sweep(SIMS, SCEN, GOLD, [], "below")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        m.threshold_sweep(SIMS, SCEN, GOLD, [0.5, 0.5], "below")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        m.threshold_sweep(SIMS, SCEN, GOLD, [0.5], "sideways")  # type: ignore[arg-type]


def _sweep(values: list[tuple[float, float]]) -> list[dict[str, float]]:
    return [{"threshold": t, "bal": v, "bal_f1": 0.0} for t, v in values]


def test_best_threshold_ties() -> None:
    # plateau 0.2, 0.3, 0.4 → median 0.3
    assert m.best_threshold(_sweep([(0.1, 50), (0.2, 80), (0.3, 80), (0.4, 80), (0.5, 60)])) == 0.3
    # even plateau 0.2, 0.3 → both equally close to 0.25 → lower one
    assert m.best_threshold(_sweep([(0.1, 50), (0.2, 80), (0.3, 80), (0.4, 60)])) == 0.2
    # non-contiguous ties 0.1, 0.5, 0.7 → median 0.5
    assert m.best_threshold(_sweep([(0.1, 90), (0.3, 10), (0.5, 90), (0.7, 90)])) == 0.5
    # float noise counts as a tie; input order does not matter
    assert m.best_threshold(_sweep([(0.6, 70 + 1e-12), (0.2, 70), (0.4, 70)])) == 0.4
    assert m.best_threshold(_sweep([(0.3, 10.0)])) == 0.3
    with pytest.raises(ValueError):
        m.best_threshold([])


# --------------------------------------------------------------------------
# report.json, markdown, write_report, plots
# --------------------------------------------------------------------------

# Shape of the example in docs/benchmark-format.md (values illustrative).
DOC_EXAMPLE = {
    "manifest": "dev.jsonl",
    "n_dialogues": 300,
    "encoder": "ge2e",
    "methods": {
        "pairwise@paper": {
            "detection": {"S1": 100.0, "S2": 1.7, "S3": 0.0, "bal": 50.4},
            "localization": {
                "S1": {"f1": 100.0},
                "S2": {"p": 1.7, "r": 1.7, "f1": 1.7},
                "S3": {"p": 0.0, "r": 0.0, "f1": 0.0},
                "bal_f1": 50.4,
            },
            "discrimination": {
                "accuracy": {"librispeech": 96.7, "avg": 96.7},
                "ndcg1": 97.8,
                "ndcg2": 98.9,
                "exact_match": 94.2,
            },
        }
    },
}


def _key_tree(obj: object) -> object:
    if isinstance(obj, dict):
        return {k: _key_tree(v) for k, v in obj.items()}
    return type(obj).__name__


def _sample_report() -> dict:
    runs = {
        "pairwise@paper": m.method_report(
            _detection_case(),
            [disc(f"x{i}", "librispeech", ("S1", "S2", "S3"), (0.9, 0.1, 0.5)) for i in range(3)],
        ),
        "centroid|odd@default": m.method_report(_detection_case(), _discrimination_case()),
        "auto": m.method_report(_detection_case(), None),
    }
    return report.build_report("dev.jsonl", 300, "ge2e", runs)


def test_report_schema_matches_doc_example() -> None:
    rep = _sample_report()
    assert list(rep) == ["manifest", "n_dialogues", "encoder", "methods"]
    assert list(rep["methods"]) == ["pairwise@paper", "centroid|odd@default", "auto"]
    doc_run = DOC_EXAMPLE["methods"]["pairwise@paper"]
    assert _key_tree(rep["methods"]["pairwise@paper"]) == _key_tree(doc_run)
    assert _key_tree({k: v for k, v in rep.items() if k != "methods"}) == _key_tree(
        {k: v for k, v in DOC_EXAMPLE.items() if k != "methods"}
    )
    assert "discrimination" not in rep["methods"]["auto"]

    # everything numeric is a percentage with at most one decimal
    def walk(o: object) -> None:
        if isinstance(o, dict):
            for v in o.values():
                walk(v)
        else:
            assert isinstance(o, float) and 0.0 <= o <= 100.0 and round(o, 1) == o

    walk(rep["methods"])


def test_build_report_rejects_bad_runs() -> None:
    with pytest.raises(ValueError):
        report.build_report("m.jsonl", 1, "e", {"x": {"detection": {}}})
    with pytest.raises(ValueError):
        report.build_report("m.jsonl", 1, "e", {"x": {"detection": {}, "localization": {}, "bogus": {}}})


def test_markdown_table() -> None:
    rep = _sample_report()
    table = report.markdown_table(rep)
    lines = table.strip().splitlines()
    assert len(lines) == 2 + len(rep["methods"])
    assert "%" in lines[0]
    for name in ["pairwise@paper", "centroid\\|odd@default", "auto"]:
        assert any(line.startswith(f"| {name} |") for line in lines[2:])
    # per-source columns (union over runs, sorted), then avg
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[13:16] == ["Disc acc a", "Disc acc b", "Disc acc librispeech"]
    assert header[16:] == ["Disc acc avg", "NDCG@1", "NDCG@2", "EM"]
    n_cols = len(header)
    for line in lines[1:]:
        assert len(line.replace("\\|", "").strip("|").split("|")) == n_cols
    auto_row = next(line for line in lines if line.startswith("| auto |"))
    assert auto_row.count("–") == 7  # 3 sources + avg + NDCG@1 + NDCG@2 + EM
    assert "| 75.0 | 50.0 | 0.0 | 50.0 |" in auto_row


def test_write_report(tmp_path: Path) -> None:
    rep = _sample_report()
    sims_sweep = m.threshold_sweep(SIMS, SCEN, GOLD, [0.1, 0.3, 0.5, 0.7, 0.9], "below")  # type: ignore[arg-type]
    dist_sweep = m.threshold_sweep(DISTS, SCEN, GOLD, [0.1, 0.3, 0.5, 0.7, 0.9], "above")  # type: ignore[arg-type]
    preds = [
        {"dialogue_id": "a", "scenario": "S1", "pred_turns": [], "scores": [0.5, math.nan]},
        {"dialogue_id": "a", "scenario": "S2", "pred_turns": [1], "scores": [0.5, 0.1]},
    ]
    out = tmp_path / "run"
    paths = report.write_report(
        out,
        rep,
        {"pairwise": sims_sweep, "centroid": dist_sweep},
        iter(preds),
        sweep_defaults={"pairwise": 0.5},
    )
    assert set(paths) == {"report_json", "report_md", "predictions", "bias_scatter", "threshold_sweep"}
    for p in paths.values():
        assert p.parent == out and p.is_file() and p.stat().st_size > 0
    assert json.loads(paths["report_json"].read_text(encoding="utf-8")) == rep
    lines = paths["predictions"].read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [
        {"dialogue_id": "a", "scenario": "S1", "pred_turns": [], "scores": [0.5, None]},
        preds[1],
    ]
    md = paths["report_md"].read_text(encoding="utf-8")
    assert md.startswith("# ")
    for name in rep["methods"]:
        assert name.replace("|", "\\|") in md
    assert "percentages" in md
    for key in ("bias_scatter", "threshold_sweep"):
        data = paths[key].read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 1000
        assert paths[key].name in md
    assert not list(out.glob("*.tmp"))


def test_write_report_without_sweeps(tmp_path: Path) -> None:
    paths = report.write_report(tmp_path, _sample_report(), None, [])
    assert "threshold_sweep" not in paths
    assert paths["predictions"].read_text(encoding="utf-8") == ""
    assert paths["bias_scatter"].read_bytes()[:8] == PNG_MAGIC


def test_plot_functions_directly(tmp_path: Path) -> None:
    sweep = m.threshold_sweep(SIMS, SCEN, GOLD, [0.1, 0.3, 0.5, 0.7, 0.9], "below")  # type: ignore[arg-type]
    p1 = plots.plot_threshold_sweep({"reference@x": sweep}, tmp_path / "sub" / "s.png", defaults=None)
    p2 = plots.plot_bias_scatter(_sample_report(), tmp_path / "b.png")
    for p in (p1, p2):
        data = p.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 1000
    with pytest.raises(ValueError):
        plots.plot_threshold_sweep({}, tmp_path / "e.png")


def test_plots_import_is_lazy() -> None:
    code = "import sys; import sleuthd_bench.plots, sleuthd_bench.report; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
