"""Turning one speaker's clip embeddings into per-turn verdicts and a speaker verdict. Pure functions.

Shared by CheckDialogue and StreamDialogue, so a stream's final verdict is exactly what CheckDialogue
gives for the same turns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from sleuthd import scoring
from sleuthd.clips import ClipEmbedding
from sleuthd.domain import SpeakerResult, TurnResult, TurnStatus
from sleuthd.scoring import METHODS, Method


@dataclass(frozen=True)
class Judgment:
    """How turns are judged: a method and its threshold on the method's scale."""

    method: Method
    threshold: float


def stack_embeddings(clips: Sequence[ClipEmbedding]) -> np.ndarray:
    """(n, D) rows of the usable clips' embeddings; (0, 1) when there are none."""
    rows = [c.embedding for c in clips if c.embedding is not None]
    return np.stack(rows) if rows else np.zeros((0, 1), np.float32)


def judge_speaker(
    speaker: str,
    turn_ids: Sequence[str],
    clips: Sequence[ClipEmbedding],
    reference: np.ndarray | None,
    judgment: Judgment,
) -> list[TurnResult]:
    """Verdicts for all of one speaker's audio turns, in the given order.

    Unusable clips are INSUFFICIENT_AUDIO; usable clips without anything to compare with are
    INSUFFICIENT_CONTEXT; the rest are scored by ``judgment.method`` and flagged at its threshold.
    The three paper scores are filled in whenever they are computable.
    """
    usable = [i for i, c in enumerate(clips) if c.embedding is not None]
    emb = stack_embeddings([clips[i] for i in usable])
    pw = scoring.pairwise_mean_cosine(emb) if len(usable) >= 2 else None
    cd = scoring.centroid_cosine_distance(emb) if len(usable) >= 2 else None
    rc = scoring.reference_cosine(emb, reference) if reference is not None and usable else None
    method_scores = {Method.PAIRWISE: pw, Method.CENTROID: cd, Method.REFERENCE: rc}[judgment.method]
    info = METHODS[judgment.method]
    out: list[TurnResult] = []
    for i, (turn_id, clip) in enumerate(zip(turn_ids, clips, strict=True)):
        result = TurnResult(
            turn_id=turn_id,
            speaker=speaker,
            status=TurnStatus.INSUFFICIENT_AUDIO,
            audio_seconds=clip.audio_seconds,
            speech_seconds=clip.speech_seconds,
            detail=clip.detail,
        )
        if not clip.usable:
            out.append(result)
            continue
        k = usable.index(i)
        result = replace(
            result,
            status=TurnStatus.INSUFFICIENT_CONTEXT,
            pairwise_mean_cosine=None if pw is None else float(pw[k]),
            centroid_cosine_distance=None if cd is None else float(cd[k]),
            reference_cosine=None if rc is None else float(rc[k]),
            detail=(
                f"speaker {speaker!r} has no other usable turn to compare with; "
                "send more turns, or a reference and use method reference"
            ),
        )
        if method_scores is not None:
            score = float(method_scores[k])
            bad = bool(scoring.flagged(judgment.method, np.array([score]), judgment.threshold)[0])
            relation = (">" if bad else "<=") if info.flag_above else ("<" if bad else ">=")
            result = replace(
                result,
                status=TurnStatus.INCONSISTENT if bad else TurnStatus.CONSISTENT,
                score=score,
                score_scale=info.scale,
                threshold=judgment.threshold,
                detail=(
                    f"{judgment.method.value}: {info.scale.replace('_', ' ')} {score:.3f} "
                    f"{relation} {judgment.threshold:.3f}"
                ),
            )
        out.append(result)
    return out


def speaker_verdict(speaker: str, turns: Sequence[TurnResult]) -> SpeakerResult:
    scored = [t for t in turns if t.status in (TurnStatus.CONSISTENT, TurnStatus.INCONSISTENT)]
    bad = tuple(t.turn_id for t in scored if t.status is TurnStatus.INCONSISTENT)
    return SpeakerResult(
        speaker=speaker,
        judged=bool(scored),
        consistent=bool(scored) and not bad,
        inconsistent_turn_ids=bad,
        scored_turns=len(scored),
        unscored_turns=len(turns) - len(scored),
    )


def judge_dialogue(
    turns: Sequence[tuple[str, str]],
    clips: Sequence[ClipEmbedding],
    references: dict[str, np.ndarray],
    judgment: Judgment,
) -> tuple[list[TurnResult], list[SpeakerResult]]:
    """Verdicts for every (turn_id, speaker) audio turn, in dialogue order, and per speaker in order of
    first appearance."""
    speakers = list(dict.fromkeys(s for _, s in turns))
    by_turn: dict[str, TurnResult] = {}
    speaker_results = []
    for speaker in speakers:
        idx = [i for i, (_, s) in enumerate(turns) if s == speaker]
        results = judge_speaker(
            speaker, [turns[i][0] for i in idx], [clips[i] for i in idx], references.get(speaker), judgment
        )
        by_turn.update((r.turn_id, r) for r in results)
        speaker_results.append(speaker_verdict(speaker, results))
    return [by_turn[t] for t, _ in turns], speaker_results
