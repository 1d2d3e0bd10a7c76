"""Length matching: a short flagged turn among long ones is judged again against the speaker's other clips cut to its
length.

Why: a short clip's embedding lies further from its speaker's than a long one's (fewer windows to average; CAM++
refills a window shorter than 3 s with its own audio), so against long turns and a long reference a genuine short
turn looks like another voice. In the robustness matrix every false alarm of the served judgment under c-mixed (1-2 s
turns among 4-5 s ones) was such a turn, 1.4-1.7 s of speech against 4-5 s. Against copies of equal length the
speaker's own yardstick is a short one too. Screened offline, chosen on the train split, reported on the eval split
(docs/research/robustness-phase3/length/REPORT.md): c-mixed 89.1 -> 90.5 balanced accuracy (consistent speakers
94.5 -> 97.3 %), no other condition and no dev split changed.

What: under the fused encoder's auto, once the dialogue is judged (channel and pitch matching included), a speaker
judged on its clips as sent (not on channel-matched copies) with an INCONSISTENT turn whose speech is shorter than
``ratio`` times the median speech of the speaker's other pieces (usable turns, and the reference when it was sent as
audio) is judged again for that turn, with every other piece replaced by its copy cut to the turn's length (the
middle of its trimmed speech, as many samples as the turn's own trimmed speech: sleuthd.encoders.clips.speech_cut;
a piece no longer than that stays as it is), the other speakers as they were. It only ever clears, and only when
both hold: the turn's probability judged so is under CLEAR_BELOW (clearly consistent, not merely under the decision
threshold: at 0.5 it cleared short similar-voice intruders as often as short genuine turns on the train split), and
its mean CAM++ cosine to the cut pieces is within pitch matching's GUARD_COSINE of their own level (the same guard:
against a speaker of 100 cut turns, 7 test sentences repeated, a 1.2 s turn of the opposite gender came out at
probability 0.17, falling as the pool grows, not diagnosed; its guard margin was -0.40). Each such turn is judged again
on its own. Not done (not screened, or nothing to cut): speakers judged on copies of any kind; a speaker whose
reference is a registered voice; a speaker with more than MAX_PIECES clips; a stream's turns whose audio it no longer
keeps (past --band-match-stream-mb). A cut that cannot be embedded leaves the turn as first judged.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from sleuthd.audio import SAMPLE_RATE
from sleuthd.domain import AudioInput
from sleuthd.encoders.clips import ChannelCopy
from sleuthd.judgment.channel_matching import Copies
from sleuthd.judgment.pitch_matching import GUARD_COSINE, Rejudged, pool_guard
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

# A turn judged again on cut copies is cleared only under this probability (chosen on the train split among 0.5, 0.3
# and 0.2 with the ratio: docs/research/robustness-phase3/length/choice.txt).
CLEAR_BELOW = 0.2

# A speaker with more pieces (usable turns and reference) than this is not length matched. Why: every turn that
# arrives for such a speaker is cut once more per short flagged turn and each such turn is judged again on a pool
# rebuilt from the cuts (a 300-turn stream with 12 short intruders: 92 ms a turn against 4 ms without; research report
# above), and the matrix it was screened on has 5 turns a speaker.
MAX_PIECES = 50

# Hears clips' trimmed speech in samples (sleuthd.encoders.embedder.ClipEmbedder.kept_samples).
KeptSamples = Callable[[Sequence[tuple[AudioInput, str]]], Awaitable[list[int]]]


@dataclass(frozen=True)
class LengthCandidate:
    """A speaker as judged after channel and pitch matching, with what judging them again needs."""

    speaker: str
    scores: SpeakerScores  # their verdicts
    pools: Mapping[str, SpeakerPool]  # the pools they were judged with (as heard): theirs and their cohort's
    turn_ids: Sequence[str]  # their usable turns, the rows of their pool
    audio: Sequence[AudioInput | None]  # each row's audio (None: no longer kept)
    reference: AudioInput | None  # the reference sent as audio (None: none)
    reference_seconds: float | None  # its speech seconds


def short_turns(seconds: Sequence[float], rows: Iterable[int], ratio: float) -> list[int]:
    """Those of ``rows`` (the flagged turns) whose speech is under ``ratio`` times the median speech of the other
    pieces. ``seconds``: every piece's speech seconds, the usable turns first, then the reference's if any. The rule
    the server judges by, and the offline judges (sleuthd_bench.robustness.judges) with it."""
    out = []
    for j in rows:
        others = [s for i, s in enumerate(seconds) if i != j]
        if others and seconds[j] < ratio * float(np.median(others)):
            out.append(j)
    return out


class LengthMatcher(Rejudged):
    """The length-matching side of one dialogue: the trimmed lengths measured and the cut copies embedded (each once),
    and the speakers' verdicts after matching, for the turns heard so far."""

    def __init__(self, copies: Copies, kept: KeptSamples, ratio: float, judgment: Judgment) -> None:
        """``ratio``: a flagged turn with less speech than this times the median of the speaker's other pieces is
        judged again."""
        super().__init__()
        self._listen = copies
        self._kept_samples = kept
        self._ratio = ratio
        self._judgment = judgment
        self._kept: dict[str, int] = {}  # a clip's digest -> its trimmed speech, samples
        self._made: dict[tuple[str, int], tuple[np.ndarray, float] | None] = {}  # (digest, samples) -> emb, speech s

    async def ensure(self, stamp: int, candidates: Sequence[LengthCandidate], deadline: float | None) -> None:
        """Judge again each short flagged turn of each candidate (the dialogue at ``stamp`` turns)."""
        out = {}
        for c in candidates:
            flagged = np.isin(c.scores.codes, FLAGGED)
            base = c.pools[c.speaker]
            if not flagged.any() or any(a is None for a in c.audio):
                continue
            if base.reference is not None and c.reference is None:
                continue  # a registered voice: nothing to cut
            if base.n + (c.reference is not None) > MAX_PIECES:
                continue
            seconds = base.seconds.tolist() + ([c.reference_seconds or 0.0] if c.reference is not None else [])
            scores, notes = c.scores, {}
            for j in short_turns(seconds, np.flatnonzero(flagged).tolist(), self._ratio):
                again = await self._judge_again(c, j, deadline)
                if again is not None:
                    rows = np.arange(base.n) == j
                    scores, notes[j] = merge_rows(scores, again[0], rows), again[1]
            if notes:
                out[c.speaker] = Rematched(scores, notes)
        self._publish(stamp, out)

    async def _judge_again(
        self, c: LengthCandidate, j: int, deadline: float | None
    ) -> tuple[SpeakerScores, str] | None:
        """The speaker judged again with every piece but row ``j`` cut to its length, and the cleared turn's note; None
        when the turn is not cleared so (or a cut cannot be embedded)."""
        audio = [a for a in c.audio if a is not None]
        own = audio[j]
        if own.digest not in self._kept:
            self._kept[own.digest] = (await self._kept_samples([(own, f"turn {c.turn_ids[j]!r}")]))[0]
        n = self._kept[own.digest]
        pieces = [(k, a, f"turn {c.turn_ids[k]!r}") for k, a in enumerate(audio) if k != j]
        if c.reference is not None:
            pieces.append((-1, c.reference, f"reference of speaker {c.speaker!r}"))
        todo = [(a, label) for _, a, label in pieces if (a.digest, n) not in self._made]
        if todo:
            made = await self._listen(ChannelCopy(cut_samples=n), todo, deadline)
            for (a, _), clip in zip(todo, made, strict=True):
                self._made[(a.digest, n)] = None if clip.embedding is None else (clip.embedding, clip.speech_seconds)
        cut = {k: self._made[(a.digest, n)] for k, a, _ in pieces}
        if any(v is None for v in cut.values()):
            return None  # too little speech in a cut to embed: judged as first judged
        rows = {k: made for k, made in cut.items() if k >= 0 and made is not None}
        reference = cut[-1][0] if -1 in cut and cut[-1] is not None else None
        pool = c.pools[c.speaker].with_rows(rows, reference)
        again = score_speakers({**c.pools, c.speaker: pool}, self._judgment)[c.speaker]
        probability = None if again.probability is None else float(again.probability[j])
        guard = pool_guard(pool, [j])
        logger.debug(
            "speaker %r: turn %r judged on cuts of %d samples: %s; guard %.3f",
            c.speaker,
            c.turn_ids[j],
            n,
            probability,
            guard,
        )
        if probability is None or not probability < CLEAR_BELOW or guard < GUARD_COSINE:
            return None
        note = (
            f"length matched: judged again against speaker {c.speaker!r}'s other clips cut to this turn's length "
            f"({n / SAMPLE_RATE:.2f} s of trimmed speech)"
        )
        return again, note
