"""Readable text for the CLI: a dialogue verdict as a per-turn table, a ranking as a list, a batch of
dialogues as a summary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sleuthd.v1 import sleuthd_pb2 as pb


def _fmt(msg: Any, field: str, digits: int = 3) -> str:
    return f"{getattr(msg, field):.{digits}f}" if msg.HasField(field) else "—"


def _align(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def verdict_table(v: pb.DialogueVerdict) -> str:
    """Per-turn verdicts and per-speaker summary as aligned text."""
    method = pb.Method.Name(v.method).removeprefix("METHOD_").lower()
    rows = [("turn", "speaker", "status", "score", "thr", "pairwise", "centroid", "reference", "speech s")]
    for t in v.turns:
        rows.append(
            (
                t.turn_id,
                t.speaker,
                pb.TurnStatus.Name(t.status),
                _fmt(t, "score"),
                _fmt(t, "threshold"),
                _fmt(t, "pairwise_mean_cosine"),
                _fmt(t, "centroid_cosine_distance"),
                _fmt(t, "reference_cosine"),
                f"{t.speech_seconds:.2f}",
            )
        )
    scale = next((t.score_scale for t in v.turns if t.score_scale), "")
    flagged = "above" if scale in ("probability", "cosine_distance") else "below"
    meaning = {
        "probability": "probability that the turn does not belong to its speaker",
        "cosine_similarity": "cosine similarity",
        "cosine_distance": "cosine distance",
    }.get(scale, scale or "-")
    lines = [
        f"dialogue {v.dialogue_id}: encoder {v.encoder}, method {method}; score = {meaning}, flagged {flagged} thr",
        "(paper scores: pairwise and reference = cosine similarity, centroid = cosine distance)",
    ]
    lines += _align(rows)
    lines.append("")
    for s in v.speakers:
        if not s.judged:
            verdict = "NOT JUDGED (no scorable turn)"
        elif s.inconsistent_turn_ids:
            verdict = f"INCONSISTENT: {', '.join(s.inconsistent_turn_ids)}"
        elif s.uncertain_turn_ids:
            verdict = f"UNCERTAIN (listen): {', '.join(s.uncertain_turn_ids)}"
        else:
            verdict = "consistent"
        lines.append(f"speaker {s.speaker}: {verdict} ({s.scored_turns} scored, {s.unscored_turns} unscored)")
    for t in v.turns:
        explained = (pb.INSUFFICIENT_AUDIO, pb.INSUFFICIENT_CONTEXT, pb.UNCERTAIN)
        if t.status in explained or t.reason == pb.SPEAKER_CONFUSION:
            lines.append(f"  {t.turn_id}: {t.detail}")
        for seg in t.drift_segments:
            lines.append(
                f"  {t.turn_id}: voice changes between {seg.start_seconds:.1f} s and {seg.end_seconds:.1f} s "
                f"(cosine distance {seg.score:.3f})"
            )
    return "\n".join(lines)


def ranking_table(r: pb.RankCandidatesResponse) -> str:
    scale = r.candidates[0].score_scale if r.candidates else ""
    better = "higher" if r.candidates and r.candidates[0].higher_is_better else "lower"
    lines = [
        f"encoder {r.encoder}, method {pb.Method.Name(r.method).removeprefix('METHOD_').lower()}, "
        f"score = {scale.replace('_', ' ')} ({better} is better), {r.usable_context} usable context clips"
    ]
    calibrated = any(c.HasField("fit_probability") for c in r.candidates)
    rows = [("rank", "candidate", "score", *(("fit p",) if calibrated else ()), "speech s")]
    for c in r.candidates:
        fit = (_fmt(c, "fit_probability"),) if calibrated else ()
        rows.append((f"{c.rank}.", c.candidate_id, f"{c.score:.4f}", *fit, f"{c.speech_seconds:.2f}"))
    lines += _align(rows)
    if calibrated:
        lines.append("(fit p = probability that the candidate belongs to the speaker if it filled the slot)")
    return "\n".join(lines)


def summary_table(rows: Sequence[Sequence[str]]) -> str:
    """A batch of checked dialogues: the header row, one row per dialogue, then the totals by verdict."""
    verdicts = [r[2].lower() for r in rows[1:]]
    totals = ", ".join(f"{verdicts.count(k)} {k}" for k in dict.fromkeys(verdicts))
    return "\n".join([*_align(rows), "", f"{len(verdicts)} dialogues: {totals}"])
