"""`sleuthd-bench side-by-side`: server configurations or checkouts measured in alternating rounds of one run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from sleuthd_bench import side_by_side

REPO = Path(__file__).resolve().parents[2]


def test_variants_are_parsed_with_their_checkouts_and_misuse_is_refused() -> None:
    a, b = side_by_side.parse_variants(["base=", "t1=--intra-op-threads 1 --workers 2"], [f"base={REPO}"])
    assert (a.name, a.serve_args, a.checkout) == ("base", (), REPO)
    assert (b.serve_args, b.checkout, b.env()) == (("--intra-op-threads", "1", "--workers", "2"), None, None)
    env = a.env()
    assert env is not None and env["PYTHONPATH"].split(":")[0] == str(REPO / "service")
    for variants, checkouts, message in [
        (["only="], [], "at least two"),
        (["a=", "a=--workers 1"], [], "at least two"),
        (["a=", "b="], ["c=" + str(REPO)], "names no variant"),
        (["a=", "b="], ["a=/nonexistent"], "sleuthd checkout"),
        (["a", "b="], [], "NAME=SERVE ARGS"),
    ]:
        with pytest.raises(ValueError, match=message):
            side_by_side.parse_variants(variants, checkouts)


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng for the speech")
def test_each_variant_is_measured_in_every_round(tmp_path: Path) -> None:
    variants = side_by_side.parse_variants(["base=", "t1=--intra-op-threads 1"], [f"base={REPO}"])
    report = side_by_side.run(variants, ["ge2e"], [1], 0.5, 2, 2, tmp_path, 2, lambda _: None, beside_check=20)
    beside = {f"beside_check_stream_{q}_ms" for q in ("p50", "p90", "max")} | {"beside_checks_per_s"}
    for name in ("base", "t1"):
        samples = report["samples"][name]["ge2e"]
        assert set(samples) == {"c1_audio_s_per_s", "c1_p50_ms", "c1_p99_ms", "stream_ms", *beside}
        assert all(len(v) == 2 and min(v) > 0 for v in samples.values())  # one value per round
    assert len(report["load_average_per_round"]) == 3
    text = side_by_side.table(report)
    assert "| c1_audio_s_per_s |" in text and "t1 / base" in text
