"""Writing a report: one self-contained index.html (inline CSS, script and data) plus its audio folder.

The page makes no network request: its style, script and data are inline, audio comes from its own
``audio/`` folder, and a Content-Security-Policy forbids every other source (no fetch, no remote fonts,
images or scripts), so a report opened from a laptop's disk or a file share behaves the same offline.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from sleuthd import __version__
from sleuthd.report.audio import AudioStore, ReportError
from sleuthd.report.model import CheckedDialogue, RankedCandidates, dialogue_json, ranking_json

# file: lets a page opened from disk load its own audio and waveform scripts ('self' does not cover file
# URLs in every browser); nothing else may be fetched.
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline' 'self' file:; "
    "media-src 'self' file: blob:; img-src 'self' data:; connect-src 'none'; base-uri 'none'; form-action 'none'"
)


def _asset(name: str) -> str:
    return resources.files("sleuthd.report").joinpath("assets", name).read_text(encoding="utf-8")


def _inline_json(data: Any) -> str:
    """JSON safe inside a <script> element: no '<', '>' or '&' can end or bend it."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _html_text(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def render_page(data: dict[str, Any], title: str) -> str:
    """The whole page as a string (data: the report's JSON object)."""
    parts = {
        "CSP": CSP,
        "TITLE": _html_text(title),
        "CSS": _asset("report.css"),
        "DATA": _inline_json(data),
        "JS": _asset("report.js"),
    }
    # One pass: text put in (a turn id, say) is never searched for placeholders again.
    return re.sub(r"\{\{([A-Z]+)\}\}", lambda m: parts[m.group(1)], _asset("page.html"))


def _prepare(out_dir: str | os.PathLike[str]) -> Path:
    root = Path(out_dir)
    if root.exists() and not root.is_dir():
        raise ReportError(f"report folder {root} is a file: give a folder (it is created if missing)")
    root.mkdir(parents=True, exist_ok=True)
    return root


def _header(kind: str, title: str) -> dict[str, Any]:
    return {
        "kind": kind,
        "title": title,
        "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "version": __version__,
    }


def _write(root: Path, data: dict[str, Any], title: str) -> Path:
    index = root / "index.html"
    tmp = root / ".index.html.part"
    tmp.write_text(render_page(data, title), encoding="utf-8")
    tmp.replace(index)
    return index


def write_report(
    out_dir: str | os.PathLike[str],
    dialogues: Iterable[CheckedDialogue],
    *,
    title: str = "sleuthd report",
    audio: str = "copy",
) -> Path:
    """Write a review report of checked dialogues into ``out_dir`` (created if missing) and return the
    path of its index.html. ``audio``: "copy" (default: the report keeps the audio that was judged) or
    "link" (symbolic links to the originals: no copies, but the report breaks when they move or change)."""
    root = _prepare(out_dir)
    store = AudioStore(root, audio)
    items = [dialogue_json(i, d, store) for i, d in enumerate(dialogues)]
    return _write(root, {**_header("check", title), "dialogues": items}, title)


def write_ranking_report(
    out_dir: str | os.PathLike[str],
    ranked: RankedCandidates,
    *,
    title: str = "sleuthd ranking",
    audio: str = "copy",
) -> Path:
    """Write a report of one ranking (candidates best first, with players) and return its index.html."""
    root = _prepare(out_dir)
    store = AudioStore(root, audio)
    return _write(root, {**_header("rank", title), "ranking": ranking_json(ranked, store)}, title)
