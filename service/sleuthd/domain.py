"""Requests and verdicts as plain frozen dataclasses: the engine's language, free of gRPC.

A leaf: only the standard library is imported here, so the client, the tools and every engine module
can share these types without pulling in audio libraries or models.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from enum import Enum


class Method(Enum):
    PAIRWISE = "pairwise"
    CENTROID = "centroid"
    REFERENCE = "reference"
    AUTO = "auto"  # calibrated probability, see sleuthd.judgment.calibration
    LALM = "lalm"  # the LALM judge's probability, see sleuthd.judgment.lalm_dialogue


class PcmEncoding(Enum):
    S16LE = "s16le"
    F32LE = "f32le"


@dataclass(frozen=True)
class PcmSpec:
    """How to read headerless PCM bytes."""

    encoding: PcmEncoding
    sample_rate_hz: int
    channels: int


@dataclass(frozen=True)
class AudioInput:
    """Client audio as received: an encoded file, or headerless PCM described by ``pcm``."""

    data: bytes
    pcm: PcmSpec | None = None  # None: an encoded file (WAV/FLAC/OGG/MP3)

    @functools.cached_property
    def digest(self) -> str:
        """The clip's identity: a SHA-256 of its bytes and PCM layout (about 1 ms per MB), computed once per
        object, so admission's cache look-up and the embedding that follows hash a request's audio once. Keys
        the embedding cache and the decoded speech the encoders of one clip share (sleuthd.encoders.cache)."""
        h = hashlib.sha256()
        if self.pcm is not None:
            h.update(f"pcm:{self.pcm.encoding.value}:{self.pcm.sample_rate_hz}:{self.pcm.channels}".encode())
        h.update(self.data)
        return h.hexdigest()


@dataclass(frozen=True)
class VoiceRef:
    """A voice enrolled in the server's registry, named in place of reference audio."""

    voice_id: str


# A speaker's reference: a clip sent with the request, or a registered voice.
Reference = AudioInput | VoiceRef


class ThresholdSet(Enum):
    DEFAULT = "default"  # the encoder manifest's thresholds
    PAPER = "paper"  # the SpeakerSleuth paper's fixed thresholds


@dataclass(frozen=True)
class CheckOptions:
    encoder: str = ""  # "" = the server's default encoder
    method: Method | None = None  # None = the encoder manifest's default method
    threshold_set: ThresholdSet = ThresholdSet.DEFAULT
    threshold: float | None = None  # explicit override on the method's scale
    detect_drift: bool = False  # also look for voice changes inside each turn
    similarity_matrix: bool = False  # also return the turn x turn cosines (DialogueResult.similarity)


@dataclass(frozen=True)
class DialogueTurn:
    turn_id: str
    speaker: str
    text: str = ""
    audio: AudioInput | None = None


@dataclass(frozen=True)
class DialogueRequest:
    dialogue_id: str
    turns: tuple[DialogueTurn, ...]
    references: dict[str, Reference] = field(default_factory=dict)
    options: CheckOptions = field(default_factory=CheckOptions)


class FlagReason(Enum):
    NONE = "none"
    SCORE_THRESHOLD = "score_threshold"  # the method's score crossed its threshold
    SPEAKER_CONFUSION = "speaker_confusion"  # closer to another speaker of the dialogue (auto only)


class TurnStatus(Enum):
    CONSISTENT = "consistent"
    INCONSISTENT = "inconsistent"
    INSUFFICIENT_AUDIO = "insufficient_audio"
    INSUFFICIENT_CONTEXT = "insufficient_context"
    UNCERTAIN = "uncertain"  # scored, but outside what the judgment can vouch for: neither flagged nor cleared


class UncertainReason(Enum):
    NONE = "none"  # the turn is not UNCERTAIN
    OUT_OF_SUPPORT = "out_of_support"  # evidence outside the calibration's fitted range
    OWN_TURNS_DISSIMILAR = "own_turns_dissimilar"  # the speaker's own turns do not agree with each other
    LOW_ANSWER_MASS = "low_answer_mass"  # method lalm: the judge barely answered yes or no


@dataclass(frozen=True)
class DriftSegment:
    """A stretch of a turn where the voice changes."""

    start_seconds: float  # seconds of the turn's decoded audio
    end_seconds: float
    score: float  # cosine distance (1 - cos) between the mean embeddings before and after; larger = stronger

    @property
    def change_seconds(self) -> float:
        """The single best guess of when the voice changes: the middle of the segment."""
        return 0.5 * (self.start_seconds + self.end_seconds)


@dataclass(frozen=True)
class DriftResult:
    score: float  # cosine distance of the turn's strongest change found; 0.0 if too few windows to look
    segments: tuple[DriftSegment, ...]  # reported changes in time order; empty when no drift


@dataclass(frozen=True)
class EncoderScores:
    """One encoder's paper scores of a turn judged with a fused encoder (same scales as TurnResult's)."""

    encoder: str
    pairwise_mean_cosine: float | None
    centroid_cosine_distance: float | None
    reference_cosine: float | None


@dataclass(frozen=True)
class TurnResult:
    turn_id: str
    speaker: str
    status: TurnStatus
    audio_seconds: float
    speech_seconds: float
    score: float | None = None  # on ``score_scale``
    score_scale: str = ""
    threshold: float | None = None
    pairwise_mean_cosine: float | None = None
    centroid_cosine_distance: float | None = None
    reference_cosine: float | None = None
    detail: str = ""
    inconsistency_probability: float | None = None
    reason: FlagReason = FlagReason.NONE
    closest_speaker: str = ""
    closest_speaker_margin: float | None = None  # cosine: own speaker minus closest other speaker
    drift: DriftResult | None = None
    # Method lalm: the judge's P(the turn is not its speaker's), the probability it put on any answer token
    # (low = it wanted to say something else), its model and whether that probability is calibrated.
    judge_probability: float | None = None
    judge_answer_mass: float | None = None
    judge_model: str = ""
    judge_calibrated: bool = False
    # With a fused encoder: each component encoder's own scores (the fused ones above are their means,
    # except the centroid distance, whose centroid is the fused one's).
    encoder_scores: tuple[EncoderScores, ...] = ()
    uncertain_reason: UncertainReason = UncertainReason.NONE  # set when status is UNCERTAIN
    # The turn's effective bandwidth, Hz (measured under the fused encoder; None otherwise or when too short to
    # tell), and the band its speaker was compared below when their clips' bandwidths differ (band matching).
    bandwidth_hz: float | None = None
    compared_below_hz: float | None = None
    # The share of the turn's samples at its peak (0-1; ~0 unclipped; measured under the fused encoder), and the
    # share its speaker's copies were clipped to when their clips differ in clipping (clip matching).
    clipped_fraction: float | None = None
    compared_clipped_fraction: float | None = None
    # The turn's estimated SNR in dB (at most 20: cleaner counts as clean; measured under the fused encoder), and
    # the SNR its speaker's copies were brought to when their clips differ in noise (noise matching).
    snr_db: float | None = None
    compared_snr_db: float | None = None
    # The turn's low band level (dB: 60-250 Hz over 300-3400 Hz; measured under the fused encoder), and the low edge
    # its speaker's copies were cut at when a telephone clip sits among clips that kept their low band.
    low_band_db: float | None = None
    compared_above_hz: float | None = None


@dataclass(frozen=True)
class SpeakerResult:
    speaker: str
    judged: bool
    consistent: bool
    inconsistent_turn_ids: tuple[str, ...]
    scored_turns: int  # CONSISTENT, INCONSISTENT or UNCERTAIN
    unscored_turns: int
    uncertain_turn_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class TurnUpdate:
    """A streamed turn verdict: the turn's first verdict, or a revision a later turn caused."""

    verdict: TurnResult
    revision: bool  # False: first verdict for this turn; True: a later turn changed its status
    trigger_turn_id: str
    speaker: SpeakerResult


@dataclass(frozen=True)
class SimilarityMatrix:
    """Cosine similarity of every pair of a dialogue's usable turns, under the encoder that judged it."""

    turn_ids: tuple[str, ...]  # the usable turns, dialogue order; rows and columns follow it
    cosines: tuple[float, ...]  # row-major n x n, cosine similarity [-1, 1]; [i * n + j] = turn i vs turn j


@dataclass(frozen=True)
class DialogueResult:
    dialogue_id: str
    turns: tuple[TurnResult, ...]
    speakers: tuple[SpeakerResult, ...]
    encoder: str
    method: Method
    threshold_set: ThresholdSet
    similarity: SimilarityMatrix | None = None  # only when CheckOptions.similarity_matrix asked for it


@dataclass(frozen=True)
class CandidateInput:
    candidate_id: str
    audio: AudioInput


@dataclass(frozen=True)
class RankRequest:
    speaker: str
    context: tuple[AudioInput, ...]
    candidates: tuple[CandidateInput, ...]
    reference: Reference | None = None
    options: CheckOptions = field(default_factory=CheckOptions)


@dataclass(frozen=True)
class RankedCandidateResult:
    candidate_id: str
    rank: int  # 1 = best
    score: float
    score_scale: str
    higher_is_better: bool
    speech_seconds: float
    fit_probability: float | None = None  # P(belongs to the speaker), when the encoder is calibrated
    # The verdict CheckDialogue's auto gives the candidate in the slot (beside the context, with the reference), and
    # its detail: the fit's status and why (encoder methods with a calibration; None and "" otherwise).
    fit_status: TurnStatus | None = None
    fit_detail: str = ""
    # Method lalm (the score is then the judge's probability that this candidate is the speaker's voice):
    judge_answer_mass: float | None = None  # mean probability the judge put on any option letter
    judge_calibrated: bool = False
    judge_model: str = ""


@dataclass(frozen=True)
class RankResult:
    candidates: tuple[RankedCandidateResult, ...]
    encoder: str
    method: Method
    usable_context: int
