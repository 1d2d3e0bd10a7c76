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

import bisect
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

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
from sleuthd.encoders.clips import NARROWBAND, UNMEASURED, Channel, ClipEmbedding
from sleuthd.errors import InvalidRequest, LimitExceeded, UnknownName
from sleuthd.judgment.channel_matching import ChannelMatcher, Copies, Keeper, ReferenceClip, RegisteredReference
from sleuthd.judgment.drift import attach_drift, find_drift
from sleuthd.judgment.length_matching import KeptSamples, LengthCandidate, LengthMatcher
from sleuthd.judgment.options import ResolvedOptions
from sleuthd.judgment.pitch_matching import PitchCandidate, Pitches, PitchMatcher
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
        """Decoded audio the dialogue keeps between turns, bytes (the LALM judge hears earlier turns again): a
        stream counts it in the process's audio budget. (The encoders' channel matching holds the turns it keeps in
        a keeper of its own: sleuthd.judgment.channel_matching.)"""

    async def add_turns(self, turns: Sequence[TurnAudio], deadline: float | None) -> None:
        """Hear completed turns (together, as one request's audio) and add them, without judging yet."""

    async def finish_turn(self, turn: TurnAudio, deadline: float | None) -> list[TurnUpdate]:
        """Hear and add one completed turn and judge the dialogue so far: the turn's verdict first, then
        every earlier turn whose status changed (revision=True), in dialogue order."""

    async def result(self, deadline: float | None) -> DialogueResult:
        """The whole dialogue's verdict (every turn added so far)."""

    def close(self) -> None:
        """The dialogue is over (the stream ended, however): let go of what it holds between turns."""


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


@dataclass(frozen=True)
class _Turn:
    turn_id: str
    speaker: str
    position: int
    audio_seconds: float
    speech_seconds: float
    detail: str  # why the clip is unusable; "" when usable
    usable: bool
    channel: Channel = UNMEASURED  # ClipEmbedding.channel


@dataclass
class _Speaker:
    pool: SpeakerPool
    turns: list[_Turn] = field(default_factory=list)  # every audio turn of the speaker, in dialogue order
    positions: list[int] = field(default_factory=list)  # their positions
    usable: int = 0  # how many of them have an embedding
    has_embedding: list[bool] = field(default_factory=list)  # per turn


class EncoderDialogue:
    """A dialogue judged by the speaker encoders (every method but lalm): the turns so far and what judging
    them needs, per speaker (sleuthd.judgment.verdicts).

    A turn keeps only its embedding and seconds (about 1 KB), plus its share of its speaker's cosine
    matrix and sorted pairs (24 bytes per pair of the speaker's turns): no window embeddings. Under the fused
    encoder's auto, a speaker whose clips differ in channel (bandwidth, clipping) is judged on like copies of them
    (sleuthd.judgment.channel_matching), which keeps turns' audio to make them."""

    def __init__(
        self,
        dialogue_id: str,
        opts: ResolvedOptions,
        references: dict[str, np.ndarray],
        observer: EngineObserver,
        embed: Embed | None = None,
        copies: Copies | None = None,
        reference_clips: Mapping[str, ReferenceClip] | None = None,
        registered: Mapping[str, RegisteredReference] | None = None,
        keeper: Keeper | None = None,
        max_kept_audio_bytes: int = 0,
        pitches: Pitches | None = None,
        kept: KeptSamples | None = None,
    ) -> None:
        """``embed``: the listener (None: turns are added as embeddings, :meth:`add_clip`). ``copies``: the
        listener of clips' copies (None: no channel matching); ``reference_clips``: speaker -> the reference
        sent as audio, with its channel; ``registered``: speaker -> the registered voice that is its reference
        (its bandwidths and narrowband embedding); ``keeper`` and ``max_kept_audio_bytes``: a stream's, where it
        holds the turns' audio kept for channel matching and how much it may (None: CheckDialogue); ``pitches``: the
        listener of clips' pitches (None: no pitch matching, which also needs channel matching's kept audio);
        ``kept``: the listener of clips' trimmed lengths (None: no length matching, which needs that audio too)."""
        self.dialogue_id = dialogue_id
        self.opts = opts
        self.references = references
        self._embed = embed
        self._ledger = VerdictLedger(observer)
        self._turns: dict[str, _Turn] = {}
        self._speakers: dict[str, _Speaker] = {}
        self._drift: dict[str, DriftResult | None] = {}  # searched turns only
        self._channels: ChannelMatcher | None = None
        if copies is not None and opts.judgment.channel_matching:  # the one place that decides it
            self._channels = ChannelMatcher(
                copies,
                opts.judgment.band_match_octaves,
                opts.judgment.clip_match_spread,
                opts.judgment.noise_match_db,
                opts.judgment.noise_compose_db,
                opts.judgment.telephone_band_db,
                opts.judgment.components,
                reference_clips or {},
                registered or {},
                keeper,
                max_kept_audio_bytes,
            )
        self._pitch: PitchMatcher | None = None
        # The verdicts before pitch matching at a number of turns (made once per turn added; see _score).
        self._first: tuple[int, list[str], dict[str, SpeakerScores]] | None = None
        if self._channels is not None and pitches is not None and opts.judgment.pitch_match_octaves > 0:
            assert copies is not None
            self._pitch = PitchMatcher(copies, pitches, opts.judgment.pitch_match_octaves, opts.judgment)
        self._length: LengthMatcher | None = None
        if self._channels is not None and kept is not None and opts.judgment.length_match_ratio > 0:
            assert copies is not None
            self._length = LengthMatcher(copies, kept, opts.judgment.length_match_ratio, opts.judgment)

    @property
    def kept_audio_bytes(self) -> int:
        return 0  # channel matching holds what it keeps in its keeper (passive memory, not the decoding budget)

    def close(self) -> None:
        if self._channels is not None:
            self._channels.close()

    def __len__(self) -> int:
        return len(self._turns)

    # ------------------------------------------------------------------ the Dialogue protocol

    async def add_turns(self, turns: Sequence[TurnAudio], deadline: float | None) -> None:
        assert self._embed is not None, "a dialogue that hears audio is opened with a listener"
        embedded = await self._embed([(t.audio, t.label) for t in turns], deadline)
        for turn, clips in zip(turns, embedded, strict=True):
            self.add_clip(turn.turn_id, turn.speaker, turn.position, clips[0], clips[1] if len(clips) > 1 else None)
            if self._channels is not None and clips[0].usable:
                self._channels.heard(turn.turn_id, turn.speaker, turn.position, turn.audio, clips[0])
        if self._channels is not None:
            await self._channels.ensure(deadline)
        if self._pitch is not None:
            await self._pitch.ensure(len(self._turns), self._pitch_candidates(), deadline)
        if self._length is not None:
            await self._length.ensure(len(self._turns), self._length_candidates(), deadline)

    def _pitch_candidates(self) -> list[PitchCandidate]:
        """The speakers as judged before pitch matching, with their pools and audio, for those it may judge again:
        judged as heard or on narrowband copies (the kinds it was screened on)."""
        assert self._channels is not None
        order, scores = self._score(pitch=False)
        self._first = (len(self._turns), order, dict(scores))
        matched = self._channels.matched()
        heard = {s: self._speakers[s].pool for s in order}
        out = []
        for s in order:
            copy = matched.get(s)
            if s not in scores or copy not in (None, NARROWBAND):
                continue
            ids = [t.turn_id for t in self._speakers[s].turns if t.usable]
            pools = heard if copy is None else self._channels.pools(copy, order)
            audio = [self._channels.audio(i) for i in ids]
            out.append(
                PitchCandidate(s, scores[s], pools, ids, audio, self._channels.reference_audio(s), copy is not None)
            )
        return out

    def _length_candidates(self) -> list[LengthCandidate]:
        """The speakers as judged after pitch matching, with their pools and audio, for those length matching may judge
        again: judged on their clips as sent (the kind it was screened on)."""
        assert self._channels is not None
        order, scores = self._score(length=False)
        if self._pitch is None:
            # Nothing re-judged these turns before: keep the scores, as pitch matching's candidates do, so that the
            # verdicts of the same turns (after their copies were made) are not scored a second time.
            self._first = (len(self._turns), order, dict(scores))
        matched = self._channels.matched()
        heard = {s: self._speakers[s].pool for s in order}
        out = []
        for s in order:
            if s not in scores or s in matched:
                continue
            ids = [t.turn_id for t in self._speakers[s].turns if t.usable]
            out.append(
                LengthCandidate(
                    s,
                    scores[s],
                    heard,
                    ids,
                    [self._channels.audio(i) for i in ids],
                    self._channels.reference_audio(s),
                    self._channels.reference_seconds(s),
                )
            )
        return out

    async def finish_turn(self, turn: TurnAudio, deadline: float | None) -> list[TurnUpdate]:
        await self.add_turns([turn], deadline)
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
            clip.channel if self.opts.judgment.components else UNMEASURED,
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

    def _score(self, pitch: bool = True, length: bool = True) -> tuple[list[str], dict[str, SpeakerScores]]:
        """Speakers in order of first appearance, and their verdict arrays (a channel-matched speaker's from the
        pools of its copies, against the other speakers' copies of the same kind: ChannelMatcher.matched; then, with
        ``pitch``, a pitch-matched speaker's as pitch matching left them: PitchMatcher; then, with ``length`` too, a
        length-matched speaker's as length matching left them: LengthMatcher)."""
        stamp = len(self._turns)
        if self._first is not None and self._first[0] == stamp:
            # Pitch (or else length) matching scored these turns already, after their copies were made: not again.
            order, scores = self._first[1], dict(self._first[2])
        else:
            order = sorted(self._speakers, key=lambda s: self._speakers[s].turns[0].position)
            scores = score_speakers({s: self._speakers[s].pool for s in order}, self.opts.judgment)
            if self._channels is not None:
                matched = {s: c for s, c in self._channels.matched().items() if s in scores}
                for copy in dict.fromkeys(matched.values()):
                    judged = score_speakers(self._channels.pools(copy, order), self.opts.judgment)
                    scores.update({s: v for s, v in judged.items() if matched.get(s) == copy})
        if pitch and self._pitch is not None:
            scores.update({s: r.scores for s, r in self._pitch.rematched(stamp).items()})
        if pitch and length and self._length is not None:
            scores.update({s: r.scores for s, r in self._length.rematched(stamp).items()})
        return order, scores

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
        matched = self._channels.matched() if self._channels is not None else {}
        rematched = self._pitch.rematched(len(self._turns)) if self._pitch is not None else {}
        lengthened = self._length.rematched(len(self._turns)) if self._length is not None else {}
        for t in turns:
            entry = self._speakers[t.speaker]
            if t.speaker not in before:
                before[t.speaker] = np.cumsum(np.array(entry.has_embedding, bool))
            k = int(before[t.speaker][bisect.bisect_left(entry.positions, t.position)]) - 1
            copy, note = self._channels.note(t.speaker, matched) if self._channels is not None else (None, "")
            pitched = rematched[t.speaker].notes.get(k, "") if t.usable and t.speaker in rematched else ""
            cut = lengthened[t.speaker].notes.get(k, "") if t.usable and t.speaker in lengthened else ""
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
                    t.channel,
                    copy,
                    "; ".join(n for n in (note, pitched, cut) if n),
                )
            )
        if self.opts.detect_drift and self.opts.entry.drift is not None:
            out = attach_drift(out, self._drift, self.opts.entry.drift)
        return out

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
