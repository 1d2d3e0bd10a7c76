"""`sleuthd check` over many dialogues: dialogue files, JSON Lines of dialogues and folders of them, checked
concurrently through one channel (or in-process with ``--local``), with progress on stderr, a summary table
and one exit code for the whole batch.

Every input is read and checked (JSON, turns) before the first request is sent, so a typo in file 900 does
not surface after 899 checks; audio is read only when its dialogue is sent. A dialogue that names an audio
file that does not exist is not sent: it becomes its own error row (file, line, dialogue, turn) and the others
are checked.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from sleuthd import client
from sleuthd.report import CheckedDialogue, write_report
from sleuthd.v1 import sleuthd_pb2 as pb

logger = logging.getLogger(__name__)

# Exit codes of `sleuthd check` (one dialogue or many).
EXIT_OK = 0  # every dialogue was judged and no judged speaker is inconsistent
EXIT_ERROR = 2  # bad input or a failed request (the message says what to fix)
EXIT_INCONSISTENT = 3  # at least one speaker of at least one dialogue is inconsistent
EXIT_UNJUDGED = 4  # nothing inconsistent, but some dialogue had no speaker that could be judged
EXIT_UNCERTAIN = 5  # nothing inconsistent, but some turn is uncertain (neither flagged nor cleared: listen)

CONSISTENT, INCONSISTENT, UNCERTAIN = "consistent", "inconsistent", "uncertain"
UNJUDGED, FAILED, NOT_SENT = "not judged", "error", "not sent"
# The code of a dialogue that was not sent because audio it names does not exist (the gRPC code a server
# gives for a name it cannot find, so a --json reader sees one vocabulary of codes).
MISSING_AUDIO = "NOT_FOUND"
DIALOGUE_SUFFIXES = (".json", ".jsonl")


@dataclass(frozen=True)
class DialogueSource:
    """One dialogue to check: a dialogue file, or one line of a JSON Lines file."""

    label: str  # the file, or FILE:LINE
    doc: Any
    base: Path  # audio paths are relative to this folder
    default_id: str  # the dialogue id when the dialogue names none
    problem: str = ""  # why it cannot be sent (audio it names does not exist); "" when it can

    @property
    def dialogue_id(self) -> str:
        given = self.doc.get("dialogue_id") if isinstance(self.doc, dict) else None
        return str(given) if given not in (None, "") else self.default_id

    def request(self, read_audio: bool = True) -> pb.CheckDialogueRequest:
        req = client.dialogue_request_from_dict(self.doc, self.base, self.label, read_audio)
        req.dialogue_id = req.dialogue_id or self.default_id
        return req


def dialogue_files(paths: Sequence[Path]) -> Iterator[tuple[Path, Path | None]]:
    """``paths`` with each folder replaced by the dialogue files under it: every ``*.json`` and ``*.jsonl``,
    subfolders included, hidden files and folders left out, in sorted path order. Each file comes with the
    folder it was found in (None: named itself)."""
    for path in paths:
        if not path.is_dir():
            yield path, None
            continue
        found = sorted(
            p
            for p in path.rglob("*")
            if p.suffix in DIALOGUE_SUFFIXES
            and p.is_file()
            and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
        if not found:
            raise client.DialogueFileError(
                f"folder {path} holds no dialogue files (*.json or *.jsonl, subfolders included)"
            )
        for p in found:
            yield p, path


def read_sources(paths: Sequence[Path]) -> list[DialogueSource]:
    """Every dialogue of ``paths`` (files, or folders of them; ``*.jsonl``: one dialogue object per line),
    each checked without reading its audio. Raises DialogueFileError naming the file (and line) of the first
    malformed one; a dialogue naming audio that does not exist is kept, with the problem recorded."""
    sources: list[tuple[DialogueSource, Path | None]] = []
    for path, folder in dialogue_files(paths):
        try:
            text = client.read_dialogue_text(path)
            if path.suffix == ".jsonl":
                lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
                if not lines:
                    raise client.DialogueFileError(f"{path} has no dialogues (one JSON object per line expected)")
                for n, line in lines:
                    where = f"{path}:{n}"
                    sources.append((DialogueSource(where, _json(line, where), path.parent, f"{path.stem}:{n}"), folder))
            else:
                sources.append((DialogueSource(str(path), _json(text, str(path)), path.parent, path.stem), folder))
        except client.DialogueFileError as exc:
            raise _found_in(exc, folder) from None
    checked = []
    for source, folder in sources:
        try:
            source.request(read_audio=False)
        except client.MissingAudioError as exc:
            source = replace(source, problem=exc.detail)
        except client.DialogueFileError as exc:
            raise _found_in(exc, folder) from None
        checked.append(source)
    return checked


def _found_in(exc: client.DialogueFileError, folder: Path | None) -> client.DialogueFileError:
    if folder is None:
        return exc
    return client.DialogueFileError(
        f"{exc} (found in folder {folder}: every *.json and *.jsonl file under a folder given to `sleuthd check` "
        "must be a dialogue file; move this one out, or name the dialogue files instead)"
    )


def _json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise client.DialogueFileError(f"{where} is not valid JSON: {exc}") from exc


@dataclass(frozen=True)
class Outcome:
    source: DialogueSource
    dialogue_id: str
    verdict: pb.DialogueVerdict | None = None
    code: str = ""  # the gRPC status code name when the request failed (or MISSING_AUDIO: not sent)
    error: str = ""

    @property
    def kind(self) -> str:
        if self.verdict is None:
            return FAILED if self.code else NOT_SENT
        judged = [s for s in self.verdict.speakers if s.judged]
        if not judged:
            return UNJUDGED
        if any(s.inconsistent_turn_ids for s in judged):
            return INCONSISTENT
        return UNCERTAIN if any(s.uncertain_turn_ids for s in judged) else CONSISTENT


def exit_code(outcomes: Sequence[Outcome]) -> int:
    """3 when anything is inconsistent (a definite finding, reported even when other dialogues failed),
    else 2 when a dialogue failed or was not sent, else 5 when a turn is uncertain (a person must listen),
    else 4 when a dialogue could not be judged, else 0."""
    kinds = {o.kind for o in outcomes}
    if INCONSISTENT in kinds:
        return EXIT_INCONSISTENT
    if kinds & {FAILED, NOT_SENT}:
        return EXIT_ERROR
    if UNCERTAIN in kinds:
        return EXIT_UNCERTAIN
    return EXIT_UNJUDGED if UNJUDGED in kinds else EXIT_OK


class Progress:
    """Plain progress lines on stderr: one line rewritten in place on a terminal, else a line every 5 %."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.every = max(1, total // 20)
        self.done = 0
        self.counts: Counter[str] = Counter()

    def update(self, outcome: Outcome) -> None:
        self.done += 1
        self.counts[outcome.kind] += 1
        c = self.counts
        line = (
            f"checked {self.done}/{self.total} dialogues: {c[INCONSISTENT]} inconsistent, {c[UNJUDGED]} not judged, "
            f"{c[FAILED] + c[NOT_SENT]} failed"
        )
        last = self.done == self.total
        if self.tty:
            self.stream.write("\r" + line + ("\n" if last else ""))
        elif last or self.done % self.every == 0:
            self.stream.write(line + "\n")
        self.stream.flush()


class RequestFailed(Exception):
    """A dialogue's check failed: ``code`` is the gRPC status code's name, ``message`` says what to fix;
    ``server_gone`` (UNAVAILABLE after the channel's own retries): the rest need not be sent."""

    def __init__(self, code: str, message: str, server_gone: bool = False) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.server_gone = server_gone


# Checks one dialogue: the verdict, or RequestFailed. A server's CheckDialogue (sleuthd.cli.main) or the
# in-process judge (sleuthd.api.Judge, `sleuthd check --local`).
CheckOne = Callable[[pb.CheckDialogueRequest], Awaitable[pb.DialogueVerdict]]


async def check_all(
    sources: Sequence[DialogueSource],
    check_one: CheckOne,
    customize: Callable[[pb.CheckDialogueRequest], None],
    concurrency: int = 4,
    progress: Progress | None = None,
) -> list[Outcome]:
    """Check every dialogue, at most ``concurrency`` at a time; results in input order. A dialogue that
    cannot be sent (its audio is missing) or whose check fails is recorded and the others go on; once one
    fails with the server gone the rest are not sent."""
    outcomes: list[Outcome | None] = [None] * len(sources)
    gate = asyncio.Semaphore(max(1, concurrency))
    server_gone = asyncio.Event()

    async def one(i: int, source: DialogueSource) -> None:
        async with gate:
            outcome = await _check(source)
            outcomes[i] = outcome
            if progress is not None:
                progress.update(outcome)

    async def _check(source: DialogueSource) -> Outcome:
        if source.problem:
            return Outcome(source, source.dialogue_id, code=MISSING_AUDIO, error=f"{source.problem} (not sent)")
        try:
            req = source.request()
        except client.MissingAudioError as exc:  # removed since it was read
            return Outcome(source, source.dialogue_id, code=MISSING_AUDIO, error=f"{exc.detail} (not sent)")
        customize(req)
        if server_gone.is_set():
            return Outcome(source, req.dialogue_id, error="not sent: the server was unavailable")
        try:
            return Outcome(source, req.dialogue_id, await check_one(req))
        except RequestFailed as exc:
            if exc.server_gone:
                server_gone.set()
            return Outcome(source, req.dialogue_id, code=exc.code, error=exc.message)

    await asyncio.gather(*(one(i, s) for i, s in enumerate(sources)))
    return [o for o in outcomes if o is not None]


def summary_rows(outcomes: Sequence[Outcome]) -> list[tuple[str, ...]]:
    """One row per dialogue: where it came from, its id, the verdict, judged speakers, flagged turns."""
    rows: list[tuple[str, ...]] = [("dialogue", "id", "verdict", "judged", "flagged turns / error")]
    for o in outcomes:
        if o.verdict is None:
            detail = f"{o.code}: {o.error}" if o.code else o.error
            rows.append((o.source.label, o.dialogue_id, o.kind.upper(), "-", _short(detail)))
            continue
        speakers = o.verdict.speakers
        flagged = [t for s in speakers for t in s.inconsistent_turn_ids]
        kind = o.kind if o.kind == CONSISTENT else o.kind.upper()
        judged = f"{sum(s.judged for s in speakers)}/{len(speakers)} speakers"
        rows.append((o.source.label, o.dialogue_id, kind, judged, ", ".join(flagged) or "-"))
    return rows


def _short(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def report(outcomes: Sequence[Outcome], out_dir: Path, voices: Mapping[str, str], audio: str = "copy") -> Path:
    """`sleuthd check --report DIR`: the HTML review report of every dialogue checked (failed ones with their
    error), playing the audio files the dialogues name; ``voices``: the --voice overrides that were sent."""
    checked = []
    for o in outcomes:
        doc, base = o.source.doc, o.source.base
        numbered = enumerate(doc.get("turns", []))
        turns = [(client.turn_id_or_default(t.get("turn_id"), n), t) for n, t in numbered if isinstance(t, dict)]
        # A dialogue that was not sent for missing audio is listed with its error and the audio that exists.
        checked.append(
            CheckedDialogue(
                verdict=None if o.verdict is None else client.Verdict.from_pb(o.verdict),
                turn_audio={i: base / t["audio"] for i, t in turns if t.get("audio") and (base / t["audio"]).is_file()},
                references={
                    s: base / p
                    for s, p in (doc.get("references") or {}).items()
                    if s not in voices and (base / p).is_file()
                },
                voices={**{s: str(v) for s, v in (doc.get("voices") or {}).items()}, **voices},
                texts={i: str(t["text"]) for i, t in turns if t.get("text")},
                dialogue_id=o.dialogue_id,
                source=o.source.label,
                error=f"{o.code}: {o.error}" if o.code else o.error,
            )
        )
    return write_report(out_dir, checked, audio=audio)
