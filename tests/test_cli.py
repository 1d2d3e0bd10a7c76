"""The console script end to end: `sleuthd serve --port 0 --registry FILE` in a subprocess, `sleuthd
check`/`rank`/`voices` against it: one dialogue, a batch or a folder, the JSON output, exit codes, candidate
ids, voices; `sleuthd check --local` without a server."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from sleuthd.client import SleuthClient

from .support import VOICE_A, VOICE_B, VOICE_C, VOICE_F, Speech

SLEUTHD = [sys.executable, "-m", "sleuthd.cli"]


@pytest.fixture(scope="module")
def server(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str]]:
    """The server process's pid and its target."""
    registry = tmp_path_factory.mktemp("registry") / "voices.sqlite3"
    log = registry.with_name("server.log")
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
            "--registry",
            str(registry),
        ],
        stdout=subprocess.PIPE,
        stderr=log.open("w"),  # a file: a pipe nobody reads would fill up with the server's log
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the server prints where it listens
    assert line.startswith("sleuthd listening on 127.0.0.1:"), line + log.read_text()
    target = line.split()[-1]
    yield proc.pid, target
    proc.send_signal(signal.SIGTERM)  # graceful shutdown: drain, close, exit 0
    assert proc.wait(timeout=30) == 0


@pytest.fixture(scope="module")
def served(server: tuple[int, str]) -> str:
    return server[1]


def dialogue_doc(speech: Speech, altered_voice: str | None, dialogue_id: str = "cli") -> dict[str, object]:
    turns = []
    for k in range(4):
        src = speech.clips[altered_voice][0] if (altered_voice and k == 2) else speech.clips[VOICE_A][k]
        turns.append({"turn_id": f"t{k}", "speaker": "Ann", "text": "...", "audio": str(src)})
    return {"dialogue_id": dialogue_id, "turns": turns, "references": {"Ann": str(speech.clips[VOICE_A][5])}}


def write_dialogue(tmp: Path, speech: Speech, altered_voice: str | None, name: str = "dialogue.json") -> Path:
    path = tmp / name
    path.write_text(json.dumps(dialogue_doc(speech, altered_voice, path.stem if name != "dialogue.json" else "cli")))
    return path


def too_short_dialogue(tmp: Path, speech: Speech, name: str = "short.json") -> Path:
    """Two turns of 0.6 s each: less speech than GE2E needs, so nothing can be judged."""
    samples, rate = sf.read(speech.clips[VOICE_A][0], dtype="float32")
    turns = []
    for k in range(2):
        clip = tmp / f"short{k}.wav"
        sf.write(clip, samples[rate * (1 + k) : rate * (1 + k) + int(0.6 * rate)], rate)
        turns.append({"turn_id": f"s{k}", "speaker": "Ann", "audio": clip.name})
    path = tmp / name
    path.write_text(json.dumps({"dialogue_id": "short", "turns": turns}))
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


# ---------------------------------------------------------------------------------------------- issue 16 defects


def test_check_json_prints_false_and_zero_fields(served: str, speech: Speech, tmp_path: Path) -> None:
    r = run("check", str(write_dialogue(tmp_path, speech, VOICE_F)), "--target", served, "--json")
    assert r.returncode == 3, r.stderr
    verdict = json.loads(r.stdout)
    (ann,) = verdict["speakers"]
    assert ann["consistent"] is False and ann["judged"] is True and ann["unscored_turns"] == 0
    clean = next(t for t in verdict["turns"] if t["turn_id"] == "t0")
    assert clean["status"] == "CONSISTENT" and clean["drift_segments"] == []
    assert clean["reason"] == "FLAG_REASON_UNSPECIFIED" and clean["closest_speaker"] == ""
    assert "drift_score" not in clean  # never computed (no --detect-drift): absent, not 0


def test_a_dialogue_with_nothing_to_judge_has_its_own_exit_code(served: str, speech: Speech, tmp_path: Path) -> None:
    r = run("check", str(too_short_dialogue(tmp_path, speech)), "--target", served)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "speaker Ann: NOT JUDGED (no scorable turn)" in r.stdout
    # The header says so too, instead of a scale and a threshold direction for scores that do not exist.
    assert r.stdout.splitlines()[0].endswith("method auto; no turn was scored (each turn's reason is below)")
    assert r.stdout.count("INSUFFICIENT_AUDIO") == 2


def test_check_detect_drift(served: str, speech: Speech, tmp_path: Path) -> None:
    """--detect-drift asks for the search; a turn long enough to search gets a drift score, the others a note."""
    long = tmp_path / "long.wav"
    parts = [sf.read(speech.clips[VOICE_A][k], dtype="float32")[0] for k in (0, 1)]
    sf.write(long, np.concatenate(parts), 16_000)
    doc = dialogue_doc(speech, None)
    doc["turns"][0]["audio"] = str(long)  # type: ignore[index]
    path = tmp_path / "drift.json"
    path.write_text(json.dumps(doc))
    r = run("check", str(path), "--target", served, "--detect-drift", "--json")
    assert r.returncode == 0, r.stderr
    turns = json.loads(r.stdout)["turns"]
    assert "drift_score" in turns[0] and turns[0]["drift_segments"] == []  # one voice throughout
    assert all("drift: too little speech" in t["detail"] and "drift_score" not in t for t in turns[1:])


def test_rank_ids_stay_unique_across_folders_and_auto_shows_fit_probability(
    served: str, speech: Speech, tmp_path: Path
) -> None:
    for folder, voice in (("c1", VOICE_A), ("c2", VOICE_B)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "t05.wav").write_bytes(speech.clips[voice][4].read_bytes())
    c1, c2 = (str(tmp_path / c / "t05.wav") for c in ("c1", "c2"))
    context = [str(p) for p in speech.clips[VOICE_A][:3]]
    args = ["rank", "--target", served, "--context", *context, "--candidate", c2, "--candidate", c1]
    as_json = run(*args, "--json")
    assert as_json.returncode == 0, as_json.stderr
    ranked = json.loads(as_json.stdout)["candidates"]
    assert [c["candidate_id"] for c in ranked] == ["c1/t05.wav", "c2/t05.wav"]
    table = run(*args, "--method", "auto")
    assert table.returncode == 0, table.stderr
    header, first = table.stdout.splitlines()[1:3]
    assert header.split() == ["rank", "candidate", "score", "fit", "p", "verdict", "speech", "s"]
    fit = float(first.split()[3])
    assert first.split()[1] == "c1/t05.wav" and 0.5 < fit <= 1.0 and first.split()[4] == "consistent"
    assert "(verdict = what CheckDialogue would say of the candidate in the slot)" in table.stdout
    twice = str(tmp_path / "c2" / ".." / "c1" / "t05.wav")
    same = run("rank", "--target", served, "--context", *context, "--candidate", c1, "--candidate", twice)
    assert same.returncode == 2 and "is given twice" in same.stderr


# ---------------------------------------------------------------------------------------------- batches and voices


def test_batch_of_files_and_json_lines(served: str, speech: Speech, tmp_path: Path) -> None:
    clean = write_dialogue(tmp_path, speech, None, "clean.json")
    bad = write_dialogue(tmp_path, speech, VOICE_F, "bad.json")
    lines = tmp_path / "more.jsonl"
    short = json.loads(too_short_dialogue(tmp_path, speech).read_text())
    lines.write_text(json.dumps(dialogue_doc(speech, None, "line-1")) + "\n\n" + json.dumps(short) + "\n")

    r = run("check", str(clean), str(bad), str(lines), "--target", served)
    assert r.returncode == 3, r.stderr  # something is inconsistent
    rows = {line.split()[0]: line.split()[2] for line in r.stdout.splitlines()[1:5]}
    assert rows == {str(clean): "consistent", str(bad): "INCONSISTENT", f"{lines}:1": "consistent",
                    f"{lines}:3": "NOT"}  # fmt: skip
    assert "4 dialogues: 2 consistent, 1 inconsistent, 1 not judged" in r.stdout
    assert "checked 4/4 dialogues: 1 inconsistent, 1 not judged, 0 failed" in r.stderr

    assert run("check", str(clean), str(lines), "--target", served, "--quiet").returncode == 4
    ok = run("check", str(clean), str(clean), "--target", served, "--json")
    assert ok.returncode == 0 and "checked 2/2 dialogues" in ok.stderr, ok.stderr
    assert [json.loads(line)["result"] for line in ok.stdout.splitlines()] == ["consistent", "consistent"]

    lines.write_text(json.dumps(dialogue_doc(speech, None)) + "\n{not json\n")
    broken = run("check", str(clean), str(lines), "--target", served)
    assert broken.returncode == 2 and f"{lines}:2 is not valid JSON" in broken.stderr and broken.stdout == ""


def test_check_against_a_registered_voice(served: str, speech: Speech, tmp_path: Path) -> None:
    with SleuthClient(served, timeout=60) as c:
        c.register_voice("ann-cli", speech.clips[VOICE_A][5:7], replace=True)
    doc = dialogue_doc(speech, VOICE_C)
    doc["references"] = {}
    path = tmp_path / "by-voice.json"
    path.write_text(json.dumps(doc))
    r = run("check", str(path), "--target", served, "--voice", "Ann=ann-cli", "--method", "reference")
    assert r.returncode == 3 and "speaker Ann: INCONSISTENT: t2" in r.stdout, r.stdout + r.stderr
    doc["voices"] = {"Ann": "ghost"}
    path.write_text(json.dumps(doc))
    r = run("check", str(path), "--target", served)
    assert r.returncode == 2 and "NOT_FOUND: no voice 'ghost' is registered" in r.stderr


# ---------------------------------------------------------------------------------------------- issue 32: a first day


def test_a_missing_audio_file_is_its_own_error_row_and_the_batch_goes_on(
    served: str, speech: Speech, tmp_path: Path
) -> None:
    lines = tmp_path / "batch.jsonl"
    gone = dialogue_doc(speech, None, "gone")
    gone["turns"][1]["audio"] = "missing.wav"  # type: ignore[index]
    docs = [dialogue_doc(speech, None, "first"), gone, dialogue_doc(speech, None, "last")]
    lines.write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    r = run("check", str(lines), "--target", served, "--quiet")
    assert r.returncode == 2, r.stdout + r.stderr  # the batch's code: a dialogue failed, nothing inconsistent
    rows = {line.split()[0]: line.split()[2] for line in r.stdout.splitlines()[1:4]}
    assert rows == {f"{lines}:1": "consistent", f"{lines}:2": "ERROR", f"{lines}:3": "consistent"}
    assert "3 dialogues: 2 consistent, 1 error" in r.stdout
    (err,) = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    missing = tmp_path / "missing.wav"
    assert err == (
        f"error: {lines}:2: dialogue 'gone': NOT_FOUND: turn 't1': audio file {missing} does not exist (not sent)"
    )
    # --json: the same error in the dialogue's own object; an inconsistent dialogue still makes the batch's code 3.
    docs.append(dialogue_doc(speech, VOICE_F, "bad"))
    lines.write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    r = run("check", str(lines), "--target", served, "--json", "--quiet")
    assert r.returncode == 3, r.stderr
    out = [json.loads(line) for line in r.stdout.splitlines()]
    assert [o["result"] for o in out] == ["consistent", "error", "consistent", "inconsistent"]
    assert out[1]["dialogue_id"] == "gone" and out[1]["error"]["code"] == "NOT_FOUND"
    # One dialogue alone: one line, exit 2, as before.
    alone = tmp_path / "alone.json"
    alone.write_text(json.dumps(gone))
    r = run("check", str(alone), "--target", served)
    assert r.returncode == 2 and r.stderr.strip().endswith("missing.wav does not exist (not sent)"), r.stderr


def test_an_audio_file_given_for_a_dialogue_is_named_for_what_it_is(speech: Speech, tmp_path: Path) -> None:
    r = run("check", str(speech.clips[VOICE_A][0]), "--target", "127.0.0.1:1")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "codec" not in r.stderr
    assert f"{speech.clips[VOICE_A][0]} is a WAV audio file, not a dialogue: give a dialogue JSON file" in r.stderr
    mp3 = tmp_path / "turn.mp3"
    mp3.write_bytes(b"ID3\x04\x00" + bytes(range(256)) * 4)
    assert "is an MP3 audio file, not a dialogue" in run("check", str(mp3)).stderr
    binary = tmp_path / "x.json"
    binary.write_bytes(b"\xac\xed\x00\x05" * 10)
    r = run("check", str(binary))
    assert r.returncode == 2 and f"{binary} is not UTF-8 text: expected a dialogue JSON file" in r.stderr


def test_turns_without_ids_are_numbered_as_the_client_library_numbers_them(
    served: str, speech: Speech, tmp_path: Path
) -> None:
    doc = dialogue_doc(speech, VOICE_F)
    for turn in doc["turns"]:  # type: ignore[attr-defined]
        del turn["turn_id"]
    path = tmp_path / "no-ids.json"
    path.write_text(json.dumps(doc))
    r = run("check", str(path), "--target", served, "--json", "--method", "reference")
    assert r.returncode == 3, r.stderr
    verdict = json.loads(r.stdout)
    assert [t["turn_id"] for t in verdict["turns"]] == ["t1", "t2", "t3", "t4"]
    assert verdict["speakers"][0]["inconsistent_turn_ids"] == ["t3"]
    with SleuthClient(served, timeout=60) as c:  # the client library, the same turns without ids
        by_client = c.check([(t["speaker"], t["audio"]) for t in doc["turns"]], method="reference",  # type: ignore[attr-defined]
                            references={"Ann": speech.clips[VOICE_A][5]}, dialogue_id="cli")  # fmt: skip
    assert [t.turn_id for t in by_client.turns] == ["t1", "t2", "t3", "t4"] and by_client.inconsistent_turns == ("t3",)


def test_a_folder_checks_every_dialogue_file_under_it(served: str, speech: Speech, tmp_path: Path) -> None:
    folder = tmp_path / "episodes"
    (folder / "b").mkdir(parents=True)
    (folder / ".cache").mkdir()
    write_dialogue(folder, speech, None, "z-clean.json")
    write_dialogue(folder / "b", speech, VOICE_F, "bad.json")
    (folder / "a.jsonl").write_text(json.dumps(dialogue_doc(speech, None, "line")) + "\n")
    (folder / ".cache" / "old.json").write_text("{not a dialogue")  # hidden: left out
    (folder / "notes.txt").write_text("not a dialogue file")
    r = run("check", str(folder), "--target", served, "--quiet")
    assert r.returncode == 3, r.stderr
    labels = [line.split()[0] for line in r.stdout.splitlines()[1:4]]
    assert labels == [f"{folder}/a.jsonl:1", f"{folder}/b/bad.json", f"{folder}/z-clean.json"]  # sorted by path
    assert "3 dialogues: 2 consistent, 1 inconsistent" in r.stdout
    (folder / "b" / "meta.json").write_text('{"voices_used": 2}')  # not a dialogue: named, with the way out
    r = run("check", str(folder), "--target", served)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert f"{folder}/b/meta.json: expected an object with a 'turns' list (found in folder {folder}: every" in r.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run("check", str(empty), "--target", served)
    assert r.returncode == 2 and f"error: folder {empty} holds no dialogue files (*.json or *.jsonl" in r.stderr


def test_check_local_judges_without_a_server_as_the_server_does(served: str, speech: Speech, tmp_path: Path) -> None:
    clean = write_dialogue(tmp_path, speech, None, "clean.json")
    bad = write_dialogue(tmp_path, speech, VOICE_F, "bad.json")
    for args in ([str(bad), "--json", "--detect-drift"], [str(clean), str(bad), "--json", "--quiet"]):
        remote = run("check", *args, "--target", served)
        local = run("check", *args, "--local", "--target", "127.0.0.1:1")  # no server there: never dialed
        assert local.returncode == remote.returncode == 3, local.stderr
        assert local.stdout == remote.stdout  # the same verdicts, to the last digit printed
    table = run("check", str(tmp_path), "--local", "--quiet")
    assert table.returncode == 3 and "2 dialogues: 1 inconsistent, 1 consistent" in table.stdout, table.stderr
    r = run("check", str(clean), "--local", "--voice", "Ann=ann-v1")
    assert r.returncode == 2 and "--local judges without one" in r.stderr
    r = run("check", str(clean), "--local", "--models-dir", str(tmp_path / "none"))
    assert r.returncode == 2 and "sleuthd models export all --models-dir" in r.stderr and "Traceback" not in r.stderr


def test_voices_commands_register_list_show_and_delete(served: str, speech: Speech, tmp_path: Path) -> None:
    clips = [str(p) for p in speech.clips[VOICE_B][5:7]]
    r = run("voices", "register", "bob-cli", *clips, "--metadata", "tts=espeak", "--target", served)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("voice bob-cli: revision 1, ") and "tts = espeak" in r.stdout
    again = run("voices", "register", "bob-cli", clips[0], "--target", served)
    assert again.returncode == 2 and "ALREADY_EXISTS" in again.stderr and "replace" in again.stderr
    replaced = run("voices", "register", "bob-cli", clips[0], "--replace", "--json", "--target", served)
    assert replaced.returncode == 0 and json.loads(replaced.stdout)["revision"] == "2", replaced.stderr  # uint64
    listed = run("voices", "list", "--target", served)
    assert listed.returncode == 0 and any(line.split()[:2] == ["bob-cli", "2"] for line in listed.stdout.splitlines())
    as_json = [json.loads(line) for line in run("voices", "list", "--json", "--target", served).stdout.splitlines()]
    assert "bob-cli" in [v["voice_id"] for v in as_json]
    shown = run("voices", "show", "bob-cli", "--target", served)
    assert shown.returncode == 0 and "ge2e" in shown.stdout and "#0" in shown.stdout
    clip_row = next(line.split() for line in shown.stdout.splitlines() if line.startswith("#0"))
    band, clipped, snr, low_band = map(float, clip_row[-4:])  # the clip's channel as registered
    assert 4.0 < band <= 8.0 and clipped < 0.1 and snr == 20.0, shown.stdout  # kHz, %, dB (clean synthetic)
    assert -20.0 < low_band < 0.0, shown.stdout  # dB: it kept its band below 300 Hz (a telephone clip: about -28)
    assert run("voices", "delete", "bob-cli", "--target", served).stdout.strip() == "deleted voice bob-cli"
    gone = run("voices", "show", "bob-cli", "--target", served)
    assert gone.returncode == 2 and gone.stderr.startswith("error: NOT_FOUND: ") and "Traceback" not in gone.stderr
    missing = run("voices", "register", "x", str(tmp_path / "nope.wav"), "--target", served)
    assert missing.returncode == 2 and "nope.wav does not exist" in missing.stderr


def test_a_missing_models_folder_names_the_command_that_builds_it(tmp_path: Path) -> None:
    r = run("serve", "--port", "0", "--metrics-port", "-1", "--models-dir", str(tmp_path / "models"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"error: models folder {tmp_path / 'models'} does not exist: build the models into it with " in r.stderr
    assert f"`sleuthd models export all --models-dir {tmp_path / 'models'}` (`make models` in a checkout)" in r.stderr


def _threads(pid: int) -> dict[int, tuple[int, int]]:
    """Each thread of process ``pid``: (nice value, CPU clock ticks used), from /proc."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()  # after the command name
        out[int(task.name)] = (int(fields[16]), int(fields[11]) + int(fields[12]))  # nice; utime + stime
    return out


def _name(pid: int, tid: int) -> str:
    try:
        return (Path(f"/proc/{pid}/task/{tid}") / "comm").read_text().strip()
    except OSError:  # ended meanwhile
        return ""


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread priorities are Linux's")
def test_the_serving_loop_runs_below_the_threads_that_decode_and_run_the_models(
    server: tuple[int, str], speech: Speech, tmp_path: Path
) -> None:
    """Under overload the loop reading and refusing requests must not take CPU from admitted work
    (sleuthd.threads): it runs at nice 10 (the default), the workers doing a check's work (named
    by start_threads, so they can be told from the intake's helpers and the heap trimmer, which may run at 10)
    at the process's 0."""
    pid, target = server
    # Audio no earlier test sent (the embedding cache would answer it without the models).
    rng = np.random.default_rng(7)
    turns = []
    for k in range(4):
        samples, rate = sf.read(speech.clips[VOICE_A][k], dtype="float32")
        sf.write(tmp_path / f"n{k}.wav", samples + rng.normal(0, 1e-3, samples.shape).astype(np.float32), rate)
        turns.append({"turn_id": f"t{k}", "speaker": "Ann", "audio": f"n{k}.wav"})
    doc = tmp_path / "fresh.json"
    doc.write_text(json.dumps({"dialogue_id": "nice", "turns": turns}))
    before = _threads(pid)
    checked = run("check", str(doc), "--target", target)
    assert checked.returncode == 0, checked.stderr
    after = _threads(pid)
    assert after[pid][0] == 10, "the main thread runs the gRPC loop: it should run at nice 10"
    # The decoding and model threads (named by sleuthd.threads.start_threads) did the check's work, at nice 0.
    workers = {tid: ticks - before.get(tid, (0, 0))[1] for tid, (_, ticks) in after.items()
               if _name(pid, tid) in ("prep", "model")}  # fmt: skip
    assert len(workers) >= 3 and sum(workers.values()) >= 3, workers  # 30 ms or more of CPU in this check
    assert {tid: after[tid][0] for tid in workers} == dict.fromkeys(workers, 0), (
        "threads that decode or run the models started below the process's priority: start them at load"
    )
