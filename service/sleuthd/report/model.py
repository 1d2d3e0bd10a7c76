"""What a report shows, as plain JSON for the page: checked dialogues and rankings with their audio.

The page gets one compact object per dialogue (short keys, numbers rounded to 4 decimals: a thousand
ten-turn dialogues are about 3 MB), so it parses everything at once and renders only what is on screen.
Statuses are passed through as the server names them, so a status this code has never heard of (say
``uncertain``) still shows, counts and filters.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sleuthd.client.requests import Turn
from sleuthd.client.results import EncoderScores, Ranking, TurnVerdict, Verdict
from sleuthd.report.audio import AudioSource, AudioStore, ReportError

# Dialogue outcomes the page knows how to rank and colour; any other turn status a verdict carries
# becomes an outcome of its own, ranked between "inconsistent" and "unjudged".
INCONSISTENT, UNJUDGED, CONSISTENT, ERROR = "inconsistent", "unjudged", "consistent", "error"
KNOWN_TURN_STATUSES = {"consistent", "inconsistent", "insufficient_audio", "insufficient_context"}


@dataclass(frozen=True)
class CheckedDialogue:
    """One checked dialogue and the audio that was sent, as the report shows it.

    ``turn_audio``: turn id -> audio (path, encoded bytes or (samples, rate)); ``references``: speaker ->
    reference audio; ``voices``: speaker -> the registered voice id used instead (nothing to play);
    ``texts``: turn id -> transcript. ``verdict`` None: the check failed, and ``error`` says why."""

    verdict: Verdict | None
    turn_audio: Mapping[str, AudioSource] = field(default_factory=dict)
    references: Mapping[str, AudioSource] = field(default_factory=dict)
    voices: Mapping[str, str] = field(default_factory=dict)
    texts: Mapping[str, str] = field(default_factory=dict)
    dialogue_id: str = ""  # "" = the verdict's
    source: str = ""  # where the dialogue came from (a file, FILE:LINE)
    error: str = ""

    @classmethod
    def from_turns(
        cls,
        verdict: Verdict,
        turns: Iterable[Turn | tuple[str, AudioSource]],
        references: Mapping[str, AudioSource] | None = None,
        voices: Mapping[str, str] | None = None,
        sample_rate: int | None = None,
    ) -> CheckedDialogue:
        """From the arguments given to ``SleuthClient.check`` (turn ids default to t1, t2, ... as there)."""
        audio: dict[str, AudioSource] = {}
        texts: dict[str, str] = {}
        for n, item in enumerate(turns):
            t = item if isinstance(item, Turn) else Turn(*item)
            turn_id = t.turn_id or f"t{n + 1}"
            if t.audio is not None:
                rate = t.sample_rate or sample_rate
                is_array = hasattr(t.audio, "__array_interface__") or hasattr(t.audio, "__array__")
                audio[turn_id] = (t.audio, rate) if is_array and not isinstance(t.audio, bytes) else t.audio
            if t.text:
                texts[turn_id] = t.text
        refs = {s: (a, sample_rate) if hasattr(a, "__array__") else a for s, a in (references or {}).items()}
        return cls(verdict, audio, refs, dict(voices or {}), texts)

    @property
    def outcome(self) -> str:
        """``error``, ``inconsistent``, another status some turn has (e.g. ``uncertain``), ``unjudged`` or
        ``consistent``: the first that applies."""
        v = self.verdict
        if v is None:
            return ERROR
        statuses = {t.status for t in v.turns}
        if INCONSISTENT in statuses:
            return INCONSISTENT
        other = sorted(statuses - KNOWN_TURN_STATUSES)
        if other:
            return other[0]
        return CONSISTENT if v.judged else UNJUDGED


def _num(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return round(float(x), 4)


def _encoder(e: EncoderScores) -> list[Any]:
    return [e.encoder, _num(e.pairwise_mean_cosine), _num(e.centroid_cosine_distance), _num(e.reference_cosine)]


def _turn(t: TurnVerdict, d: CheckedDialogue, store: AudioStore, drift: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": t.turn_id,
        "s": t.speaker,
        "st": t.status,
        "p": _num(t.inconsistency_probability),
        "sc": _num(t.score),
        "scale": t.score_scale,
        "th": _num(t.threshold),
        "r": t.reason,
        "cl": t.closest_speaker,
        "mg": _num(t.closest_speaker_margin),
        "sp": _num(t.speech_seconds),
        "au": _num(t.audio_seconds),
        "d": t.detail,
        "tx": d.texts.get(t.turn_id, ""),
        "pw": _num(t.pairwise_mean_cosine),
        "cd": _num(t.centroid_cosine_distance),
        "rc": _num(t.reference_cosine),
        "e": [_encoder(e) for e in t.encoder_scores],
        "dr": _num(t.drift_score),
        "seg": [[_num(s.start_seconds), _num(s.end_seconds), _num(s.score)] for s in t.drift_segments],
        "a": None,
        "w": None,
    }
    source = d.turn_audio.get(t.turn_id)
    if source is not None:
        clip = store.add(source, f"turn {t.turn_id!r}")
        out["a"], out["an"] = clip.url, clip.name
        if drift:  # the waveform is drawn only where drift was asked for
            out["w"] = store.sidecar(clip)
    return out


def dialogue_json(index: int, d: CheckedDialogue, store: AudioStore) -> dict[str, Any]:
    """The page's object for one dialogue; its audio is stored on the way."""
    v = d.verdict
    out: dict[str, Any] = {
        "i": index,
        "id": d.dialogue_id or (v.dialogue_id if v is not None else "") or f"#{index + 1}",
        "src": d.source,
        "o": d.outcome,
        "err": d.error,
    }
    if v is None:
        return {**out, "sp": [], "t": [], "sim": None, "pmax": None, "nf": 0}
    drift = any(t.drift_score is not None for t in v.turns)
    turns = [_turn(t, d, store, drift) for t in v.turns]
    speakers = []
    for s in v.speakers:
        ref = d.references.get(s.speaker)
        clip = store.add(ref, f"reference of {s.speaker!r}") if ref is not None else None
        speakers.append({
            "n": s.speaker, "j": s.judged, "c": s.consistent, "f": list(s.inconsistent_turns),
            "scored": s.scored_turns, "unscored": s.unscored_turns,
            "ref": clip.url if clip else None, "refn": clip.name if clip else "", "voice": d.voices.get(s.speaker, ""),
        })  # fmt: skip
    probs = [t.inconsistency_probability for t in v.turns if t.inconsistency_probability is not None]
    sim = None
    if v.similarity is not None:
        sim = {"ids": list(v.similarity.turn_ids), "c": [_num(c) for c in v.similarity.cosines]}
    return {
        **out,
        "enc": v.encoder,
        "m": v.method,
        "ts": v.threshold_set,
        "drift": drift,
        "sp": speakers,
        "t": turns,
        "sim": sim,
        "pmax": _num(max(probs)) if probs else None,
        "nf": len(v.inconsistent_turns),
    }


@dataclass(frozen=True)
class RankedCandidates:
    """A ranking and the audio behind it: ``candidates``: candidate id -> audio; ``context``: the speaker's
    other turns; ``reference``: the reference clip, or ``reference_voice``: the registered voice used."""

    ranking: Ranking
    candidates: Mapping[str, AudioSource]
    context: Sequence[AudioSource] = ()
    reference: AudioSource = None
    reference_voice: str = ""
    speaker: str = ""


def ranking_json(r: RankedCandidates, store: AudioStore) -> dict[str, Any]:
    missing = [c.candidate_id for c in r.ranking.candidates if c.candidate_id not in r.candidates]
    if missing:
        raise ReportError(f"no audio given for candidate(s) {', '.join(missing)}: pass every ranked candidate's audio")
    cands = []
    for c in r.ranking.candidates:
        clip = store.add(r.candidates[c.candidate_id], f"candidate {c.candidate_id!r}")
        cands.append({
            "id": c.candidate_id, "rank": c.rank, "sc": _num(c.score), "scale": c.score_scale,
            "hib": c.higher_is_better, "sp": _num(c.speech_seconds), "fit": _num(c.fit_probability),
            "a": clip.url, "an": clip.name,
        })  # fmt: skip
    context = []
    for n, a in enumerate(r.context):
        clip = store.add(a, f"context clip #{n}")
        context.append({"a": clip.url, "an": clip.name})
    ref = store.add(r.reference, "reference") if r.reference is not None else None
    return {
        "speaker": r.speaker,
        "enc": r.ranking.encoder,
        "m": r.ranking.method,
        "usable": r.ranking.usable_context,
        "cands": cands,
        "ctx": context,
        "ref": {"a": ref.url, "an": ref.name} if ref else None,
        "voice": r.reference_voice,
    }
