"""One streamed dialogue: turns arrive in chunks, each is judged as soon as it is complete.

A :class:`DialogueSession` is the engine side of ``StreamDialogue`` (it never imports grpc). It
buffers the audio of open turns (bounded per stream), embeds a turn when its final chunk arrives,
re-judges that speaker's turns with everything known so far, and reports the new turn's verdict plus
a revision for every earlier turn whose status changed. On close it gives the same verdict
CheckDialogue gives for the whole dialogue.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from sleuthd.audio import PcmSpec
from sleuthd.clips import ClipEmbedding
from sleuthd.domain import AudioInput, CheckOptions, DialogueResult, SpeakerResult, TurnResult, TurnStatus
from sleuthd.drift import DriftResult
from sleuthd.engine import Engine, ResolvedOptions, check_id
from sleuthd.errors import Duplicate, InvalidRequest, LimitExceeded, OutOfSequence, UnknownName
from sleuthd.judge import judge_dialogue

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamLimits:
    """Per-stream bounds, so one client cannot hold unbounded memory."""

    # Audio bytes buffered for turns that are still open (not yet final), summed over the stream.
    max_buffered_bytes: int = 64 * 1024 * 1024
    # Turns per stream (completed turns keep only their embedding, about 2 KB with windows).
    max_turns: int = 1000


@dataclass(frozen=True)
class TurnUpdate:
    verdict: TurnResult
    revision: bool  # False: first verdict for this turn; True: a later turn changed its status
    trigger_turn_id: str
    speaker: SpeakerResult


@dataclass
class _OpenTurn:
    turn_id: str
    speaker: str
    pcm: PcmSpec | None
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0


class DialogueSession:
    def __init__(self, engine: Engine, limits: StreamLimits | None = None) -> None:
        self.engine = engine
        self.limits = limits or StreamLimits()
        self.dialogue_id = ""
        self._opts: ResolvedOptions | None = None
        self._references: dict[str, np.ndarray] = {}
        self._open: dict[str, _OpenTurn] = {}
        self._done: dict[str, tuple[str, ClipEmbedding]] = {}  # turn_id -> (speaker, clip), completion order
        self._order: list[str] = []  # turn ids in dialogue (start) order
        self._last_status: dict[str, TurnStatus] = {}
        self._last_index = -1
        self._detect_drift = False
        self._drift: dict[str, DriftResult | None] = {}
        self._buffered = 0
        self.engine.active_streams += 1
        self._released = False

    @property
    def buffered_bytes(self) -> int:
        return self._buffered

    def release(self) -> None:
        """Free buffered audio; safe to call more than once (the servicer calls it in ``finally``)."""
        if not self._released:
            self._released = True
            self._open.clear()
            self._buffered = 0
            self.engine.active_streams -= 1

    def _require_open(self) -> ResolvedOptions:
        if self._opts is None:
            raise OutOfSequence("the first message of a stream must be `open`")
        return self._opts

    async def open(
        self, dialogue_id: str, references: dict[str, AudioInput], options: CheckOptions, deadline: float | None = None
    ) -> None:
        if self._opts is not None:
            raise OutOfSequence("the stream is already open; send `open` once, first")
        opts = self.engine.resolve(options)
        self._references = await self.engine.embed_references(opts, references, deadline)
        self.dialogue_id = dialogue_id
        self._detect_drift = options.detect_drift
        self._opts = opts

    def start_turn(self, turn_id: str, speaker: str, index: int, pcm: PcmSpec | None) -> None:
        opts = self._require_open()
        check_id(turn_id, "turn_start.turn_id")
        check_id(speaker, f"turn {turn_id!r} speaker")
        if turn_id in self._open or turn_id in self._done:
            raise Duplicate(f"turn_id {turn_id!r} was already started in this stream; turn ids must be unique")
        if index <= self._last_index:
            raise InvalidRequest(
                f"turn {turn_id!r} has index {index} but turn index {self._last_index} was already started: "
                "start turns in dialogue order (increasing index)"
            )
        if len(self._order) >= self.limits.max_turns:
            raise LimitExceeded(f"this stream already has {len(self._order)} turns, the limit; open a new stream")
        self.engine.require_references(opts, [speaker], self._references.keys())
        self._last_index = index
        self._open[turn_id] = _OpenTurn(turn_id, speaker, pcm)
        self._order.append(turn_id)

    def add_audio(self, turn_id: str, data: bytes) -> None:
        self._require_open()
        turn = self._open.get(turn_id)
        if turn is None:
            if turn_id in self._done:
                raise OutOfSequence(f"turn {turn_id!r} is already complete (its final chunk arrived); no more audio")
            raise UnknownName(f"audio for turn {turn_id!r}, which was never started: send turn_start first")
        if self._buffered + len(data) > self.limits.max_buffered_bytes:
            raise LimitExceeded(
                f"this stream would buffer {self._buffered + len(data)} bytes of unfinished turns; the limit is "
                f"{self.limits.max_buffered_bytes}: finish turns (final=true) before sending more audio"
            )
        turn.chunks.append(data)
        turn.size += len(data)
        self._buffered += len(data)

    async def finish_turn(self, turn_id: str, deadline: float | None = None) -> list[TurnUpdate]:
        """Embed the completed turn and re-judge its speaker; returns the turn's verdict and revisions."""
        opts = self._require_open()
        turn = self._open.pop(turn_id)
        data = b"".join(turn.chunks)
        self._buffered -= turn.size
        ((clip, dense),) = await self.engine.embed_placements(
            opts.encoder, [(AudioInput(data, turn.pcm), f"turn {turn_id!r}")], deadline, self._detect_drift
        )
        self._done[turn_id] = (turn.speaker, clip)
        if dense is not None and clip.usable:
            self._drift[turn_id] = self.engine.find_drift(opts.encoder, dense)
        # Re-judge everything so far: a new turn can change its own speaker's verdicts and, through
        # attribution and the cohort, other speakers' too. Embeddings are kept, so this is cheap.
        results, speakers = self._judge()
        verdicts = {v.speaker: v for v in speakers}
        # The new turn's verdict first, then revisions of earlier turns in dialogue order.
        updates = [TurnUpdate(r, False, turn_id, verdicts[r.speaker]) for r in results if r.turn_id == turn_id]
        self.engine.observer.verdict(updates[0].verdict.status)
        for r in results:
            previous = self._last_status.get(r.turn_id)
            if r.turn_id != turn_id and previous is not None and previous is not r.status:
                updates.append(TurnUpdate(r, True, turn_id, verdicts[r.speaker]))
            self._last_status[r.turn_id] = r.status
        return updates

    def _judge(self) -> tuple[list[TurnResult], list[SpeakerResult]]:
        opts = self._require_open()
        ids = [t for t in self._order if t in self._done]
        turns, speakers = judge_dialogue(
            [(t, self._done[t][0]) for t in ids], [self._done[t][1] for t in ids], self._references, opts.judgment
        )
        if self._detect_drift:
            turns = self.engine.apply_drift(opts, turns, self._drift)
        return turns, speakers

    def close(self) -> DialogueResult:
        """The whole dialogue's verdict, as CheckDialogue would give it."""
        opts = self._require_open()
        if self._open:
            still_open = ", ".join(repr(t) for t in sorted(self._open))
            raise OutOfSequence(f"stream closed with turns still open: {still_open}; send their final chunk first")
        if not self._done:
            raise InvalidRequest("the stream ended without any complete turn: nothing to judge")
        turns, speakers = self._judge()
        return opts.result(self.dialogue_id, turns, speakers)
