"""Readable text for the CLI: a dialogue verdict as a per-turn table, a ranking as a list, a batch of
dialogues as a summary, registered voices, and an RPC's failure with what to try."""

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
    if any(t.HasField("score") for t in v.turns):
        flagged = "above" if scale in ("probability", "cosine_distance") else "below"
        meaning = {
            "probability": "probability that the turn does not belong to its speaker",
            "cosine_similarity": "cosine similarity",
            "cosine_distance": "cosine distance",
        }.get(scale, scale or "-")
        what = f"score = {meaning}, flagged {flagged} thr"
    else:  # a scale and a threshold direction would describe scores that do not exist
        what = "no turn was scored (each turn's reason is below)"
    lines = [
        f"dialogue {v.dialogue_id}: encoder {v.encoder}, method {method}; {what}",
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
    judged = any(c.HasField("fit_status") for c in r.candidates)
    fit_head = (("fit p",) if calibrated else ()) + (("verdict",) if judged else ())
    rows = [("rank", "candidate", "score", *fit_head, "speech s")]
    for c in r.candidates:
        fit: tuple[str, ...] = (_fmt(c, "fit_probability"),) if calibrated else ()
        if judged:
            fit += (pb.TurnStatus.Name(c.fit_status).lower() if c.HasField("fit_status") else "-",)
        rows.append((f"{c.rank}.", c.candidate_id, f"{c.score:.4f}", *fit, f"{c.speech_seconds:.2f}"))
    lines += _align(rows)
    if calibrated:
        lines.append("(fit p = probability that the candidate belongs to the speaker if it filled the slot)")
    if judged:
        lines.append("(verdict = what CheckDialogue would say of the candidate in the slot)")
    return "\n".join(lines)


def summary_table(rows: Sequence[Sequence[str]]) -> str:
    """A batch of checked dialogues: the header row, one row per dialogue, then the totals by verdict."""
    verdicts = [r[2].lower() for r in rows[1:]]
    totals = ", ".join(f"{verdicts.count(k)} {k}" for k in dict.fromkeys(verdicts))
    return "\n".join([*_align(rows), "", f"{len(verdicts)} dialogues: {totals}"])


def voices_table(voices: Sequence[Any]) -> str:
    """Registered voices (sleuthd.client.VoiceInfo), one line each."""
    rows = [("voice", "revision", "speech s", "clips", "encoders", "updated (UTC)", "metadata")]
    for v in voices:
        rows.append(
            (
                v.voice_id,
                str(v.revision),
                f"{v.speech_seconds:.2f}",
                str(len(v.clips)),
                ", ".join(e.encoder for e in v.embeddings) or "-",
                v.updated_at.strftime("%Y-%m-%d %H:%M:%S"),
                ", ".join(f"{k}={val}" for k, val in sorted(v.metadata.items())) or "-",
            )
        )
    return "\n".join(_align(rows))


def voice_text(v: Any) -> str:
    """One registered voice (sleuthd.client.VoiceInfo) in full: its clips and its embeddings."""
    lines = [
        f"voice {v.voice_id}: revision {v.revision}, {v.speech_seconds:.2f} s of speech in {len(v.clips)} clip(s), "
        f"audio {'kept' if v.audio_kept else 'not kept'}",
        f"registered {v.created_at:%Y-%m-%d %H:%M:%S} UTC, updated {v.updated_at:%Y-%m-%d %H:%M:%S} UTC",
    ]
    for k, val in sorted(v.metadata.items()):
        lines.append(f"  {k} = {val}")
    rows: list[tuple[str, ...]] = [
        ("clip", "sha256", "bytes", "audio s", "speech s", "band kHz", "clipped %", "SNR dB", "low band dB")
    ]
    for n, c in enumerate(v.clips):
        # "-": registered before it was recorded (or too short or silent to tell)
        band = "-" if c.bandwidth_hz is None else f"{c.bandwidth_hz / 1000:.1f}"
        clipped = "-" if c.clipped_fraction is None else f"{100 * c.clipped_fraction:.2f}"
        snr = "-" if c.snr_db is None else f"{c.snr_db:.1f}"
        low = "-" if c.low_band_db is None else f"{c.low_band_db:.1f}"
        rows.append(
            (f"#{n}", c.sha256[:16], str(c.size_bytes), f"{c.audio_seconds:.2f}", f"{c.speech_seconds:.2f}", band,
             clipped, snr, low)
        )  # fmt: skip
    lines += _align(rows)
    embedded: list[tuple[str, ...]] = [("encoder", "weights sha256", "dimension", "loaded")]
    for e in v.embeddings:
        embedded.append((e.encoder, e.weights_sha256[:16], str(e.dimension), "yes" if e.loaded else "no"))
    lines += _align(embedded)
    return "\n".join(lines)


def explain_rpc_error(code: str, details: str, tls: bool) -> str:
    """An RPC's failure as the CLI reports it (``details``, the server's or gRPC's message), with what to try
    when the details show that the connection's security does not match the server's. ``tls``: whether the
    call went over TLS. The one place the CLI words RPC errors (check, rank, health, voices)."""
    hint = ""
    if code == "UNAVAILABLE":
        if not tls and "Socket closed" in details:
            # A TLS server hangs up on a plaintext HTTP/2 preface without a word: gRPC sees only the socket close.
            hint = (
                "the server may require TLS: connect with --tls (a certificate from a public CA) or "
                "--tls-root-ca CA.pem (its CA's certificate)"
            )
        elif tls and "WRONG_VERSION_NUMBER" in details:
            hint = "the server may not speak TLS: connect without --tls and the --tls-* flags"
        elif tls and "CERTIFICATE_VERIFY_FAILED" in details:
            hint = (
                "the server's certificate is not trusted: give --tls-root-ca with the CA that signed it "
                "(and --tls-server-name when it names another host)"
            )
    return f"{details} ({hint})" if hint else details
