"""Benchmark instances derived from a manifest line, and the runs a replay performs (pure, no I/O).

From each line (``docs/benchmark-format.md``): three detection/localization instances (S1 as
given, S2 and S3 with ``altered_turn`` replaced) and one discrimination instance (the other turns
as context, the original/S2/S3 clips as candidates, shuffled with a seed fixed per dialogue).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from sleuthd_bench.manifest import ManifestLine
from sleuthd_bench.metrics import SCENARIOS, Scenario

PAPER_METHODS = ("pairwise", "centroid", "reference")
AUTO = "auto"
LALM = "lalm"  # the server's LALM judge (sleuthd serve --judge-model / --judge-endpoint)
METHOD_CHOICES = (*PAPER_METHODS, AUTO, LALM)
THRESHOLD_SETS = ("paper", "default")
UNTHRESHOLDED = (AUTO, LALM)  # one run each: their probability's decision threshold is the server's


@dataclass(frozen=True)
class Run:
    """One column of results: a method with a threshold set (``None`` for ``auto`` and ``lalm``)."""

    method: str
    thresholds: str | None

    @property
    def name(self) -> str:
        """``"pairwise@paper"`` for thresholded methods, the bare method name otherwise."""
        return self.method if self.thresholds is None else f"{self.method}@{self.thresholds}"


def parse_choices(text: str, allowed: Sequence[str], what: str) -> tuple[str, ...]:
    """``"pairwise, centroid"`` -> ``("pairwise", "centroid")``; unknown or empty entries raise ValueError."""
    items = [t.strip().lower() for t in text.split(",")]
    if not all(items):
        raise ValueError(f"{what}: empty entry in {text!r}")
    unknown = [t for t in items if t not in allowed]
    if unknown:
        raise ValueError(f"{what}: unknown {', '.join(unknown)}; choose from {', '.join(allowed)}")
    return tuple(dict.fromkeys(items))


def plan_runs(methods: Sequence[str], thresholds: Sequence[str]) -> list[Run]:
    """The runs for the requested methods x threshold sets, plus the paper's three methods at the
    paper's thresholds (always run, so every report can be compared with the paper's Table 2).

    Order: methods as requested, then the paper methods not requested; within a method, threshold
    sets as requested, with ``paper`` first when it was not requested; ``auto`` and ``lalm`` have a single run.
    """
    runs: list[Run] = []
    for method in dict.fromkeys([*methods, *PAPER_METHODS]):
        if method in UNTHRESHOLDED:
            runs.append(Run(method, None))
            continue
        sets = list(dict.fromkeys(thresholds)) if method in methods else []
        if "paper" not in sets:
            sets.insert(0, "paper")
        runs.extend(Run(method, t) for t in sets)
    return runs


def scenario_turns(line: ManifestLine, scenario: Scenario) -> tuple[str, ...]:
    """The target's turns (manifest-relative paths) of one detection scenario."""
    turns = list(line.target_turns)
    if scenario == "S2":
        turns[line.altered_turn] = line.s2_audio
    elif scenario == "S3":
        turns[line.altered_turn] = line.s3_audio
    elif scenario != "S1":
        raise ValueError(f"unknown scenario {scenario!r}; expected one of {SCENARIOS}")
    return tuple(turns)


def gold_turns(line: ManifestLine, scenario: Scenario) -> frozenset[int]:
    """Indices of the inconsistent turns: none in S1, ``altered_turn`` in S2 and S3."""
    return frozenset() if scenario == "S1" else frozenset({line.altered_turn})


@dataclass(frozen=True)
class Candidate:
    """A discrimination candidate: an opaque id sent to the server, its true label kept here."""

    candidate_id: str
    label: str  # "S1" (the original turn), "S2" or "S3"
    path: str


def discrimination_candidates(line: ManifestLine, seed: int = 0) -> list[Candidate]:
    """The three candidates in presentation order, shuffled by ``Random(f"{seed}:{dialogue_id}")``.

    The shuffle depends only on the seed and the dialogue id, so a replay presents the same order
    every time and to every method. Ids are ``c0``..``c2`` in presentation order, so they carry no
    hint of the label.
    """
    pool = [("S1", line.target_turns[line.altered_turn]), ("S2", line.s2_audio), ("S3", line.s3_audio)]
    random.Random(f"{seed}:{line.dialogue_id}").shuffle(pool)
    return [Candidate(f"c{k}", label, path) for k, (label, path) in enumerate(pool)]


def discrimination_context(line: ManifestLine) -> tuple[str, ...]:
    """The target's other turns (the masked slot left out), as context for ranking."""
    return tuple(p for i, p in enumerate(line.target_turns) if i != line.altered_turn)
