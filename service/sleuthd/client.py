"""Client-side helpers: requests from files on disk, calls with retries, and readable tables.

Used by the CLI (`sleuthd check`, `sleuthd rank`) and by benchmark replay; everything goes through a
real gRPC channel.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc

from sleuthd import convert
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

T = TypeVar("T")

STATUS_NAMES = {
    pb.CONSISTENT: "CONSISTENT",
    pb.INCONSISTENT: "INCONSISTENT",
    pb.INSUFFICIENT_AUDIO: "INSUFFICIENT_AUDIO",
    pb.INSUFFICIENT_CONTEXT: "INSUFFICIENT_CONTEXT",
}
THRESHOLD_SETS = {"default": pb.THRESHOLD_SET_DEFAULT, "paper": pb.THRESHOLD_SET_PAPER}


class DialogueFileError(ValueError):
    """A dialogue JSON file is malformed or names audio that does not exist."""


def channel(target: str, max_message_bytes: int = 128 * 1024 * 1024) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(
        target,
        options=[
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
        ],
    )


def stub(ch: grpc.aio.Channel) -> pb_grpc.SleuthStub:
    return pb_grpc.SleuthStub(ch)


def audio_file(path: Path) -> pb.Audio:
    if not path.is_file():
        raise DialogueFileError(f"audio file {path} does not exist")
    return pb.Audio(encoded=path.read_bytes())


def make_options(
    method: str | None = None, thresholds: str | None = None, threshold: float | None = None, encoder: str = ""
) -> pb.CheckOptions:
    opts = pb.CheckOptions(encoder=encoder)
    if method:
        opts.method = convert.method_from_name(method)  # type: ignore[assignment]
    if thresholds:
        if thresholds not in THRESHOLD_SETS:
            raise DialogueFileError(f"thresholds must be one of {', '.join(THRESHOLD_SETS)}, not {thresholds!r}")
        opts.threshold_set = THRESHOLD_SETS[thresholds]  # type: ignore[assignment]
    if threshold is not None:
        opts.threshold = threshold
    return opts


def dialogue_request_from_file(path: Path) -> pb.CheckDialogueRequest:
    """Read a dialogue JSON file (audio paths relative to the file) into a request.

    Format: {"dialogue_id": str, "turns": [{"turn_id", "speaker", "text"?, "audio"?}],
    "references": {speaker: path}?, "options": {"method"?, "thresholds"?, "threshold"?, "encoder"?}?}
    """
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DialogueFileError(f"cannot read dialogue file {path}: {exc}") from exc
    base = path.parent
    if not isinstance(doc.get("turns"), list):
        raise DialogueFileError(f"{path}: 'turns' must be a list")
    req = pb.CheckDialogueRequest(dialogue_id=str(doc.get("dialogue_id", path.stem)))
    for n, t in enumerate(doc["turns"]):
        missing = [k for k in ("turn_id", "speaker") if k not in t]
        if missing:
            raise DialogueFileError(f"{path}: turns[{n}] lacks {', '.join(missing)}")
        turn = req.turns.add(turn_id=str(t["turn_id"]), speaker=str(t["speaker"]), text=str(t.get("text", "")))
        if t.get("audio"):
            turn.audio.CopyFrom(audio_file(base / t["audio"]))
    for speaker, ref in (doc.get("references") or {}).items():
        req.references.add(speaker=speaker, audio=audio_file(base / ref))
    o = doc.get("options") or {}
    req.options.CopyFrom(make_options(o.get("method"), o.get("thresholds"), o.get("threshold"), o.get("encoder", "")))
    return req


RETRYABLE = (grpc.StatusCode.UNAVAILABLE,)


async def call_with_retries(call: Callable[[], Awaitable[T]], attempts: int = 4, first_backoff_s: float = 0.25) -> T:
    """Retry UNAVAILABLE with exponential backoff; every other status is final."""
    for attempt in range(attempts):
        try:
            return await call()
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in RETRYABLE or attempt == attempts - 1:
                raise
            delay = first_backoff_s * 2**attempt
            logger.warning("%s: %s; retrying in %.2f s", exc.code().name, exc.details(), delay)
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")


def _fmt(msg: Any, field: str, digits: int = 3) -> str:
    return f"{getattr(msg, field):.{digits}f}" if msg.HasField(field) else "—"


def verdict_table(v: pb.DialogueVerdict) -> str:
    """Per-turn verdicts and per-speaker summary as aligned text."""
    method = pb.Method.Name(v.method).removeprefix("METHOD_").lower()
    rows = [("turn", "speaker", "status", "score", "thr", "pairwise", "centroid", "reference", "speech s")]
    for t in v.turns:
        rows.append(
            (
                t.turn_id,
                t.speaker,
                STATUS_NAMES.get(t.status, "?"),
                _fmt(t, "score"),
                _fmt(t, "threshold"),
                _fmt(t, "pairwise_mean_cosine"),
                _fmt(t, "centroid_cosine_distance"),
                _fmt(t, "reference_cosine"),
                f"{t.speech_seconds:.2f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
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
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.append("")
    for s in v.speakers:
        if not s.judged:
            verdict = "NOT JUDGED (no scorable turn)"
        elif s.consistent:
            verdict = "consistent"
        else:
            verdict = f"INCONSISTENT: {', '.join(s.inconsistent_turn_ids)}"
        lines.append(f"speaker {s.speaker}: {verdict} ({s.scored_turns} scored, {s.unscored_turns} unscored)")
    for t in v.turns:
        if t.status in (pb.INSUFFICIENT_AUDIO, pb.INSUFFICIENT_CONTEXT) or t.reason == pb.SPEAKER_CONFUSION:
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
    lines += [f"{c.rank:>3}. {c.candidate_id}  {c.score:.4f}" for c in r.candidates]
    return "\n".join(lines)
