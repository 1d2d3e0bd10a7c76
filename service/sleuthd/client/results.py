"""What the server answers, as frozen dataclasses: a dialogue's verdict, a ranking, a registered voice.

Every number keeps the scale the proto documents (proto/sleuthd/v1/sleuthd.proto); a value the server
did not compute is None, never 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sleuthd.v1 import sleuthd_pb2 as pb


def _opt(msg: Any, name: str) -> float | None:
    return float(getattr(msg, name)) if msg.HasField(name) else None


def _name(enum: Any, value: int, prefix: str = "") -> str:
    return str(enum.Name(value)).removeprefix(prefix).lower()


@dataclass(frozen=True)
class DriftSegment:
    start_seconds: float  # from the start of the turn's decoded audio
    end_seconds: float
    score: float  # cosine distance between the voice before and after; larger = stronger change


@dataclass(frozen=True)
class EncoderScores:
    """One encoder's own paper scores of a turn judged with the fused encoder."""

    encoder: str
    pairwise_mean_cosine: float | None
    centroid_cosine_distance: float | None
    reference_cosine: float | None


@dataclass(frozen=True)
class TurnVerdict:
    turn_id: str
    speaker: str
    # "consistent", "inconsistent", "uncertain" (scored, but neither flagged nor cleared: listen to it),
    # "insufficient_audio" or "insufficient_context"
    status: str
    score: float | None  # the method's score on score_scale; None when not scored
    score_scale: str  # "cosine_similarity", "cosine_distance" or "probability"
    threshold: float | None  # on score_scale
    inconsistency_probability: float | None  # P(the turn does not belong to its speaker), 0..1
    pairwise_mean_cosine: float | None  # the three paper scores (cosine similarity / distance)
    centroid_cosine_distance: float | None
    reference_cosine: float | None
    audio_seconds: float
    speech_seconds: float  # after silence trimming
    detail: str  # why a turn was not scored, or why it was flagged
    reason: str  # "" , "score_threshold" or "speaker_confusion" (why it was flagged)
    closest_speaker: str
    closest_speaker_margin: float | None  # cosine: own speaker minus the closest other speaker
    drift_score: float | None  # only when drift detection was asked for
    drift_segments: tuple[DriftSegment, ...]
    encoder_scores: tuple[EncoderScores, ...] = ()  # with the fused encoder: each encoder it joins
    # Why the turn is uncertain: "out_of_support", "own_turns_dissimilar", "low_answer_mass"; "" otherwise.
    uncertain_reason: str = ""
    bandwidth_hz: float | None = None  # the turn's effective bandwidth (fused encoder), Hz
    compared_below_hz: float | None = None  # set when its speaker was judged on clips low-passed below this
    clipped_fraction: float | None = None  # share of the turn's samples at its peak, 0-1 (fused encoder)
    compared_clipped_fraction: float | None = None  # set when its speaker was judged on copies clipped to this
    snr_db: float | None = None  # the turn's estimated SNR, dB, at most 20 (fused encoder)
    compared_snr_db: float | None = None  # set when its speaker was judged on copies with noise added to this SNR
    low_band_db: float | None = None  # the turn's power at 60-250 Hz over 300-3400 Hz, dB (fused encoder)
    compared_above_hz: float | None = None  # set when its speaker's copies also lost the band below this (telephone)

    @property
    def inconsistent(self) -> bool:
        return self.status == "inconsistent"

    @property
    def uncertain(self) -> bool:
        return self.status == "uncertain"

    @property
    def scored(self) -> bool:
        return self.score is not None

    @classmethod
    def from_pb(cls, t: pb.TurnVerdict) -> TurnVerdict:
        return cls(
            turn_id=t.turn_id,
            speaker=t.speaker,
            status=_name(pb.TurnStatus, t.status),
            score=_opt(t, "score"),
            score_scale=t.score_scale,
            threshold=_opt(t, "threshold"),
            inconsistency_probability=_opt(t, "inconsistency_probability"),
            pairwise_mean_cosine=_opt(t, "pairwise_mean_cosine"),
            centroid_cosine_distance=_opt(t, "centroid_cosine_distance"),
            reference_cosine=_opt(t, "reference_cosine"),
            audio_seconds=t.audio_seconds,
            speech_seconds=t.speech_seconds,
            detail=t.detail,
            reason="" if t.reason == pb.FLAG_REASON_UNSPECIFIED else _name(pb.FlagReason, t.reason),
            closest_speaker=t.closest_speaker,
            closest_speaker_margin=_opt(t, "closest_speaker_margin"),
            drift_score=_opt(t, "drift_score"),
            drift_segments=tuple(DriftSegment(s.start_seconds, s.end_seconds, s.score) for s in t.drift_segments),
            encoder_scores=tuple(
                EncoderScores(
                    e.encoder,
                    _opt(e, "pairwise_mean_cosine"),
                    _opt(e, "centroid_cosine_distance"),
                    _opt(e, "reference_cosine"),
                )
                for e in t.encoder_scores
            ),
            uncertain_reason=(
                _name(pb.UncertainReason, t.uncertain_reason)
                if t.uncertain_reason != pb.UNCERTAIN_REASON_UNSPECIFIED
                else ""
            ),
            bandwidth_hz=_opt(t, "bandwidth_hz"),
            compared_below_hz=_opt(t, "compared_below_hz"),
            clipped_fraction=_opt(t, "clipped_fraction"),
            compared_clipped_fraction=_opt(t, "compared_clipped_fraction"),
            snr_db=_opt(t, "snr_db"),
            compared_snr_db=_opt(t, "compared_snr_db"),
            low_band_db=_opt(t, "low_band_db"),
            compared_above_hz=_opt(t, "compared_above_hz"),
        )


@dataclass(frozen=True)
class SpeakerVerdict:
    speaker: str
    consistent: bool  # every scored turn consistent (none flagged, none uncertain); only meaningful when judged
    judged: bool  # False: none of the speaker's turns could be scored
    inconsistent_turns: tuple[str, ...]  # flagged turn ids, dialogue order
    scored_turns: int
    unscored_turns: int
    uncertain_turns: tuple[str, ...] = ()  # turn ids neither flagged nor cleared, dialogue order

    @classmethod
    def from_pb(cls, s: pb.SpeakerVerdict) -> SpeakerVerdict:
        return cls(
            s.speaker,
            s.consistent,
            s.judged,
            tuple(s.inconsistent_turn_ids),
            s.scored_turns,
            s.unscored_turns,
            tuple(s.uncertain_turn_ids),
        )


@dataclass(frozen=True)
class SimilarityMatrix:
    """Cosine similarity of every pair of a dialogue's usable turns under the verdict's encoder."""

    turn_ids: tuple[str, ...]  # the usable turns, dialogue order
    cosines: tuple[float, ...]  # row-major n x n, cosine similarity [-1, 1]; use cosine(a, b)

    def cosine(self, a: str, b: str) -> float:
        """The cosine similarity of turns ``a`` and ``b`` (KeyError: a turn without usable audio)."""
        index = {t: i for i, t in enumerate(self.turn_ids)}
        missing = [t for t in (a, b) if t not in index]
        if missing:
            raise KeyError(f"turn(s) {', '.join(missing)} have no usable audio, so they are not in the matrix")
        return self.cosines[index[a] * len(self.turn_ids) + index[b]]


@dataclass(frozen=True)
class Verdict:
    """A dialogue's verdict. ``consistent``: something was judged and every judged speaker is consistent
    (no turn flagged, none uncertain); ``judged`` False means nothing could be scored (too little speech),
    which is not a pass; ``uncertain_turns`` are neither flagged nor cleared."""

    dialogue_id: str
    turns: tuple[TurnVerdict, ...]  # one per turn with audio, dialogue order
    speakers: tuple[SpeakerVerdict, ...]  # order of first appearance
    encoder: str
    method: str  # "pairwise", "centroid", "reference", "auto" or "lalm"
    threshold_set: str  # "default" or "paper"
    similarity: SimilarityMatrix | None = None  # only when asked for (check(..., similarity_matrix=True))

    @property
    def judged(self) -> bool:
        return any(s.judged for s in self.speakers)

    @property
    def consistent(self) -> bool:
        return self.judged and all(s.consistent for s in self.speakers if s.judged)

    @property
    def inconsistent_turns(self) -> tuple[str, ...]:
        """Flagged turn ids, in dialogue order (localization)."""
        return tuple(t.turn_id for t in self.turns if t.inconsistent)

    @property
    def uncertain_turns(self) -> tuple[str, ...]:
        """Turn ids the judgment cannot vouch for (status "uncertain"), in dialogue order: listen to them."""
        return tuple(t.turn_id for t in self.turns if t.uncertain)

    @property
    def probabilities(self) -> Mapping[str, float]:
        """Turn id -> probability that the turn does not belong to its speaker (turns that have one)."""
        return {t.turn_id: t.inconsistency_probability for t in self.turns if t.inconsistency_probability is not None}

    def turn(self, turn_id: str) -> TurnVerdict:
        for t in self.turns:
            if t.turn_id == turn_id:
                return t
        raise KeyError(f"no verdict for turn {turn_id!r} (turns without audio have none)")

    def speaker(self, name: str) -> SpeakerVerdict:
        for s in self.speakers:
            if s.speaker == name:
                return s
        raise KeyError(f"no verdict for speaker {name!r}")

    @classmethod
    def from_pb(cls, v: pb.DialogueVerdict) -> Verdict:
        return cls(
            dialogue_id=v.dialogue_id,
            turns=tuple(TurnVerdict.from_pb(t) for t in v.turns),
            speakers=tuple(SpeakerVerdict.from_pb(s) for s in v.speakers),
            encoder=v.encoder,
            method=_name(pb.Method, v.method, "METHOD_"),
            threshold_set=_name(pb.ThresholdSet, v.threshold_set, "THRESHOLD_SET_"),
            similarity=(
                SimilarityMatrix(tuple(v.similarity.turn_ids), tuple(v.similarity.cosines))
                if v.HasField("similarity")
                else None
            ),
        )


@dataclass(frozen=True)
class TurnUpdate:
    """What a stream (``SleuthClient.stream``) learns as a turn completes: that turn's first verdict, or a
    revision of an earlier turn whose status the new evidence changed (the new verdict replaces the old)."""

    verdict: TurnVerdict  # judged against the speaker's evidence so far
    revision: bool  # False: the turn's first verdict; True: it replaces an earlier one
    trigger_turn_id: str  # the turn whose completion produced this update
    speaker: SpeakerVerdict  # the speaker's verdict after this update

    @classmethod
    def from_pb(cls, u: pb.TurnUpdate) -> TurnUpdate:
        return cls(TurnVerdict.from_pb(u.verdict), u.revision, u.trigger_turn_id, SpeakerVerdict.from_pb(u.speaker))


@dataclass(frozen=True)
class RankedCandidate:
    candidate_id: str
    rank: int  # 1 = best fit
    score: float  # on score_scale
    score_scale: str
    higher_is_better: bool
    speech_seconds: float
    fit_probability: float | None  # P(the candidate belongs to the speaker), 0..1, when calibrated
    # CheckDialogue's verdict for the candidate in the slot ("consistent", "inconsistent", "uncertain"; None when not
    # judged so: uncalibrated encoder, or method lalm) and its detail.
    fit_status: str | None = None
    fit_detail: str = ""


@dataclass(frozen=True)
class Ranking:
    candidates: tuple[RankedCandidate, ...]  # best first
    encoder: str
    method: str
    usable_context: int  # context clips with enough speech

    @property
    def best(self) -> RankedCandidate:
        return self.candidates[0]

    @classmethod
    def from_pb(cls, r: pb.RankCandidatesResponse) -> Ranking:
        ranked = tuple(
            RankedCandidate(
                c.candidate_id, c.rank, c.score, c.score_scale, c.higher_is_better, c.speech_seconds,
                _opt(c, "fit_probability"),
                _name(pb.TurnStatus, c.fit_status) if c.HasField("fit_status") else None, c.fit_detail,
            )
            for c in r.candidates
        )  # fmt: skip
        return cls(ranked, r.encoder, _name(pb.Method, r.method, "METHOD_"), r.usable_context)


@dataclass(frozen=True)
class VoiceClip:
    sha256: str  # of the bytes as sent
    size_bytes: int
    audio_seconds: float
    speech_seconds: float
    bandwidth_hz: float | None = None  # effective bandwidth; None for a clip registered before it was recorded
    # Share of samples at the peak (0-1) and estimated SNR (dB); None for a clip registered before they were
    # recorded, or too short or silent to tell.
    clipped_fraction: float | None = None
    snr_db: float | None = None
    # Power at 60-250 Hz over 300-3400 Hz (dB; a telephone clip about -28); None for a clip registered before it was
    # recorded (until the voice's first use in a judgment, when its audio was kept), or too short or silent to tell.
    low_band_db: float | None = None


@dataclass(frozen=True)
class VoiceEmbedding:
    encoder: str
    weights_sha256: str  # the encoder model file's SHA-256
    dimension: int
    created_at: datetime | None
    loaded: bool  # the server has these weights loaded


@dataclass(frozen=True)
class VoiceInfo:
    """A voice registered on the server (without its audio)."""

    voice_id: str
    metadata: Mapping[str, str]
    created_at: datetime  # UTC
    updated_at: datetime
    revision: int  # 1 when registered, +1 per replacement
    speech_seconds: float
    audio_kept: bool
    clips: tuple[VoiceClip, ...]
    embeddings: tuple[VoiceEmbedding, ...]

    @classmethod
    def from_pb(cls, v: pb.Voice) -> VoiceInfo:
        return cls(
            voice_id=v.voice_id,
            metadata=dict(v.metadata),
            created_at=v.created_at.ToDatetime(tzinfo=UTC),
            updated_at=v.updated_at.ToDatetime(tzinfo=UTC),
            revision=v.revision,
            speech_seconds=v.speech_seconds,
            audio_kept=v.audio_kept,
            clips=tuple(
                VoiceClip(
                    c.sha256, c.size_bytes, c.audio_seconds, c.speech_seconds, _opt(c, "bandwidth_hz"),
                    _opt(c, "clipped_fraction"), _opt(c, "snr_db"), _opt(c, "low_band_db"),
                )
                for c in v.clips
            ),
            embeddings=tuple(
                VoiceEmbedding(
                    e.encoder, e.weights_sha256, e.dimension,
                    e.created_at.ToDatetime(tzinfo=UTC) if e.HasField("created_at") else None, e.loaded,
                )
                for e in v.embeddings
            ),
        )  # fmt: skip


@dataclass(frozen=True)
class VoicePage:
    voices: tuple[VoiceInfo, ...]  # voice id order
    next_page_token: str  # "" on the last page
    total: int  # voices registered, all pages

    @classmethod
    def from_pb(cls, r: pb.ListVoicesResponse) -> VoicePage:
        return cls(tuple(VoiceInfo.from_pb(v) for v in r.voices), r.next_page_token, r.total_size)


# ---------------------------------------------------------------------------------------------- server info


@dataclass(frozen=True)
class EncoderInfo:
    name: str
    embedding_size: int
    min_speech_seconds: float  # speech a clip needs (after silence trimming) to be scored, seconds
    default_thresholds: Mapping[str, float]  # method name -> threshold on the method's scale
    default_method: str
    execution_provider: str  # e.g. "CPUExecutionProvider"
    sha256: str  # of the model file
    components: tuple[str, ...]  # for "fused": the encoders it joins; () for a model


@dataclass(frozen=True)
class RegistryInfo:
    """The server's voice registry and its bounds."""

    backend: str  # "sqlite" or "postgresql"
    keep_audio: bool  # whether clips' bytes are kept by default
    max_voices: int
    max_clips_per_voice: int
    max_clip_bytes: int
    max_voice_bytes: int
    max_clip_seconds: float
    max_metadata_entries: int
    max_metadata_bytes: int


@dataclass(frozen=True)
class JudgeInfo:
    """The LALM judge the server runs (method "lalm")."""

    model_name: str
    backend: str  # "in-process" or "remote"
    architecture: str
    device: str
    dtype: str
    max_clip_seconds: float
    weights_sha256: str
    calibrated_detection: bool
    calibrated_discrimination: bool
    prompt_version: str
    max_context_clips: int
    orderings: int
    decision_threshold: float  # probability scale


@dataclass(frozen=True)
class ServerInfo:
    """What ``server_info()`` reports: version, encoders, limits, and the registry and judge when present."""

    version: str
    encoders: tuple[EncoderInfo, ...]  # by name
    default_encoder: str  # what a request that names no encoder gets
    max_message_bytes: int  # largest request accepted, bytes
    paper_thresholds: Mapping[str, float]  # method name -> the paper's threshold
    registry: RegistryInfo | None  # None: the server has no voice registry
    judge: JudgeInfo | None  # None: the server has no LALM judge

    def encoder(self, name: str) -> EncoderInfo:
        for e in self.encoders:
            if e.name == name:
                return e
        raise KeyError(f"the server has no encoder {name!r}; it has {', '.join(e.name for e in self.encoders)}")

    @classmethod
    def from_pb(cls, r: pb.GetServerInfoResponse) -> ServerInfo:
        encoders = tuple(
            EncoderInfo(
                e.name, e.embedding_size, e.min_speech_seconds, dict(e.default_thresholds), e.default_method,
                e.execution_provider, e.sha256, tuple(e.components),
            )
            for e in r.encoders
        )  # fmt: skip
        registry = None
        if r.HasField("registry"):
            g = r.registry
            registry = RegistryInfo(
                g.backend, g.keep_audio, g.max_voices, g.max_clips_per_voice, g.max_clip_bytes, g.max_voice_bytes,
                g.max_clip_seconds, g.max_metadata_entries, g.max_metadata_bytes,
            )  # fmt: skip
        judge = None
        if r.HasField("judge"):
            j = r.judge
            judge = JudgeInfo(
                j.model_name, j.backend, j.architecture, j.device, j.dtype, j.max_clip_seconds, j.weights_sha256,
                j.calibrated_detection, j.calibrated_discrimination, j.prompt_version, j.max_context_clips,
                j.orderings, j.decision_threshold,
            )  # fmt: skip
        return cls(
            r.version, encoders, r.default_encoder, r.max_message_bytes, dict(r.paper_thresholds), registry, judge
        )
