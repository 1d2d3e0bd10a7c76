"""What the dialogue's other speakers add to `auto`: the same dialogues judged without and with them.

Two uses, both offline tooling:
- ``cohort_cross_validate`` (`sleuthd-bench calibrate cohort-cv`): on the fit corpus, by folds of held-out
  target voices, fits every variant on the other voices and compares the plain and the cohort models;
- ``compare`` on dialogues of any corpus with the shipped calibration (`sleuthd-bench calibrate
  cohort-eval`): how the fitted cohort models transfer to voices they never saw.

Test dialogues are benchmark-style (5 turns, a reference, S2 opposite gender, S3 the most similar
same-gender speaker) with 1-3 other speakers of 1-5 turns each who are strangers to the target and
the intruder unless ``intruder_in_cohort`` says otherwise: the cohort then only normalises; it does
not hand over the intruder's voice (the SPEAKER_CONFUSION rule covers that case on its own).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from sleuthd.judgment.calibration import LogisticModel

from sleuthd_bench.calibrate import DECISION_THRESHOLD, Clip, Instance, dialogue_scores, fit_models, make_instances
from sleuthd_bench.calibrate_cv import fold_mean, held_out_folds
from sleuthd_bench.reliability import expected_calibration_error

JUDGMENTS = ("without cohort", "with cohort")


def compare(
    models: Mapping[str, LogisticModel], instances: Sequence[Instance], tau: float = DECISION_THRESHOLD
) -> dict[str, dict[str, float]]:
    """Per judgment: S1/S2/S3/bal/bal_f1 (percent) at ``tau`` and the per-turn ECE (0-1) on the same
    dialogues, once from their plain features and once from their cohort features."""
    if any(i.plain_features is None for i in instances):
        raise ValueError("every instance needs a cohort (make_instances(..., cohort=True))")
    labels = np.concatenate([i.labels for i in instances])
    out = {}
    for judgment in JUDGMENTS:
        probs = [
            models[i.variant].probability(i.features)
            if judgment == "with cohort"
            else models[i.plain_variant].probability(i.plain_features)  # type: ignore[arg-type]
            for i in instances
        ]
        out[judgment] = {
            **dialogue_scores(instances, probs, tau),
            "ece": expected_calibration_error(np.concatenate(probs), labels),
        }
    return out


def cohort_cross_validate(
    clips: Sequence[Clip],
    *,
    folds: int = 6,
    repeats: int = 2,
    seed: int = 0,
    train_dialogues: int = 4000,
    test_dialogues: int = 1200,
    test_jitters: Sequence[float] = (0.0, 0.01, 0.02, 0.03),
    look_alike: bool = False,
    progress: Callable[[str], None] = lambda _message: None,
) -> dict[float, dict[str, dict[str, float]]]:
    """Test jitter -> judgment -> metrics, means over the folds of ``repeats`` fold splits. Training
    mirrors `calibrate fit` (plain and cohort dialogues from separate draws) with the shipped L2.
    ``look_alike``: every test cohort includes the target's second most similar same-gender speaker."""
    collected: dict[float, dict[str, list[dict[str, float]]]] = {}
    for fold in held_out_folds(clips, folds, repeats, seed, progress):
        train = make_instances(fold.train_clips, train_dialogues, fold.draw_seed) + make_instances(
            fold.train_clips, train_dialogues, fold.draw_seed + 2, cohort=True
        )
        models = fit_models(train)
        for j in test_jitters:
            test = make_instances(
                clips,
                test_dialogues,
                fold.draw_seed + 1,
                benchmark_like=True,
                jitter_levels=(j,),
                targets=fold.held_out,
                cohort=True,
                intruder_in_cohort=0.0,
                similar_in_cohort=look_alike,
            )
            for judgment, m in compare(models, test).items():
                collected.setdefault(j, {}).setdefault(judgment, []).append(m)
    return {j: {judgment: fold_mean(ms) for judgment, ms in by_j.items()} for j, by_j in collected.items()}


def table(rows: Mapping[str, Mapping[str, Mapping[str, float]]]) -> str:
    """Markdown: one line per (row label, judgment); detection and F1 in %, ECE on the 0-1 scale."""
    head = "| dialogues | judgment | Det S1 | S2 | S3 | Bal | Bal F1 | ECE |"
    lines = [head, "| :--- | :--- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, by_judgment in rows.items():
        for judgment in JUDGMENTS:
            m = by_judgment[judgment]
            lines.append(
                f"| {label} | {judgment} | {m['S1']:.1f} | {m['S2']:.1f} | {m['S3']:.1f} | {m['bal']:.2f} | "
                f"{m['bal_f1']:.2f} | {m['ece']:.3f} |"
            )
    return "\n".join(lines)


def to_json(rows: Mapping[str, Mapping[str, Mapping[str, float]]], params: dict[str, Any]) -> dict[str, Any]:
    return {"params": params, "scale": "S1-S3, bal, bal_f1: percent; ece: 0-1", "results": rows}
