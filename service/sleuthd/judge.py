"""Turning clip embeddings into per-turn and per-speaker verdicts. Pure functions.

Shared by CheckDialogue and StreamDialogue, so a stream's final verdict is exactly what CheckDialogue
gives for the same turns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from sleuthd import scoring
from sleuthd.calibration import Calibration, inconsistency_probability
from sleuthd.clips import ClipEmbedding
from sleuthd.domain import FlagReason, SpeakerResult, TurnResult, TurnStatus
from sleuthd.scoring import METHODS, Method, unit


@dataclass(frozen=True)
class Judgment:
    """How turns are judged: a method, its threshold on the method's scale, and the encoder's
    calibration (None when the encoder has none; required for Method.AUTO)."""

    method: Method
    threshold: float
    calibration: Calibration | None = None


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
    cohort: np.ndarray | None = None,
) -> list[TurnResult]:
    """Verdicts for all of one speaker's audio turns, in the given order (no attribution).

    Unusable clips are INSUFFICIENT_AUDIO; usable clips without anything to compare with are
    INSUFFICIENT_CONTEXT; the rest are scored by ``judgment.method``. The three paper scores and, with
    a calibration, the inconsistency probability are filled in whenever they are computable; ``cohort``
    ((c, D) centroids of the dialogue's other speakers) normalises that probability (auto only).
    """
    usable = [i for i, c in enumerate(clips) if c.embedding is not None]
    emb = stack_embeddings([clips[i] for i in usable])
    pw = scoring.pairwise_mean_cosine(emb) if len(usable) >= 2 else None
    cd = scoring.centroid_cosine_distance(emb) if len(usable) >= 2 else None
    rc = scoring.reference_cosine(emb, reference) if reference is not None and usable else None
    prob, model = None, ""
    if judgment.calibration is not None and (len(usable) >= 2 or (usable and reference is not None)):
        seconds = np.array([clips[i].speech_seconds for i in usable])
        model, prob = inconsistency_probability(judgment.calibration, emb, reference, seconds, cohort)
    method_scores = {Method.PAIRWISE: pw, Method.CENTROID: cd, Method.REFERENCE: rc, Method.AUTO: prob}[judgment.method]
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
            inconsistency_probability=None if prob is None else float(prob[k]),
            detail=(
                f"speaker {speaker!r} has no other usable turn to compare with; "
                "send more turns, or a reference and use method reference or auto"
            ),
        )
        if method_scores is not None:
            score = float(method_scores[k])
            bad = bool(scoring.flagged(judgment.method, np.array([score]), judgment.threshold)[0])
            relation = (">" if bad else "<=") if info.flag_above else ("<" if bad else ">=")
            result = replace(
                result,
                status=TurnStatus.INCONSISTENT if bad else TurnStatus.CONSISTENT,
                reason=FlagReason.SCORE_THRESHOLD if bad else FlagReason.NONE,
                score=score,
                score_scale=info.scale,
                threshold=judgment.threshold,
                detail=(
                    # auto names the fitted model it used (which evidence it had, cohort or not).
                    f"{judgment.method.value}{f' ({model} model)' if judgment.method is Method.AUTO else ''}: "
                    f"{info.scale.replace('_', ' ')} {score:.3f} {relation} {judgment.threshold:.3f}"
                ),
            )
        out.append(result)
    return out


def _usable_by_speaker(turns: Sequence[tuple[str, str]], clips: Sequence[ClipEmbedding]) -> dict[str, list[int]]:
    """Speaker -> indices of their turns with a usable embedding (speakers without any are left out)."""
    by_speaker: dict[str, list[int]] = {}
    for i, ((_, speaker), clip) in enumerate(zip(turns, clips, strict=True)):
        if clip.embedding is not None:
            by_speaker.setdefault(speaker, []).append(i)
    return by_speaker


def speaker_centroids(turns: Sequence[tuple[str, str]], clips: Sequence[ClipEmbedding]) -> dict[str, np.ndarray]:
    """Speaker -> unit centroid of all their usable turns (the voice other speakers are compared with)."""
    return {
        s: unit(stack_embeddings([clips[i] for i in idx]).mean(axis=0))
        for s, idx in _usable_by_speaker(turns, clips).items()
    }


def attribute(
    turns: Sequence[tuple[str, str]],
    clips: Sequence[ClipEmbedding],
    references: dict[str, np.ndarray],
    centroids: dict[str, np.ndarray],
) -> dict[str, tuple[str, float]]:
    """For each usable turn, the dialogue speaker it sounds closest to and the margin (cosine).

    Own evidence: the centroid of the speaker's OTHER usable turns (leave-one-out), else the speaker's
    reference. Other speakers: their ``centroids`` (speaker_centroids: of all their usable turns).
    Margin = cos(own) - max cos(other); no threshold is involved. Empty when fewer than two speakers
    have usable audio.
    """
    by_speaker = _usable_by_speaker(turns, clips)
    if len(by_speaker) < 2:
        return {}
    emb: dict[int, np.ndarray] = {}
    for idx in by_speaker.values():
        for i in idx:
            e_i = clips[i].embedding
            assert e_i is not None
            emb[i] = e_i
    out: dict[str, tuple[str, float]] = {}
    for speaker, idx in by_speaker.items():
        for i in idx:
            e = emb[i]
            others_of_own = [emb[j] for j in idx if j != i]
            if others_of_own:
                own = float(e @ unit(np.mean(others_of_own, axis=0)))
            elif speaker in references:
                own = float(e @ references[speaker])
            else:
                continue  # nothing of its own speaker to compare with
            rivals = {s: float(e @ c) for s, c in centroids.items() if s != speaker}
            rival, rival_cos = max(rivals.items(), key=lambda kv: kv[1])
            margin = own - rival_cos
            out[turns[i][0]] = (speaker if margin >= 0 else rival, margin)
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
    first appearance. The other speakers' voices are each speaker's cohort; under auto, a turn closer
    to another speaker is also flagged SPEAKER_CONFUSION."""
    speakers = list(dict.fromkeys(s for _, s in turns))
    centroids = speaker_centroids(turns, clips)
    by_turn: dict[str, TurnResult] = {}
    for speaker in speakers:
        idx = [i for i, (_, s) in enumerate(turns) if s == speaker]
        others = [c for s, c in centroids.items() if s != speaker]
        results = judge_speaker(
            speaker,
            [turns[i][0] for i in idx],
            [clips[i] for i in idx],
            references.get(speaker),
            judgment,
            np.stack(others) if others else None,
        )
        by_turn.update((r.turn_id, r) for r in results)
    for turn_id, (closest, margin) in attribute(turns, clips, references, centroids).items():
        r = replace(by_turn[turn_id], closest_speaker=closest, closest_speaker_margin=margin)
        if judgment.method is Method.AUTO and closest != r.speaker:
            r = replace(
                r,
                status=TurnStatus.INCONSISTENT,
                reason=FlagReason.SPEAKER_CONFUSION,
                detail=(
                    f"sounds closer to speaker {closest!r} than to {r.speaker!r} "
                    f"(cosine margin {margin:.3f}); {r.detail}"
                ),
            )
        by_turn[turn_id] = r
    ordered = [by_turn[t] for t, _ in turns]
    verdicts = [speaker_verdict(s, [r for r in ordered if r.speaker == s]) for s in speakers]
    return ordered, verdicts
