"""Pitch matching: a flagged turn pitched well away from its speaker is judged again on a copy moved to their pitch.

Why: a pitch shift that moves the spectral envelope with the pitch (sox's `pitch` effect, a resampling pitch control,
audio played at the wrong rate) makes a voice sound like a smaller or larger person, and both speaker encoders read
it as another voice. In the robustness matrix the turn flagged in a consistent speaker under such shifts was the
speaker's pitch outlier in 34 of 34 cases on real speech (f-fsdd-prosody) and 62 of 66 on espeak-ng voices (train
b-espeak-sox). Screened offline, chosen on the train split, reported on the eval split
(docs/research/robustness-phase3/resample/REPORT.md): f-fsdd-prosody 78.6 -> 92.0 balanced accuracy, b-espeak-sox
71.1 -> 80.9, mean over 25 conditions +0.90 [+0.66, +1.14]; three conditions lose one similar-voice intruder each.

What: under the fused encoder's auto, once the dialogue is judged (channel matching included), a speaker judged as
heard or on its narrowband copies with an INCONSISTENT turn whose median pitch (sleuthd.audio.pitch) lies at least
``octaves`` and less than CEILING_OCTAVES from the median of the speaker's other pieces (usable turns, and the
reference when it was sent as audio) is judged again with each such turn replaced by its copy moved to that median
(pitch and envelope together, as the shift did; low-passed too where the speaker is band-matched), the other
speakers as they were. It only ever clears: a turn flagged before and not after is cleared, and only when every
moved copy's mean CAM++ cosine to the speaker's other pieces is within GUARD_COSINE of the speaker's own CAM++ level
(the median of those pieces' mean cosine to each other): an intruder whose voice the move merely brings closer
stays flagged. Everything else keeps its first verdict. Not done (not screened, or no audio to copy): speakers
judged on clipped, noisy or telephone-band copies; a stream's turns whose audio it no longer keeps (past
--band-match-stream-mb); the pitch of a registered voice (its speaker's median is its turns'). A copy that cannot be
embedded leaves the speaker as first judged.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from sleuthd.audio.pitch import STEPS_PER_OCTAVE, shift_steps
from sleuthd.config import PITCH_CEILING_OCTAVES
from sleuthd.domain import AudioInput
from sleuthd.encoders.clips import ChannelCopy
from sleuthd.judgment.channel_matching import Copies
from sleuthd.judgment.pool import SpeakerPool
from sleuthd.judgment.verdicts import (
    FLAGGED,
    Judgment,
    Rematched,
    SpeakerScores,
    merge_rows,
    score_speakers,
)

logger = logging.getLogger(__name__)

# A jump of about an octave is another gender's voice (and a man's voice moved up half an octave passed both
# encoders in the WORLD screen, docs/research/robustness-phase3/prosody/REPORT.md): never moved from 0.5 octave.
# The number lives with the option it bounds (--pitch-match-octaves).
CEILING_OCTAVES = PITCH_CEILING_OCTAVES
# The moved copy must sit this close to the speaker's own CAM++ level (cosine; chosen on the train split among
# -0.15 .. +0.025: the best mean balanced accuracy with no train condition worse).
GUARD_COSINE = -0.075
GUARD_ENCODER = "campplus"

# Hears clips' median pitches, log2(Hz) (sleuthd.encoders.embedder.ClipEmbedder.pitches).
Pitches = Callable[[Sequence[tuple[AudioInput, str]]], Awaitable[list[float | None]]]


@dataclass(frozen=True)
class PitchCandidate:
    """A speaker as first judged, with what judging them again needs."""

    speaker: str
    scores: SpeakerScores  # their verdicts
    pools: Mapping[str, SpeakerPool]  # the pools they were judged with: theirs and their cohort's
    turn_ids: Sequence[str]  # their usable turns, the rows of their pool
    audio: Sequence[AudioInput | None]  # each row's audio (None: no longer kept)
    reference: AudioInput | None  # the reference sent as audio (None: none, or a registered voice)
    narrow: bool  # judged on narrowband copies


class Rejudged:
    """The speakers a matcher judged again (pitch or length matching), as of the dialogue's last turn count: what
    sleuthd.judgment.dialogue reads back when it scores the dialogue at that count."""

    def __init__(self) -> None:
        self._stamp = -1
        self._rematched: dict[str, Rematched] = {}

    def rematched(self, stamp: int) -> Mapping[str, Rematched]:
        """The speakers this matching changed, for the dialogue at ``stamp`` turns (empty at any other)."""
        return self._rematched if stamp == self._stamp else {}

    def _publish(self, stamp: int, rematched: dict[str, Rematched]) -> None:
        self._stamp, self._rematched = stamp, rematched


class PitchMatcher(Rejudged):
    """The pitch-matching side of one dialogue: the pitches measured and the copies embedded (each once), and the
    speakers' verdicts after matching, for the turns heard so far."""

    def __init__(self, copies: Copies, pitches: Pitches, octaves: float, judgment: Judgment) -> None:
        """``octaves``: the least pitch distance (from the speaker's other pieces) at which a flagged turn is moved."""
        super().__init__()
        self._listen = copies
        self._pitches = pitches
        self._octaves = octaves
        self._judgment = judgment
        self._pitch: dict[str, float | None] = {}  # a clip's digest -> its median pitch
        self._made: dict[tuple[str, ChannelCopy], tuple[np.ndarray, float] | None] = {}  # (turn, copy) -> emb, speech s

    async def ensure(self, stamp: int, candidates: Sequence[PitchCandidate], deadline: float | None) -> None:
        """Judge again each candidate with a flagged turn pitched away from them (the dialogue at ``stamp`` turns)."""
        out = {}
        for c in candidates:
            flagged = np.isin(c.scores.codes, FLAGGED)
            if not flagged.any() or any(a is None for a in c.audio):
                continue
            moves = await self._moves(c, flagged)
            if moves:
                found = await self._judge_again(c, flagged, moves, deadline)
                if found is not None:
                    out[c.speaker] = found
        self._publish(stamp, out)

    async def _moves(self, c: PitchCandidate, flagged: np.ndarray) -> dict[int, int]:
        """Flagged row -> quarter-tone steps to the median pitch of the speaker's other pieces, for the rows lying
        ``octaves`` .. CEILING_OCTAVES from it."""
        pieces = [a for a in c.audio if a is not None] + ([c.reference] if c.reference is not None else [])
        todo = list({a.digest: a for a in pieces if a.digest not in self._pitch}.values())
        if todo:
            found = await self._pitches([(a, f"a clip of speaker {c.speaker!r}") for a in todo])
            self._pitch.update((a.digest, p) for a, p in zip(todo, found, strict=True))
        return pitch_moves([self._pitch[a.digest] for a in pieces], np.flatnonzero(flagged).tolist(), self._octaves)

    async def _judge_again(
        self, c: PitchCandidate, flagged: np.ndarray, moves: dict[int, int], deadline: float | None
    ) -> Rematched | None:
        copies = {}
        for j, steps in moves.items():
            copy = ChannelCopy(narrow=c.narrow, pitch_steps=steps)
            key = (c.turn_ids[j], copy)
            if key not in self._made:
                audio = c.audio[j]
                assert audio is not None
                clip = (await self._listen(copy, [(audio, f"turn {c.turn_ids[j]!r}")], deadline))[0]
                self._made[key] = None if clip.embedding is None else (clip.embedding, clip.speech_seconds)
            made = self._made[key]
            if made is None:  # too little speech left to embed: judged as first judged
                return None
            copies[j] = made
        pool = c.pools[c.speaker].with_rows(copies)
        again = score_speakers({**c.pools, c.speaker: pool}, self._judgment)[c.speaker]
        cleared = flagged & ~np.isin(again.codes, FLAGGED)
        guard = pool_guard(pool, list(moves)) if cleared.any() else np.nan
        logger.debug(
            "speaker %r: moved %s; would clear %s; guard %.3f", c.speaker, moves, np.flatnonzero(cleared), guard
        )
        if not cleared.any() or guard < GUARD_COSINE:
            return None
        moved = ", ".join(f"turn {c.turn_ids[j]!r} {s / STEPS_PER_OCTAVE:+.2f}" for j, s in sorted(moves.items()))
        note = (
            f"pitch matched: judged again with a copy moved in pitch (and spectral envelope) to the median pitch of "
            f"speaker {c.speaker!r}'s other clips ({moved} octave)"
        )
        return Rematched(merge_rows(c.scores, again, cleared), {j: note for j in np.flatnonzero(cleared).tolist()})


def pitch_moves(pitches: Sequence[float | None], rows: Iterable[int], octaves: float) -> dict[int, int]:
    """Row -> quarter-tone steps to the median pitch of the other pieces, for each of ``rows`` (the flagged turns)
    whose pitch lies ``octaves`` .. CEILING_OCTAVES from it. ``pitches``: every piece's median pitch, log2(Hz) (None:
    too little voiced), the usable turns first. The rule the server judges by, and the offline judges
    (sleuthd_bench.robustness.judges) with it."""
    moves = {}
    for j in rows:
        own = pitches[j]
        others = [p for i, p in enumerate(pitches) if i != j and p is not None]
        if own is None or not others:
            continue
        target = float(np.median(others))
        steps = shift_steps(own, target)
        if octaves <= abs(own - target) < CEILING_OCTAVES and steps:
            moves[j] = steps
    return moves


def pool_guard(pool: SpeakerPool, moved: Sequence[int]) -> float:
    """:func:`guard_margin` of the ``moved`` turns (rows of the speaker's usable turns) in the pool's GUARD_ENCODER
    part; -inf without that encoder. Length matching guards its cut copies with it too."""
    part = pool.components.get(GUARD_ENCODER)
    if part is None:
        return -np.inf
    return guard_margin(part.gram(), [part.r0 + j for j in moved])  # reference first


def guard_margin(gram: np.ndarray, moved: Sequence[int]) -> float:
    """The least, over the ``moved`` rows of a speaker's cosine matrix, of their mean cosine to the other pieces minus
    the speaker's level there (the median of those pieces' mean cosine to each other). Compared with GUARD_COSINE."""
    rest = [i for i in range(len(gram)) if i not in moved]
    sub = gram[np.ix_(rest, rest)]
    level = float(np.median((sub.sum(axis=1) - np.diag(sub)) / max(len(rest) - 1, 1)))
    return min(float(gram[r, rest].mean()) - level for r in moved)
