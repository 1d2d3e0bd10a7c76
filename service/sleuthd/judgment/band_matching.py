"""Band matching: a speaker heard through different channels is judged on copies of their clips at a common band.

Why: a low-bitrate Opus or MP3 turn, or a telephone one, keeps only the band below 4-6 kHz, and both speaker
encoders place it away from the same voice's full-band turns, so the judgment reads the channel as another
voice (in the robustness matrix, the turn flagged in a consistent speaker under Opus was that speaker's
bandwidth outlier in 55 of 55 cases). A speaker whose usable turns and reference clip span more than
``band_match_octaves`` of bandwidth is therefore judged on every clip's copy low-passed at 3.6 kHz
(sleuthd.encoders.clips.narrowband_copy), against the other speakers' copies (their centroids are its cohort);
the other speakers stay full band (docs/research/robustness.md, "Phase 3"). A speaker whose reference is a
registered voice counts the bandwidths its clips were registered with, and is compared with the voice's stored
embedding of their narrowband copies (sleuthd.registry.voices).

A :class:`BandMatcher` is the narrowband side of one dialogue (sleuthd.judgment.dialogue.EncoderDialogue holds
one under the fused encoder's auto). So that a speaker who becomes mixed at turn k can have turns 0..k-1
narrowed, it keeps each usable turn's audio (the request's own bytes) until that turn's narrowband embedding
exists. A stream holds what it keeps in a process-wide :class:`Keeper` (memory, not decoding work); one that
would keep more than ``max_kept_bytes``, or finds the keeper full, embeds every later turn's copy as it arrives
instead, in the background (the turn's verdict waits for it only when a speaker is mixed): more work, no more
memory. The narrowband pools are built turn by turn like the full-band ones, so the verdicts are
CheckDialogue's either way.
"""

from __future__ import annotations

import asyncio
import bisect
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from sleuthd.audio.bandwidth import NARROW_CUTOFF_HZ
from sleuthd.domain import AudioInput
from sleuthd.encoders.clips import ClipEmbedding
from sleuthd.errors import InvalidRequest
from sleuthd.judgment.pool import SpeakerPool

# Hears clips' copies at the common band (sleuthd.encoders.embedder.ClipEmbedder.narrowband): one embedding each.
Narrow = Callable[[Sequence[tuple[AudioInput, str]], float | None], Awaitable[list[ClipEmbedding]]]

_REF = "\0reference:"  # key prefix of a speaker's reference clip among the kept and narrowed clips


@dataclass(frozen=True)
class RegisteredReference:
    """A speaker's reference that is a registered voice: the bandwidths its clips were registered with (empty:
    not recorded, so the speaker's turns alone decide) and how to read its narrowband embedding (a store read;
    made from the stored clips when missing). The embedding is read only if the speaker's clips turn out mixed."""

    voice_id: str
    widths: tuple[float, ...]
    narrowband: Callable[[float | None], Awaitable[np.ndarray]]  # deadline -> the embedding


class Keeper(Protocol):
    """Where streams hold the audio they keep for band matching (sleuthd.engine.memory.KeptAudio)."""

    def hold(self, n: int) -> bool:
        """Hold ``n`` more bytes; False (nothing held) when there is no room."""

    def release(self, n: int) -> None: ...


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


@dataclass
class _Speaker:
    widths: list[float] = field(default_factory=list)  # the usable turns' measured bandwidths, Hz
    usable: int = 0  # usable turns heard
    pool: SpeakerPool | None = None  # the narrowband copies' pool (reference first), built when needed
    positions: list[int] = field(default_factory=list)  # dialogue positions of the turns in ``pool``
    unusable: str = ""  # why ``pool`` cannot stand in for the speaker's pool ("": it can)


class BandMatcher:
    """The narrowband side of one dialogue: the usable turns' bandwidths, the audio kept until it is narrowed,
    the narrowband embeddings and each speaker's pool of them."""

    def __init__(
        self,
        narrow: Narrow,
        octaves: float,
        components: Sequence[tuple[str, int, int]],
        reference_clips: Mapping[str, tuple[AudioInput, float | None]],
        registered: Mapping[str, RegisteredReference] | None = None,
        keeper: Keeper | None = None,
        max_kept_bytes: int = 0,
    ) -> None:
        """``narrow``: the listener of narrowband copies; ``octaves``: the spread above which a speaker is
        matched; ``components``: the fused encoder's parts (each pool keeps one per part); ``reference_clips``:
        speaker -> the reference clip's audio and bandwidth, for the references sent as audio; ``registered``:
        speaker -> the registered voice that is its reference;
        ``keeper`` and ``max_kept_bytes``: a stream's, where it holds the audio it keeps and how much it may (None:
        CheckDialogue, whose audio is its request's, already in memory and bounded by its size)."""
        self._listen = narrow
        self._octaves = octaves
        self._components = components
        self._references = dict(reference_clips)
        self._registered = dict(registered or {})
        # A registered voice's narrowband embedding once read, or why it cannot be (speaker -> either).
        self._registered_narrow: dict[str, np.ndarray | str] = {}
        self._keeper = keeper
        self._max_kept = max_kept_bytes
        self._speakers: dict[str, _Speaker] = {}
        self._turns: dict[str, tuple[str, int]] = {}  # turn id -> speaker, position
        self._kept: dict[str, AudioInput] = {}  # turn id or reference key -> its audio, until it is narrowed
        self._held: dict[str, int] = {}  # the kept clips' bytes held in the keeper
        self._held_bytes = 0
        self._narrowed: dict[str, ClipEmbedding] = {}  # turn id or reference key -> its narrowband embedding
        self._narrowing: dict[str, asyncio.Task[None]] = {}  # background narrowband embeddings (streams)
        self._eager = False  # a stream past its bound: every turn is narrowed as it arrives
        self._cache: tuple[int, dict[str, BandMatch]] | None = None  # matches() at a number of turns heard
        for s, (audio, _) in self._references.items():
            self._keep(_REF + s, audio)

    def heard(self, turn_id: str, speaker: str, position: int, audio: AudioInput, bandwidth_hz: float | None) -> None:
        """A usable turn was added to the dialogue: keep its audio until it is narrowed."""
        entry = self._speakers.setdefault(speaker, _Speaker())
        entry.usable += 1
        if bandwidth_hz:
            entry.widths.append(bandwidth_hz)
        self._turns[turn_id] = (speaker, position)
        self._keep(turn_id, audio)

    def _keep(self, key: str, audio: AudioInput) -> None:
        """Keep a clip's audio until it is narrowed; a stream holds it in its keeper, and one past its bound (or
        finding the keeper full) narrows every clip as it arrives from then on."""
        self._kept[key] = audio
        if self._keeper is None or self._eager:
            return
        n = len(audio.data)
        if self._held_bytes + n > self._max_kept or not self._keeper.hold(n):
            self._eager = True
            return
        self._held[key] = n
        self._held_bytes += n

    def _let_go(self, key: str) -> None:
        self._kept.pop(key, None)
        n = self._held.pop(key, 0)
        if n and self._keeper is not None:
            self._held_bytes -= n
            self._keeper.release(n)

    def close(self) -> None:
        """The dialogue is over: let go of everything held, and stop embedding copies nobody will read."""
        for task in set(self._narrowing.values()):
            task.cancel()
        for key in list(self._kept):
            self._let_go(key)

    def matches(self) -> dict[str, BandMatch]:
        """The speakers whose clips span more than ``octaves`` of bandwidth."""
        if self._cache is not None and self._cache[0] == len(self._turns):
            return self._cache[1]
        out = {}
        for s, entry in self._speakers.items():
            widths = list(entry.widths)
            reference = self._references.get(s)
            if reference is not None and reference[1]:
                widths.append(reference[1])
            if s in self._registered:
                widths.extend(self._registered[s].widths)
            if len(widths) >= 2:
                match = BandMatch(min(widths), max(widths))
                if match.octaves > self._octaves:
                    out[s] = match
        self._cache = (len(self._turns), out)  # turns are only ever added
        return out

    def matched(self) -> dict[str, BandMatch]:
        """The matched speakers whose narrowband pool can stand in for their pool (every usable turn in it)."""
        out = {}
        for s, match in self.matches().items():
            entry = self._speakers[s]
            if entry.pool is not None and not entry.unusable and entry.pool.n == entry.usable:
                out[s] = match
        return out

    def pools(self, order: Sequence[str]) -> dict[str, SpeakerPool]:
        """The narrowband pools of these speakers that exist, in that order (a matched speaker's cohort)."""
        return {s: p for s in order if s in self._speakers and (p := self._speakers[s].pool) is not None}

    def note(self, speaker: str, matched: Mapping[str, BandMatch]) -> tuple[float | None, str]:
        """(the band the speaker's turns were compared below, or None; what a turn's detail says of it)."""
        if speaker in matched:
            return NARROW_CUTOFF_HZ, matched[speaker].note(speaker)
        match = self.matches().get(speaker)
        if match is None:
            return None, ""
        # Mixed, but a narrowband copy could not be judged: full band, and said so.
        why = self._speakers[speaker].unusable or "a narrowband copy is missing"
        return None, (
            f"compared at full band although the clips of speaker {speaker!r} span {match.octaves:.2f} octave "
            f"of bandwidth: {why}"
        )

    async def ensure(self, deadline: float | None) -> None:
        """Have the narrowband embeddings the verdicts need: every kept clip's once some speaker is mixed (each
        speaker's own, and the others' for its cohort); in a stream past its bound, start embedding every new
        clip's copy in the background."""
        if not self._kept:
            return
        if not self.matches():
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
        try:
            clips = await self._listen([(self._kept[k], _label(k)) for k in keys], deadline)
        finally:
            for k in keys:
                self._narrowing.pop(k, None)
        added = []
        for k, clip in zip(keys, clips, strict=True):
            if k in self._narrowed:  # made meanwhile by another call: each turn joins its pool once
                continue
            self._narrowed[k] = clip
            self._let_go(k)
            added.append(k)
        turns = sorted((k for k in added if not k.startswith(_REF)), key=lambda k: self._turns[k][1])
        # A registered speaker's pool starts from the voice's narrowband embedding: read it before the first turn.
        for s in dict.fromkeys(self._turns[k][0] for k in turns):
            if s in self._registered and s not in self._registered_narrow:
                self._registered_narrow[s] = await self._read_registered(s, deadline)
        for k in turns:
            self._add(k)

    async def _read_registered(self, speaker: str, deadline: float | None) -> np.ndarray | str:
        """The registered voice's narrowband embedding, or why it cannot be had (the speaker is then judged at
        full band, and its turns say why)."""
        voice = self._registered[speaker]
        try:
            return await voice.narrowband(deadline)
        except InvalidRequest as exc:  # no such embedding and no clips kept to make it; deleted meanwhile
            return f"registered voice {voice.voice_id!r} has no narrowband embedding ({exc})"

    def _add(self, turn_id: str) -> None:
        """A turn's narrowband embedding into its speaker's narrowband pool (at its place in dialogue order)."""
        speaker, position = self._turns[turn_id]
        entry = self._speakers[speaker]
        clip = self._narrowed[turn_id]
        if entry.pool is None:
            entry.pool = SpeakerPool(self._reference(speaker, entry), self._components)
        if clip.embedding is None:
            entry.unusable = entry.unusable or f"turn {turn_id!r}'s narrowband copy: {clip.detail}"
            return
        at = bisect.bisect(entry.positions, position)
        entry.pool.add(at, clip.embedding, clip.speech_seconds)
        entry.positions.insert(at, position)

    def _reference(self, speaker: str, entry: _Speaker) -> np.ndarray | None:
        """The reference embedding of the speaker's narrowband pool (None: it has no reference); where the
        reference exists but its narrowband embedding does not, the entry is marked unusable."""
        if speaker in self._registered:
            found = self._registered_narrow.get(speaker, "its narrowband embedding was not read")
            if isinstance(found, str):
                entry.unusable = found
                return None
            return found
        if speaker not in self._references:
            return None
        reference = self._narrowed.get(_REF + speaker)
        if reference is None or reference.embedding is None:
            why = "its narrowband copy was not made" if reference is None else reference.detail
            entry.unusable = f"the reference clip's narrowband copy is unusable ({why})"
            return None
        return reference.embedding


def _label(key: str) -> str:
    return f"reference of speaker {key[len(_REF) :]!r}" if key.startswith(_REF) else f"turn {key!r}"
