"""A dialogue judged by the LALM judge (method lalm): the second implementation of the Dialogue protocol.

Each turn is heard twice from one decode (the listener, sleuthd.encoders.embedder.ClipEmbedder.hear): its
embedding goes into an ordinary :class:`~sleuthd.judgment.dialogue.EncoderDialogue`, which supplies what
every method's verdict carries (INSUFFICIENT_AUDIO, the paper scores, auto's probability when the encoder
is calibrated, attribution; drift is attached here, after the judge's detail), and its waveform goes to
the judge. The judge decides the status: per speaker, each usable turn against the reference clip and the
speaker's nearest other turns (``Judge.detect_turns``), INCONSISTENT when its probability of a different
speaker is above the threshold.

The judge's answers are kept per turn with the context turns they were asked with. When a streamed turn
completes, only the prompts whose context changed are asked again (the new turn and its nearest
neighbours: about ``max_context_clips / 2 + 1`` prompts per turn), so each turn's verdict and the revisions
it causes come at once, and the stream's final verdict is made of exactly the prompts CheckDialogue asks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

import numpy as np

from sleuthd.aio import gather_or_cancel
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
from sleuthd.encoders.clips import Heard
from sleuthd.errors import LimitExceeded
from sleuthd.judgment.calibration import Calibration
from sleuthd.judgment.dialogue import EncoderDialogue, TurnAudio, VerdictLedger
from sleuthd.judgment.drift import attach_drift, find_drift
from sleuthd.judgment.options import ResolvedOptions
from sleuthd.judgment.scoring import Method
from sleuthd.judgment.verdicts import Judgment, speaker_verdict
from sleuthd.lalm.judge import Judge, nearest_context
from sleuthd.lalm.types import JudgeProbability
from sleuthd.ops.observe import EngineObserver, NullObserver

# Hears a request's clips (each with a label for errors): a waveform and its embeddings per clip
# (sleuthd.engine.judging.LalmJudging.hear_all).
HearAll = Callable[[Sequence[tuple[AudioInput, str]], float | None], Awaitable[list[Heard]]]


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
        hear: HearAll,
        max_audio_bytes: int | None = None,
    ) -> None:
        """``references``: each speaker's reference embedding; ``reference_waves``: the same clips' waveforms.
        ``max_audio_bytes``: a bound on the waveforms kept (streams; a CheckDialogue's size bounds its own)."""
        self.dialogue_id = dialogue_id
        self.opts = opts
        self.references = references
        self._reference_waves = reference_waves
        self._judge = judge
        self._hear = hear
        self._max_audio_bytes = max_audio_bytes
        self._ledger = VerdictLedger(observer)
        self._inner = EncoderDialogue(dialogue_id, embedding_options(opts), references, NullObserver())
        self._speaker: dict[str, str] = {}  # turn_id -> speaker
        self._position: dict[str, int] = {}
        self._waves: dict[str, np.ndarray] = {}  # usable turns only
        self._held = sum(w.nbytes for w in reference_waves.values())
        self._answers: dict[str, tuple[tuple[str, ...], JudgeProbability]] = {}  # turn -> (context, answer)
        self._drift: dict[str, DriftResult | None] = {}  # searched turns only

    def __len__(self) -> int:
        return len(self._inner)

    @property
    def kept_audio_bytes(self) -> int:
        return self._held

    def close(self) -> None:
        """Nothing to let go of here: the stream session holds the kept waveforms' bytes in its audio budget."""

    # ------------------------------------------------------------------ the Dialogue protocol

    async def add_turns(self, turns: Sequence[TurnAudio], deadline: float | None) -> None:
        heard = await self._hear([(t.audio, t.label) for t in turns], deadline)
        for turn, h in zip(turns, heard, strict=True):
            self._add(turn, h)

    async def finish_turn(self, turn: TurnAudio, deadline: float | None) -> list[TurnUpdate]:
        await self.add_turns([turn], deadline)
        await self._judge_speakers([turn.speaker], deadline)
        results, speakers = self._verdicts()
        verdicts = {v.speaker: v for v in speakers}
        new = next(r for r in results if r.turn_id == turn.turn_id)
        self._ledger.count([new])
        revised = set(self._ledger.revisions(((r.turn_id, r.status) for r in results), turn.turn_id))
        return [TurnUpdate(new, False, turn.turn_id, verdicts[new.speaker])] + [
            TurnUpdate(r, True, turn.turn_id, verdicts[r.speaker]) for r in results if r.turn_id in revised
        ]

    async def result(self, deadline: float | None) -> DialogueResult:
        """Every speaker judged (a CheckDialogue asks the judge here; a stream has asked turn by turn)."""
        await self._judge_speakers(list(dict.fromkeys(self._speaker.values())), deadline)
        turns, speakers = self._verdicts()
        self._ledger.count(turns)
        return self.opts.result(self.dialogue_id, turns, speakers, self._inner.similarity())

    # ------------------------------------------------------------------ hearing and asking

    def _add(self, turn: TurnAudio, heard: Heard) -> None:
        """A completed turn at its position in the dialogue (not judged yet: see :meth:`_judge_speakers`)."""
        if heard.clip.usable:
            if self._max_audio_bytes is not None and self._held + heard.samples.nbytes > self._max_audio_bytes:
                raise LimitExceeded(
                    f"this stream would keep {self._held + heard.samples.nbytes} bytes of decoded audio for the "
                    f"judge (it hears earlier turns again as context); the limit is {self._max_audio_bytes} "
                    "(--judge-max-stream-audio-mb): open a new stream for the rest of the dialogue"
                )
            self._waves[turn.turn_id] = heard.samples
            self._held += heard.samples.nbytes
        self._speaker[turn.turn_id] = turn.speaker
        self._position[turn.turn_id] = turn.position
        self._inner.add_clip(turn.turn_id, turn.speaker, turn.position, heard.clip)
        config = self.opts.entry.drift
        if self.opts.detect_drift and config is not None and heard.clip.usable and len(heard.clips) > 1:
            dense = heard.clips[1]
            self._drift[turn.turn_id] = find_drift(dense.window_embeddings, dense.window_times, config)

    async def _judge_speakers(self, speakers: Sequence[str], deadline: float | None) -> None:
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

    def _verdicts(self) -> tuple[list[TurnResult], list[SpeakerResult]]:
        """Verdicts of every turn added so far, in dialogue order, and per speaker in order of appearance."""
        inner_turns, inner_speakers = self._inner.judge()
        turns = [self._verdict(t) for t in inner_turns]
        if self.opts.detect_drift and self.opts.entry.drift is not None:
            turns = attach_drift(turns, self._drift, self.opts.entry.drift)
        speakers = [
            speaker_verdict(s.speaker, [(t.turn_id, t.status) for t in turns if t.speaker == s.speaker])
            for s in inner_speakers
        ]
        return turns, speakers
