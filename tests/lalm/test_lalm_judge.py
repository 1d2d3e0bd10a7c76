"""The judge façade (detection, ranking, calibration) over the in-process backend, and its options."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from sleuthd.cli import main as cli
from sleuthd.config import ConfigError, add_cli_args, from_cli_args
from sleuthd.errors import InvalidRequest, LimitExceeded
from sleuthd.lalm import prompts
from sleuthd.lalm.batcher import PromptBatcherConfig
from sleuthd.lalm.calibration import (
    JudgeCalibration,
    Platt,
    Temperature,
    fit_platt,
    fit_temperature,
    save_entry,
    select,
    weights_sha256,
)
from sleuthd.lalm.config import JudgeConfig
from sleuthd.lalm.inprocess import LocalScorer
from sleuthd.lalm.judge import DEFAULT_MIN_ANSWER_MASS, NO_JUDGE, LalmJudge, load_judge, nearest_context, rotations
from sleuthd.lalm.templates import template_text
from sleuthd.lalm.types import Clip

from tests.lalm.lalm_support import tone
from tests.support import VOICE_A, VOICE_B, VOICE_F


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def scorer(models: dict[str, Any]) -> AsyncIterator[LocalScorer]:
    s = LocalScorer(models["qwen2-audio"])
    yield s
    await s.aclose()


def _calibration(scorer: LocalScorer, **kw: Any) -> JudgeCalibration:
    return JudgeCalibration(scorer.weights_sha256, scorer.model_name, prompts.PROMPT_VERSION, **kw)


def test_context_and_rotation_choices() -> None:
    assert nearest_context(6, 0, 2) == [1, 2]
    assert nearest_context(6, 3, 3) == [1, 2, 4]  # 2 and 4 at distance 1, then the earlier of 1 and 5
    assert nearest_context(1, 0, 4) == []
    assert rotations(4, 0) == [0, 1, 2, 3]
    assert rotations(6, 2) == [0, 3]
    assert rotations(3, 9) == [0, 1, 2]


async def test_detect_turns_judges_each_turn_against_reference_and_neighbours(
    scorer: LocalScorer, voices: dict[str, list[np.ndarray]]
) -> None:
    judge = LalmJudge(scorer, max_context_clips=2)
    turns = [voices[VOICE_A][1], voices[VOICE_A][2], voices[VOICE_F][0], voices[VOICE_A][3]]
    reference = voices[VOICE_A][0]
    results = await judge.detect_turns(turns, reference)
    assert len(results) == 4
    for i, r in enumerate(results):
        assert 0 <= r.probability <= 1 and 0 < r.answer_mass <= 1
        assert (r.calibrated, r.model_name, r.probability) == (False, "qwen2-audio", r.raw_probability)
        # The same as asking about that turn alone with its two nearest other turns as context.
        ctx = [turns[j] for j in nearest_context(4, i, 2)]
        single = await judge.detect(turns[i], reference, ctx)
        assert r.probability == pytest.approx(single.probability, abs=1e-5)
    assert judge.info.calibrated_detection is False and judge.info.architecture == "qwen2-audio"


async def test_rank_averages_rotations_of_the_candidates(
    scorer: LocalScorer, voices: dict[str, list[np.ndarray]]
) -> None:
    cands = [voices[VOICE_B][0], voices[VOICE_A][1], voices[VOICE_F][1]]
    reference = voices[VOICE_A][0]
    ranking = await LalmJudge(scorer).rank(cands, reference)
    assert ranking.orderings == 3 and ranking.calibrated is False
    assert sorted(o.rank for o in ranking.options) == [1, 2, 3]
    assert sum(o.probability for o in ranking.options) == pytest.approx(1.0)
    best = min(ranking.options, key=lambda o: o.rank)
    assert best.probability == max(o.probability for o in ranking.options)
    # Each candidate's probability is its answer share averaged over the three rotations.
    clips = [Clip.of(c) for c in cands]
    expected = np.zeros(3)
    for r in range(3):
        order = [(j + r) % 3 for j in range(3)]
        s = await scorer.score(prompts.discrimination([clips[k] for k in order], Clip.of(reference)))
        expected[order] += s.shares() / 3
    np.testing.assert_allclose([o.probability for o in ranking.options], expected, atol=1e-5)
    one = await LalmJudge(scorer, orderings=1).rank(cands, reference)
    assert one.orderings == 1


async def test_inputs_the_judge_cannot_hear_are_refused(
    scorer: LocalScorer, voices: dict[str, list[np.ndarray]]
) -> None:
    judge = LalmJudge(scorer)
    ref = voices[VOICE_A][0]
    with pytest.raises(InvalidRequest, match=r"the turn under test is 31\.0 s; .* at most 30 s per clip and never cut"):
        await judge.detect(tone(31.0), ref)
    with pytest.raises(InvalidRequest, match=r"turn 2 of the speaker is 40\.0 s"):
        await judge.detect_turns([ref, tone(40.0)], None)
    with pytest.raises(InvalidRequest, match="needs a reference clip or at least one other turn"):
        await judge.detect(ref, None)
    with pytest.raises(InvalidRequest, match="at most 10 candidates"):
        await judge.rank([tone(1.0, 100 + 10 * i) for i in range(11)], ref)
    with pytest.raises(InvalidRequest, match="expected float32"):
        await judge.detect(ref.astype(np.float64), ref)


def test_platt_and_temperature_fits_recover_known_curves() -> None:
    rng = np.random.default_rng(0)
    raw = rng.uniform(0.02, 0.98, 4000)
    z = 2.0 * np.log(raw / (1 - raw)) - 1.0
    labels = rng.uniform(size=raw.size) < 1 / (1 + np.exp(-z))
    platt = fit_platt(raw, labels)
    assert platt.a == pytest.approx(2.0, abs=0.2) and platt.b == pytest.approx(-1.0, abs=0.15)
    assert platt.apply(0.5) == pytest.approx(1 / (1 + np.exp(1.0)), abs=0.04)
    with pytest.raises(ValueError, match="both kinds"):
        fit_platt([0.2, 0.3], [True, True])
    # Rankings whose true probabilities are the raw shares sharpened by T = 0.5.
    shares, correct = [], []
    for _ in range(2000):
        s = rng.dirichlet([1.0, 1.0, 1.0])
        truth = Temperature(0.5, 0).apply(s)
        shares.append(s)
        correct.append(int(rng.choice(3, p=truth)))
    assert fit_temperature(shares, correct).temperature == pytest.approx(0.5, rel=0.15)


async def test_a_calibrated_judge_says_so_and_applies_it(
    scorer: LocalScorer, voices: dict[str, list[np.ndarray]]
) -> None:
    cal = _calibration(scorer, detection=Platt(1.5, -0.7, 100), discrimination=Temperature(2.0, 50))
    judge = LalmJudge(scorer, cal)
    r = await judge.detect(voices[VOICE_F][0], voices[VOICE_A][0])
    assert r.calibrated is True and r.probability == pytest.approx(Platt(1.5, -0.7, 100).apply(r.raw_probability))
    plain = await LalmJudge(scorer).rank([voices[VOICE_B][0], voices[VOICE_A][1]], voices[VOICE_A][0])
    ranked = await judge.rank([voices[VOICE_B][0], voices[VOICE_A][1]], voices[VOICE_A][0])
    assert ranked.calibrated is True
    assert [o.rank for o in ranked.options] == [o.rank for o in plain.options]  # T changes confidence, not order
    assert judge.info.calibrated_detection and judge.info.calibrated_discrimination
    with pytest.raises(ValueError, match="other weights"):
        LalmJudge(scorer, replace(cal, weights_sha256="0" * 64))


async def test_the_answer_mass_floor_comes_from_the_options_else_the_calibration(
    scorer: LocalScorer, tmp_path: Path
) -> None:
    assert LalmJudge(scorer).info.min_answer_mass == DEFAULT_MIN_ANSWER_MASS == 0.5
    cal = _calibration(scorer, detection=Platt(1.0, 0.0, 10), min_answer_mass=0.31)
    assert LalmJudge(scorer, cal).info.min_answer_mass == 0.31
    assert LalmJudge(scorer, cal, min_answer_mass=0.2).info.min_answer_mass == 0.2  # the option wins
    assert LalmJudge(scorer, replace(cal, min_answer_mass=None)).info.min_answer_mass == 0.5
    path = tmp_path / "cal.json"
    save_entry(path, cal)  # the floor travels with the entry
    assert select(path, scorer.weights_sha256, prompts.PROMPT_VERSION).min_answer_mass == 0.31
    with pytest.raises(ConfigError, match="probability"):
        JudgeConfig(judge_min_answer_mass=1.5)


async def test_a_request_larger_than_the_queue_is_refused_with_the_limit(
    models: dict[str, Any], voices: dict[str, list[np.ndarray]]
) -> None:
    """More prompts at once than the judge's queue holds could never fit: LimitExceeded (INVALID_ARGUMENT) with
    the limit named, before anything is queued; not Overloaded ("retry later")."""
    small = LocalScorer(models["qwen2-audio"], PromptBatcherConfig(max_queue_prompts=2))
    try:
        judge = LalmJudge(small, max_context_clips=1)
        with pytest.raises(LimitExceeded, match=r"asks the judge 3 prompts at once .* holds 2 \(--judge-max-queue"):
            await judge.detect_turns(voices[VOICE_A][1:4], voices[VOICE_A][0])
        assert small.stats().prompts == 0
        assert len(await judge.detect_turns(voices[VOICE_A][1:3], voices[VOICE_A][0])) == 2
        with pytest.raises(LimitExceeded, match="asks the judge 3 prompts"):  # a ranking asks one per rotation
            await judge.rank([voices[v][1] for v in (VOICE_A, VOICE_B, VOICE_F)], voices[VOICE_A][0])
    finally:
        await small.aclose()


def test_a_calibration_for_other_weights_or_wording_is_refused(tmp_path: Path, scorer: LocalScorer) -> None:
    path = tmp_path / "judge-calibration.json"
    other = JudgeCalibration("f" * 64, "someone-else", prompts.PROMPT_VERSION, Platt(1.0, 0.0, 10))
    save_entry(path, other)
    with pytest.raises(ConfigError, match=r"no calibration for weights .* it has: ffffffffffff… \(someone-else\)"):
        select(path, scorer.weights_sha256, prompts.PROMPT_VERSION)
    save_entry(path, _calibration(scorer, detection=Platt(1.0, 0.0, 10)))
    assert select(path, scorer.weights_sha256, prompts.PROMPT_VERSION).detection == Platt(1.0, 0.0, 10)
    assert len(json.loads(path.read_text())["calibrations"]) == 2
    with pytest.raises(ConfigError, match="fitted with prompt version 1; this server asks prompt version 2"):
        select(path, scorer.weights_sha256, "2")
    with pytest.raises(ConfigError, match="--judge-weights-sha256"):
        select(path, "", prompts.PROMPT_VERSION)
    doc = json.loads(path.read_text())
    doc["calibrations"]["a" * 64] = doc["calibrations"].pop("f" * 64)
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="the key must match"):
        select(path, scorer.weights_sha256, prompts.PROMPT_VERSION)


def test_load_judge_builds_what_the_options_say(tmp_path: Path, tiny_dirs: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match="method lalm needs an LALM judge") as info:
        load_judge(JudgeConfig())
    assert str(info.value) == NO_JUDGE
    folder = tiny_dirs["qwen2.5-omni"]
    path = tmp_path / "cal.json"
    save_entry(path, JudgeCalibration("e" * 64, "other", prompts.PROMPT_VERSION, Platt(1.0, 0.0, 10)))
    with pytest.raises(ConfigError, match="no calibration for weights"):
        load_judge(JudgeConfig(judge_model=str(folder), judge_calibration=str(path), judge_device="cpu"))
    save_entry(path, JudgeCalibration(weights_sha256(folder), "qwen2.5-omni", prompts.PROMPT_VERSION, Platt(1, 0, 9)))
    judge = load_judge(JudgeConfig(judge_model=str(folder), judge_calibration=str(path), judge_max_context_clips=2))
    assert (judge.info.backend, judge.info.architecture, judge.info.dtype) == ("in-process", "qwen2.5-omni", "float32")
    assert judge.info.calibrated_detection and not judge.info.calibrated_discrimination
    assert judge.info.max_clip_seconds == 300.0 and judge.max_context_clips == 2


def test_judge_options_become_flags_and_refuse_contradictions() -> None:
    parser = argparse.ArgumentParser()
    add_cli_args(parser, JudgeConfig, env={"SLEUTHD_JUDGE_MAX_WAIT_MS": "3"})
    args = parser.parse_args(["--judge-endpoint", "http://gpu1:8000/v1", "--judge-model-name", "Qwen2-Audio-7B"])
    config = from_cli_args(JudgeConfig, args)
    assert (config.judge_endpoint, config.judge_model_name, config.judge_max_wait_ms) == (
        "http://gpu1:8000/v1",
        "Qwen2-Audio-7B",
        3.0,
    )
    assert config.enabled and not JudgeConfig().enabled
    with pytest.raises(ConfigError, match="needs judge_model_name"):
        JudgeConfig(judge_endpoint="http://gpu1:8000/v1")
    with pytest.raises(ConfigError, match="exclude each other"):
        JudgeConfig(judge_model="/models/q", judge_endpoint="http://x/v1", judge_model_name="q")
    with pytest.raises(ConfigError, match="at most 20"):
        JudgeConfig(judge_top_logprobs=50)
    with pytest.raises(ConfigError, match="judge_max_batch_prompts must be at least 1"):
        JudgeConfig(judge_max_batch_prompts=0)


def test_the_documented_commands_build_and_hash_a_tiny_judge(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`sleuthd models tiny-judge DIR` and `sleuthd models judge-hash DIR`."""
    out = tmp_path / "tiny-omni"
    assert cli.main(["--log-level", "warning", "models", "tiny-judge", str(out), "--arch", "qwen2.5-omni"]) == 0
    assert (out / "config.json").exists() and (out / "model.safetensors").exists()
    assert (out / "tokenizer.json").exists() and (out / "chat_template.jinja").exists()
    capsys.readouterr()
    assert cli.main(["models", "judge-hash", str(out)]) == 0
    assert capsys.readouterr().out.strip() == weights_sha256(out)
    assert (out / "chat_template.jinja").read_text() == template_text("qwen2.5-omni")  # sleuthd's own
    assert cli.main(["models", "judge-hash", str(tmp_path)]) == 2  # no weights there: an error, not a hash
    assert (
        capsys.readouterr().err.strip() == f"error: {tmp_path}: no weight files (.safetensors, .bin, .pt, .pth) to hash"
    )
    assert cli.main(["models", "judge-hash", str(tmp_path / "nowhere")]) == 2


def test_importing_the_judge_loads_no_torch_transformers_or_httpx() -> None:
    code = (
        "import sys\n"
        "import sleuthd.lalm.judge, sleuthd.lalm.config, sleuthd.lalm.tiny, sleuthd.lalm.selftest\n"
        "import sleuthd.lalm.remote, sleuthd.lalm.inprocess, sleuthd.lalm.openai_reply\n"
        "print(sorted(m for m in ('torch', 'transformers', 'httpx') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_judge_bench_command_times_the_encoder_modes_side_by_side(
    tiny_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """`sleuthd-bench judge bench DIR` runs (its figures are for the docs, not asserted: speed is measured by
    the command, never in a test)."""
    from sleuthd_bench.cli import main as bench_main

    rows = tmp_path / "rows.json"
    args = ["judge", "bench", str(tiny_dirs["qwen2-audio"]), "--batches", "2", "--repeats", "1", "--device", "cpu"]
    assert bench_main([*args, "--clip-seconds", "1", "--json", str(rows)]) == 0
    out = capsys.readouterr().out
    assert "prompts/s: padded  real 8/pass  real" in out
    found = json.loads(rows.read_text())["rows"]
    assert [(r["batch"], r["mode"]) for r in found] == [(2, "padded"), (2, "real, 8/pass"), (2, "real")]
    assert all(r["prompts_per_second"] > 0 and r["encoder_passes_per_call"] >= 1 for r in found)
    assert bench_main(["judge", "bench"]) == 2  # neither a folder nor --random-7b
    assert "needs a judge model folder, or --random-7b" in capsys.readouterr().err
