"""`sleuthd-bench report-paint`: how fast an HTML review report opens in headless Chromium, a small one and
a large one measured side by side in one run.

The dialogues are real: 2-3 speakers, 6-10 turns each, drawn from cached speech clips (one folder of WAVs
per voice, by default the tests' data/test-speech), every fifth with one turn swapped for another voice,
checked by a real server with the turn x turn matrix (what `sleuthd check --report` asks for). Clips repeat
across dialogues, so the server's embedding cache keeps checking a thousand dialogues to a minute or two;
the report stores each distinct clip once.

Each report is then opened cold (a fresh Chromium and profile per run) and three times are read from the
page: first contentful paint, the end of the report's own script (the list is in the DOM: mark
``sleuthd:rendered``), the first frame after it (mark ``sleuthd:painted``) and when the list was painted
(Element Timing of the line drawn with it: the figure to read), all in ms from navigation.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from sleuthd.client import AsyncSleuthClient, Turn, Verdict
from sleuthd.report import CheckedDialogue, write_report

from sleuthd_bench.browser import chromium

SPEAKERS = ("Ann", "Bob", "Cid")

TIMES = """async () => {
  const ready = () => performance.getEntriesByName('sleuthd:painted').length
    && performance.getEntriesByName('first-contentful-paint').length;
  while (!ready()) await new Promise(r => setTimeout(r, 20));
  const at = (name) => performance.getEntriesByName(name)[0].startTime;
  // Element Timing: when the line above the list ("Dialogues 1-50 of N"), drawn with it, was painted.
  const list = await new Promise((done) => new PerformanceObserver((entries) => {
    const e = entries.getEntries().find((x) => x.identifier === 'sleuthd-list');
    if (e) done(e.renderTime || e.loadTime);
  }).observe({type: 'element', buffered: true}));
  return {fcp: at('first-contentful-paint'), rendered: at('sleuthd:rendered'), painted: at('sleuthd:painted'),
          list, rows: document.querySelectorAll('tr.row').length};
}"""


def voices(clips_dir: Path) -> dict[str, list[Path]]:
    found = {d.name: sorted(d.glob("*.wav")) for d in sorted(clips_dir.iterdir()) if d.is_dir()}
    found = {v: c for v, c in found.items() if c}
    if len(found) < 4:
        raise ValueError(
            f"{clips_dir} needs 4 or more folders of WAVs (one per voice); run the tests once "
            "(they cache data/test-speech) or `sleuthd-bench synth`"
        )
    return found


def dialogue_turns(clips: dict[str, list[Path]], k: int, rng: np.random.Generator) -> list[Turn]:
    """Dialogue ``k``: 2-3 speakers on distinct voices, 6-10 turns; every fifth has one foreign turn."""
    names = list(clips)
    n_speakers = 2 + int(rng.integers(2))
    cast = dict(zip(SPEAKERS, rng.choice(len(names), n_speakers + 1, replace=False).tolist(), strict=False))
    spare = names[int(rng.choice(len(names), n_speakers + 1, replace=False)[-1])]
    turns = []
    n_turns = 6 + int(rng.integers(5))
    foreign = int(rng.integers(n_turns)) if k % 5 == 0 else -1
    for t in range(n_turns):
        speaker = SPEAKERS[t % n_speakers]
        voice = spare if t == foreign else names[cast[speaker]]
        clip = clips[voice][int(rng.integers(len(clips[voice])))]
        turns.append(Turn(speaker, clip, turn_id=f"t{t + 1}"))
    return turns


async def check_all(
    target: str, clips: dict[str, list[Path]], count: int, seed: int, progress: Callable[[str], None]
) -> list[CheckedDialogue]:
    rng = np.random.default_rng(seed)
    plans = [dialogue_turns(clips, k, rng) for k in range(count)]
    out: list[CheckedDialogue | None] = [None] * count
    gate = asyncio.Semaphore(8)
    async with AsyncSleuthClient(target, timeout=300) as client:

        async def one(k: int) -> None:
            async with gate:
                v: Verdict = await client.check(plans[k], dialogue_id=f"bench-{k:04d}", similarity_matrix=True)
            out[k] = CheckedDialogue.from_turns(v, plans[k])
            if (k + 1) % 100 == 0:
                progress(f"checked {k + 1}/{count}")

        await asyncio.gather(*(one(k) for k in range(count)))
    return [d for d in out if d is not None]


async def open_cold(index: Path, runs: int) -> list[dict[str, float]]:
    """``runs`` cold opens of the report: a fresh Chromium and profile each."""
    found = []
    for _ in range(runs):
        async with chromium(1280, 800) as browser:
            page = await browser.new_page()
            await page.goto(index.as_uri())
            found.append(await page.evaluate(TIMES))
    return found


class _Server:
    def __init__(self) -> None:
        cmd = [sys.executable, "-m", "sleuthd.cli", "--log-level", "warning", "serve", "--port", "0"]
        cmd += ["--metrics-port", "-1"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        line = self.proc.stdout.readline()
        if not line.startswith("sleuthd listening on "):
            raise RuntimeError(f"server did not start: {line}{self.proc.stderr.read()}")
        self.target = line.split()[-1]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def run(
    sizes: list[int], clips_dir: Path, out: Path, runs: int, target: str | None, seed: int,
    progress: Callable[[str], None],
) -> dict[str, Any]:  # fmt: skip
    clips = voices(clips_dir)
    server = None if target else _Server()
    address = target or (server.target if server is not None else "")
    try:
        progress(f"checking {max(sizes)} dialogues against {address}")
        checked = asyncio.run(check_all(address, clips, max(sizes), seed, progress))
    finally:
        if server is not None:
            server.stop()
    results: dict[str, Any] = {"runs": runs, "sizes": {}}
    for n in sizes:
        index = write_report(out / f"report-{n}", checked[:n], title=f"sleuthd report ({n} dialogues)")
        progress(f"opening {index} {runs} times")
        times = asyncio.run(open_cold(index, runs))
        results["sizes"][str(n)] = {
            "index": str(index),
            "page_mb": index.stat().st_size / 2**20,
            "turns": sum(len(d.verdict.turns) for d in checked[:n] if d.verdict is not None),
            "rows": times[0]["rows"],
            **{key: statistics.median(t[key] for t in times) for key in ("fcp", "rendered", "painted", "list")},
            "list_max": max(t["list"] for t in times),
        }
    return results


def table(results: dict[str, Any]) -> str:
    sizes = results["sizes"]
    keys = list(sizes)
    base = sizes[keys[0]]
    lines = [
        f"cold opens in headless Chromium, median of {results['runs']} (ms from navigation start)",
        f"{'dialogues':>10} {'turns':>7} {'page MB':>8} {'first paint':>12} {'script done':>12} "
        f"{'next frame':>11} {'list painted':>13} {'max':>6} {'x ' + keys[0]:>7}",
    ]
    for n, r in sizes.items():
        lines.append(
            f"{n:>10} {r['turns']:>7} {r['page_mb']:>8.2f} {r['fcp']:>12.0f} {r['rendered']:>12.0f} "
            f"{r['painted']:>11.0f} {r['list']:>13.0f} {r['list_max']:>6.0f} {r['list'] / base['list']:>7.2f}"
        )
    lines.append(
        "first paint: first contentful paint (the header can paint while the page is still parsed); script done: "
        "the list is in the DOM; next frame: the first frame after it; list painted: Element Timing of the list"
    )
    return "\n".join(lines)
