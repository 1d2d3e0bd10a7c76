"""`sleuthd-bench latency` end to end on a tiny run: a real server subprocess, a real stream and real
CheckDialogue calls. Checks what the report contains, never how fast anything was."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from sleuthd_bench import latency, synth

needs_tools = pytest.mark.skipif(
    any(shutil.which(t) is None for t in synth.TOOLS), reason="needs espeak-ng, flite and sox (make setup)"
)


@needs_tools
def test_turns_are_distinct_real_speech(tmp_path: Path) -> None:
    clips = latency.voice_clips(tmp_path)
    turns = latency.stream_turns(clips, 30, seed=0)
    assert len({wav for _, wav in turns}) == 30  # every turn is embedded, never answered from a cache
    assert [s for s, _ in turns[:4]] == ["S0", "S1", "S0", "S1"]
    request = latency.check_request(clips, 12, seed=0)
    assert len({t.audio.pcm.data for t in request.turns}) == 12
    assert all(len(t.audio.pcm.data) == 2 * int(latency.CHECK_SECONDS * latency.CHECK_RATE) for t in request.turns)


@needs_tools
def test_a_small_run_reports_every_measurement(tmp_path: Path, models_dir: Path) -> None:
    messages: list[str] = []
    report = latency.run([2, 12], [3], 1, tmp_path, None, ["--models-dir", str(models_dir)], messages.append)
    stream = report["stream"]
    assert set(stream["median_ms_of_last_10"]) == {"2", "12"}
    # The server logged its judging of every streamed turn, so each checkpoint has a judging time.
    assert set(stream["judge_median_ms_of_last_10"]) == {"2", "12"}
    assert stream["rss_bytes_per_turn"] is not None and stream["revisions"] >= 0
    assert report["check"]["3"]["judge_p50_ms"] is not None and report["check"]["3"]["rpc_p50_ms"] > 0
    table = latency.table(report)
    assert "| 12 |" in table and "| 3 |" in table
