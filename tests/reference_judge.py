"""The judgment as it was before it was vectorised: a slow, obviously-correct reference for the tests.

One Python pass per turn with per-turn leave-one-out centroids and medians over explicit lists, exactly
as sleuthd.judgment.calibration.turn_features and sleuthd.judgment.verdicts.judge_dialogue computed them
(the only change: ``ref_turn_features`` takes its cosines from the pool as given, in float64). Not product code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from sleuthd.domain import FlagReason, SpeakerResult, TurnResult, TurnStatus
from sleuthd.encoders.clips import ClipEmbedding
from sleuthd.judgment import scoring
from sleuthd.judgment.calibration import COHORT_SUFFIX, FEATURES, MIN_DISTANCE, MIN_SPREAD, Calibration
from sleuthd.judgment.scoring import METHODS, Method, unit
from sleuthd.judgment.verdicts import Judgment


def _variant(n: int, has_reference: bool) -> str:
    if n >= 3:
        return "context_reference" if has_reference else "context"
    if n == 2:
        return "pair_reference" if has_reference else "pair"
    return "reference_only"


def _pair_values(sims: np.ndarray, members: np.ndarray) -> np.ndarray:
    sub = sims[np.ix_(members, members)]
    return np.asarray(sub[np.triu_indices(len(members), k=1)])


def ref_turn_features(
    emb: np.ndarray, reference: np.ndarray | None, speech_seconds: np.ndarray, cohort: np.ndarray | None = None
) -> tuple[str, np.ndarray]:
    n = len(emb)
    pool = np.vstack([emb, reference[None, :]]) if reference is not None else emb
    m = len(pool)
    sims = (pool @ pool.T).astype(np.float64)
    log_dur = np.log(np.maximum(speech_seconds, 0.1))
    rows: list[dict[str, float]] = [{"log_speech_seconds": float(log_dur[i])} for i in range(n)]
    nearest_other = (
        (pool @ cohort.T).max(axis=1).astype(np.float64) if cohort is not None and len(cohort) and n >= 2 else None
    )
    for i in range(n):
        row = rows[i]
        turn_others = np.array([j for j in range(n) if j != i], dtype=int)
        others = np.array([j for j in range(m) if j != i], dtype=int)
        if n >= 2:
            row["pair_cosine"] = float(sims[i, turn_others].mean())
        if nearest_other is not None:
            near = float(nearest_other[i])
            own_i = float(sims[i, others].mean())
            row["cohort_position"] = max((own_i - near) / max(1.0 - near, MIN_DISTANCE), -1.0)
        if reference is not None:
            row["reference_cosine"] = float(sims[i, n])
            if n >= 2:
                to_reference = sims[turn_others, n]
                ref_level = float(np.median(to_reference))
                row["reference_gap"] = (ref_level - float(sims[i, n])) / max(1.0 - ref_level, MIN_DISTANCE)
                row["reference_z"] = (ref_level - float(sims[i, n])) / max(float(to_reference.std()), MIN_SPREAD)
        if len(others) >= 2 and n >= 2:
            values = _pair_values(sims, others)
            level = float(np.median(values))
            spread = max(float(values.std()), MIN_SPREAD)
            room = max(1.0 - level, MIN_DISTANCE)
            mean_i, max_i = float(sims[i, others].mean()), float(sims[i, others].max())
            row["context_gap"] = (level - mean_i) / room
            row["context_z"] = (level - mean_i) / spread
            robust_spread = max(1.4826 * float(np.median(np.abs(values - level))), MIN_SPREAD)
            row["context_robust_z"] = (level - mean_i) / robust_spread
            row["nearest_gap"] = (level - max_i) / room
            row["farthest_gap"] = (level - float(sims[i, others].min())) / room
            loo_i = float(pool[i] @ unit(pool[others].mean(axis=0)))
            loo_rest = np.array([float(pool[j] @ unit(pool[others[others != j]].mean(axis=0))) for j in others])
            loo_level = float(np.median(loo_rest))
            row["loo_gap"] = (loo_level - loo_i) / max(1.0 - loo_level, MIN_DISTANCE)
            row["loo_z"] = (loo_level - loo_i) / max(float(loo_rest.std()), MIN_SPREAD)
            row["log_turns"] = float(np.log(n))
            if nearest_other is not None:
                separation = max(level - float(np.median(nearest_other[others])), MIN_DISTANCE)
                row["cohort_gap"] = (level - mean_i) / separation
    if all("context_gap" in r for r in rows) and n >= 3:
        gaps = np.array([r["loo_gap"] for r in rows])
        for i in range(n):
            rows[i]["gap_excess"] = float(gaps[i] - np.median(np.delete(gaps, i)))
    variant = _variant(n, reference is not None) + (COHORT_SUFFIX if nearest_other is not None else "")
    return variant, np.array([[r[f] for f in FEATURES[variant]] for r in rows], dtype=np.float64)


def _stack(clips: Sequence[ClipEmbedding]) -> np.ndarray:
    rows = [c.embedding for c in clips if c.embedding is not None]
    return np.stack(rows) if rows else np.zeros((0, 1))


def _judge_speaker(
    speaker: str,
    turn_ids: Sequence[str],
    clips: Sequence[ClipEmbedding],
    reference: np.ndarray | None,
    judgment: Judgment,
    calibration: Calibration | None,
    cohort: np.ndarray | None,
) -> list[TurnResult]:
    usable = [i for i, c in enumerate(clips) if c.embedding is not None]
    emb = _stack([clips[i] for i in usable])
    pw = scoring.pairwise_mean_cosine(emb) if len(usable) >= 2 else None
    cd = scoring.centroid_cosine_distance(emb) if len(usable) >= 2 else None
    rc = scoring.reference_cosine(emb, reference) if reference is not None and usable else None
    prob, model = None, ""
    if calibration is not None and (len(usable) >= 2 or (usable and reference is not None)):
        seconds = np.array([clips[i].speech_seconds for i in usable])
        model, x = ref_turn_features(emb, reference, seconds, cohort)
        prob = calibration.models[model].probability(x)
    method_scores = {Method.PAIRWISE: pw, Method.CENTROID: cd, Method.REFERENCE: rc, Method.AUTO: prob}[judgment.method]
    info = METHODS[judgment.method]
    out: list[TurnResult] = []
    for i, (turn_id, clip) in enumerate(zip(turn_ids, clips, strict=True)):
        result = TurnResult(turn_id, speaker, TurnStatus.INSUFFICIENT_AUDIO, clip.audio_seconds, clip.speech_seconds)
        if not clip.usable:
            out.append(replace(result, detail=clip.detail))
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
                    f"{judgment.method.value}{f' ({model} model)' if judgment.method is Method.AUTO else ''}: "
                    f"{info.scale.replace('_', ' ')} {score:.3f} {relation} {judgment.threshold:.3f}"
                ),
            )
        out.append(result)
    return out


def ref_judge_dialogue(
    turns: Sequence[tuple[str, str]],
    clips: Sequence[ClipEmbedding],
    references: dict[str, np.ndarray],
    judgment: Judgment,
) -> tuple[list[TurnResult], list[SpeakerResult]]:
    """(turn_id, speaker) turns in dialogue order -> verdicts, as the pre-vectorised judge gave them."""
    speakers = list(dict.fromkeys(s for _, s in turns))
    by_speaker: dict[str, list[int]] = {}
    for i, ((_, s), c) in enumerate(zip(turns, clips, strict=True)):
        if c.embedding is not None:
            by_speaker.setdefault(s, []).append(i)
    centroids = {s: unit(_stack([clips[i] for i in idx]).mean(axis=0)) for s, idx in by_speaker.items()}
    by_turn: dict[str, TurnResult] = {}
    for speaker in speakers:
        idx = [i for i, (_, s) in enumerate(turns) if s == speaker]
        others = [c for s, c in centroids.items() if s != speaker]
        results = _judge_speaker(
            speaker,
            [turns[i][0] for i in idx],
            [clips[i] for i in idx],
            references.get(speaker),
            judgment,
            judgment.calibration,
            np.stack(others) if others else None,
        )
        by_turn.update((r.turn_id, r) for r in results)
    if len(by_speaker) >= 2:
        for speaker, idx in by_speaker.items():
            for i in idx:
                e = clips[i].embedding
                assert e is not None
                others_of_own = [clips[j].embedding for j in idx if j != i]
                if others_of_own:
                    own = float(e @ unit(np.mean(others_of_own, axis=0)))
                elif speaker in references:
                    own = float(e @ references[speaker])
                else:
                    continue
                rivals = {s: float(e @ c) for s, c in centroids.items() if s != speaker}
                rival, rival_cos = max(rivals.items(), key=lambda kv: kv[1])
                margin = own - rival_cos
                closest = speaker if margin >= 0 else rival
                r = replace(by_turn[turns[i][0]], closest_speaker=closest, closest_speaker_margin=margin)
                if judgment.method is Method.AUTO and closest != speaker:
                    r = replace(
                        r,
                        status=TurnStatus.INCONSISTENT,
                        reason=FlagReason.SPEAKER_CONFUSION,
                        detail=(
                            f"sounds closer to speaker {closest!r} than to {speaker!r} "
                            f"(cosine margin {margin:.3f}); {r.detail}"
                        ),
                    )
                by_turn[turns[i][0]] = r
    ordered = [by_turn[t] for t, _ in turns]
    verdicts = []
    for s in speakers:
        mine = [r for r in ordered if r.speaker == s]
        scored = [t for t in mine if t.status in (TurnStatus.CONSISTENT, TurnStatus.INCONSISTENT)]
        bad = tuple(t.turn_id for t in scored if t.status is TurnStatus.INCONSISTENT)
        verdicts.append(
            SpeakerResult(s, bool(scored), bool(scored) and not bad, bad, len(scored), len(mine) - len(scored))
        )
    return ordered, verdicts
