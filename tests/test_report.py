"""The HTML review report, end to end: real synthesized dialogues checked by the real in-process server
(`sleuthd check --report` and `sleuthd rank --report` run as commands), the pages opened in headless
Chromium (Debian's, driven by Playwright), and what a listener relies on checked in the DOM: the foreign
turn highlighted, a player on every turn and reference that really decodes in the browser, the drift
waveform drawn from audio decoded with Web Audio, the heat map, the keys, a phone-width layout, and no
request leaving the report's folder. The turn x turn similarity matrix it draws is checked against the
verdict's own scores.

Screenshots go to the test's tmp folder; with SLEUTHD_REPORT_SCREENSHOTS=DIR they are copied there too
(how docs/img/report.png was made).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from sleuthd.client import AsyncSleuthClient, Turn
from sleuthd.report import CheckedDialogue, ReportError, write_report
from sleuthd.rpc.server import RunningServer
from sleuthd_bench import driftset, synth
from sleuthd_bench.browser import chromium, watch

from .support import REPO, VOICE_A, VOICE_B, VOICE_C, VOICE_F, Speech

DRIFT_CACHE = REPO / "data" / "test-speech" / "drift"


def short_clip(speech: Speech, folder: Path) -> Path:
    """0.6 s of Bob's voice: less speech than GE2E needs, so the turn cannot be judged."""
    samples, rate = sf.read(speech.clips[VOICE_C][2], dtype="float32")
    path = folder / "bob-short.wav"
    sf.write(path, samples[rate : rate + int(0.6 * rate)], rate)
    return path


def spliced_turn(folder: Path) -> Path:
    """One turn whose voice changes part way (espeak m3, then m7), as tests/test_drift.py builds it."""
    texts = synth.sentences(8, seed=23)
    plan = driftset.UtterancePlan(
        uid="report-abrupt", split="fit", subtype="abrupt", voice_a=VOICE_A, voice_b=VOICE_B,
        texts=(texts[0], texts[1], texts[2]), texts_b=tuple(texts[3:6]), boundary=1, noise_seed=7,
        spare_texts=tuple(texts[6:8]),
    )  # fmt: skip
    label = driftset.render_utterance(plan, folder, driftset.SegmentCache(DRIFT_CACHE))
    return folder / label.path


def dialogue_files(speech: Speech, folder: Path) -> Path:
    """A JSON Lines batch: "mixed" (Ann's fifth turn is another, female voice; Bob's sixth is too short),
    "drift" (Cid's third turn changes voice part way; drift asked for) and "clean" (nothing wrong)."""
    a, b, c, f = (speech.clips[v] for v in (VOICE_A, VOICE_B, VOICE_C, VOICE_F))
    mixed = {
        "dialogue_id": "mixed",
        "turns": [
            {"turn_id": "t1", "speaker": "Ann", "text": "Morning! Did the parcel come?", "audio": str(a[0])},
            {"turn_id": "t2", "speaker": "Bob", "text": "It did, just now.", "audio": str(c[0])},
            {"turn_id": "t3", "speaker": "Ann", "audio": str(a[1])},
            {"turn_id": "t4", "speaker": "Bob", "audio": str(c[1])},
            {"turn_id": "t5", "speaker": "Ann", "text": "Then let's open it.", "audio": str(f[2])},
            {"turn_id": "t6", "speaker": "Bob", "text": "Sure.", "audio": str(short_clip(speech, folder))},
            {"turn_id": "t7", "speaker": "Ann", "audio": str(a[3])},
        ],
        "references": {"Ann": str(a[5])},
    }
    drift = {
        "dialogue_id": "drift",
        "turns": [
            {"turn_id": "d1", "speaker": "Cid", "audio": str(b[0])},
            {"turn_id": "d2", "speaker": "Cid", "audio": str(b[1])},
            {"turn_id": "d3", "speaker": "Cid", "audio": str(spliced_turn(folder))},
            {"turn_id": "d4", "speaker": "Cid", "audio": str(b[2])},
        ],
        "options": {"detect_drift": True},
    }
    clean = {
        "dialogue_id": "clean",
        "turns": [{"turn_id": f"c{k}", "speaker": "Ann" if k % 2 else "Bob", "audio": str((a if k % 2 else c)[k])}
                  for k in range(1, 5)],
    }  # fmt: skip
    path = folder / "batch.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in (mixed, drift, clean)))
    return path


async def sleuthd(*args: str) -> tuple[int, str, str]:
    """The `sleuthd` command in a subprocess (the server shares this test's event loop)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sleuthd.cli", "--log-level", "warning", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def page_data(index: Path) -> dict[str, Any]:
    match = re.search(r'<script id="data" type="application/json">(.*?)</script>', index.read_text(), re.S)
    assert match, "the page lost its inline data"
    return dict(json.loads(match.group(1)))


def keep_screenshot(path: Path) -> None:
    folder = os.environ.get("SLEUTHD_REPORT_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, Path(folder) / path.name)


# Every <audio> of the view, once it has read the file's header: its duration in seconds, or the error.
DURATIONS = """() => Promise.all([...document.querySelectorAll('audio')].map(a => new Promise(done => {
  const report = () => done({src: a.getAttribute('src'), duration: a.duration, error: a.error && a.error.message});
  if (a.readyState >= 1 || a.error) report();
  else { a.addEventListener('loadedmetadata', report, {once: true});
         a.addEventListener('error', report, {once: true}); }
})))"""


async def decoded_durations(page: Any, root: Path) -> list[tuple[str, float]]:
    """Wait for every player of the view to decode its file's header; each must match the file's length."""
    found = await asyncio.wait_for(page.evaluate(DURATIONS), 60)
    assert found, "no <audio> in this view"
    for a in found:
        assert a["error"] is None, a
        expected = sf.info(str(root / a["src"])).duration
        assert a["duration"] == pytest.approx(expected, abs=0.05), a
    return [(a["src"], a["duration"]) for a in found]


async def test_check_and_rank_reports_open_in_chromium(server: RunningServer, speech: Speech, tmp_path: Path) -> None:
    target = f"127.0.0.1:{server.port}"
    batch = dialogue_files(speech, tmp_path)
    report = tmp_path / "report"
    code, _, err = await sleuthd("check", str(batch), "--target", target, "--report", str(report), "--quiet")
    assert code == 3, err  # a speaker is inconsistent
    assert f"report: {report / 'index.html'}" in err
    data = page_data(report / "index.html")
    by_id = {d["id"]: d for d in data["dialogues"]}
    mixed = by_id["mixed"]
    flagged = {t["id"] for t in mixed["t"] if t["st"] == "inconsistent"}
    assert "t5" in flagged and mixed["o"] == "inconsistent"
    assert {t["id"]: t["st"] for t in mixed["t"]}["t6"] == "insufficient_audio"
    # The heat map's matrix came with the verdict: the usable turns only (not the short one).
    assert mixed["sim"]["ids"] == ["t1", "t2", "t3", "t4", "t5", "t7"]
    assert by_id["drift"]["drift"] and not mixed["drift"]
    # Audio is copied, each distinct file once (the clean dialogue reuses two of Ann's clips).
    docs = [json.loads(line) for line in batch.read_text().splitlines()]
    sent = {t["audio"] for doc in docs for t in doc["turns"]}
    sent |= {r for doc in docs for r in doc.get("references", {}).values()}
    copies = sorted(p for p in (report / "audio").iterdir() if p.suffix == ".wav")
    assert len(copies) == len({Path(p).read_bytes() for p in sent}) == 14
    assert all(not p.is_symlink() for p in copies)

    rank_dir = tmp_path / "rank"
    a = speech.clips[VOICE_A]
    code, _, err = await sleuthd(
        "rank", "--target", target, "--speaker", "Ann", "--context", str(a[0]), str(a[1]), str(a[2]),
        "--candidate", str(speech.clips[VOICE_F][3]), "--candidate", str(a[4]), "--reference", str(a[5]),
        "--report", str(rank_dir),
    )  # fmt: skip
    assert code == 0, err

    async with chromium(1280, 800) as browser:
        page = await browser.new_page()
        log = watch(page)
        await page.goto((report / "index.html").as_uri())
        # The summary counts every outcome; the list shows each dialogue's.
        cards = await page.eval_on_selector_all(
            ".card", "cs => cs.map(c => [c.dataset.outcome, c.querySelector('b').textContent])"
        )
        inconsistent = sum(d["o"] == "inconsistent" for d in data["dialogues"])
        assert dict(cards)["all"] == "3" and dict(cards)["inconsistent"] == str(inconsistent)
        assert await page.locator("tr.row").count() == 3

        # Keyboard: the first row is selected; j moves down, Enter opens the selected dialogue.
        first = await page.get_attribute("tr.row.sel", "data-i")
        await page.keyboard.press("j")
        second = await page.get_attribute("tr.row.sel", "data-i")
        assert second != first
        await page.keyboard.press("Enter")
        await page.wait_for_function(f"location.hash === '#d={second}'")
        await page.keyboard.press("Escape")
        await page.wait_for_selector("tr.row")

        for d in data["dialogues"]:
            await page.goto(f"{(report / 'index.html').as_uri()}#d={d['i']}")
            await page.wait_for_selector("tr.turn")
            rows = page.locator("tr.turn")
            assert await rows.count() == len(d["t"])
            # A player on every turn and every reference, each decoding its file.
            assert await page.locator("tr.turn audio").count() == len(d["t"])
            references = sum(1 for s in d["sp"] if s["ref"])
            assert await page.locator("table.speakers audio").count() == references
            await decoded_durations(page, report)
            shown = await page.eval_on_selector_all("tr.turn.flagged", "rs => rs.map(r => r.dataset.turn)")
            assert set(shown) == {t["id"] for t in d["t"] if t["st"] == "inconsistent"}
            if d["sim"]:
                assert await page.get_attribute("canvas.heat", "data-turns") == str(len(d["sim"]["ids"]))

        # The foreign turn: highlighted, reached with f, played with its speaker's reference by one key.
        await page.goto(f"{(report / 'index.html').as_uri()}#d={mixed['i']}")
        await page.wait_for_selector("tr.turn")
        t5 = page.locator('tr.turn[data-turn="t5"]')
        assert await t5.get_attribute("data-status") == "inconsistent"
        assert "flagged" in (await t5.get_attribute("class") or "")
        short = page.locator('tr.turn[data-turn="t6"]')
        assert await short.get_attribute("data-status") == "insufficient_audio"
        assert "flagged" not in (await short.get_attribute("class") or "")
        await page.keyboard.press("k")  # off the flagged turn, then f finds it again
        await page.keyboard.press("f")
        assert await page.get_attribute("tr.turn.sel", "data-turn") in flagged
        await page.evaluate("window.scrollTo(0, 0)")
        shot = tmp_path / "report.png"
        await page.screenshot(path=str(shot), full_page=True)
        keep_screenshot(shot)
        for _ in flagged:  # f steps through the flagged turns
            if await page.get_attribute("tr.turn.sel", "data-turn") == "t5":
                break
            await page.keyboard.press("f")
        assert await page.get_attribute("tr.turn.sel", "data-turn") == "t5"
        await page.keyboard.press("a")
        await page.wait_for_function("document.getElementById('status').textContent.startsWith('Playing t5')")
        assert await page.text_content("#status") == "Playing t5, then Ann's reference"
        await page.wait_for_function("!document.querySelector('tr.turn.sel audio').paused")

        # Drift: each turn's waveform decoded in the browser, the change drawn on the spliced turn.
        drift = by_id["drift"]
        await page.goto(f"{(report / 'index.html').as_uri()}#d={drift['i']}")
        await page.wait_for_function("[...document.querySelectorAll('canvas.wave')].every(c => c.dataset.state)")
        states = await page.eval_on_selector_all(
            "canvas.wave", "cs => cs.map(c => [c.dataset.state, +c.dataset.segments, +c.dataset.duration])"
        )
        assert [s[0] for s in states] == ["drawn"] * len(drift["t"])
        assert [s[1] for s in states] == [len(t["seg"]) for t in drift["t"]]
        assert {t["id"]: len(t["seg"]) for t in drift["t"]}["d3"] >= 1
        for (_, _, seconds), t in zip(states, drift["t"], strict=True):
            assert seconds == pytest.approx(sf.info(str(report / t["a"])).duration, abs=0.05)

        # The ranking: best first, fit probabilities, a decoding player on every candidate and clip.
        await page.goto((rank_dir / "index.html").as_uri())
        await page.wait_for_selector("tr.turn")
        order = await page.eval_on_selector_all("tr.turn", "rs => rs.map(r => r.dataset.candidate)")
        assert order == ["04.wav", "03.wav"]
        fits = page_data(rank_dir / "index.html")["ranking"]["cands"]
        assert fits[0]["fit"] > fits[1]["fit"]
        assert len(await decoded_durations(page, rank_dir)) == 2 + 3 + 1

        assert log.errors == [] and log.failed == []
        assert log.outside(report, rank_dir) == [] and len(log.requests) > 20

    # On a phone: nothing wider than the screen, in the list and in a dialogue.
    async with chromium(390, 844, scale=2) as phone:
        page = await phone.new_page()
        log = watch(page)
        for view in ("", f"#d={mixed['i']}"):
            await page.goto(f"{(report / 'index.html').as_uri()}{view}")
            await page.wait_for_selector("tr.row, tr.turn")
            assert await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        shot = tmp_path / "report-phone.png"
        await page.screenshot(path=str(shot))
        keep_screenshot(shot)
        assert log.errors == [] and log.failed == [] and log.outside(report) == []


async def test_similarity_matrix_matches_the_verdict_and_to_html_writes_a_report(
    server: RunningServer, speech: Speech, tmp_path: Path
) -> None:
    a, c, f = speech.clips[VOICE_A], speech.clips[VOICE_C], speech.clips[VOICE_F]
    turns = [Turn("Ann", a[0], text="Hello."), ("Bob", c[0]), ("Ann", a[1]), ("Ann", f[2]), ("Bob", c[1]),
             ("Ann", short_clip(speech, tmp_path)), ("Ann", a[3])]  # fmt: skip
    async with AsyncSleuthClient(f"127.0.0.1:{server.port}", timeout=120) as client:
        plain = await client.check(turns, references={"Ann": a[5]})
        verdict = await client.check(turns, references={"Ann": a[5]}, similarity_matrix=True)
    assert plain.similarity is None  # opt-in
    m = verdict.similarity
    assert m is not None and m.turn_ids == ("t1", "t2", "t3", "t4", "t5", "t7")  # t6: too little speech
    n = len(m.turn_ids)
    g = np.array(m.cosines).reshape(n, n)
    assert np.allclose(g, g.T) and np.allclose(np.diag(g), 1.0)
    # The same cosines the verdict judged with: a turn's pairwise score is its mean cosine to the speaker's
    # other usable turns.
    speaker = {t.turn_id: t.speaker for t in verdict.turns}
    for i, tid in enumerate(m.turn_ids):
        own = [j for j, u in enumerate(m.turn_ids) if speaker[u] == speaker[tid] and j != i]
        assert float(np.mean(g[i, own])) == pytest.approx(verdict.turn(tid).pairwise_mean_cosine, abs=1e-6)
    assert m.cosine("t1", "t3") > m.cosine("t1", "t4")  # Ann's own voice against the foreign one
    with pytest.raises(KeyError, match="no usable audio"):
        m.cosine("t1", "t6")

    index = verdict.to_html(tmp_path / "one", turns, references={"Ann": a[5]})
    data = page_data(index)
    (d,) = data["dialogues"]
    assert [t["id"] for t in d["t"]] == [t.turn_id for t in verdict.turns]
    assert d["t"][0]["tx"] == "Hello." and d["sp"][0]["ref"] is not None
    for t, path in zip(d["t"], [a[0], c[0], a[1], f[2], c[1], tmp_path / "bob-short.wav", a[3]], strict=True):
        assert (index.parent / t["a"]).read_bytes() == Path(path).read_bytes()  # the audio that was judged

    # "link" makes symbolic links instead of copies; a turn's missing audio is named in the error.
    linked = write_report(tmp_path / "linked", [CheckedDialogue.from_turns(verdict, turns)], audio="link")
    assert all(p.is_symlink() for p in (linked.parent / "audio").iterdir())
    with pytest.raises(ReportError, match=r"turn 't2': audio file .*nope\.wav does not exist"):
        write_report(tmp_path / "bad", [CheckedDialogue(verdict, {"t2": tmp_path / "nope.wav"})])
    with pytest.raises(ReportError, match="audio mode 'hardlink' is not one of: copy, link"):
        write_report(tmp_path / "bad", [], audio="hardlink")


async def test_a_streams_final_verdict_carries_the_same_matrix(stub: Any, speech: Speech) -> None:
    """StreamDialogue's final verdict is CheckDialogue's, the matrix included; turn updates never carry one."""
    from sleuthd.v1 import sleuthd_pb2 as pb

    clips = [("Ann", speech.clips[VOICE_A][0]), ("Bob", speech.clips[VOICE_C][0]), ("Ann", speech.clips[VOICE_A][1]),
             ("Bob", speech.clips[VOICE_C][1])]  # fmt: skip
    options = pb.CheckOptions(method=pb.METHOD_AUTO, similarity_matrix=True)
    unary = pb.CheckDialogueRequest(dialogue_id="m", options=options)
    call = stub.StreamDialogue(timeout=120)
    await call.write(pb.StreamDialogueRequest(open=pb.StreamOpen(dialogue_id="m", options=options)))
    for k, (speaker, path) in enumerate(clips):
        data = Path(path).read_bytes()
        unary.turns.add(turn_id=f"t{k}", speaker=speaker, audio=pb.Audio(encoded=data))
        await call.write(pb.StreamDialogueRequest(turn_start=pb.TurnStart(turn_id=f"t{k}", speaker=speaker, index=k)))
        await call.write(pb.StreamDialogueRequest(audio=pb.TurnAudio(turn_id=f"t{k}", data=data, final=True)))
    await call.done_writing()
    messages = [msg async for msg in call]
    final = messages[-1].final
    checked = await stub.CheckDialogue(unary, timeout=120)
    assert list(final.similarity.turn_ids) == ["t0", "t1", "t2", "t3"]
    assert final.similarity == checked.similarity
    assert all(m.WhichOneof("message") == "turn" for m in messages[:-1])
