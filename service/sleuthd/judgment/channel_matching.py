"""Channel matching: a speaker heard through different channels is judged on like copies of their clips.

Why: both speaker encoders read a change of channel as a change of voice.
- **Bandwidth.** A low-bitrate Opus or MP3 turn, or a telephone one, keeps only the band below 4-6 kHz (in the
  robustness matrix the turn flagged in a consistent speaker under Opus was that speaker's bandwidth outlier in
  55 of 55 cases). A speaker whose usable turns and reference clip span more than ``band_match_octaves`` of
  bandwidth is judged on copies of every clip low-passed at 3.6 kHz (Opus 71.8 -> 90.9 balanced accuracy).
- **Clipping.** A clipped turn (rendered too loud) was the speaker's most-clipped turn in 26 of 28 false alarms
  under clipping. A speaker whose pieces differ in plateau fraction (sleuthd.audio.clipping: the share of samples
  at the peak) by more than ``clip_match_spread`` is judged on copies of every clip clipped as hard as its
  most-clipped piece (d-clip 80.9 -> 91.4).
- **Noise.** A speaker matched neither way whose pieces differ in estimated SNR (sleuthd.audio.noise) by more
  than ``noise_match_db`` is judged on copies of every clip with its noisiest piece's own noise added until each
  is as noisy (d-noise 77.7 -> 95.9). A speaker matched by band or clipping gets the noise too when its pieces
  differ by more than ``noise_compose_db`` (a channel that drifts from turn to turn: a noisy turn among
  narrowband copies is still the one noisy piece; the higher trigger keeps clipping's own effect on the SNR
  estimate from adding noise to a clipped speaker's copies: docs/research/robustness.md, "Screen 8").
A speaker mixed several ways is judged on copies clipped, made noisier, then low-passed
(sleuthd.encoders.clips.channel_copy): its copies follow what differs in its clips, not more (copies that were always
both cost real speech 9 points: docs/research/robustness.md, "Screen 4"). Its cohort is the other speakers' copies
made the same way; the other speakers are judged as they are. A speaker whose reference is a registered voice counts
the channels its clips were registered with (sleuthd.registry.voices) as the pieces of a reference sent as audio
count: its narrowband copy is the voice's stored narrowband embedding; its clipped or noisy copies are made per
request from the voice's kept clips, and its noisiest kept clip gives the noise when the voice is the speaker's
noisiest piece. A voice registered without its audio cannot have those: its speaker is then judged as heard (or on its
narrowband copies), and its turns say why.

A :class:`ChannelMatcher` is the copying side of one dialogue (sleuthd.judgment.dialogue.EncoderDialogue holds one
under the fused encoder's auto). A speaker's clipping target is its most-clipped piece, so it moves when a more
clipped turn arrives, and every copy is then made again at the new target: the matcher keeps each usable turn's
audio (the request's own bytes) for the dialogue's life. A stream holds what it keeps in a process-wide
:class:`Keeper` (memory, not decoding work); one that would keep more than ``max_kept_bytes``, or finds the keeper
full, keeps no more audio: it makes every later turn's narrowband copy as it arrives, in the background (the turn's
verdict waits for it only when a speaker is band-mixed), and a speaker whose clipped copies would need audio it
no longer has is judged on its narrowband copies or as heard, and its turns say why. The pools of copies are
built turn by turn like the heard ones, so the verdicts are CheckDialogue's either way.
"""

from __future__ import annotations

import asyncio
import bisect
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from sleuthd.audio.bandwidth import NARROW_CUTOFF_HZ, TELEPHONE_LOW_HZ
from sleuthd.audio.clipping import copy_target
from sleuthd.audio.noise import copy_snr
from sleuthd.domain import AudioInput
from sleuthd.encoders.clips import NARROWBAND, Channel, ChannelCopy, ClipEmbedding
from sleuthd.errors import InvalidRequest
from sleuthd.judgment.pool import SpeakerPool

# Hears clips' copies (sleuthd.encoders.embedder.ClipEmbedder.copies): one embedding each.
Copies = Callable[[ChannelCopy, Sequence[tuple[AudioInput, str]], float | None], Awaitable[list[ClipEmbedding]]]

_REF = "\0reference:"  # key prefix of a speaker's reference clip among the kept and copied clips


@dataclass(frozen=True)
class RegisteredReference:
    """A speaker's reference that is a registered voice: each of its clips' channel as registered (a field is None
    where it was not recorded, and the speaker's other pieces alone decide that kind), and how to read what its
    matching needs, each read only if the speaker's clips turn out mixed that way. Each read raises InvalidRequest
    saying why it cannot be had (the voice's audio was not kept; deleted meanwhile)."""

    voice_id: str
    channels: tuple[Channel, ...]
    # deadline -> its embedding of its clips' narrowband copies (stored; made from the kept clips when missing)
    narrowband: Callable[[float | None], Awaitable[np.ndarray]]
    # (copy, deadline) -> its embedding of its kept clips' copies made so (clipped or noisy: made per request)
    copy: Callable[[ChannelCopy, float | None], Awaitable[np.ndarray]]
    # -> the audio of its noisiest kept clip (the noise the speaker's copies get when the voice is its noisiest)
    noisiest: Callable[[], Awaitable[AudioInput]]


@dataclass(frozen=True)
class ReferenceClip:
    """A speaker's reference sent as audio, with its channel as the fused decode measured it and its speech seconds
    (what length matching compares a turn's speech with)."""

    audio: AudioInput
    channel: Channel
    speech_seconds: float = 0.0


class Keeper(Protocol):
    """Where streams hold the audio they keep for channel matching (sleuthd.engine.memory.KeptAudio)."""

    def hold(self, n: int) -> bool:
        """Hold ``n`` more bytes; False (nothing held) when there is no room."""

    def release(self, n: int) -> None: ...


@dataclass(frozen=True)
class ChannelMatch:
    """Why a speaker is judged on copies: the bandwidths their clips span (Hz, lowest and highest; None: not
    band-matched) and the plateau fractions (least and most clipped; None: not clip-matched)."""

    band: tuple[float, float] | None
    plateau: tuple[float, float] | None
    # Noise matching: the least and most noisy SNR (dB, noisiest first), the noisiest piece's audio (None: no
    # longer kept, so its copies cannot be made) and which piece that is (a turn id, or the reference's key).
    snr: tuple[float, float] | None = None
    noise: AudioInput | None = None
    noisiest: str | None = None
    # Band-matched with a telephone clip among clips that kept their low band: the lowest and highest low band level
    # (dB; None: not so), and its copies lose the band below the telephone's low edge too.
    low_band: tuple[float, float] | None = None

    @property
    def copy(self) -> ChannelCopy:
        """The copies this speaker is judged on: clipped to its most-clipped piece, with its noisiest piece's noise
        added and low-passed (band-passed to the telephone band), as far as each differs."""
        target = None if self.plateau is None else copy_target(self.plateau[1])
        snr = None if self.snr is None else copy_snr(self.snr[0])
        noise = self.noise if snr is not None else None
        # low_band is only ever set on a band-matched speaker (matches()).
        return ChannelCopy(self.band is not None, target, snr, noise, telephone=self.low_band is not None)

    @property
    def fallbacks(self) -> list[ChannelCopy]:
        """The copies it is judged on, then those it falls back to when they cannot be had (a copy too short to
        embed; in a stream past its bound, audio no longer kept), in order: without the noise, narrowband only."""
        out = [self.copy]
        if self.snr is not None and (self.band is not None or self.plateau is not None):
            out.append(replace(self.copy, snr_db=None, noise=None))
        if self.band is not None:
            out.append(replace(NARROWBAND, telephone=self.copy.telephone))
            out.append(NARROWBAND)
        return list(dict.fromkeys(out))

    def _differs(self, copy: ChannelCopy) -> list[str]:
        out = []
        if copy.narrow and self.band is not None:
            low, high = self.band
            out.append(f"span {math.log2(high / low):.2f} octave of bandwidth ({low / 1000:.1f}-{high / 1000:.1f} kHz)")
        if copy.telephone and self.low_band is not None:
            out.append(f"include a telephone clip (its band below 250 Hz {-self.low_band[0]:.0f} dB down)")
        if copy.plateau is not None and self.plateau is not None:
            low, high = self.plateau
            out.append(f"differ in clipping ({100 * low:.2f}-{100 * high:.2f} % of samples at the peak)")
        if copy.snr_db is not None and self.snr is not None:
            out.append(f"differ in noise ({self.snr[0]:.1f}-{self.snr[1]:.1f} dB SNR)")
        return out

    def note(self, speaker: str, used: ChannelCopy) -> str:
        """What a turn's detail says: what the speaker was compared on and why (``used``: the copies it was
        judged on, which are ``copy`` unless those could not be made)."""
        how = []
        if used.narrow:
            low = f"{TELEPHONE_LOW_HZ / 1000:.1f}-" if used.telephone else "below "
            how.append(f"{'at ' if used.telephone else ''}{low}{NARROW_CUTOFF_HZ / 1000:.1f} kHz")
        if used.plateau is not None:
            how.append(f"on copies clipped to {100 * used.plateau:.2f} % at the peak")
        if used.snr_db is not None:
            how.append(f"on copies with its noisiest clip's noise added to {used.snr_db:.1f} dB SNR")
        return f"compared {' and '.join(how)}: the clips of speaker {speaker!r} {' and '.join(self._differs(used))}"

    def missed(self, speaker: str, used: ChannelCopy | None, why: str) -> str:
        """What a turn's detail says when the speaker's copies could not be had (``used``: the copies it was
        judged on instead, its narrowband ones; None: as heard)."""
        if used is None:
            as_heard = "at full band" if self.copy == NARROWBAND else "as heard"
            differs = " and ".join(self._differs(self.copy))
            return f"compared {as_heard} although the clips of speaker {speaker!r} {differs}: {why}"
        wanted = self.copy
        left = ChannelCopy(
            plateau=wanted.plateau if used.plateau is None else None,
            snr_db=wanted.snr_db if used.snr_db is None else None,
            telephone=wanted.telephone and not used.telephone,
        )
        kinds = (
            ("clipped", left.plateau),
            ("noise-matched", left.snr_db),
            ("cut to the telephone band", left.telephone),
        )
        how = " or ".join(w for w, on in kinds if on not in (None, False))
        return f"{self.note(speaker, used)}; not {how} although they {' and '.join(self._differs(left))}: {why}"


@dataclass
class _Speaker:
    widths: list[float] = field(default_factory=list)  # the usable turns' measured bandwidths, Hz
    plateaus: list[float] = field(default_factory=list)  # the usable turns' plateau fractions
    snrs: list[tuple[int, float, str]] = field(default_factory=list)  # the usable turns' (position, SNR dB, id)
    lows: list[float] = field(default_factory=list)  # the usable turns' low band levels, dB
    usable: int = 0  # usable turns heard


@dataclass
class _Pool:
    """A speaker's pool of one kind of copy (reference first), and why it cannot stand in for their pool."""

    pool: SpeakerPool
    positions: list[int] = field(default_factory=list)  # dialogue positions of the turns in ``pool``
    unusable: str = ""  # "": it can


class ChannelMatcher:
    """The copying side of one dialogue: the usable turns' channels, the audio kept, the copies' embeddings and
    each speaker's pool of each kind of copy in use."""

    def __init__(
        self,
        copies: Copies,
        octaves: float,
        spread: float,
        noise_db: float,
        compose_db: float,
        telephone_db: float,
        components: Sequence[tuple[str, int, int]],
        reference_clips: Mapping[str, ReferenceClip],
        registered: Mapping[str, RegisteredReference] | None = None,
        keeper: Keeper | None = None,
        max_kept_bytes: int = 0,
    ) -> None:
        """``copies``: the listener of copies; ``octaves``, ``spread`` and ``noise_db``: the bandwidth (octaves),
        plateau fraction and SNR (dB) spreads above which a speaker is matched (0: that kind never); ``compose_db``:
        the SNR spread above which a speaker matched by band or clipping is noise-matched too (0: never);
        ``telephone_db``: the low band level (dB, negative) below which a clip counts as a telephone one: a band-matched
        speaker with one among clips above it is compared at the telephone band (0: never);
        ``components``: the fused encoder's parts (each pool keeps one per part); ``reference_clips``: speaker -> the
        reference sent as audio; ``registered``: speaker -> the registered voice that is its reference; ``keeper`` and
        ``max_kept_bytes``: a stream's, where it holds the audio it keeps and how much it may (None:
        CheckDialogue, whose audio is its request's, already in memory and bounded by its size)."""
        self._listen = copies
        self._octaves = octaves
        self._spread = spread
        self._noise_db = noise_db
        self._compose_db = compose_db
        self._telephone_db = telephone_db
        self._components = components
        self._references = dict(reference_clips)
        self._registered = dict(registered or {})
        # A registered voice's embedding of each kind of copy once read, or why it cannot be ((copy, speaker) ->
        # either); why its noisiest clip's audio cannot be read (speaker -> why).
        self._registered_copies: dict[tuple[ChannelCopy, str], np.ndarray | str] = {}
        self._registered_noise: dict[str, str] = {}
        self._keeper = keeper
        self._max_kept = max_kept_bytes
        self._speakers: dict[str, _Speaker] = {}
        self._turns: dict[str, tuple[str, int]] = {}  # turn id -> speaker, position
        self._keys: list[str] = [_REF + s for s in self._references]  # every clip copies are made of, in order
        self._kept: dict[str, AudioInput] = {}  # key -> its audio, for copies still to be made
        self._held: dict[str, int] = {}  # the kept clips' bytes held in the keeper
        self._held_bytes = 0
        self._copies: dict[ChannelCopy, dict[str, ClipEmbedding]] = {}  # kind -> key -> its copy's embedding
        self._pools: dict[ChannelCopy, dict[str, _Pool]] = {}  # kind -> speaker -> their pool of those copies
        self._making: dict[tuple[ChannelCopy, str], asyncio.Task[None]] = {}  # background copies (streams)
        self._eager = False  # a stream past its bound: every turn's narrowband copy is made as it arrives
        self._cache: tuple[int, dict[str, ChannelMatch]] | None = None  # matches() at a number of turns heard
        # The audio of every piece that has been a speaker's noisiest (a few per speaker): its noise is what the
        # speaker's noisy copies get, so it outlives the kept audio of a stream past its bound.
        self._noise_sources: dict[str, AudioInput] = {}
        for s, reference in self._references.items():
            self._keep(_REF + s, reference.audio)

    def heard(self, turn_id: str, speaker: str, position: int, audio: AudioInput, clip: ClipEmbedding) -> None:
        """A usable turn was added to the dialogue: note its channel and keep its audio."""
        entry = self._speakers.setdefault(speaker, _Speaker())
        entry.usable += 1
        width, plateau, snr, low = clip.channel
        if low is not None:
            entry.lows.append(low)
        if width:
            entry.widths.append(width)
        if plateau is not None:
            entry.plateaus.append(plateau)
        if snr is not None:
            entry.snrs.append((position, snr, turn_id))
        self._turns[turn_id] = (speaker, position)
        self._keys.append(turn_id)
        self._keep(turn_id, audio)

    def _keep(self, key: str, audio: AudioInput) -> None:
        """Keep a clip's audio for the copies to come; a stream holds it in its keeper, and one past its bound (or
        finding the keeper full) keeps each later clip only until its narrowband copy is made."""
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
        """The dialogue is over: let go of everything held, and stop making copies nobody will read."""
        for task in set(self._making.values()):
            task.cancel()
        for key in list(self._kept):
            self._let_go(key)

    def matches(self) -> dict[str, ChannelMatch]:
        """The speakers whose clips span more than ``octaves`` of bandwidth or differ by more than ``spread`` in
        plateau fraction."""
        if self._cache is not None and self._cache[0] == len(self._turns):
            return self._cache[1]
        out = {}
        for s, entry in self._speakers.items():
            references = self._reference_channels(s)
            widths = entry.widths + [c.bandwidth_hz for c in references if c.bandwidth_hz]
            plateaus = entry.plateaus + [c.plateau for c in references if c.plateau is not None]
            band = (min(widths), max(widths)) if len(widths) >= 2 else None
            if band is None or not (self._octaves > 0 and math.log2(band[1] / band[0]) > self._octaves):
                band = None
            plateau = (min(plateaus), max(plateaus)) if len(plateaus) >= 2 else None
            if plateau is None or not (self._spread > 0 and plateau[1] - plateau[0] > self._spread):
                plateau = None
            noisy = self._noise(s, entry, self._noise_db if band is None and plateau is None else self._compose_db)
            lows = entry.lows + [c.low_band_db for c in references if c.low_band_db is not None]
            low_band = (min(lows), max(lows)) if lows else None
            telephone = (
                self._telephone_db < 0 and low_band is not None and low_band[0] < self._telephone_db <= low_band[1]
            )
            if band is None or not telephone:
                low_band = None
            if band is not None or plateau is not None or noisy is not None:
                snr, noise, noisiest = noisy or (None, None, None)
                out[s] = ChannelMatch(band, plateau, snr=snr, noise=noise, noisiest=noisiest, low_band=low_band)
        self._cache = (len(self._turns), out)  # turns are only ever added
        return out

    def _noise(
        self, speaker: str, entry: _Speaker, trigger: float
    ) -> tuple[tuple[float, float], AudioInput | None, str] | None:
        """The speaker's noise match, (SNR range, the noisiest piece's audio, its key), if their pieces differ in SNR
        by more than ``trigger`` dB (the usable turns in dialogue order, then the reference sent as audio or the
        registered voice's clips; the noisiest is the first of the lowest SNR)."""
        if not trigger > 0:
            return None
        pieces = [(snr, key) for _, snr, key in sorted(entry.snrs)]
        # A registered voice's noise, when it is the noisiest, is read from its kept clips (ensure).
        pieces += [(c.snr_db, _REF + speaker) for c in self._reference_channels(speaker) if c.snr_db is not None]
        if len(pieces) < 2:
            return None
        low = min(p[0] for p in pieces)
        high = max(p[0] for p in pieces)
        if not high - low > trigger:
            return None
        noisiest = next(key for snr, key in pieces if snr == low)
        source = self._noise_sources.get(noisiest) or self._kept.get(noisiest)
        if source is not None:
            self._noise_sources[noisiest] = source
        return (low, high), source, noisiest

    def _reference_channels(self, speaker: str) -> list[Channel]:
        """The channels of the speaker's reference: the clip sent as audio, or each clip of the registered voice
        (a field None where it was not recorded)."""
        reference = self._references.get(speaker)
        registered = self._registered.get(speaker)
        return [reference.channel] if reference is not None else list(registered.channels) if registered else []

    def _complete(self, copy: ChannelCopy, speaker: str) -> bool:
        found = self._pools.get(copy, {}).get(speaker)
        return found is not None and not found.unusable and found.pool.n == self._speakers[speaker].usable

    def matched(self) -> dict[str, ChannelCopy]:
        """The matched speakers and the copies they are judged on: their own kind where its pool can stand in for
        their pool (every usable turn in it), else their narrowband copies where those can (a band- and
        clip-mixed speaker of a stream that no longer has the audio to clip)."""
        out = {}
        for s, match in self.matches().items():
            for copy in match.fallbacks:
                if self._complete(copy, s):
                    out[s] = copy
                    break
        return out

    def audio(self, turn_id: str) -> AudioInput | None:
        """A usable turn's audio, while kept (pitch and length matching copy it too)."""
        return self._kept.get(turn_id)

    def reference_audio(self, speaker: str) -> AudioInput | None:
        """The speaker's reference sent as audio, while kept (None: none, or a registered voice)."""
        return self._kept.get(_REF + speaker)

    def reference_seconds(self, speaker: str) -> float | None:
        """The speech seconds of the speaker's reference sent as audio (None: none, or a registered voice)."""
        reference = self._references.get(speaker)
        return None if reference is None else reference.speech_seconds

    def pools(self, copy: ChannelCopy, order: Sequence[str]) -> dict[str, SpeakerPool]:
        """The pools of these speakers' copies of this kind that exist, in that order (a matched speaker's
        cohort)."""
        pools = self._pools.get(copy, {})
        return {s: pools[s].pool for s in order if s in pools}

    def note(self, speaker: str, matched: Mapping[str, ChannelCopy]) -> tuple[ChannelCopy | None, str]:
        """(the copies the speaker's turns were compared on, or None; what a turn's detail says of it)."""
        match = self.matches().get(speaker)
        if match is None:
            return None, ""
        used = matched.get(speaker)
        if used == match.copy:
            return used, match.note(speaker, used)
        # Mixed, but their copies could not be judged: their narrowband copies, or as heard, and said so.
        wanted = self._pools.get(match.copy, {}).get(speaker)
        why = wanted.unusable if wanted is not None and wanted.unusable else self._why_missing(match.copy, speaker)
        return used, match.missed(speaker, used, why)

    def _why_missing(self, copy: ChannelCopy, speaker: str) -> str:
        if copy.snr_db is not None and copy.noise is None:
            return self._registered_noise.get(
                speaker, "the stream no longer keeps its noisiest turn's audio (past --band-match-stream-mb)"
            )
        lost = [k for k in self._keys if self._owner(k) == speaker and k not in self._copies.get(copy, {})]
        if lost and all(k not in self._kept for k in lost):
            return "the stream no longer keeps its turns' audio (past --band-match-stream-mb)"
        return f"a {copy.describe()} is missing"

    def _owner(self, key: str) -> str:
        return key[len(_REF) :] if key.startswith(_REF) else self._turns[key][0]

    async def ensure(self, deadline: float | None) -> None:
        """Have the copies the verdicts need: every clip's copy of each kind some matched speaker is judged on
        (each speaker's own, and the others' for its cohort); drop the kinds nobody is judged on any more (a
        clipping target that moved); in a stream past its bound, make every new clip's narrowband copy in the
        background."""
        await self._read_registered_noise()
        # Each speaker's kinds in the order it falls back to them (ChannelMatch.fallbacks); noise copies whose noisiest
        # piece's audio is no longer kept cannot be made (note() says why).
        chains = {
            s: [c for c in m.fallbacks if c.snr_db is None or c.noise is not None] for s, m in self.matches().items()
        }
        wanted = {c for chain in chains.values() for c in chain}
        for copy in [c for c in self._copies if c not in wanted and not (self._eager and c == NARROWBAND)]:
            self._drop(copy)
        if self._eager and NARROWBAND not in wanted:
            waiting = [k for k in self._kept if (NARROWBAND, k) not in self._making and not self._has(NARROWBAND, k)]
            if waiting:
                task = asyncio.ensure_future(self._make(NARROWBAND, waiting, deadline))
                task.add_done_callback(lambda t: None if t.cancelled() else t.exception())
                self._making.update({(NARROWBAND, k): task for k in waiting})
        if not wanted:
            return
        # Wait for the background copies (one that failed is made again below), then the rest.
        pending = set(self._making.values())
        if pending:
            await asyncio.wait(pending)
        # A kind a speaker falls back to is made only when the ones before it cannot stand in for its pool (a copy too
        # short to embed): one encoder pass over the clips per kind in use, not per kind it might need. A stream past
        # its bound lets its clips' audio go once their copies are made, so it makes every kind at once.
        tried: set[ChannelCopy] = set()
        while True:
            if self._eager:
                todo = wanted - tried
            else:
                todo = {c for s, chain in chains.items() if (c := self._next_kind(chain, s, tried)) is not None}
            if not todo:
                break
            for copy in sorted(todo, key=lambda c: (c.narrow, c.telephone, c.plateau or 0.0, c.snr_db or 0.0)):
                await self._make(copy, [k for k in self._kept if not self._has(copy, k)], deadline)
            tried |= todo
        if self._eager:  # a clip not held is kept until its copies are made
            for key in [k for k in self._kept if k not in self._held and self._has(NARROWBAND, k)]:
                if all(self._has(copy, key) for copy in tried):
                    self._let_go(key)

    def _next_kind(self, chain: list[ChannelCopy], speaker: str, tried: set[ChannelCopy]) -> ChannelCopy | None:
        """The first of the speaker's kinds not tried yet, unless one tried before it stands in for its pool."""
        for copy in chain:
            if copy not in tried:
                return copy
            if self._complete(copy, speaker):
                return None
        return None

    def _has(self, copy: ChannelCopy, key: str) -> bool:
        return key in self._copies.get(copy, {})

    def _drop(self, copy: ChannelCopy) -> None:
        for key, task in [(k, t) for k, t in self._making.items() if k[0] == copy]:
            task.cancel()
            self._making.pop(key, None)
        self._copies.pop(copy, None)
        self._pools.pop(copy, None)
        for key in [k for k in self._registered_copies if k[0] == copy]:
            del self._registered_copies[key]

    async def _make(self, copy: ChannelCopy, keys: list[str], deadline: float | None) -> None:
        """Embed these kept clips' copies of one kind and add them to their speakers' pools of that kind."""
        keys = [k for k in keys if k in self._kept]
        if not keys:
            return
        try:
            clips = await self._listen(copy, [(self._kept[k], _label(k)) for k in keys], deadline)
        finally:
            for k in keys:
                self._making.pop((copy, k), None)
        made = self._copies.setdefault(copy, {})
        added = []
        for k, clip in zip(keys, clips, strict=True):
            if k in made:  # made meanwhile by another call: each turn joins its pool once
                continue
            made[k] = clip
            added.append(k)
        turns = sorted((k for k in added if not k.startswith(_REF)), key=lambda k: self._turns[k][1])
        # A registered speaker's pool starts from the voice's embedding of the same copies: read it first.
        for s in dict.fromkeys(self._turns[k][0] for k in turns):
            if s in self._registered and (copy, s) not in self._registered_copies:
                self._registered_copies[(copy, s)] = await self._read_registered(s, copy, deadline)
        for k in turns:
            self._add(copy, k)

    async def _read_registered(self, speaker: str, copy: ChannelCopy, deadline: float | None) -> np.ndarray | str:
        """The registered voice's embedding of its clips' copies of this kind, or why it cannot be had (the speaker
        is then judged as heard or on its narrowband copies, and its turns say why)."""
        voice = self._registered[speaker]
        try:
            if copy == NARROWBAND:
                return await voice.narrowband(deadline)
            return await voice.copy(copy, deadline)
        except InvalidRequest as exc:  # no clips kept to make it from; deleted meanwhile
            if copy == NARROWBAND:
                return f"registered voice {voice.voice_id!r} has no narrowband embedding ({exc})"
            return f"registered voice {voice.voice_id!r}: {exc}"

    async def _read_registered_noise(self) -> None:
        """Read the noisiest kept clip of each registered voice that is its speaker's noisiest piece (its noise is
        what the speaker's copies get), once a dialogue; where it cannot be, note why (the copies are not made)."""
        for s, match in self.matches().items():
            voice = self._registered.get(s)
            if voice is None or match.snr is None or match.noise is not None or s in self._registered_noise:
                continue
            if match.noisiest != _REF + s:  # a turn no longer kept (a stream past its bound)
                continue
            try:
                self._noise_sources[_REF + s] = await voice.noisiest()
            except InvalidRequest as exc:
                self._registered_noise[s] = f"registered voice {voice.voice_id!r}: {exc}"
            self._cache = None  # matches() again, with the noise now at hand

    def _add(self, copy: ChannelCopy, turn_id: str) -> None:
        """A turn's copy into its speaker's pool of that kind (at its place in dialogue order)."""
        speaker, position = self._turns[turn_id]
        pools = self._pools.setdefault(copy, {})
        entry = pools.get(speaker)
        if entry is None:
            reference, why = self._reference(copy, speaker)
            entry = pools[speaker] = _Pool(SpeakerPool(reference, self._components), unusable=why)
        clip = self._copies[copy][turn_id]
        if clip.embedding is None:
            entry.unusable = entry.unusable or f"turn {turn_id!r}'s {copy.describe()}: {clip.detail}"
            return
        at = bisect.bisect(entry.positions, position)
        entry.pool.add(at, clip.embedding, clip.speech_seconds)
        entry.positions.insert(at, position)

    def _reference(self, copy: ChannelCopy, speaker: str) -> tuple[np.ndarray | None, str]:
        """The reference embedding of the speaker's pool of these copies (None: none) and, where the reference
        exists but its copy does not, why the pool cannot stand in for theirs."""
        if speaker in self._registered:
            found = self._registered_copies.get(
                (copy, speaker), f"the registered voice's {copy.describe()} was not read"
            )
            return (None, found) if isinstance(found, str) else (found, "")
        if speaker not in self._references:
            return None, ""
        reference = self._copies.get(copy, {}).get(_REF + speaker)
        if reference is None or reference.embedding is None:
            why = f"its {copy.describe()} was not made" if reference is None else reference.detail
            return None, f"the reference clip's {copy.describe()} is unusable ({why})"
        return reference.embedding, ""


def _label(key: str) -> str:
    return f"reference of speaker {key[len(_REF) :]!r}" if key.startswith(_REF) else f"turn {key!r}"
