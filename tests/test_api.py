"""The in-process API (sleuthd.api): a dialogue judged by ``Judge`` without a server equals, bit for bit, the
verdict a real server gives for the same dialogue, because both take one path (the client's request
building, the server's conversions and engine, the client's result types). Under the fused encoder, to CAM++'s
rounding: its model rounds a row differently with the other rows of its batch, and batches form by arrival."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from sleuthd.api import Judge
from sleuthd.client import AsyncSleuthClient, Turn, Verdict
from sleuthd.encoders.manifest import ManifestError
from sleuthd.errors import InvalidRequest, Unsupported
from sleuthd.rpc.server import RunningServer

from .support import VOICE_A, VOICE_B, VOICE_C, VOICE_F, Speech, assert_same_up_to_batch_rounding


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def judge(models_dir: Path) -> AsyncIterator[Judge]:
    # The session's server serves GE2E by default (tests/fixtures.py); the judge is loaded as a user would,
    # with that one default named.
    async with Judge.load(models_dir, encoder="ge2e", device="cpu") as j:
        yield j


@pytest_asyncio.fixture(loop_scope="session")
async def client(server: RunningServer) -> AsyncIterator[AsyncSleuthClient]:
    async with AsyncSleuthClient(f"127.0.0.1:{server.port}", timeout=60) as c:
        yield c


def two_speakers(speech: Speech) -> list[Turn]:
    """Ann (voice A) and Bob (voice C) taking turns; Ann's third turn is voice F, Bob's second voice B."""
    a, c = speech.clips[VOICE_A], speech.clips[VOICE_C]
    return [
        Turn("Ann", a[0], text="Good morning."), Turn("Bob", c[0]), Turn("Ann", a[1]),
        Turn("Bob", speech.clips[VOICE_B][1]), Turn("Ann", speech.clips[VOICE_F][2]), Turn("Bob", c[2]),
        Turn("Ann", a[3]), Turn("Bob", None, text="(not synthesized yet)"),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "options",
    [
        {},  # the server's defaults: auto on GE2E
        {"encoder": "fused", "similarity_matrix": True},
        {"method": "reference", "detect_drift": True},
        {"method": "centroid", "threshold": 0.05},
    ],
)
async def test_the_judge_gives_the_servers_verdict_bit_for_bit(
    judge: Judge, client: AsyncSleuthClient, speech: Speech, options: dict[str, object]
) -> None:
    turns = two_speakers(speech)
    references = {"Ann": speech.clips[VOICE_A][5], "Bob": speech.clips[VOICE_C][5]}
    served = await client.check(turns, references=references, dialogue_id="same", **options)  # type: ignore[arg-type]
    local = await judge.acheck(turns, references=references, dialogue_id="same", **options)  # type: ignore[arg-type]
    assert isinstance(local, Verdict)
    if options.get("encoder") == "fused":
        assert_same_up_to_batch_rounding(local, served)  # CAM++ rounds by batch composition
    else:
        assert local == served  # every field, every float to the bit (dataclass equality compares floats exactly)
    assert local.inconsistent_turns  # something was found, so the comparison covers flagged turns too
    assert [t.turn_id for t in local.turns] == ["t1", "t2", "t3", "t4", "t5", "t6", "t7"]


async def test_the_judge_ranks_as_the_server_does(judge: Judge, client: AsyncSleuthClient, speech: Speech) -> None:
    a = speech.clips[VOICE_A]
    candidates = {"other": speech.clips[VOICE_B][2], "same": a[4], "far": speech.clips[VOICE_F][3]}
    for method in ("auto", "pairwise"):
        served = await client.rank(candidates, context=a[:3], method=method)
        local = await judge.arank(candidates, context=a[:3], method=method)
        assert local == served and local.best.candidate_id == "same"


def test_the_blocking_judge_and_its_errors(models_dir: Path, speech: Speech, tmp_path: Path) -> None:
    """The synchronous methods, on the judge's own event loop; bad input raises the engine's own errors."""
    with Judge.load(models_dir, encoder="ge2e", device="cpu") as judge:
        turns = [("Ann", p) for p in (*speech.clips[VOICE_A][:3], speech.clips[VOICE_F][0])]
        verdict = judge.check(turns)
        assert verdict.inconsistent_turns == ("t4",) and verdict.encoder == "ge2e"
        assert judge.check(turns) == verdict  # the loop is reused
        assert judge.rank([speech.clips[VOICE_F][1], speech.clips[VOICE_A][4]], context=speech.clips[VOICE_A][:3]).best
        junk = tmp_path / "junk.wav"
        junk.write_bytes(b"not audio" * 50)
        with pytest.raises(InvalidRequest, match="turn 't1'"):
            judge.check([("Ann", junk), ("Ann", speech.clips[VOICE_A][0])])
        with pytest.raises(Unsupported, match=r"Judge\.load\(registry=FILE\)"):
            judge.check(turns, voices={"Ann": "ann-v1"})
        with pytest.raises(ValueError, match="choose from pairwise"):
            judge.check(turns, method="bogus")
    with pytest.raises(ManifestError, match="sleuthd models export all"):
        Judge.load(tmp_path / "no-models")


async def test_a_judge_with_a_registry_names_voices(models_dir: Path, speech: Speech, tmp_path: Path) -> None:
    """Judge.load(registry=...) opens the same voice registry a server would (voices registered there)."""
    from sleuthd.client import register_request
    from sleuthd.rpc.convert import registration_from_pb

    async with Judge.load(models_dir, encoder="ge2e", device="cpu", registry=str(tmp_path / "v.sqlite3")) as judge:
        assert judge.engine.registry is not None
        req = register_request("ann", speech.clips[VOICE_A][5:7])
        await judge.engine.voices.register(registration_from_pb(req), None)
        turns = [("Ann", p) for p in (*speech.clips[VOICE_A][:3], speech.clips[VOICE_F][0])]
        by_voice = await judge.acheck(turns, voices={"Ann": "ann"}, method="reference")
        assert by_voice.inconsistent_turns == ("t4",)


def test_importing_the_api_loads_no_grpc() -> None:
    """The judge reaches the client library (which loads grpc) only when it is used."""
    import subprocess
    import sys

    code = "import sys, sleuthd.api; print(any(m == 'grpc' or m.startswith('grpc.') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"


def test_the_readme_judge_example_runs_as_written(speech: Speech, tmp_path: Path) -> None:
    import re
    import shutil
    import subprocess
    import sys

    from .support import REPO

    match = re.search(r"<!-- judge-example -->\n```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert match, "README.md lost its Judge example (marked <!-- judge-example -->)"
    files = {"m1": speech.clips[VOICE_A][0], "t1": speech.clips[VOICE_C][0], "m2": speech.clips[VOICE_F][2],
             "ref": speech.clips[VOICE_A][5], "a": speech.clips[VOICE_A][4], "b": speech.clips[VOICE_B][3]}  # fmt: skip
    for name, path in files.items():
        shutil.copy(path, tmp_path / f"{name}.wav")
    out = subprocess.run([sys.executable, "-c", match.group(1)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False ('t3',)"


def test_a_judge_never_closed_releases_its_models_quietly_at_exit(speech: Speech, tmp_path: Path) -> None:
    # A script that forgets close() used to end with asyncio's "Task was destroyed but it is pending!" for
    # each encoder's micro-batcher; the Judge now releases its models on its own loop at exit.
    import subprocess
    import sys

    for name, path in {"a": speech.clips[VOICE_A][0], "b": speech.clips[VOICE_A][1]}.items():
        (tmp_path / f"{name}.wav").write_bytes(path.read_bytes())
    script = (
        "from sleuthd.api import Judge\n"
        "judge = Judge.load()\n"
        "print(judge.check([('A', 'a.wav'), ('A', 'b.wav')]).consistent)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
    assert "Task was destroyed" not in out.stderr and "Traceback" not in out.stderr, out.stderr
