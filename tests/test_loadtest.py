"""The locust load test end to end: a `sleuthd serve` subprocess, locust headless for a few seconds, CSV read back.

Locust is only ever run in a subprocess: importing it monkey-patches the standard library with gevent,
which would break the asyncio gRPC used by every other test in this process.
"""

from __future__ import annotations

import csv
import io
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from loadtest.speech import dialogues, tag_wav

from .support import REPO


@pytest.fixture
def server_target(models_dir: Path, tmp_path: Path) -> Iterator[str]:
    """``host:port`` of a real server process on a free loopback port, stopped (SIGTERM) afterwards."""
    log = (tmp_path / "server.log").open("w")
    cmd = [sys.executable, "-m", "sleuthd.cli", "--log-level", "warning", "serve", "--host", "127.0.0.1",
           "--port", "0", "--metrics-port", "-1", "--models-dir", str(models_dir)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        line = proc.stdout.readline() if ready else ""
        if not line.startswith("sleuthd listening on "):
            pytest.fail(f"server did not start: {line!r}\n{(tmp_path / 'server.log').read_text()}")
        yield line.split()[-1]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_locust_sends_both_rpcs_and_none_fail(server_target: str, tmp_path: Path) -> None:
    dialogues(2)  # synthesize (or find cached) speech before locust's clock starts
    prefix = tmp_path / "lt"
    # 2 users at 0.25 RPC/s each for 8 s: about 4 calls, far below what two cores serve. Each user
    # makes its first call within its first 4 s (a random phase in one interval), and the two start
    # at different places of the check/stream schedule, so each RPC runs at least once; calls still
    # in flight at the end finish within --stop-timeout and are counted.
    cmd = [sys.executable, "-m", "locust", "-f", "loadtest/locustfile.py", "--headless", "--only-summary",
           "--host", server_target, "--users", "2", "--spawn-rate", "2", "--run-time", "8s",
           "--stop-timeout", "20", "--csv", str(prefix), "--loglevel", "WARNING",
           "--tasks-per-second", "0.25", "--dialogues", "2", "--stream-chunks", "3"]  # fmt: skip
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr

    with Path(f"{prefix}_stats.csv").open(newline="") as fh:
        rows = {row["Name"]: row for row in csv.DictReader(fh)}
    for rpc in ("CheckDialogue", "StreamDialogue"):
        assert rows[rpc]["Type"] == "grpc"
        assert int(rows[rpc]["Request Count"]) > 0, (rpc, run.stdout)
        assert int(rows[rpc]["Failure Count"]) == 0, (rpc, Path(f"{prefix}_failures.csv").read_text())


def test_tagged_audio_is_new_to_the_cache_but_sounds_the_same() -> None:
    wav = dialogues(1)[0][0]
    a, b = tag_wav(wav, 0x1234_5678_9ABC), tag_wav(wav, 0x0FED_CBA9_8765)
    # Different bytes, so the server's embedding cache (keyed by the audio's bytes) misses ...
    assert len({wav, a, b}) == 3
    assert len(a) == len(wav)
    # ... yet every sample is within one step of 16-bit PCM of the original, and the header is intact.
    original, rate = sf.read(io.BytesIO(wav), dtype="int16")
    tagged, tagged_rate = sf.read(io.BytesIO(a), dtype="int16")
    assert tagged_rate == rate and tagged.shape == original.shape
    assert int(np.max(np.abs(tagged.astype(np.int32) - original))) <= 1
    # The tag is the nonce's bits in the low bits of the first 48 samples.
    assert sum(int(s & 1) << k for k, s in enumerate(tagged[:48])) == 0x1234_5678_9ABC
