"""A replay's best threshold held out over target speakers (sleuthd_bench.sweeps.held_out): chosen on half the
speakers, measured on the other half."""

from __future__ import annotations

from sleuthd_bench.sweeps import SweepInstance, held_out, held_out_table, sweep_method


def _speaker(name: str, consistent: float, similar: float) -> tuple[list[SweepInstance], dict[str, str]]:
    """One dialogue of a speaker whose own turns score ``consistent`` (pairwise mean cosine), whose similar-voice
    intruder scores ``similar`` and whose opposite-gender one 0.3."""
    out = []
    for scenario, first in (("S1", consistent), ("S2", 0.3), ("S3", similar)):
        gold = frozenset() if scenario == "S1" else frozenset({0})
        out.append(SweepInstance(f"{name}/{scenario}", scenario, gold, {"pairwise_mean_cosine": [first, consistent]}))
    return out, {i.key: name for i in out}


def _build(levels: list[tuple[float, float]]) -> tuple[list[SweepInstance], dict[str, str]]:
    instances, speakers = [], {}
    for k, (consistent, similar) in enumerate(levels):
        got, names = _speaker(f"s{k}", consistent, similar)
        instances += got
        speakers |= names
    return instances, speakers


def test_speakers_alike_keep_the_best_threshold_on_new_speakers() -> None:
    instances, speakers = _build([(0.9, 0.8)] * 6)
    h = held_out("pairwise", instances, speakers)
    assert h is not None and (h["speakers"], h["splits"]) == (6, 20)
    assert h["bal"] == {"mean": 100.0, "low": 100.0, "high": 100.0} and h["own_best_bal"] == 100.0


def test_speakers_at_other_levels_lose_what_hindsight_found() -> None:
    # Half the speakers sit a level lower: their own turns score 0.8, as the other half's similar voices do. A half
    # that draws mostly one kind chooses that kind's threshold, which then fails the other kind.
    instances, speakers = _build([(0.9, 0.8)] * 4 + [(0.8, 0.7)] * 4)
    hindsight = sweep_method("pairwise", instances)["best_by_bal"]["bal"]
    h = held_out("pairwise", instances, speakers)
    assert h is not None and h["splits"] == 20
    assert h["threshold"]["low"] < h["threshold"]["high"]  # the halves choose differently
    assert h["bal"]["low"] < h["bal"]["mean"] < min(h["own_best_bal"], hindsight) <= h["bal"]["high"] <= 100.0
    assert held_out("pairwise", instances, speakers, seed=1) != h  # the halvings are seeded
    table = held_out_table({"pairwise": {"held_out": h}, "centroid": {}})
    assert table.count("\n") == 3 and f"| pairwise | {h['threshold']['low']:g}-{h['threshold']['high']:g} |" in table


def test_fewer_than_four_speakers_give_nothing() -> None:
    instances, speakers = _build([(0.9, 0.8)] * 3)
    assert held_out("pairwise", instances, speakers) is None
    assert held_out_table({"pairwise": {}}) == ""
