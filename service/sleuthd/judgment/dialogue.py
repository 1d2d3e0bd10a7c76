"""A dialogue being judged: the one protocol both judges implement, and the encoder's implementation.

CheckDialogue adds every turn and asks for the result once; StreamDialogue adds turns as they complete
(:meth:`Dialogue.finish_turn`) and sends each turn's verdict and the revisions it caused. Both go through
the same :class:`Dialogue`, whichever method judges (the speaker encoders here; the LALM judge in
sleuthd.judgment.lalm_dialogue), so the engine and the stream session never ask which one they hold, and a
stream's final verdict is exactly CheckDialogue's for the same turns.

A dialogue hears its turns through a *listener* the engine gives it (audio in, what this judge needs
out: embeddings, or a waveform and its embeddings), so judging stays free of decoding and batching.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import math
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from sleuthd.audio.bandwidth import NARROW_CUTOFF_HZ
from sleuthd.domain import (
    AudioInput,
    DialogueRequest,
    DialogueResult,
    DriftResult,
    FlagReason,
    SimilarityMatrix,
    SpeakerResult,
    TurnResult,
    TurnStatus,
    TurnUpdate,
)
from sleuthd.encoders.clips import ClipEmbedding
from sleuthd.errors import InvalidRequest, LimitExceeded, UnknownName
from sleuthd.judgment.drift import attach_drift, find_drift
from sleuthd.judgment.options import ResolvedOptions
from sleuthd.judgment.pool import SpeakerPool
from sleuthd.judgment.scoring import Method
from sleuthd.judgment.similarity import similarity_matrix
from sleuthd.judgment.verdicts import (
    NO_AUDIO,
    STATUS_OF_CODE,
    SpeakerScores,
    score_speakers,
    speaker_verdict,
    turn_result,
)
from sleuthd.ops.observe import EngineObserver

MAX_ID_CHARS = 128

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TurnAudio:
    """A completed turn: its id, speaker, order in the dialogue and audio."""

    turn_id: str
    speaker: str
    position: int  # 0-based order among the dialogue's audio turns
    audio: AudioInput

    @property
    def label(self) -> str:
        """How error messages name the turn."""
        return f"turn {self.turn_id!r}"


class Dialogue(Protocol):
    """One dialogue being judged, by whichever method (sleuthd.engine builds it for the request's options)."""

    @property
    def dialogue_id(self) -> str: ...

    @property
    def opts(self) -> ResolvedOptions:
        """How it is judged: encoder, method, threshold."""

    @property
    def references(self) -> Mapping[str, np.ndarray]:
        """Speaker -> reference embedding, for the speakers that have one."""

    def __len__(self) -> int:
        """Turns added so far."""

    @property
    def kept_audio_bytes(self) -> int:
        """Audio the dialogue keeps between turns, bytes (the LALM judge hears earlier turns again; the encoders
        keep turns for band matching until their narrowband copies are embedded): a stream counts it in the
        process's audio budget."""

    async def add_turns(self, turns: Sequence[TurnAudio], deadline: float | None) -> None:
        """Hear completed turns (together, as one request's audio) and add them, without judging yet."""

    async def finish_turn(self, turn: TurnAudio, deadline: float | None) -> list[TurnUpdate]:
        """Hear and add one completed turn and judge the dialogue so far: the turn's verdict first, then
        every earlier turn whose status changed (revision=True), in dialogue order."""

    async def result(self, deadline: float | None) -> DialogueResult:
        """The whole dialogue's verdict (every turn added so far)."""


class VerdictLedger:
    """What a dialogue has reported so far: each turn's status as last sent (a later turn that changes it
    is a revision) and the turns whose verdict the metrics have counted (each once)."""

    def __init__(self, observer: EngineObserver) -> None:
        self._observer = observer
        self._reported: dict[str, TurnStatus] = {}
        self._counted: set[str] = set()

    def revisions(self, statuses: Iterable[tuple[str, TurnStatus]], new_turn: str) -> list[str]:
        """The turns (in the order given, ``new_turn`` left out) whose status differs from the one last
        sent; every status given is recorded as sent."""
        changed = []
        for turn_id, status in statuses:
            before = self._reported.get(turn_id)
            if turn_id != new_turn and before is not None and before is not status:
                changed.append(turn_id)
            self._reported[turn_id] = status
        return changed

    def count(self, turns: Iterable[TurnResult]) -> None:
        for t in turns:
            if t.turn_id not in self._counted:
                self._counted.add(t.turn_id)
                why = t.reason if t.reason is not FlagReason.NONE else t.uncertain_reason
                self._observer.verdict(t.status, why.value)


# Hears a request's clips (each with a label for errors) under the dialogue's window placements: one list
# of embeddings per clip, the manifest's placement first (sleuthd.encoders.embedder.ClipEmbedder.embed).
Embed = Callable[[Sequence[tuple[AudioInput, str]], float | None], Awaitable[list[list[ClipEmbedding]]]]
# Hears clips' copies at the common band (sleuthd.encoders.embedder.ClipEmbedder.narrowband): one embedding each.
Narrow = Callable[[Sequence[tuple[AudioInput, str]], float | None], Awaitable[list[ClipEmbedding]]]


@dataclass(frozen=True)
class _Turn:
    turn_id: str
    speaker: str
    position: int
    audio_seconds: float
    speech_seconds: float
    detail: str  # why the clip is unusable; "" when usable
    usable: bool
    bandwidth_hz: float | None = None  # ClipEmbedding.bandwidth_hz


@dataclass
class _Speaker:
    pool: SpeakerPool
    turns: list[_Turn] = field(default_factory=list)  # every audio turn of the speaker, in dialogue order
    positions: list[int] = field(default_factory=list)  # their positions
    usable: int = 0  # how many of them have an embedding
    has_embedding: list[bool] = field(default_factory=list)  # per turn
    # Band matching: the same pool on the clips' narrowband copies (built when some speaker needs it), the
    # positions of the turns in it, and why it cannot stand in for the pool ("": it can).
    narrow: SpeakerPool | None = None
    narrow_positions: list[int] = field(default_factory=list)
    narrow_unusable: str = ""


@dataclass(frozen=True)
class BandMatch:
    """Why a speaker is judged at the common band: the bandwidths their clips span (Hz, lowest and highest)."""

    low_hz: float
    high_hz: float

    @property
    def octaves(self) -> float:
        return math.log2(self.high_hz / self.low_hz)

    def note(self, speaker: str) -> str:
        return (
            f"compared below {NARROW_CUTOFF_HZ / 1000:.1f} kHz: the clips of speaker {speaker!r} span "
            f"{self.octaves:.2f} octave of bandwidth ({self.low_hz / 1000:.1f}-{self.high_hz / 1000:.1f} kHz)"
        )


class EncoderDialogue:
    """A dialogue judged by the speaker encoders (every method but lalm): the turns so far and what judging
    them needs, per speaker (sleuthd.judgment.verdicts).

    A turn keeps only its embedding and seconds (about 1 KB), plus its share of its speaker's cosine
    matrix and sorted pairs (24 bytes per pair of the speaker's turns): no window embeddings.

    **Band matching** (Judgment.band_matching: the fused encoder's auto): a low-bitrate or telephone turn keeps
    only the band below 4-6 kHz, and both encoders then place it away from the same speaker's full-band turns.
    A speaker whose clips (usable turns, and reference clip) span more than ``band_match_octaves`` of bandwidth
    is therefore judged on every clip's copy low-passed at 3.6 kHz (docs/research/robustness.md, "Phase 3"),
    against the other speakers' copies (their centroids are its cohort); the others stay full band. So that
    a speaker who becomes mixed at turn k can have turns 0..k-1 narrowed, the dialogue keeps each usable turn's
    audio (the request's own bytes) until its narrowband embedding exists; a stream that keeps more than
    ``max_kept_audio_bytes`` embeds every later turn's copy as it arrives instead (in the background: the
    turn's verdict waits for it only when a speaker is mixed). The verdicts are CheckDialogue's either way."""

    def __init__(
        self,
        dialogue_id: str,
        opts: ResolvedOptions,
        references: dict[str, np.ndarray],
        observer: EngineObserver,
        embed: Embed | None = None,
        narrow: Narrow | None = None,
        reference_clips: Mapping[str, tuple[AudioInput, float | None]] | None = None,
        max_kept_audio_bytes: int | None = None,
    ) -> None:
        """``embed``: the listener (None: turns are added as embeddings, :meth:`add_clip`). ``narrow``: the
        listener of narrowband copies (None: no band matching); ``reference_clips``: speaker -> the reference
        clip's audio and bandwidth, for the references sent as audio; ``max_kept_audio_bytes``: a stream's
        bound on the turns' audio kept for band matching (None: CheckDialogue, whose request bounds it)."""
        self.dialogue_id = dialogue_id
        self.opts = opts
        self.references = references
        self._embed = embed
        self._ledger = VerdictLedger(observer)
        self._turns: dict[str, _Turn] = {}
        self._speakers: dict[str, _Speaker] = {}
        self._drift: dict[str, DriftResult | None] = {}  # searched turns only
        self._narrow_listener = narrow if opts.judgment.band_matching else None
        self._max_kept = max_kept_audio_bytes
        self._reference_clips = dict(reference_clips or {})
        self._kept: dict[str, AudioInput] = {}  # turn id or reference key -> audio not yet narrowed
        self._narrowed: dict[str, ClipEmbedding] = {}  # turn id or reference key -> its narrowband embedding
        self._narrowing: dict[str, asyncio.Task[None]] = {}  # background narrowband embeddings (streams)
        self._eager = False  # a stream past its bound: every turn is narrowed as it arrives
        self._band_cache: tuple[int, dict[str, BandMatch]] | None = None  # band_matches() at a number of turns
        if self._narrow_listener is not None:
            self._kept.update({_REF + s: audio for s, (audio, _) in self._reference_clips.items()})

    @property
    def kept_audio_bytes(self) -> int:
        return sum(len(a.data) for a in self._kept.values())

    def __len__(self) -> int:
        return len(self._turns)

    # ------------------------------------------------------------------ the Dialogue protocol

    async def add_turns(self, turns: Sequence[TurnAudio], deadline: float | None) -> None:
        await self._hear(turns, deadline)
        await self._match_bands(deadline)

    async def _hear(self, turns: Sequence[TurnAudio], deadline: float | None) -> None:
        assert self._embed is not None, "a dialogue that hears audio is opened with a listener"
        embedded = await self._embed([(t.audio, t.label) for t in turns], deadline)
        for turn, clips in zip(turns, embedded, strict=True):
            self.add_clip(turn.turn_id, turn.speaker, turn.position, clips[0], clips[1] if len(clips) > 1 else None)
            if self._narrow_listener is not None and clips[0].usable:
                self._kept[turn.turn_id] = turn.audio

    async def finish_turn(self, turn: TurnAudio, deadline: float | None) -> list[TurnUpdate]:
        await self._hear([turn], deadline)
        if self._max_kept is not None and not self._eager and self.kept_audio_bytes > self._max_kept:
            self._eager = True
        await self._match_bands(deadline)
        return self.updates(turn.turn_id)

    async def result(self, deadline: float | None = None) -> DialogueResult:
        return self.verdict()

    # ------------------------------------------------------------------ embeddings in, verdicts out

    def add_clip(
        self, turn_id: str, speaker: str, position: int, clip: ClipEmbedding, dense: ClipEmbedding | None = None
    ) -> None:
        """A completed turn at ``position`` in the dialogue, with its embedding on the drift windows when
        the request asked for drift (searched now, since only this turn's windows are needed)."""
        turn = _Turn(
            turn_id,
            speaker,
            position,
            clip.audio_seconds,
            clip.speech_seconds,
            clip.detail,
            clip.usable,
            # Measured by the fused encoder's shared decode; a single encoder's clip may carry it from the cache
            # (the fusion's component entry), and is reported without it, whichever came first.
            clip.bandwidth_hz if self.opts.judgment.components else None,
        )
        self._turns[turn_id] = turn
        entry = self._speakers.get(speaker)
        if entry is None:
            entry = self._speakers[speaker] = _Speaker(
                SpeakerPool(self.references.get(speaker), self.opts.judgment.components)
            )
        at = bisect.bisect(entry.positions, position)
        if clip.embedding is not None:
            k = entry.usable if at == len(entry.turns) else sum(t.usable for t in entry.turns[:at])
            entry.pool.add(k, clip.embedding, clip.speech_seconds)
            entry.usable += 1
        entry.turns.insert(at, turn)
        entry.positions.insert(at, position)
        entry.has_embedding.insert(at, clip.usable)
        config = self.opts.entry.drift
        if dense is not None and clip.usable and config is not None:
            self._drift[turn_id] = find_drift(dense.window_embeddings, dense.window_times, config)

    # ------------------------------------------------------------------ band matching

    def band_matches(self) -> dict[str, BandMatch]:
        """The speakers whose clips span more than the judgment's band_match_octaves of bandwidth. A speaker
        whose reference is a registered voice (kept as an embedding: no audio to narrow) is never one."""
        if self._narrow_listener is None:
            return {}
        if self._band_cache is not None and self._band_cache[0] == len(self._turns):
            return self._band_cache[1]
        out = {}
        for s, entry in self._speakers.items():
            if s in self.references and s not in self._reference_clips:
                continue
            widths = [t.bandwidth_hz for t in entry.turns if t.usable and t.bandwidth_hz]
            reference = self._reference_clips.get(s)
            if reference is not None and reference[1]:
                widths.append(reference[1])
            if len(widths) >= 2:
                match = BandMatch(min(widths), max(widths))
                if match.octaves > self.opts.judgment.band_match_octaves:
                    out[s] = match
        self._band_cache = (len(self._turns), out)  # turns are only ever added
        return out

    async def _match_bands(self, deadline: float | None) -> None:
        """Have the narrowband embeddings the verdicts need: every kept clip's once some speaker is mixed
        (each speaker's own, and the others' for its cohort); in a stream past its bound, start embedding
        every new clip's copy in the background."""
        if self._narrow_listener is None or not self._kept:
            return
        if not self.band_matches():
            if self._eager:
                waiting = [k for k in self._kept if k not in self._narrowing]
                if waiting:
                    task = asyncio.ensure_future(self._narrow(waiting, deadline))
                    task.add_done_callback(lambda t: None if t.cancelled() else t.exception())
                    self._narrowing.update(dict.fromkeys(waiting, task))
            return
        # Mixed: wait for the background copies (one that failed is made again below), then the rest.
        pending = set(self._narrowing.values())
        if pending:
            await asyncio.wait(pending)
        await self._narrow(list(self._kept), deadline)

    async def _narrow(self, keys: list[str], deadline: float | None) -> None:
        """Embed the narrowband copies of these kept clips, add them to their speakers' narrowband pools and
        let go of their audio."""
        keys = [k for k in keys if k in self._kept]
        if not keys:
            return
        assert self._narrow_listener is not None
        try:
            clips = await self._narrow_listener([(self._kept[k], self._label(k)) for k in keys], deadline)
        finally:
            for k in keys:
                self._narrowing.pop(k, None)
        added = []
        for k, clip in zip(keys, clips, strict=True):
            if k in self._narrowed:  # made meanwhile by another call: each turn joins its pool once
                continue
            self._narrowed[k] = clip
            self._kept.pop(k, None)
            added.append(k)
        for k in sorted((k for k in added if not k.startswith(_REF)), key=lambda k: self._turns[k].position):
            self._add_narrow(self._turns[k])

    def _label(self, key: str) -> str:
        return f"reference of speaker {key[len(_REF) :]!r}" if key.startswith(_REF) else f"turn {key!r}"

    def _add_narrow(self, turn: _Turn) -> None:
        """A turn's narrowband embedding into its speaker's narrowband pool (at its place in dialogue order)."""
        entry = self._speakers[turn.speaker]
        clip = self._narrowed[turn.turn_id]
        if entry.narrow is None:
            reference = self._narrowed.get(_REF + turn.speaker) if turn.speaker in self._reference_clips else None
            if turn.speaker in self._reference_clips and (reference is None or reference.embedding is None):
                why = "its narrowband copy was not made" if reference is None else reference.detail
                entry.narrow_unusable = f"the reference clip's narrowband copy is unusable ({why})"
            ref = reference.embedding if reference is not None and reference.embedding is not None else None
            entry.narrow = SpeakerPool(ref, self.opts.judgment.components)
        if clip.embedding is None:
            entry.narrow_unusable = entry.narrow_unusable or f"turn {turn.turn_id!r}'s narrowband copy: {clip.detail}"
            return
        at = bisect.bisect(entry.narrow_positions, turn.position)
        entry.narrow.add(at, clip.embedding, clip.speech_seconds)
        entry.narrow_positions.insert(at, turn.position)

    def _score(self) -> tuple[list[str], dict[str, SpeakerScores]]:
        """Speakers in order of first appearance, and their verdict arrays (a band-matched speaker's from the
        narrowband pools: :meth:`band_matches`)."""
        order = sorted(self._speakers, key=lambda s: self._speakers[s].turns[0].position)
        scores = score_speakers({s: self._speakers[s].pool for s in order}, self.opts.judgment)
        matched = [s for s in self._matched() if s in scores]
        if matched:
            narrow = {s: p for s in order if (p := self._speakers[s].narrow) is not None}
            scores.update({s: v for s, v in score_speakers(narrow, self.opts.judgment).items() if s in matched})
        return order, scores

    def _matched(self) -> dict[str, BandMatch]:
        """The band-matched speakers whose narrowband pool can stand in for their pool."""
        out = {}
        for s, match in self.band_matches().items():
            entry = self._speakers[s]
            if entry.narrow is not None and not entry.narrow_unusable and entry.narrow.n == entry.usable:
                out[s] = match
        return out

    def _statuses(self, speaker: str, scores: dict[str, SpeakerScores]) -> list[tuple[str, TurnStatus]]:
        """Each of the speaker's turns with its status, in dialogue order (INSUFFICIENT_AUDIO for unusable ones)."""
        entry = self._speakers[speaker]
        codes = np.full(len(entry.turns), NO_AUDIO)
        if speaker in scores:
            codes[np.array(entry.has_embedding, bool)] = scores[speaker].codes
        return [(t.turn_id, STATUS_OF_CODE[c]) for t, c in zip(entry.turns, codes.tolist(), strict=True)]

    def _verdicts(self, turns: list[_Turn], scores: dict[str, SpeakerScores]) -> list[TurnResult]:
        """Verdict objects of ``turns`` (made only for these: a long dialogue's other turns cost nothing)."""
        out = []
        before: dict[str, np.ndarray] = {}  # speaker -> usable turns up to each of their turns
        matches = self.band_matches()
        matched = self._matched() if matches else {}
        for t in turns:
            entry = self._speakers[t.speaker]
            if t.speaker not in before:
                before[t.speaker] = np.cumsum(np.array(entry.has_embedding, bool))
            k = int(before[t.speaker][bisect.bisect_left(entry.positions, t.position)]) - 1
            out.append(
                turn_result(
                    t.turn_id,
                    t.speaker,
                    t.audio_seconds,
                    t.speech_seconds,
                    t.detail,
                    scores[t.speaker] if t.usable else None,
                    k,
                    self.opts.judgment,
                    t.bandwidth_hz,
                    *self._band_note(t.speaker, matches, matched),
                )
            )
        if self.opts.detect_drift and self.opts.entry.drift is not None:
            out = attach_drift(out, self._drift, self.opts.entry.drift)
        return out

    def _band_note(
        self, speaker: str, matches: Mapping[str, BandMatch], matched: Mapping[str, BandMatch]
    ) -> tuple[float | None, str]:
        """(the band the speaker's turns were compared below, or None; what the turn's detail says of it)."""
        if speaker in matched:
            return NARROW_CUTOFF_HZ, matched[speaker].note(speaker)
        if speaker in matches:  # mixed, but a narrowband copy could not be judged: full band, said so
            why = self._speakers[speaker].narrow_unusable or "a narrowband copy is missing"
            return None, f"compared at full band although the clips of speaker {speaker!r} span " + (
                f"{matches[speaker].octaves:.2f} octave of bandwidth: {why}"
            )
        return None, ""

    def judge(self) -> tuple[list[TurnResult], list[SpeakerResult]]:
        """Verdicts of every turn added so far, in dialogue order, and per speaker."""
        order, scores = self._score()
        turns = sorted(self._turns.values(), key=lambda t: t.position)
        return self._verdicts(turns, scores), [speaker_verdict(s, self._statuses(s, scores)) for s in order]

    def updates(self, turn_id: str) -> list[TurnUpdate]:
        """After ``turn_id`` was added: its verdict first, then every earlier turn whose status changed
        (revision=True), in dialogue order; each with its speaker's verdict."""
        # A new turn can change its own speaker's verdicts and, through attribution and the cohort,
        # other speakers' too, so every status is looked at again; the speakers' pools keep their
        # statistics, so this is vector work on arrays, and verdict objects are made only for the turns sent.
        started = time.perf_counter()
        order, scores = self._score()
        statuses = {s: self._statuses(s, scores) for s in order}
        changed = self._ledger.revisions((pair for s in order for pair in statuses[s]), turn_id)
        revised = sorted((self._turns[t] for t in changed), key=lambda t: t.position)
        sent = self._verdicts([self._turns[turn_id], *revised], scores)
        verdicts = {s: speaker_verdict(s, statuses[s]) for s in {t.speaker for t in sent}}
        self._ledger.count([sent[0]])
        logger.debug("dialogue %r: judged %d turns in %.2f ms", self.dialogue_id, len(self), _ms(started))
        return [TurnUpdate(r, k > 0, turn_id, verdicts[r.speaker]) for k, r in enumerate(sent)]

    def verdict(self) -> DialogueResult:
        """The dialogue's verdict, now (judging embeddings needs no waiting)."""
        started = time.perf_counter()
        turns, speakers = self.judge()
        self._ledger.count(turns)
        # `sleuthd-bench latency` reads this line (--log-level debug) for the judging share of CheckDialogue.
        logger.debug("dialogue %r: judged %d turns in %.2f ms", self.dialogue_id, len(turns), _ms(started))
        return self.opts.result(self.dialogue_id, turns, speakers, self.similarity())

    def similarity(self) -> SimilarityMatrix | None:
        """The usable turns' cosine matrix when the request asked for it (sleuthd.judgment.similarity)."""
        if not self.opts.similarity_matrix:
            return None
        rows = []  # a speaker's usable turns, in dialogue order, are the rows of its pool's embeddings
        for e in self._speakers.values():
            rows += [(t.position, t.turn_id, e.pool.emb[k]) for k, t in enumerate(u for u in e.turns if u.usable)]
        return similarity_matrix(rows)


_REF = "\0reference:"  # key prefix of a speaker's reference clip among the kept and narrowed clips


def _ms(since: float) -> float:
    return 1e3 * (time.perf_counter() - since)


# ---------------------------------------------------------------------------------------------- requests


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


def audio_turns(request: DialogueRequest) -> list[TurnAudio]:
    """The request's turns that carry audio, numbered in dialogue order (turns without audio are not judged)."""
    with_audio = [t for t in request.turns if t.audio is not None]
    return [TurnAudio(t.turn_id, t.speaker, n, t.audio) for n, t in enumerate(with_audio) if t.audio is not None]


def require_references(opts: ResolvedOptions, speakers: Sequence[str], with_reference: Collection[str]) -> None:
    """Method reference cannot judge a speaker without a reference clip: say which are missing."""
    if opts.method is Method.REFERENCE:
        missing = [s for s in dict.fromkeys(speakers) if s not in with_reference]
        if missing:
            raise InvalidRequest(
                f"method reference needs a reference clip for every speaker; missing for: {', '.join(missing)}"
            )
