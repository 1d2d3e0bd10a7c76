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
