"""One dialogue's state: turn embeddings in, verdicts out. Shared by CheckDialogue and StreamDialogue.

CheckDialogue adds every turn and asks for the result once; StreamDialogue adds turns as they complete
and asks after each for the new turn's verdict and the revisions it caused. Both judge the same way
(sleuthd.judge), so a stream's final verdict is exactly CheckDialogue's for the same turns.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from sleuthd.clips import ClipEmbedding
from sleuthd.domain import (
    DialogueRequest,
    DialogueResult,
    DriftResult,
    SpeakerResult,
    TurnResult,
    TurnStatus,
    TurnUpdate,
)
from sleuthd.drift import attach_drift, find_drift
from sleuthd.errors import InvalidRequest, LimitExceeded, UnknownName
from sleuthd.judge import judge_dialogue
from sleuthd.observe import EngineObserver
from sleuthd.options import ResolvedOptions
from sleuthd.scoring import Method

MAX_ID_CHARS = 128


class DialogueState:
    def __init__(
        self, dialogue_id: str, opts: ResolvedOptions, references: dict[str, np.ndarray], observer: EngineObserver
    ) -> None:
        self.dialogue_id = dialogue_id
        self.opts = opts
        self.references = references
        self._observer = observer
        self._turns: dict[str, tuple[int, str, ClipEmbedding]] = {}  # turn_id -> (position, speaker, clip)
        self._drift: dict[str, DriftResult | None] = {}  # searched turns only
        self._last_status: dict[str, TurnStatus] = {}
        self._counted: set[str] = set()  # turns whose verdict the observer has seen

    def __len__(self) -> int:
        return len(self._turns)

    def add_turn(
        self, turn_id: str, speaker: str, position: int, clip: ClipEmbedding, dense: ClipEmbedding | None = None
    ) -> None:
        """A completed turn at ``position`` in the dialogue, with its embedding on the drift windows when
        the request asked for drift (searched now, since only this turn's windows are needed)."""
        self._turns[turn_id] = (position, speaker, clip)
        config = self.opts.entry.drift
        if dense is not None and clip.usable and config is not None:
            self._drift[turn_id] = find_drift(dense.window_embeddings, dense.window_times, config)

    def judge(self) -> tuple[list[TurnResult], list[SpeakerResult]]:
        """Verdicts of every turn added so far, in dialogue order, and per speaker."""
        ordered = sorted(self._turns.items(), key=lambda item: item[1][0])
        turns, speakers = judge_dialogue(
            [(turn_id, speaker) for turn_id, (_, speaker, _) in ordered],
            [clip for _, (_, _, clip) in ordered],
            self.references,
            self.opts.judgment,
        )
        if self.opts.detect_drift and self.opts.entry.drift is not None:
            turns = attach_drift(turns, self._drift, self.opts.entry.drift)
        return turns, speakers

    def updates(self, turn_id: str) -> list[TurnUpdate]:
        """After ``turn_id`` was added: its verdict first, then every earlier turn whose status changed
        (revision=True), in dialogue order; each with its speaker's verdict."""
        # A new turn can change its own speaker's verdicts and, through attribution and the cohort,
        # other speakers' too, so everything so far is judged again. Embeddings are kept, so this is cheap.
        results, speakers = self.judge()
        verdicts = {v.speaker: v for v in speakers}
        out = [TurnUpdate(r, False, turn_id, verdicts[r.speaker]) for r in results if r.turn_id == turn_id]
        self._count([out[0].verdict])
        for r in results:
            previous = self._last_status.get(r.turn_id)
            if r.turn_id != turn_id and previous is not None and previous is not r.status:
                out.append(TurnUpdate(r, True, turn_id, verdicts[r.speaker]))
            self._last_status[r.turn_id] = r.status
        return out

    def result(self) -> DialogueResult:
        turns, speakers = self.judge()
        self._count(turns)
        return self.opts.result(self.dialogue_id, turns, speakers)

    def _count(self, turns: Sequence[TurnResult]) -> None:
        for t in turns:
            if t.turn_id not in self._counted:
                self._counted.add(t.turn_id)
                self._observer.verdict(t.status)


def check_id(value: str, what: str) -> None:
    if not value:
        raise InvalidRequest(f"{what} is empty")
    if len(value) > MAX_ID_CHARS:
        raise InvalidRequest(f"{what} is {len(value)} characters; at most {MAX_ID_CHARS} allowed")


def validate_dialogue(request: DialogueRequest, max_turns: int) -> None:
    if not request.turns:
        raise InvalidRequest("dialogue has no turns")
    if len(request.turns) > max_turns:
        raise LimitExceeded(f"dialogue has {len(request.turns)} turns; the limit is {max_turns}: split it")
    seen: set[str] = set()
    for n, t in enumerate(request.turns):
        check_id(t.turn_id, f"turn #{n} turn_id")
        check_id(t.speaker, f"turn {t.turn_id!r} speaker")
        if t.turn_id in seen:
            raise InvalidRequest(f"turn_id {t.turn_id!r} appears twice; turn ids must be unique")
        seen.add(t.turn_id)
    if not any(t.audio is not None for t in request.turns):
        raise InvalidRequest("dialogue has no turn with audio: attach audio to the turns to be judged")
    audio_speakers = {t.speaker for t in request.turns if t.audio is not None}
    for s in request.references:
        if s not in audio_speakers:
            raise UnknownName(f"reference given for speaker {s!r}, who has no turn with audio in this dialogue")


def require_references(opts: ResolvedOptions, speakers: Sequence[str], with_reference: Collection[str]) -> None:
    """Method reference cannot judge a speaker without a reference clip: say which are missing."""
    if opts.method is Method.REFERENCE:
        missing = [s for s in dict.fromkeys(speakers) if s not in with_reference]
        if missing:
            raise InvalidRequest(
                f"method reference needs a reference clip for every speaker; missing for: {', '.join(missing)}"
            )
