"""One dialogue judged by the LALM judge (method lalm), shared by CheckDialogue and StreamDialogue.

Each turn is heard twice from one decode (sleuthd.lalm_judging): its embedding goes into an ordinary
:class:`~sleuthd.dialogue.DialogueState`, which supplies what every method's verdict carries (INSUFFICIENT_AUDIO,
the paper scores, auto's probability when the encoder is calibrated, attribution; drift is attached here,
after the judge's detail), and its waveform goes to the judge. The judge decides the status: per speaker,
each usable turn against the reference clip and the speaker's nearest other turns (``Judge.detect_turns``),
INCONSISTENT when its probability of a different speaker is above the threshold.

The judge's answers are kept per turn with the context turns they were asked with. When a streamed turn
completes, only the prompts whose context changed are asked again (the new turn and its nearest
neighbours: about ``max_context_clips / 2 + 1`` prompts per turn), so each turn's verdict and the revisions
it causes come at once, and the stream's final verdict is made of exactly the prompts CheckDialogue asks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np

from sleuthd.calibration import Calibration
from sleuthd.clips import ClipEmbedding
from sleuthd.dialogue import DialogueState
from sleuthd.domain import (
    AudioInput,
    DialogueResult,
    DriftResult,
    FlagReason,
    SpeakerResult,
    TurnResult,
    TurnStatus,
    TurnUpdate,
    UncertainReason,
)
from sleuthd.drift import attach_drift, find_drift
from sleuthd.errors import LimitExceeded
from sleuthd.judge import Judgment
from sleuthd.lalm.judge import Judge, nearest_context
from sleuthd.lalm.types import JudgeProbability
from sleuthd.observe import EngineObserver, NullObserver
from sleuthd.options import ResolvedOptions
from sleuthd.scoring import Method

T = TypeVar("T")


@dataclass(frozen=True)
class Heard:
    """A clip decoded once: the waveform the judge hears and the embeddings the encoder made of it.

    ``samples``: (n,) float32, 16 kHz mono, as decoded (before loudness normalisation and trimming).
    ``clips``: one embedding per window placement asked for (the manifest's first, then drift windows).
    """

    samples: np.ndarray
    clips: list[ClipEmbedding]

    @property
    def clip(self) -> ClipEmbedding:
        return self.clips[0]


# Hears one turn's audio (``label`` names it in errors): sleuthd.lalm_judging.LalmJudging.hear.
Hear = Callable[[AudioInput, str, float | None], Awaitable[Heard]]


async def gather_or_cancel(aws: Sequence[Awaitable[T]]) -> list[T]:
    """Await all; on the first failure cancel the rest (their queued work is withdrawn) and re-raise."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def embedding_options(opts: ResolvedOptions) -> ResolvedOptions:
    """The options the embedding side of a lalm dialogue runs under: auto when the encoder is calibrated
    (its probability and attribution are then filled in), else pairwise (paper scores and attribution).
    Drift is left to :class:`LalmDialogue`, which attaches it after writing the judge's detail."""
    cal = opts.entry.calibration
    if isinstance(cal, Calibration):
        judgment = Judgment(Method.AUTO, cal.decision_threshold, cal)
    else:
        judgment = Judgment(Method.PAIRWISE, 0.0, None)  # its statuses are never shown
    return replace(opts, judgment=judgment, detect_drift=False)


class LalmDialogue:
    """The turns of one dialogue so far, their waveforms (usable turns only) and the judge's answers."""

    def __init__(
        self,
        dialogue_id: str,
        opts: ResolvedOptions,
        references: dict[str, np.ndarray],
        reference_waves: dict[str, np.ndarray],
        judge: Judge,
        observer: EngineObserver,
        hear: Hear | None = None,
        max_audio_bytes: int | None = None,
    ) -> None:
        """``references``: each speaker's reference embedding; ``reference_waves``: the same clips' waveforms.
        ``hear`` and ``max_audio_bytes`` (a bound on the waveforms kept) are for streams; CheckDialogue hears
        its turns up front, and its request size bounds them."""
        self.dialogue_id = dialogue_id
        self.opts = opts
        self.references = references
        self._reference_waves = reference_waves
        self._judge = judge
        self._hear = hear
        self._observer = observer
        self._max_audio_bytes = max_audio_bytes
        self._inner = DialogueState(dialogue_id, embedding_options(opts), references, NullObserver())
        self._speaker: dict[str, str] = {}  # turn_id -> speaker
        self._position: dict[str, int] = {}
        self._waves: dict[str, np.ndarray] = {}  # usable turns only
        self._held = sum(w.nbytes for w in reference_waves.values())
        self._answers: dict[str, tuple[tuple[str, ...], JudgeProbability]] = {}  # turn -> (context, answer)
        self._drift: dict[str, DriftResult | None] = {}  # searched turns only
        self._reported: dict[str, TurnStatus] = {}
        self._counted: set[str] = set()

    def __len__(self) -> int:
        return len(self._inner)

    def add_turn(self, turn_id: str, speaker: str, position: int, heard: Heard) -> None:
        """A completed turn at ``position`` in the dialogue (not judged yet: see :meth:`judge_speakers`)."""
        if heard.clip.usable:
            if self._max_audio_bytes is not None and self._held + heard.samples.nbytes > self._max_audio_bytes:
                raise LimitExceeded(
                    f"this stream would keep {self._held + heard.samples.nbytes} bytes of decoded audio for the "
                    f"judge (it hears earlier turns again as context); the limit is {self._max_audio_bytes} "
                    "(--judge-max-stream-audio-mb): open a new stream for the rest of the dialogue"
                )
            self._waves[turn_id] = heard.samples
            self._held += heard.samples.nbytes
        self._speaker[turn_id] = speaker
        self._position[turn_id] = position
        self._inner.add_turn(turn_id, speaker, position, heard.clip)
        config = self.opts.entry.drift
        if self.opts.detect_drift and config is not None and heard.clip.usable and len(heard.clips) > 1:
            dense = heard.clips[1]
            self._drift[turn_id] = find_drift(dense.window_embeddings, dense.window_times, config)

    async def judge_speakers(self, speakers: Sequence[str], deadline: float | None) -> None:
        """Ask the judge about ``speakers``' turns whose prompts are new or changed, all concurrently (a request
        of more prompts than the judge's queue holds is refused first: it could never fit)."""
        plans = [plan for s in dict.fromkeys(speakers) if (plan := self._plan(s)) is not None]
        self._judge.admit(sum(len(todo) for _, _, _, todo in plans))
        await gather_or_cancel([self._judge_speaker(*plan, deadline) for plan in plans])

    def _plan(self, speaker: str) -> tuple[list[str], np.ndarray | None, list[tuple[str, ...]], list[int]] | None:
        """A speaker's usable turns in order, reference, each turn's context and the turns to ask; None when
        there is nothing to ask."""
        ids = sorted((t for t in self._waves if self._speaker[t] == speaker), key=self._position.__getitem__)
        reference = self._reference_waves.get(speaker)
        if not ids or (len(ids) < 2 and reference is None):
            return None  # nothing to compare with: INSUFFICIENT_CONTEXT
        k = self._judge.max_context_clips
        contexts = [tuple(ids[j] for j in nearest_context(len(ids), i, k)) for i in range(len(ids))]
        todo = [i for i, ctx in enumerate(contexts) if ids[i] not in self._answers or self._answers[ids[i]][0] != ctx]
        return (ids, reference, contexts, todo) if todo else None

    async def _judge_speaker(
        self,
        ids: list[str],
        reference: np.ndarray | None,
        contexts: list[tuple[str, ...]],
        todo: list[int],
        deadline: float | None,
    ) -> None:
        answers: list[JudgeProbability]
        if len(todo) == len(ids):  # the whole speaker (CheckDialogue): the judge's per-speaker call
            answers = await self._judge.detect_turns([self._waves[t] for t in ids], reference, deadline)
        else:  # the same prompts as detect_turns would build for these turns
            answers = await gather_or_cancel(
                [
                    self._judge.detect(self._waves[ids[i]], reference, [self._waves[c] for c in contexts[i]], deadline)
                    for i in todo
                ]
            )
        for i, answer in zip(todo, answers, strict=True):
            self._answers[ids[i]] = (contexts[i], answer)

    # ------------------------------------------------------------------ verdicts

    def _verdict(self, t: TurnResult) -> TurnResult:
        """The embedding side's verdict of a turn, with the judge's status, score and fields."""
        if t.status is TurnStatus.INSUFFICIENT_AUDIO:
            return t
        cleared = replace(
            t, score=None, score_scale="", threshold=None, reason=FlagReason.NONE, uncertain_reason=UncertainReason.NONE
        )
        if t.turn_id not in self._answers:
            return replace(
                cleared,
                status=TurnStatus.INSUFFICIENT_CONTEXT,
                detail=(
                    f"speaker {t.speaker!r} has no other usable turn for the judge to compare with; "
                    "send more turns or a reference clip"
                ),
            )
        answer = self._answers[t.turn_id][1]
        p, threshold = answer.probability, self.opts.judgment.threshold
        bad = p > threshold
        calibrated = "calibrated" if answer.calibrated else "uncalibrated"
        said = replace(  # what the judge said, on every scored turn
            cleared,
            score=p,
            score_scale="probability",
            threshold=threshold,
            judge_probability=p,
            judge_answer_mass=answer.answer_mass,
            judge_model=answer.model_name,
            judge_calibrated=answer.calibrated,
        )
        unsure = self._unsure(answer, threshold)
        if unsure:
            detail = f"lalm ({answer.model_name}, {calibrated}): {unsure}; neither flagged nor cleared"
            return replace(
                said, status=TurnStatus.UNCERTAIN, uncertain_reason=UncertainReason.LOW_ANSWER_MASS, detail=detail
            )
        return replace(
            said,
            status=TurnStatus.INCONSISTENT if bad else TurnStatus.CONSISTENT,
            reason=FlagReason.SCORE_THRESHOLD if bad else FlagReason.NONE,
            detail=(
                f"lalm ({answer.model_name}, {calibrated}): probability {p:.3f} {'>' if bad else '<='} "
                f"{threshold:.3f}; answer mass {answer.answer_mass:.2f}"
            ),
        )

    def _unsure(self, answer: JudgeProbability, threshold: float) -> str:
        """Why the judge's answer is no verdict (the turn is UNCERTAIN, LOW_ANSWER_MASS), or "" when it is one."""
        floor = self._judge.info.min_answer_mass
        if answer.answer_mass < floor:
            return (
                f"answer mass {answer.answer_mass:.2f} under the floor {floor:.2f}: the model barely answered Yes or "
                f"No, so its probability {answer.probability:.3f} means little"
            )
        if answer.bounds is not None and (answer.bounds[0] > threshold) != (answer.bounds[1] > threshold):
            return (
                f"the judge server reported only its top tokens, which leave the probability between "
                f"{answer.bounds[0]:.3f} and {answer.bounds[1]:.3f}, on both sides of {threshold:.3f}"
            )
        return ""

    def judge(self) -> tuple[list[TurnResult], list[SpeakerResult]]:
        """Verdicts of every turn added so far, in dialogue order, and per speaker in order of appearance."""
        inner_turns, inner_speakers = self._inner.judge()
        turns = [self._verdict(t) for t in inner_turns]
        if self.opts.detect_drift and self.opts.entry.drift is not None:
            turns = attach_drift(turns, self._drift, self.opts.entry.drift)
        return turns, [speaker_result(s.speaker, [t for t in turns if t.speaker == s.speaker]) for s in inner_speakers]

    async def finish_turn(
        self, turn_id: str, speaker: str, position: int, audio: AudioInput, deadline: float | None
    ) -> list[TurnUpdate]:
        """StreamDialogue: hear and judge a completed turn; its verdict first, then every earlier turn whose
        status changed (revision=True), in dialogue order, each with its speaker's verdict."""
        assert self._hear is not None, "a stream's dialogue is opened with a hearing stage"
        self.add_turn(turn_id, speaker, position, await self._hear(audio, f"turn {turn_id!r}", deadline))
        await self.judge_speakers([speaker], deadline)
        results, speakers = self.judge()
        verdicts = {v.speaker: v for v in speakers}
        out = [TurnUpdate(r, False, turn_id, verdicts[r.speaker]) for r in results if r.turn_id == turn_id]
        self._count([out[0].verdict])
        for r in results:
            previous = self._reported.get(r.turn_id)
            if r.turn_id != turn_id and previous is not None and previous is not r.status:
                out.append(TurnUpdate(r, True, turn_id, verdicts[r.speaker]))
            self._reported[r.turn_id] = r.status
        return out

    def result(self) -> DialogueResult:
        """The dialogue's verdict (every speaker judged: CheckDialogue judges all, a stream each turn's)."""
        turns, speakers = self.judge()
        self._count(turns)
        return self.opts.result(self.dialogue_id, turns, speakers)

    def _count(self, turns: Sequence[TurnResult]) -> None:
        for t in turns:
            if t.turn_id not in self._counted:
                self._counted.add(t.turn_id)
                self._observer.verdict(t.status)


def speaker_result(speaker: str, turns: Sequence[TurnResult]) -> SpeakerResult:
    """A speaker's verdict from their turns' (detection: every scored turn CONSISTENT; localization: which
    are INCONSISTENT; UNCERTAIN turns are listed apart, neither flagged nor cleared)."""
    scored = [t for t in turns if t.status in (TurnStatus.CONSISTENT, TurnStatus.INCONSISTENT, TurnStatus.UNCERTAIN)]
    bad = tuple(t.turn_id for t in scored if t.status is TurnStatus.INCONSISTENT)
    unsure = tuple(t.turn_id for t in scored if t.status is TurnStatus.UNCERTAIN)
    return SpeakerResult(
        speaker=speaker,
        judged=bool(scored),
        consistent=bool(scored) and not bad and not unsure,
        inconsistent_turn_ids=bad,
        scored_turns=len(scored),
        unscored_turns=len(turns) - len(scored),
        uncertain_turn_ids=unsure,
    )
