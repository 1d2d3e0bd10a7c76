"""`sleuthd-bench replay`: the small synthetic dev set replayed through the real in-process server."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from sleuthd.api import SpeakerEncoder
from sleuthd.rpc.server import RunningServer
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd_bench import synth
from sleuthd_bench.devsets import PRESETS, build_devsets
from sleuthd_bench.instances import discrimination_candidates, discrimination_context, plan_runs, scenario_turns
from sleuthd_bench.manifest import ManifestError, ManifestLine, read_manifest, relative_path
from sleuthd_bench.replay import ReplayConfig, ReplayError, check_auto_supported, replay

from tests.support import REPO, assert_same_up_to_batch_rounding

needs_tools = pytest.mark.skipif(
    any(shutil.which(t) is None for t in synth.TOOLS), reason="needs espeak-ng, flite and sox (make setup)"
)

SMALL_DIR = REPO / "data" / "dev" / "small"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PAPER_RUNS = ("pairwise@paper", "centroid@paper", "reference@paper")
ALL_RUNS = (
    "pairwise@paper",
    "pairwise@default",
    "centroid@paper",
    "centroid@default",
    "reference@paper",
    "reference@default",
)
RUN_KEYS = {"detection", "localization", "discrimination"}


def _line(**kw: Any) -> ManifestLine:
    base: dict[str, Any] = {
        "dialogue_id": "d1",
        "source": "src",
        "target_speaker": "A",
        "reference": "ref.wav",
        "target_turns": ("t0.wav", "t1.wav", "t2.wav", "t3.wav"),
        "altered_turn": 2,
        "s2_audio": "s2.wav",
        "s3_audio": "s3.wav",
    }
    return ManifestLine(**{**base, **kw})


# --------------------------------------------------------------------------- pure parts


def test_runs_always_include_the_paper_methods_at_paper_thresholds() -> None:
    assert [r.name for r in plan_runs(["pairwise"], ["default"])] == [
        "pairwise@paper",
        "pairwise@default",
        "centroid@paper",
        "reference@paper",
    ]
    assert [r.name for r in plan_runs(["centroid", "auto"], ["default", "paper"])] == [
        "centroid@default",
        "centroid@paper",
        "auto",
        "pairwise@paper",
        "reference@paper",
    ]
    # The LALM judge, like auto, is one run: its decision threshold is the server's.
    assert [r.name for r in plan_runs(["lalm", "auto"], ["default"])] == [
        "lalm",
        "auto",
        "pairwise@paper",
        "centroid@paper",
        "reference@paper",
    ]


def test_instances_derived_from_a_line() -> None:
    line = _line()
    assert scenario_turns(line, "S1") == ("t0.wav", "t1.wav", "t2.wav", "t3.wav")
    assert scenario_turns(line, "S2") == ("t0.wav", "t1.wav", "s2.wav", "t3.wav")
    assert scenario_turns(line, "S3") == ("t0.wav", "t1.wav", "s3.wav", "t3.wav")
    assert discrimination_context(line) == ("t0.wav", "t1.wav", "t3.wav")
    cands = discrimination_candidates(line, seed=0)
    assert [c.candidate_id for c in cands] == ["c0", "c1", "c2"]
    assert {(c.label, c.path) for c in cands} == {("S1", "t2.wav"), ("S2", "s2.wav"), ("S3", "s3.wav")}
    assert discrimination_candidates(line, seed=0) == cands  # fixed per dialogue
    orders = {tuple(c.label for c in discrimination_candidates(_line(dialogue_id=f"d{i}"))) for i in range(40)}
    assert len(orders) > 3, "the shuffle should vary between dialogues"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda o: o.pop("s3_audio"), "m.jsonl line 2: missing required field(s) s3_audio"),
        (lambda o: o.update(altered_turn=4), "m.jsonl line 2: d2: altered_turn 4 is outside 0..3"),
        (lambda o: o.update(dialogue_id="d1"), "m.jsonl line 2: dialogue_id 'd1' already used on line 1"),
        (lambda o: o.update(target_turns=["t0.wav"]), "target_turns needs at least 2 turns"),
        (lambda o: o.update(source="avg"), "source 'avg' is reserved"),
    ],
)
def test_manifest_errors_name_the_line(tmp_path: Path, edit: Any, message: str) -> None:
    second = _line(dialogue_id="d2").to_json()
    edit(second)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps(_line().to_json()) + "\n" + json.dumps(second) + "\n")
    with pytest.raises(ManifestError, match=re.escape(message)):
        read_manifest(manifest, check_audio=False)


def test_auto_needs_the_method_in_the_api() -> None:
    check_auto_supported(["pairwise", "centroid"])
    if "METHOD_AUTO" in pb.Method.keys():
        check_auto_supported(["auto"])
    else:
        with pytest.raises(ReplayError, match="this server/client has no auto method"):
            check_auto_supported(["auto"])


# --------------------------------------------------------------------------- through the server


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def small_devset(speaker_encoder: SpeakerEncoder) -> dict[str, Path]:
    """The small dev set (cached under data/dev/small/; FSDD included when the data is present)."""
    result = await build_devsets(SMALL_DIR, PRESETS["small"], speaker_encoder, show_progress=False)
    return result.manifests


def _assert_pct_tree(obj: Any, where: str) -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            _assert_pct_tree(v, f"{where}.{k}")
    else:
        assert isinstance(obj, float) and 0.0 <= obj <= 100.0, f"{where} = {obj!r}"


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR" and data[-8:-4] == b"IEND", f"{path} is not a PNG"


@needs_tools
async def test_small_devset_replays_with_a_complete_report(
    server: RunningServer, small_devset: dict[str, Path], tmp_path: Path
) -> None:
    manifest = small_devset["all"]
    lines = read_manifest(manifest)
    assert {line.source for line in lines} == {"fit", "transfer"}
    out = tmp_path / "report"
    methods = ("pairwise", "centroid", "reference", "auto")
    result = await replay(
        ReplayConfig(
            manifest=manifest,
            target=f"127.0.0.1:{server.port}",
            out_dir=out,
            methods=methods,
            show_progress=False,
        )
    )
    assert result.failures == [] and result.incomplete_runs == []
    runs = (*ALL_RUNS, "auto")

    report = json.loads((out / "report.json").read_text())
    assert set(report) == {"manifest", "n_dialogues", "encoder", "methods"}
    assert (report["manifest"], report["n_dialogues"], report["encoder"]) == ("all.jsonl", len(lines), "ge2e")
    assert tuple(report["methods"]) == runs
    for name, res in report["methods"].items():
        assert set(res) == RUN_KEYS, name
        assert set(res["detection"]) == {"S1", "S2", "S3", "bal"}
        assert set(res["localization"]) == {"S1", "S2", "S3", "bal_f1"}
        assert set(res["localization"]["S1"]) == {"f1"}
        assert set(res["localization"]["S2"]) == set(res["localization"]["S3"]) == {"p", "r", "f1"}
        assert set(res["discrimination"]) == {"accuracy", "ndcg1", "ndcg2", "exact_match"}
        assert set(res["discrimination"]["accuracy"]) == {"fit", "transfer", "avg"}
        _assert_pct_tree(res, name)
        # Ranking the original turn against a gender switch and another voice is easy for GE2E.
        assert res["discrimination"]["accuracy"]["avg"] >= 90.0, name
    calibrated = report["methods"]["pairwise@default"]["detection"]
    assert calibrated["S2"] >= 80.0 and calibrated["S1"] >= 80.0

    for png in ("threshold_sweep.png", "bias_scatter.png", "reliability.png"):
        _assert_png(out / png)
    predictions = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == len(runs) * len(lines) * 4  # S1, S2, S3 and discrimination
    s2 = next(p for p in predictions if p["run"] == "pairwise@default" and p["scenario"] == "S2")
    assert len(s2["turns"]) == 5 and all(t["reference_cosine"] is not None for t in s2["turns"])
    disc = next(p for p in predictions if p["scenario"] == "discrimination")
    assert sorted(disc["labels"]) == ["S1", "S2", "S3"] and len(disc["scores"]) == 3
    # auto's order is the server's (the candidates the gate would pass first), not its score's: that is what counts.
    auto_disc = [p for p in predictions if p["run"] == "auto" and p["scenario"] == "discrimination"]
    top1 = 100 * sum(p["pred_order"][0] == "S1" for p in auto_disc) / len(auto_disc)
    assert report["methods"]["auto"]["discrimination"]["accuracy"]["avg"] == pytest.approx(top1, abs=0.05)

    sweep = json.loads((out / "sweep.json").read_text())
    assert set(sweep["methods"]) == {"pairwise", "centroid", "reference"}
    for method, s in sweep["methods"].items():
        assert len(s["curve"]) == (121 if method == "centroid" else 101)
        assert {"threshold", "bal", "bal_f1"} <= set(s["best_by_bal"]) and "threshold" in s["best_by_bal_f1"]
    md = (out / "report.md").read_text()
    assert all(f"| {run} |" in md for run in runs)
    # Where the manifest names 4 or more target speakers, each best threshold held out over them.
    if len({line.target_speaker for line in lines}) >= 4:
        for method, s in sweep["methods"].items():
            h = s["held_out"]
            assert h["speakers"] == len({line.target_speaker for line in lines}) and 0 < h["splits"] <= 20, method
            assert h["bal"]["low"] <= h["bal"]["mean"] <= h["bal"]["high"] and h["bal"]["mean"] <= h["own_best_bal"]
        assert "### The best threshold, held out over target speakers" in md
    else:
        assert all("held_out" not in s for s in sweep["methods"].values()) and "held out over target" not in md

    # auto's probabilities, and auto against every other run over the same dialogues.
    calibration = json.loads((out / "calibration.json").read_text())
    assert calibration["run"] == "auto" and 0.0 <= calibration["ece"] <= 1.0
    comparisons = json.loads((out / "comparison.json").read_text())["comparisons"]
    assert [c["baseline"] for c in comparisons] == list(ALL_RUNS)
    for c in comparisons:
        name = c["baseline"]
        assert c["run"] == "auto" and c["n_dialogues"] == len(lines)
        for measure, key in (("bal", "bal"), ("bal_f1", "bal_f1")):
            section = "detection" if measure == "bal" else "localization"
            got = report["methods"]["auto"][section][key] - report["methods"][name][section][key]
            # report.json rounds each run to 0.1, so its difference is within 0.1 of the paired one.
            assert abs(c[measure]["difference"] - got) <= 0.1 + 1e-9, (name, measure)
            assert c[measure]["low"] <= c[measure]["high"] and 0.0 <= c[measure]["p_ahead"] <= 1.0, (name, measure)
    assert "## auto against each run, paired" in md and "| auto vs | n | Δ Bal acc [95 % CI]" in md
    # Where a speaker has several dialogues, the same comparisons over whole speakers, beside them.
    speakers = {line.target_speaker for line in lines}
    saved = json.loads((out / "comparison.json").read_text())
    if len(speakers) < len(lines):
        over = saved["comparisons_by_speaker"]
        assert [c["baseline"] for c in over] == list(ALL_RUNS) and {c["clusters"] for c in over} == {len(speakers)}
        for c, d in zip(over, comparisons, strict=True):
            assert c["bal"]["difference"] == pytest.approx(d["bal"]["difference"])
        assert "### The same over target speakers" in md and f"over {len(speakers)} clusters" in md
    else:
        assert "comparisons_by_speaker" not in saved and "The same over target speakers" not in md

    if "fsdd" in small_devset:  # real speech, all male: S2 falls back to the least similar speaker
        assert {line.meta["s2_policy"] for line in read_manifest(small_devset["fsdd"])} == {"least_similar"}


@needs_tools
async def test_failed_instances_are_counted_and_left_out(
    server: RunningServer, small_devset: dict[str, Path], tmp_path: Path
) -> None:
    # Three dialogues in a manifest of our own (paths rewritten relative to it); one S3 clip is not audio.
    base = small_devset["all"].parent
    broken = tmp_path / "broken.wav"
    broken.write_text("not audio")
    raw = [json.loads(x) for x in small_devset["all"].read_text().splitlines()[:3]]
    for obj in raw:
        for key in ("reference", "s2_audio", "s3_audio"):
            obj[key] = relative_path(base / obj[key], tmp_path)
        obj["target_turns"] = [relative_path(base / t, tmp_path) for t in obj["target_turns"]]
    raw[1]["s3_audio"] = "broken.wav"
    manifest = tmp_path / "three.jsonl"
    manifest.write_text("".join(json.dumps(o) + "\n" for o in raw))

    result = await replay(
        ReplayConfig(
            manifest=manifest,
            target=f"127.0.0.1:{server.port}",
            out_dir=tmp_path / "out",
            methods=("pairwise",),
            thresholds=("paper",),
            show_progress=False,
        )
    )
    # Three paper runs: S3 of dialogue 1 fails in each, and so does its ranking for each method.
    assert len(result.failures) == 6
    assert {f.code for f in result.failures} == {"INVALID_ARGUMENT"}
    assert {f.dialogue_id for f in result.failures} == {raw[1]["dialogue_id"]}
    assert "could not be decoded" in result.failures[0].message
    assert result.report["n_dialogues"] == 3
    predictions = (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()
    assert len(predictions) == 3 * 3 * 4 - 6
    replay_doc = json.loads((tmp_path / "out" / "replay.json").read_text())
    assert replay_doc["failures"]["by_code"] == {"INVALID_ARGUMENT": 6}
    assert "## Failures" in (tmp_path / "out" / "report.md").read_text()


@needs_tools
async def test_speakers_with_several_dialogues_get_the_comparison_over_speakers_too(
    server: RunningServer, small_devset: dict[str, Path], tmp_path: Path
) -> None:
    """Six dialogues named as three speakers' (two each): comparison.json and report.md carry auto against each run
    over the three speakers beside the one over the six dialogues; same differences, resampled by speaker."""
    base = small_devset["all"].parent
    raw = [json.loads(x) for x in small_devset["all"].read_text().splitlines()[:6]]
    for k, obj in enumerate(raw):
        for key in ("reference", "s2_audio", "s3_audio"):
            obj[key] = relative_path(base / obj[key], tmp_path)
        obj["target_turns"] = [relative_path(base / t, tmp_path) for t in obj["target_turns"]]
        obj["target_speaker"] = f"speaker-{k // 2}"
    manifest = tmp_path / "six.jsonl"
    manifest.write_text("".join(json.dumps(o) + "\n" for o in raw))
    out = tmp_path / "out"
    await replay(
        ReplayConfig(
            manifest=manifest,
            target=f"127.0.0.1:{server.port}",
            out_dir=out,
            methods=("auto",),
            thresholds=("paper",),
            show_progress=False,
        )
    )
    saved = json.loads((out / "comparison.json").read_text())
    plain, over = saved["comparisons"], saved["comparisons_by_speaker"]
    assert [c["baseline"] for c in over] == [c["baseline"] for c in plain] and len(over) == 3
    for c, d in zip(over, plain, strict=True):
        assert (c["clusters"], d["clusters"], c["n_dialogues"]) == (3, 0, 6)
        assert c["bal"]["difference"] == pytest.approx(d["bal"]["difference"])
    md = (out / "report.md").read_text()
    assert "### The same over target speakers" in md and "over 3 clusters of dialogues, each drawn whole" in md


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def busy_server(models_dir: Path) -> AsyncIterator[RunningServer]:
    """A server that admits one request's audio at a time (--max-audio-in-flight-mb 0.01: a request finding another
    in flight is refused RESOURCE_EXHAUSTED; one finding nothing held is always let in)."""
    from sleuthd.config import AdmissionConfig, EngineConfig, ServerConfig
    from sleuthd.engine.facade import Engine
    from sleuthd.ops.metrics import ServiceMetrics
    from sleuthd.rpc.server import create_server

    admission = AdmissionConfig(max_audio_in_flight_mb=0.01)
    engine = Engine.load(EngineConfig(models_dir=models_dir, device="cpu", admission=admission))
    running = await create_server(engine, ServerConfig(port=0, metrics_port=0), ServiceMetrics())
    yield running
    await running.stop(grace=1.0)
    await engine.aclose()


@needs_tools
async def test_busy_refusals_are_sent_again_until_answered(
    busy_server: RunningServer, small_devset: dict[str, Path], tmp_path: Path
) -> None:
    """RESOURCE_EXHAUSTED means "busy, retry later" (sleuthd.rpc.status): the replay backs off and sends the call again
    instead of leaving the instance out. Four calls in flight against a server that admits one at a time: without
    retries some are refused and left out; with them every instance is answered, with the same verdicts."""
    manifest = tmp_path / "two.jsonl"
    base = small_devset["all"].parent
    raw = [json.loads(x) for x in small_devset["all"].read_text().splitlines()[:2]]
    for obj in raw:
        for key in ("reference", "s2_audio", "s3_audio"):
            obj[key] = relative_path(base / obj[key], tmp_path)
        obj["target_turns"] = [relative_path(base / t, tmp_path) for t in obj["target_turns"]]
    manifest.write_text("".join(json.dumps(o) + "\n" for o in raw))

    def config(out: str, retries: int) -> ReplayConfig:
        return ReplayConfig(
            manifest=manifest,
            target=f"127.0.0.1:{busy_server.port}",
            out_dir=tmp_path / out,
            methods=("pairwise",),
            thresholds=("paper",),
            concurrency=4,
            show_progress=False,
            busy_retries=retries,
        )

    refused = await replay(config("once", 0))
    assert refused.failures and {f.code for f in refused.failures} == {"RESOURCE_EXHAUSTED"}
    assert refused.busy_retries == 0
    patient = await replay(config("patient", 6))
    assert patient.failures == [] and patient.busy_retries > 0
    assert patient.rpcs == len(plan_runs(("pairwise",), ("paper",))) * 2 * 4 + patient.busy_retries
    answered = {(p["run"], p["dialogue_id"], p.get("scenario")): p for p in _predictions(tmp_path / "patient")}
    for p in _predictions(tmp_path / "once"):
        assert_same_up_to_batch_rounding(answered[(p["run"], p["dialogue_id"], p.get("scenario"))], p)


def _predictions(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@needs_tools
async def test_unreachable_target_fails_with_a_clear_message(small_devset: dict[str, Path], tmp_path: Path) -> None:
    config = ReplayConfig(
        manifest=small_devset["all"],
        target=f"127.0.0.1:{_closed_port()}",
        out_dir=tmp_path,
        connect_timeout_s=1.0,
        show_progress=False,
    )
    with pytest.raises(ReplayError, match="cannot reach a sleuthd server"):
        await replay(config)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sleuthd_bench.cli", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_cli_errors_are_one_line_without_traceback(tmp_path: Path) -> None:
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps(_line().to_json()) + "\n")
    missing = _cli("replay", str(manifest), "--target", f"127.0.0.1:{_closed_port()}", "--out", str(tmp_path / "o"))
    assert missing.returncode == 2
    assert "error: manifest m.jsonl names 7 audio file(s) that do not exist" in missing.stderr
    assert "Traceback" not in missing.stderr

    for name in ("ref.wav", "t0.wav", "t1.wav", "t2.wav", "t3.wav", "s2.wav", "s3.wav"):
        (tmp_path / name).write_bytes(b"RIFF")
    unreachable = _cli(
        "replay", str(manifest), "--target", f"127.0.0.1:{_closed_port()}", "--connect-timeout", "1", "--quiet"
    )
    assert unreachable.returncode == 2
    assert "error: cannot reach a sleuthd server" in unreachable.stderr
    assert "Traceback" not in unreachable.stderr

    bad_option = _cli("replay", str(manifest), "--thresholds", "paper,tuned")
    assert bad_option.returncode == 2 and "unknown tuned" in bad_option.stderr


def test_auto_discrimination_is_scored_by_the_servers_order() -> None:
    """auto ranks the candidates the gate would pass first, so its order may disagree with its scores (cosines):
    the metrics read its server order; every other method is read by score, ties pessimistically."""
    from sleuthd_bench.instances import Candidate
    from sleuthd_bench.metrics import discrimination_metrics
    from sleuthd_bench.replay import RankOutcome, _discrimination_record

    line = _line()
    candidates = [Candidate("c0", "S3", "y.wav"), Candidate("c1", "S1", "t1.wav"), Candidate("c2", "S2", "x.wav")]
    # The similar voice has the higher cosine; the server put the original first (the gate passes only it).
    outcome = RankOutcome(candidates, [0.91, 0.88, 0.40], True, ["S1", "S3", "S2"], "fused")
    auto = discrimination_metrics([_discrimination_record(line, outcome, "auto")])
    by_score = discrimination_metrics([_discrimination_record(line, outcome, "centroid")])
    assert auto["accuracy"]["avg"] == 100.0 and auto["exact_match"] == 100.0
    assert by_score["accuracy"]["avg"] == 0.0
