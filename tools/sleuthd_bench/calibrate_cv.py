"""`sleuthd-bench calibrate cv`: choose the `auto` fitting settings by cross-validation on the fit corpus.

The evaluation splits (other voice families, real speech) must stay unseen, so settings such as the
domain-randomisation jitter and the L2 penalty are compared on the FIT corpus alone: its speakers are
split into folds; for each fold the models are fitted on dialogues of the other speakers and scored
on benchmark-style dialogues (5 turns + reference, S3 = most similar same-gender speaker) whose
*target* speakers were never trained on. Each test set is scored as recorded and again with every
embedding jittered (0.01-0.03 per dimension) as a stand-in for voices less self-consistent than the
corpus's own: a setting that only works on this corpus's tight spreads is found out there.
With ``short_clips`` (`--short-turns`), two more test conditions: every turn a short crop of its clip
(about 2 s of speech; turn_lengths.short_crop), and "mixed", each clip whole or cropped by a coin flip, so
a speaker's turns differ in length as a real dialogue's do.

Selection rule (stated before the comparison): among the settings whose consistent speakers (S1) stay
unflagged in at least ``min_s1`` % of dialogues in *every* test condition (each test jitter, and the
turn-length conditions when run), the highest mean balanced detection accuracy over those conditions.
A false alarm on a consistent speaker costs a TTS team a
needless regeneration on every release, so robustness of S1 comes first.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sleuthd.judgment.calibration import BASE_VARIANTS

from sleuthd_bench.calibrate import (
    DECISION_THRESHOLD,
    Clip,
    Instance,
    dialogue_scores,
    fit_models,
    make_instances,
    mix_lengths,
    training_instances,
)
from sleuthd_bench.turn_lengths import MIXED_SHORT_SHARE

TEST_JITTERS: tuple[float, ...] = (0.0, 0.01, 0.02, 0.03)
# The turn-length test conditions (at jitter 0); "mixed" cuts a share MIXED_SHORT_SHARE of the clips.
TURN_LENGTH_CONDITIONS = ("short", "mixed")


@dataclass(frozen=True)
class Setting:
    jitter_levels: tuple[float, ...]
    l2: float
    train_short_share: float = 0.0  # share of training clips replaced by their short crops
    length_profiles: bool = False  # training dialogues by length profile (calibrate.training_instances)

    def label(self) -> str:
        cuts = f", {self.train_short_share:.0%} of training clips cut" if self.train_short_share else ""
        cuts += ", trained by length profile" if self.length_profiles else ""
        return f"jitter {{{', '.join(f'{j:g}' for j in self.jitter_levels)}}}, L2 {self.l2:g}{cuts}"


@dataclass(frozen=True)
class SettingResult:
    setting: Setting
    by_test_jitter: dict[float, dict[str, float]]  # test jitter -> S1/S2/S3/bal/bal_f1 (percent, fold mean)
    # "short" / "mixed" -> the same, when the turn-length conditions were run (TURN_LENGTH_CONDITIONS)
    by_turn_length: dict[str, dict[str, float]] = field(default_factory=dict)

    def conditions(self) -> list[dict[str, float]]:
        return [*self.by_test_jitter.values(), *self.by_turn_length.values()]

    @property
    def mean_bal(self) -> float:
        return float(np.mean([m["bal"] for m in self.conditions()]))

    @property
    def min_s1(self) -> float:
        return min(m["S1"] for m in self.conditions())


def speaker_folds(speakers: Sequence[str], folds: int, seed: int) -> list[list[str]]:
    """Disjoint groups of speakers covering all of them (a shuffled round-robin)."""
    if not 2 <= folds <= len(speakers):
        raise ValueError(f"--folds must be between 2 and the number of speakers ({len(speakers)}), not {folds}")
    order = sorted(speakers)
    random.Random(seed).shuffle(order)
    return [order[f::folds] for f in range(folds)]


@dataclass(frozen=True)
class Fold:
    held_out: list[str]  # target speakers of the test dialogues
    train_clips: list[Clip]  # the clips of every other speaker
    draw_seed: int  # seed of this fold's training and test draws


def held_out_folds(
    clips: Sequence[Clip], folds: int, repeats: int, seed: int, progress: Callable[[str], None]
) -> Iterator[Fold]:
    """The folds of ``repeats`` independent speaker splits, reporting each one done to ``progress``."""
    speakers = sorted({c.speaker for c in clips})
    runs = [(r, f, held) for r in range(repeats) for f, held in enumerate(speaker_folds(speakers, folds, seed + r))]
    for k, (r, f, held_out) in enumerate(runs):
        yield Fold(held_out, [c for c in clips if c.speaker not in held_out], (seed + r) * 1000 + f)
        progress(f"fold {k + 1}/{len(runs)} done ({len(held_out)} held-out target speakers)")


def fold_mean(metrics: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Metric-wise mean over folds."""
    return {key: float(np.mean([m[key] for m in metrics])) for key in metrics[0]}


def cross_validate(
    clips: Sequence[Clip],
    jitter_sets: Sequence[tuple[float, ...]],
    l2_values: Sequence[float],
    *,
    folds: int = 6,
    repeats: int = 1,
    seed: int = 0,
    train_dialogues: int = 4000,
    test_dialogues: int = 600,
    test_jitters: Sequence[float] = TEST_JITTERS,
    decision_threshold: float = DECISION_THRESHOLD,
    short_clips: Sequence[Clip] | None = None,
    train_short_shares: Sequence[float] = (0.0,),
    length_profiles: bool = False,
    progress: Callable[[str], None] = lambda _message: None,
) -> list[SettingResult]:
    """Score every (jitter set, L2, training share of short crops) setting on held-out target
    speakers; means over the folds of ``repeats`` independent fold splits, per test jitter (and per
    turn-length condition when ``short_clips``, short crops of ``clips`` paired by ``Clip.source``,
    are given; they are also the crops a training share or ``length_profiles`` draws from; see
    calibrate.training_instances)."""
    if (length_profiles or any(share > 0 for share in train_short_shares)) and short_clips is None:
        raise ValueError("training on short turns needs the short crops (--short-turns)")
    if length_profiles and any(share > 0 for share in train_short_shares):
        raise ValueError("training by length profile replaces a training share of cuts: use one or the other")
    scores: dict[Setting, dict[float | str, list[dict[str, float]]]] = {}
    for fold in held_out_folds(clips, folds, repeats, seed, progress):
        tests: dict[float | str, list[Instance]] = {
            j: make_instances(
                clips,
                test_dialogues,
                fold.draw_seed,
                benchmark_like=True,
                jitter_levels=(j,),
                targets=fold.held_out,
            )
            for j in test_jitters
        }
        if short_clips is not None:
            corpora = {
                "short": list(short_clips),
                "mixed": mix_lengths(clips, short_clips, fold.draw_seed, MIXED_SHORT_SHARE),
            }
            for condition in TURN_LENGTH_CONDITIONS:
                tests[condition] = make_instances(
                    corpora[condition],
                    test_dialogues,
                    fold.draw_seed,
                    benchmark_like=True,
                    targets=fold.held_out,
                )
        for jitter_levels, share in itertools.product(jitter_sets, train_short_shares):
            train = training_instances(
                fold.train_clips,
                short_clips or (),
                train_dialogues,
                fold.draw_seed,
                short_share=share,
                length_profiles=length_profiles,
                jitter_levels=jitter_levels,
            )
            for l2 in l2_values:
                models = fit_models(train, l2=l2, variants=BASE_VARIANTS)
                setting = Setting(tuple(jitter_levels), l2, share, length_profiles)
                for j, test in tests.items():
                    probs = [models[i.variant].probability(i.features) for i in test]
                    m = dialogue_scores(test, probs, decision_threshold)
                    scores.setdefault(setting, {}).setdefault(j, []).append(m)
    return [
        SettingResult(
            s,
            # Turn-length conditions are named; every other key is a test jitter (whatever its number type).
            {j: fold_mean(ms) for j, ms in by_test.items() if not isinstance(j, str)},
            {c: fold_mean(ms) for c, ms in by_test.items() if isinstance(c, str)},
        )
        for s, by_test in scores.items()
    ]


def select(results: Sequence[SettingResult], min_s1: float) -> SettingResult | None:
    """The selection rule: best mean Bal among settings whose S1 accuracy stays >= min_s1 everywhere."""
    eligible = [r for r in results if r.min_s1 >= min_s1]
    return max(eligible, key=lambda r: r.mean_bal) if eligible else None


def table(results: Sequence[SettingResult], chosen: SettingResult | None, min_s1: float) -> str:
    jitters = list(next(iter(results)).by_test_jitter) if results else []
    lengths = list(next(iter(results)).by_turn_length) if results else []
    head = [
        "setting",
        *(f"S1 / S3 / Bal @ test jitter {j:g}" for j in jitters),
        *(f"S1 / S3 / Bal @ {c} turns" for c in lengths),
        "min S1",
        "mean Bal",
        "",
    ]
    lines = ["| " + " | ".join(head) + " |", "| :--- " + "| ---: " * (len(head) - 2) + "| :--- |"]
    for r in results:
        cells = [f"{m['S1']:.1f} / {m['S3']:.1f} / {m['bal']:.2f}" for m in r.conditions()]
        mark = "chosen" if r is chosen else ("" if r.min_s1 >= min_s1 else f"S1 < {min_s1:g}")
        lines.append(
            f"| {r.setting.label()} | " + " | ".join(cells) + f" | {r.min_s1:.1f} | {r.mean_bal:.2f} | {mark} |"
        )
    return "\n".join(lines)


def to_json(results: Sequence[SettingResult], chosen: SettingResult | None, params: dict[str, Any]) -> dict[str, Any]:
    return {
        "params": params,
        "scale": "percent, mean over folds",
        "results": [
            {
                "jitter_levels": list(r.setting.jitter_levels),
                "l2": r.setting.l2,
                "train_short_share": r.setting.train_short_share,
                "length_profiles": r.setting.length_profiles,
                "by_test_jitter": {f"{j:g}": m for j, m in r.by_test_jitter.items()},
                "by_turn_length": r.by_turn_length,
                "min_s1": r.min_s1,
                "mean_bal": r.mean_bal,
            }
            for r in results
        ],
        "chosen": None
        if chosen is None
        else {
            "jitter_levels": list(chosen.setting.jitter_levels),
            "l2": chosen.setting.l2,
            "train_short_share": chosen.setting.train_short_share,
            "length_profiles": chosen.setting.length_profiles,
        },
    }
