"""`sleuthd-bench throughput` per encoder: the serving rate beside the raw model's, in one run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from sleuthd_bench import throughput
from sleuthd_bench.model_rate import model_rate

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng for the dialogues")


def test_model_rate_is_windows_per_second_at_each_batch() -> None:
    rates = model_rate("campplus", batches=(1, 2), seconds=0.2)
    assert sorted(rates) == [1, 2]
    assert all(0 < r < 10_000 for r in rates.values())  # windows/s of a 3 s-window CPU model


def test_throughput_reports_each_encoder_against_its_raw_model(tmp_path: Path) -> None:
    report = throughput.run(
        [1], 1.0, 2, tmp_path / "speech", "cpu", [], lambda _: None, ["resemblyzer", "batched"], encoder="fused"
    )
    assert report["encoder"] == "fused"
    assert list(report["modes"]) == ["batched"]  # resemblyzer is a GE2E baseline only
    raw = report["raw_model"]
    assert sorted(raw["components"]) == ["campplus", "ge2e"]
    parts = [p["audio_seconds_per_second"] for p in raw["components"].values()]
    assert raw["audio_seconds_per_second"] == pytest.approx(1 / sum(1 / p for p in parts))
    level = report["modes"]["batched"]["1"]
    assert level["errors"] == 0 and level["dialogues"] >= 1
    ratio = report["ratios"]["1"]["batched_over_raw_model"]
    assert ratio == pytest.approx(level["audio_seconds_per_second"] / raw["audio_seconds_per_second"])
    assert 0 < ratio < 2
    text = throughput.table(report)
    assert text.startswith("encoder fused: raw model ge2e ") and "batched / raw model" in text


def test_triton_mode_serves_the_same_scores_and_reports_both_processes(tmp_path: Path) -> None:
    """`--modes batched,triton`: the same dialogues through a real Triton (the wheel's server, --python-backend
    repository) score exactly as in-process, and the table carries the server's and Triton's CPU and memory."""
    report = throughput.run([2], 1.0, 2, tmp_path / "speech", "cpu", [], lambda _: None, ["batched", "triton"])
    for mode in ("batched", "triton"):
        level = report["modes"][mode]["2"]
        assert level["errors"] == 0 and level["dialogues"] >= 1 and level["turns_per_second"] > 0
        assert level["server_cores"] > 0 and level["server_rss_peak_mib"] > 50
    assert report["modes"]["triton"]["2"]["triton_cores"] > 0  # the models ran in Triton's processes
    assert report["modes"]["batched"]["2"]["triton_cores"] is None
    assert report["agreement_batched_vs_unbatched"]["triton_max_abs_pairwise_cosine_difference"] < 1e-6
    assert "batched / triton (audio s/s)" in throughput.table(report)
