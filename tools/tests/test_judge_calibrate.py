"""`sleuthd-bench judge calibrate` on replay folders of known miscalibration (the end-to-end run, from a real
replay through a judge server to a server using the fit, is tests/lalm/test_lalm_serving.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sleuthd.lalm.calibration import select
from sleuthd_bench.judge_calibrate import JudgeCalibrationError, fit

WEIGHTS = "ab" * 32


def _replay(folder: Path, rng: np.random.Generator, dialogues: int, bias: float, weights: str = WEIGHTS) -> Path:
    """A replay of ``dialogues`` 5-turn dialogues whose judge says raw P(other) while the truth is
    sigmoid(logit(raw) + bias): a judge off by a constant in logit space (Platt's b), with answer masses
    of 0.5-1."""
    folder.mkdir(parents=True)
    judge = {"model": "judge-x", "weights_sha256": weights, "prompt_version": "1", "calibrated_detection": False}
    (folder / "replay.json").write_text(json.dumps({"judge": judge}))
    lines = []
    for d in range(dialogues):
        raw = rng.uniform(0.02, 0.98, 5)
        truth = 1 / (1 + np.exp(-(np.log(raw / (1 - raw)) + bias)))
        gold = [k for k in range(5) if rng.uniform() < truth[k]]
        turns = [
            {"status": "CONSISTENT", "judge_probability": float(r), "judge_answer_mass": float(rng.uniform(0.5, 1))}
            for r in raw
        ]
        lines.append({"run": "lalm", "dialogue_id": f"d{d}", "scenario": "S1", "gold_turns": gold, "turns": turns})
        lines.append({"run": "pairwise@paper", "dialogue_id": f"d{d}", "scenario": "S1", "gold_turns": gold})
    (folder / "predictions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return folder


def test_a_biased_judge_gets_platt_scaling_and_better_calibration(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    dirs = [_replay(tmp_path / "a", rng, 200, -1.5), _replay(tmp_path / "b", rng, 200, -1.5)]
    result = fit(dirs, tmp_path / "out" / "cal.json")
    det = result.report["detection"]
    assert det["chosen"] == "platt" and det["cv_log_loss"]["platt"] < det["cv_log_loss"]["temperature"]
    assert det["b"] == pytest.approx(-1.5, abs=0.3) and det["a"] == pytest.approx(1.0, abs=0.2)
    assert det["after_cross_validated"]["ece"] < det["before"]["ece"] / 2
    entry = select(tmp_path / "out" / "cal.json", WEIGHTS, "1")
    assert entry.detection is not None and entry.detection.kind == "platt" and entry.detection.instances == 2000
    assert entry.min_answer_mass == pytest.approx(0.5, abs=0.01) and entry.discrimination is None
    assert result.plot_path.exists() and result.report_path.exists()


def test_replays_that_cannot_be_fitted_say_why(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    one = _replay(tmp_path / "one", rng, 20, 0.0)
    other = _replay(tmp_path / "other", rng, 20, 0.0, weights="cd" * 32)
    with pytest.raises(JudgeCalibrationError, match="fit one judge at a time"):
        fit([one, other], tmp_path / "cal.json")
    with pytest.raises(JudgeCalibrationError, match=r"no replay\.json"):
        fit([tmp_path], tmp_path / "cal.json")
    remote = _replay(tmp_path / "remote", rng, 20, 0.0, weights="")
    with pytest.raises(JudgeCalibrationError, match="pass --weights-sha256"):
        fit([remote], tmp_path / "cal.json")
    assert fit([remote], tmp_path / "cal.json", weights_sha256=WEIGHTS).entry.weights_sha256 == WEIGHTS
    same = _replay(tmp_path / "same", rng, 20, -50.0)  # no turn of another speaker
    with pytest.raises(JudgeCalibrationError, match="needs turns of both kinds"):
        fit([same], tmp_path / "cal.json")
