"""Paired bootstrap comparison of replay runs (sleuthd_bench.paired) and `sleuthd-bench compare`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sleuthd_bench import paired
from sleuthd_bench.metrics import DetectionRecord, detection_metrics, localization_metrics


def _dialogue(did: str, s1_flag: set[int], s2_flag: set[int], s3_flag: set[int]) -> list[DetectionRecord]:
    """The three detection instances of one dialogue whose altered turn is 1, with the turns a run flagged."""
    gold = {"S1": set(), "S2": {1}, "S3": {1}}
    flags = {"S1": s1_flag, "S2": s2_flag, "S3": s3_flag}
    return [
        DetectionRecord(did, "src", s, frozenset(gold[s]), frozenset(flags[s]), bool(flags[s]))  # type: ignore[arg-type]
        for s in ("S1", "S2", "S3")
    ]


def _perfect(ids: list[str]) -> list[DetectionRecord]:
    return [r for d in ids for r in _dialogue(d, set(), {1}, {1})]


IDS = ["d0", "d1", "d2", "d3"]


def test_identical_runs_differ_by_nothing() -> None:
    run = _perfect(IDS)
    c = paired.compare("a", run, "b", run, resamples=200)
    for diff in (c.bal, c.bal_f1):
        assert (diff.difference, diff.low, diff.high, diff.p_ahead) == (0.0, 0.0, 0.0, 0.0)
    assert c.discordant == {"S1": (0, 0), "S2": (0, 0), "S3": (0, 0)} and c.n_dialogues == 4


def test_clusters_of_repeated_dialogues_are_resampled_whole() -> None:
    """Four voices, each with five dialogues that repeat one another; the baseline has a false alarm in every dialogue
    of the last voice. Over dialogues, a resample of 20 almost always draws some of them (P(ahead) = 1 - 0.75^20); over
    voices, it is the one-in-four voice of the four-dialogue case (P(ahead) = 1 - 0.75^4), and the interval is wider."""
    voices = {f"v{k}-{j}": f"v{k}" for k in range(4) for j in range(5)}
    run = _perfect(sorted(voices))
    base = [r for d in sorted(voices) for r in _dialogue(d, {0} if d.startswith("v3") else set(), {1}, {1})]
    plain = paired.compare("run", run, "base", base, resamples=4000, seed=1)
    whole = paired.compare("run", run, "base", base, resamples=4000, seed=1, groups=voices)
    assert plain.bal.difference == whole.bal.difference == pytest.approx(12.5)
    assert (plain.clusters, whole.clusters) == (0, 4)
    assert plain.bal.p_ahead == pytest.approx(1 - 0.75**20, abs=0.01)
    assert whole.bal.p_ahead == pytest.approx(1 - 0.75**4, abs=0.03)
    assert whole.bal.low == 0.0 and whole.bal.high - whole.bal.low > plain.bal.high - plain.bal.low
    assert "4 clusters" in paired.explanation([whole])
    with pytest.raises(ValueError, match="no cluster"):
        paired.compare("run", run, "base", base, resamples=10, groups={"v0-0": "v0"})


def test_one_false_alarm_of_four_dialogues() -> None:
    """The baseline flags turn 0 of one consistent dialogue: S1 accuracy 75 %, so Bal is 12.5 points lower
    (S1 weighs half), and so is Bal F1 (that S1 instance has F1 0)."""
    run = _perfect(IDS)
    base = [r for d in IDS[:3] for r in _dialogue(d, set(), {1}, {1})] + _dialogue("d3", {0}, {1}, {1})
    # The point estimates agree with the report's own metric functions.
    expected = detection_metrics(run)["bal"] - detection_metrics(base)["bal"]
    assert expected == pytest.approx(12.5)
    assert localization_metrics(run)["bal_f1"] - localization_metrics(base)["bal_f1"] == pytest.approx(12.5)

    c = paired.compare("run", run, "base", base, resamples=4000, seed=1)
    assert c.bal.difference == pytest.approx(12.5) and c.bal_f1.difference == pytest.approx(12.5)
    assert c.discordant == {"S1": (1, 0), "S2": (0, 0), "S3": (0, 0)}
    # A resample without d3 ties (difference 0); with k copies of it the run leads by 12.5 k points.
    assert c.bal.low == 0.0 and 12.5 < c.bal.high <= 50.0
    # P(ahead) = P(d3 is drawn at least once in 4 draws) = 1 - (3/4)^4 = 0.684.
    assert c.bal.p_ahead == pytest.approx(1 - 0.75**4, abs=0.03)
    # The other way round, everything flips sign.
    back = paired.compare("base", base, "run", run, resamples=4000, seed=1)
    assert back.bal.difference == pytest.approx(-12.5) and back.bal.p_ahead == 0.0
    assert (back.bal.low, back.bal.high) == pytest.approx((-c.bal.high, -c.bal.low))
    assert back.discordant["S1"] == (0, 1)


def test_a_missed_replacement_costs_localization_and_detection() -> None:
    run = _perfect(IDS)
    # The baseline misses the S3 replacement of d0 and flags the wrong turn in d1's S2 instance.
    base = _dialogue("d0", set(), {1}, set()) + _dialogue("d1", set(), {2}, {1}) + _perfect(IDS[2:])
    c = paired.compare("run", run, "base", base, resamples=100)
    assert c.bal.difference == pytest.approx(100 * 0.25 * (1 / 4))  # S3 accuracy 75 % (the wrong turn is detected)
    assert c.bal_f1.difference == pytest.approx(100 * 0.25 * (1 / 4 + 1 / 4))  # both F1s fall by a quarter
    assert c.discordant == {"S1": (0, 0), "S2": (0, 0), "S3": (1, 0)}


def test_only_dialogues_both_runs_answered_in_every_scenario_count() -> None:
    run = _perfect(IDS)
    base = _perfect(IDS[:2]) + [r for r in _perfect(["d2"]) if r.scenario != "S3"]  # d2 lacks S3, d3 is absent
    assert paired.compare("run", run, "base", base, resamples=10).n_dialogues == 2
    with pytest.raises(ValueError, match="share no dialogue"):
        paired.compare("run", run, "base", _perfect(["x"]), resamples=10)
    with pytest.raises(ValueError, match="resamples"):
        paired.compare("run", run, "base", run, resamples=0)
    with pytest.raises(ValueError, match="level"):
        paired.compare("run", run, "base", run, level=1.0)


def test_the_seed_fixes_the_interval() -> None:
    run = _perfect(IDS)
    base = _dialogue("d0", {0}, {1}, set()) + _dialogue("d1", set(), set(), {1}) + _perfect(IDS[2:])
    first = paired.compare("run", run, "base", base, resamples=300, seed=5)
    assert paired.compare("run", run, "base", base, resamples=300, seed=5) == first
    assert first.to_json()["discordant"]["S1"] == {"run_only": 1, "baseline_only": 0}


def test_compare_with_all_and_the_markdown_table() -> None:
    runs = {
        "auto": _perfect(IDS),
        "centroid@default": _dialogue("d0", {0}, {1}, {1}) + _perfect(IDS[1:]),
        "pairwise@paper": [r for d in IDS for r in _dialogue(d, set(), set(), set())],
    }
    comparisons = paired.compare_with_all(runs, "auto", resamples=200)
    assert [c.baseline for c in comparisons] == ["centroid@default", "pairwise@paper"]
    assert comparisons[1].bal.difference == pytest.approx(50.0)  # S2 and S3 all missed by the baseline
    table = paired.markdown_table(comparisons)
    assert table.splitlines()[0].startswith("| auto vs | n | Δ Bal acc [95 % CI]")
    assert "| centroid@default | 4 | +12.50 [" in table and "| 1/0 · 0/0 · 0/0 |" in table
    assert "| pairwise@paper | 4 | +50.00 [+50.00, +50.00] | 1.00 |" in table
    assert "200 resamples, seed 0" in paired.explanation(comparisons)
    with pytest.raises(ValueError, match="no run named 'ecapa'"):
        paired.compare_with_all(runs, "ecapa")


def _prediction_rows(run: str, records: list[DetectionRecord]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = [
        {
            "run": run,
            "dialogue_id": r.dialogue_id,
            "source": r.source,
            "scenario": r.scenario,
            "gold_inconsistent": r.gold_inconsistent,
            "pred_inconsistent": r.pred_inconsistent,
            "gold_turns": sorted(r.gold_turns),
            "pred_turns": sorted(r.pred_turns),
            "judged": True,
            "turns": [],
        }
        for r in records
    ]
    rows.append({"run": run, "dialogue_id": "d0", "scenario": "discrimination", "labels": ["S1", "S2", "S3"]})
    return rows


def test_records_from_predictions_round_trip() -> None:
    base = _dialogue("d0", {0}, {1}, set()) + _perfect(IDS[1:])
    rows = _prediction_rows("auto", _perfect(IDS)) + _prediction_rows("centroid@default", base)
    records = paired.detection_records(rows)
    assert list(records) == ["auto", "centroid@default"]
    assert records["centroid@default"] == base  # discrimination rows skipped, everything else kept


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sleuthd_bench.cli", "compare", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_bench_compare_command(tmp_path: Path) -> None:
    base = _dialogue("d0", {0}, {1}, set()) + _perfect(IDS[1:])
    rows = _prediction_rows("auto", _perfect(IDS)) + _prediction_rows("centroid@default", base)
    (tmp_path / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ok = _cli(str(tmp_path), "--resamples", "500", "--json", str(tmp_path / "c.json"))
    assert ok.returncode == 0, ok.stderr
    assert "| centroid@default | 4 | +18.75 [" in ok.stdout  # S1 -25 %, S3 -25 %: ½·25 + ¼·25
    saved = json.loads((tmp_path / "c.json").read_text())
    assert saved["comparisons"][0]["bal"]["difference"] == pytest.approx(18.75)

    for args, message in (
        ((str(tmp_path / "nowhere"),), "no such file"),
        ((str(tmp_path), "--run", "ecapa"), "no run named 'ecapa'"),
        ((str(tmp_path), "--level", "95"), "level must lie between 0 and 1"),
    ):
        bad = _cli(*args)
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    (tmp_path / "junk.jsonl").write_text("RIFF....WAVE\n")
    junk = _cli(str(tmp_path / "junk.jsonl"))
    assert junk.returncode == 2 and "not a replay's predictions.jsonl" in junk.stderr


def test_bench_compare_by_speaker(tmp_path: Path) -> None:
    """--by-speaker MANIFEST resamples the target speakers the manifest names (two dialogues each here)."""
    ids = [f"d{k}" for k in range(8)]
    base = [r for d in ids for r in _dialogue(d, {0} if d in ("d6", "d7") else set(), {1}, {1})]
    rows = _prediction_rows("auto", _perfect(ids)) + _prediction_rows("centroid@default", base)
    (tmp_path / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = [
        {"dialogue_id": d, "source": "src", "target_speaker": f"s{k // 2}", "reference": "r.wav",
         "target_turns": ["a.wav", "b.wav"], "altered_turn": 1, "s2_audio": "c.wav", "s3_audio": "d.wav"}
        for k, d in enumerate(ids)
    ]  # fmt: skip
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    ok = _cli(
        str(tmp_path),
        "--resamples",
        "500",
        "--by-speaker",
        str(tmp_path / "m.jsonl"),
        "--json",
        str(tmp_path / "c.json"),
    )
    assert ok.returncode == 0, ok.stderr
    assert "over 4 clusters of dialogues" in ok.stdout
    assert json.loads((tmp_path / "c.json").read_text())["comparisons"][0]["clusters"] == 4
    bad = _cli(str(tmp_path), "--by-speaker", str(tmp_path / "nowhere.jsonl"))
    assert bad.returncode == 2 and "--by-speaker" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def test_bench_compare_across_replays_of_one_manifest(tmp_path: Path) -> None:
    """One replay per encoder: runs are named FOLDER:RUN by the folder that tells the replays apart."""
    base = _dialogue("d0", {0}, {1}, set()) + _perfect(IDS[1:])
    for encoder, rows in (("ge2e", base), ("fused", _perfect(IDS))):
        folder = tmp_path / encoder / "fsdd"
        folder.mkdir(parents=True)
        (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _prediction_rows("auto", rows)))
    ok = _cli(
        str(tmp_path / "fused" / "fsdd"), str(tmp_path / "ge2e" / "fsdd"), "--run", "fused:auto", "--resamples", "500"
    )
    assert ok.returncode == 0, ok.stderr
    assert "| ge2e:auto | 4 | +18.75 [" in ok.stdout
    missing = _cli(str(tmp_path / "fused" / "fsdd"), str(tmp_path / "ge2e" / "fsdd"))  # --run auto: named FOLDER:RUN
    assert missing.returncode == 2 and "no run named 'auto'" in missing.stderr and "fused:auto" in missing.stderr
