"""The console script end to end: `sleuthd serve --port 0` in a subprocess, `sleuthd check`/`rank` against it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .support import VOICE_A, VOICE_B, VOICE_F, Speech

SLEUTHD = [sys.executable, "-m", "sleuthd.cli"]


@pytest.fixture(scope="module")
def served(models_dir: Path) -> Iterator[str]:
    proc = subprocess.Popen(
        [
            *SLEUTHD,
            "--log-level",
            "warning",
            "serve",
            "--port",
            "0",
            "--metrics-port",
            "0",
            "--models-dir",
            str(models_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the server prints where it listens
    assert line.startswith("sleuthd listening on 127.0.0.1:"), line + (proc.stderr.read() if proc.stderr else "")
    target = line.split()[-1]
    yield target
    proc.send_signal(signal.SIGTERM)  # graceful shutdown: drain, close, exit 0
    assert proc.wait(timeout=30) == 0


def write_dialogue(tmp: Path, speech: Speech, altered_voice: str | None) -> Path:
    turns = []
    for k in range(4):
        src = speech.clips[altered_voice][0] if (altered_voice and k == 2) else speech.clips[VOICE_A][k]
        turns.append({"turn_id": f"t{k}", "speaker": "Ann", "text": "...", "audio": str(src)})
    path = tmp / "dialogue.json"
    path.write_text(
        json.dumps({"dialogue_id": "cli", "turns": turns, "references": {"Ann": str(speech.clips[VOICE_A][5])}})
    )
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SLEUTHD, *args], capture_output=True, text=True, timeout=120)


def test_check_prints_table_and_exit_code(served: str, speech: Speech, tmp_path: Path) -> None:
    ok = run("check", str(write_dialogue(tmp_path, speech, None)), "--target", served)
    assert ok.returncode == 0, ok.stderr
    assert "speaker Ann: consistent (4 scored, 0 unscored)" in ok.stdout
    bad = run("check", str(write_dialogue(tmp_path, speech, VOICE_F)), "--target", served, "--method", "reference")
    assert bad.returncode == 3, bad.stderr
    assert "speaker Ann: INCONSISTENT: t2" in bad.stdout
    as_json = run("check", str(write_dialogue(tmp_path, speech, VOICE_F)), "--target", served, "--json")
    verdict = json.loads(as_json.stdout)
    assert verdict["speakers"][0]["inconsistent_turn_ids"] == ["t2"]


def test_rank_prints_best_first(served: str, speech: Speech) -> None:
    r = run(
        "rank",
        "--target", served,
        "--context", *(str(p) for p in speech.clips[VOICE_A][:3]),
        "--candidate", str(speech.clips[VOICE_B][2]),
        "--candidate", str(speech.clips[VOICE_A][4]),
        "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    ranked = json.loads(r.stdout)["candidates"]
    assert ranked[0]["candidate_id"] == "04.wav" and ranked[0]["rank"] == 1


def test_client_errors_are_one_line(served: str, tmp_path: Path) -> None:
    missing = tmp_path / "d.json"
    missing.write_text(json.dumps({"turns": [{"turn_id": "a", "speaker": "A", "audio": "nope.wav"}]}))
    r = run("check", str(missing), "--target", served)
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr
    junk = tmp_path / "junk.wav"
    junk.write_bytes(b"not audio at all" * 10)
    missing.write_text(json.dumps({"turns": [{"turn_id": "a", "speaker": "A", "audio": "junk.wav"}]}))
    r = run("check", str(missing), "--target", served)
    assert r.returncode == 2 and "INVALID_ARGUMENT" in r.stderr and "turn 'a'" in r.stderr


def test_unreachable_server_is_a_clear_error(tmp_path: Path, speech: Speech) -> None:
    start = time.monotonic()
    r = run("check", str(write_dialogue(tmp_path, speech, None)), "--target", "127.0.0.1:1", "--timeout", "5")
    assert r.returncode == 2 and "UNAVAILABLE" in r.stderr, r.stderr
    assert time.monotonic() - start < 60  # retries are bounded
