"""Fitting the LALM judge's calibration from replays (``sleuthd-bench judge calibrate REPLAY_DIR...``).

Input: replays of dev manifests through a server with the judge, run *uncalibrated* (``sleuthd-bench replay
MANIFEST --methods lalm``): ``replay.json`` names the judge (weights hash, prompt version, whether it was
calibrated) and ``predictions.jsonl`` holds, per detection turn of run ``lalm``, the judge's raw
``judge_probability`` and ``judge_answer_mass`` and whether the turn really was another speaker, and per
ranking the judge's candidate probabilities and the true candidate.

Detection: Platt scaling (``sigmoid(a·logit(p) + b)``) or temperature scaling (``sigmoid(logit(p) / T)``, i.e.
b = 0), whichever has the lower cross-validated log-loss, folds by dialogue (a dialogue's turns share a
reference and never straddle folds); then refitted on every turn. Discrimination: temperature scaling
(``fit_temperature``). The answer-mass floor is the low tail of the dev turns' answer mass (the
``--mass-quantile`` quantile, 1 % by default, rounded down to 0.01): below it the calibration has seen too
little to vouch for a probability, and the server makes such turns UNCERTAIN.

Output: the entry, keyed by the weights' hash with the prompt version, added to the calibration file the server
reads (``--judge-calibration``); beside it ``judge_calibration_report.json`` (log-loss, Brier and ECE before
calibration, cross-validated after, and in-sample after; the method chosen and why) and
``judge_reliability.png`` (observed share of other-speaker turns against the predicted probability, before and
after, cross-validated).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from sleuthd.lalm.calibration import (
    JudgeCalibration,
    Platt,
    Temperature,
    fit_platt,
    fit_temperature,
    save_entry,
)

from sleuthd_bench import reliability

RUN = "lalm"
_EPS = 1e-6


class JudgeCalibrationError(ValueError):
    """The replays cannot be fitted (say why and what to run instead)."""


@dataclass
class JudgeReplays:
    """The judge the replays ran against and what it said."""

    weights_sha256: str
    model_name: str
    prompt_version: str
    raw: list[float] = field(default_factory=list)  # per detection turn: the judge's raw P(other speaker)
    mass: list[float] = field(default_factory=list)  # its answer mass
    different: list[bool] = field(default_factory=list)  # whether the turn really was another speaker
    group: list[str] = field(default_factory=list)  # its dialogue (folds keep a dialogue together)
    shares: list[list[float]] = field(default_factory=list)  # per ranking: the candidates' raw probabilities
    correct: list[int] = field(default_factory=list)  # per ranking: the true candidate


def read_replays(dirs: Sequence[Path], weights_sha256: str = "") -> JudgeReplays:
    """The judge's turns and rankings from replay folders of one judge (same weights and prompt version)."""
    found: JudgeReplays | None = None
    for d in dirs:
        try:
            judge = json.loads((d / "replay.json").read_text())["judge"]
        except FileNotFoundError:
            raise JudgeCalibrationError(f"{d}: no replay.json; give the folder `sleuthd-bench replay` wrote") from None
        except (KeyError, json.JSONDecodeError):
            raise JudgeCalibrationError(
                f"{d}: replay.json describes no LALM judge; replay with --methods lalm against a server with one"
            ) from None
        if judge.get("calibrated_detection") or judge.get("calibrated_discrimination"):
            raise JudgeCalibrationError(
                f"{d}: the replay ran against a calibrated judge, so its probabilities are not the model's raw "
                "answers: replay against the server started without --judge-calibration"
            )
        weights = weights_sha256 or judge.get("weights_sha256", "")
        if not weights:
            raise JudgeCalibrationError(
                f"{d}: the judge's weights hash is unknown (a remote judge started without --judge-weights-sha256): "
                "pass --weights-sha256 (`sleuthd models judge-hash DIR` on the served folder)"
            )
        this = (weights, judge.get("prompt_version", ""))
        if found is None:
            found = JudgeReplays(weights, judge.get("model", ""), this[1])
        elif this != (found.weights_sha256, found.prompt_version):
            raise JudgeCalibrationError(
                f"{d}: replayed weights {weights[:12]}… prompt version {this[1]}, but {dirs[0]} replayed "
                f"{found.weights_sha256[:12]}… prompt version {found.prompt_version}: fit one judge at a time"
            )
        _read_predictions(d / "predictions.jsonl", found)
    assert found is not None
    return found


def _read_predictions(path: Path, out: JudgeReplays) -> None:
    try:
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    except FileNotFoundError:
        raise JudgeCalibrationError(f"{path}: missing; give the folder `sleuthd-bench replay` wrote") from None
    for rec in lines:
        if rec.get("run") != RUN:
            continue
        if "turns" in rec:
            gold = set(rec.get("gold_turns", []))
            for k, turn in enumerate(rec["turns"]):
                if turn.get("judge_probability") is None:
                    continue  # not heard by the judge (too little speech, nothing to compare with)
                out.raw.append(float(turn["judge_probability"]))
                out.mass.append(float(turn.get("judge_answer_mass") or 0.0))
                out.different.append(k in gold)
                out.group.append(f"{path.parent}/{rec['dialogue_id']}")
        elif rec.get("scenario") == "discrimination" and "S1" in rec.get("labels", []):
            out.shares.append([float(s) for s in rec["scores"]])
            out.correct.append(list(rec["labels"]).index("S1"))


def _log_loss(p: np.ndarray, y: np.ndarray) -> float:
    q = np.clip(p, _EPS, 1 - _EPS)
    return float(-np.mean(y * np.log(q) + (1 - y) * np.log(1 - q)))


def _apply(platt: Platt, raw: np.ndarray) -> np.ndarray:
    return np.array([platt.apply(float(r)) for r in raw])


def _folds(groups: Sequence[str], labels: np.ndarray, k: int) -> list[np.ndarray]:
    """Turn indices of ``k`` folds, whole dialogues each; dialogues with another-speaker turn spread first."""
    names = sorted(set(groups), key=lambda g: (not any(labels[i] for i, x in enumerate(groups) if x == g), g))
    fold_of = {g: n % k for n, g in enumerate(names)}
    return [np.array([i for i, g in enumerate(groups) if fold_of[g] == f]) for f in range(k)]


def cross_validate(raw: np.ndarray, y: np.ndarray, groups: Sequence[str], k: int) -> dict[str, Any]:
    """Held-out predictions and log-loss of Platt and of temperature scaling over ``k`` dialogue folds (a fold
    whose training part lacks either label keeps the raw probability for its turns)."""
    k = max(2, min(k, len(set(groups))))
    held = {"platt": raw.copy(), "temperature": raw.copy()}
    used = 0
    for test in _folds(groups, y, k):
        train = np.setdiff1d(np.arange(len(raw)), test)
        if len(test) == 0 or not 0 < y[train].sum() < len(train):
            continue
        used += 1
        fit_raw, fit_y = raw[train].tolist(), [bool(v) for v in y[train]]
        held["platt"][test] = _apply(fit_platt(fit_raw, fit_y), raw[test])
        held["temperature"][test] = _apply(fit_platt(fit_raw, fit_y, with_bias=False), raw[test])
    return {
        "folds": k,
        "folds_fitted": used,
        "log_loss": {name: _log_loss(p, y) for name, p in held.items()},
        "held_out": held,
    }


def _metrics(p: np.ndarray, y: np.ndarray) -> dict[str, float]:
    return {
        "log_loss": round(_log_loss(p, y), 4),
        "brier": round(float(np.mean((p - y) ** 2)), 4),
        "ece": round(reliability.expected_calibration_error(p, y), 4),
    }


@dataclass(frozen=True)
class FitResult:
    entry: JudgeCalibration
    report: dict[str, Any]
    calibration_path: Path
    report_path: Path
    plot_path: Path


def fit(
    dirs: Sequence[Path],
    out: Path,
    folds: int = 5,
    mass_quantile: float = 0.01,
    fitted_on: str = "",
    weights_sha256: str = "",
) -> FitResult:
    """Fit, write the entry into ``out`` (added to what the file holds) and the report beside it."""
    data = read_replays(dirs, weights_sha256)
    raw = np.clip(np.asarray(data.raw, np.float64), _EPS, 1 - _EPS)
    y = np.asarray(data.different, np.float64)
    if len(raw) == 0 or not 0 < y.sum() < len(y):
        raise JudgeCalibrationError(
            f"{len(raw)} judged turns, {int(y.sum())} of another speaker: the detection fit needs turns of both "
            "kinds; replay a dev manifest with S2/S3 instances (--methods lalm)"
        )
    cv = cross_validate(raw, y, data.group, folds)
    chosen = min(("platt", "temperature"), key=lambda m: cv["log_loss"][m])
    detection = fit_platt(raw.tolist(), data.different, with_bias=chosen == "platt")
    calibrated = _apply(detection, raw)
    floor = math.floor(float(np.quantile(np.asarray(data.mass), mass_quantile)) * 100) / 100
    discrimination: Temperature | None = None
    ranking: dict[str, Any] = {"rankings": len(data.shares)}
    if data.shares:
        discrimination = fit_temperature(data.shares, data.correct)
        ranking.update(
            temperature=round(discrimination.temperature, 4),
            nll_before=round(_ranking_nll(data.shares, data.correct, 1.0), 4),
            nll_after=round(_ranking_nll(data.shares, data.correct, discrimination.temperature), 4),
        )
    entry = JudgeCalibration(
        weights_sha256=data.weights_sha256,
        model_name=data.model_name,
        prompt_version=data.prompt_version,
        detection=detection,
        discrimination=discrimination,
        fitted_on=fitted_on or ", ".join(str(d) for d in dirs),
        min_answer_mass=floor,
    )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_entry(out, entry)
    report = {
        "replays": [str(d) for d in dirs],
        "model": data.model_name,
        "weights_sha256": data.weights_sha256,
        "prompt_version": data.prompt_version,
        "turns": len(raw),
        "other_speaker_turns": int(y.sum()),
        "detection": {
            "chosen": chosen,
            "why": f"lower {cv['folds']}-fold cross-validated log-loss by dialogue ({cv['folds_fitted']} folds fitted)",
            "cv_log_loss": {m: round(v, 4) for m, v in cv["log_loss"].items()},
            "a": round(detection.a, 4),
            "b": round(detection.b, 4),
            "before": _metrics(raw, y),
            "after_cross_validated": _metrics(cv["held_out"][chosen], y),
            "after_in_sample": _metrics(calibrated, y),
        },
        "min_answer_mass": {"value": floor, "quantile": mass_quantile},
        "discrimination": ranking,
        "calibration_file": str(out),
    }
    report_path = out.parent / "judge_calibration_report.json"
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    plot_path = plot_reliability(raw, cv["held_out"][chosen], y, out.parent / "judge_reliability.png", report)
    return FitResult(entry, report, out, report_path, plot_path)


def _ranking_nll(shares: Sequence[Sequence[float]], correct: Sequence[int], temperature: float) -> float:
    total = 0.0
    for s, c in zip(shares, correct, strict=True):
        p = Temperature(temperature, 0).apply(np.asarray(s, np.float64))
        total -= math.log(max(float(p[c]), 1e-12))
    return total / len(shares)


def plot_reliability(raw: np.ndarray, after: np.ndarray, y: np.ndarray, path: Path, report: dict[str, Any]) -> Path:
    """Observed share of other-speaker turns per bin of predicted probability, before and after (held out)."""
    from sleuthd_bench.plots import _new_figure

    fig = _new_figure(5.4, 6.0)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1])
    top.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=0.9, label="perfect calibration")
    det = report["detection"]
    for name, p, ece in (
        ("raw answer share", raw, det["before"]["ece"]),
        (f"{det['chosen']} (cross-validated)", after, det["after_cross_validated"]["ece"]),
    ):
        bins = reliability.reliability_table(p, y)
        label = f"{name}, ECE {ece:.3f}"
        top.plot([b["predicted"] for b in bins], [b["observed"] for b in bins], marker="o", label=label)
        bottom.bar([(b["low"] + b["high"]) / 2 for b in bins], [b["count"] for b in bins], width=0.045, alpha=0.6)
    top.set_ylabel("observed share of other-speaker turns")
    top.set_title(f"judge {report['model']}: {report['turns']} dev turns")
    top.set_xlim(0, 1)
    top.set_ylim(0, 1)
    top.grid(True, alpha=0.3)
    top.legend(loc="upper left", fontsize="small")
    bottom.set_yscale("log")
    bottom.set_xlabel("predicted probability that the turn is another speaker's")
    bottom.set_ylabel("turns")
    fig.savefig(path)
    return path
