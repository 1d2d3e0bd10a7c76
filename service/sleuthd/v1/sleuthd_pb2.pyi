import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PcmEncoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PCM_ENCODING_UNSPECIFIED: _ClassVar[PcmEncoding]
    PCM_S16LE: _ClassVar[PcmEncoding]
    PCM_F32LE: _ClassVar[PcmEncoding]

class Method(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    METHOD_UNSPECIFIED: _ClassVar[Method]
    METHOD_PAIRWISE: _ClassVar[Method]
    METHOD_CENTROID: _ClassVar[Method]
    METHOD_REFERENCE: _ClassVar[Method]
    METHOD_AUTO: _ClassVar[Method]
    METHOD_LALM: _ClassVar[Method]

class ThresholdSet(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    THRESHOLD_SET_UNSPECIFIED: _ClassVar[ThresholdSet]
    THRESHOLD_SET_DEFAULT: _ClassVar[ThresholdSet]
    THRESHOLD_SET_PAPER: _ClassVar[ThresholdSet]

class TurnStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TURN_STATUS_UNSPECIFIED: _ClassVar[TurnStatus]
    CONSISTENT: _ClassVar[TurnStatus]
    INCONSISTENT: _ClassVar[TurnStatus]
    INSUFFICIENT_AUDIO: _ClassVar[TurnStatus]
    INSUFFICIENT_CONTEXT: _ClassVar[TurnStatus]
    UNCERTAIN: _ClassVar[TurnStatus]

class FlagReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FLAG_REASON_UNSPECIFIED: _ClassVar[FlagReason]
    SCORE_THRESHOLD: _ClassVar[FlagReason]
    SPEAKER_CONFUSION: _ClassVar[FlagReason]

class UncertainReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNCERTAIN_REASON_UNSPECIFIED: _ClassVar[UncertainReason]
    OUT_OF_SUPPORT: _ClassVar[UncertainReason]
    OWN_TURNS_DISSIMILAR: _ClassVar[UncertainReason]
    LOW_ANSWER_MASS: _ClassVar[UncertainReason]
PCM_ENCODING_UNSPECIFIED: PcmEncoding
PCM_S16LE: PcmEncoding
PCM_F32LE: PcmEncoding
METHOD_UNSPECIFIED: Method
METHOD_PAIRWISE: Method
METHOD_CENTROID: Method
METHOD_REFERENCE: Method
METHOD_AUTO: Method
METHOD_LALM: Method
THRESHOLD_SET_UNSPECIFIED: ThresholdSet
THRESHOLD_SET_DEFAULT: ThresholdSet
THRESHOLD_SET_PAPER: ThresholdSet
TURN_STATUS_UNSPECIFIED: TurnStatus
CONSISTENT: TurnStatus
INCONSISTENT: TurnStatus
INSUFFICIENT_AUDIO: TurnStatus
INSUFFICIENT_CONTEXT: TurnStatus
UNCERTAIN: TurnStatus
FLAG_REASON_UNSPECIFIED: FlagReason
SCORE_THRESHOLD: FlagReason
SPEAKER_CONFUSION: FlagReason
UNCERTAIN_REASON_UNSPECIFIED: UncertainReason
OUT_OF_SUPPORT: UncertainReason
OWN_TURNS_DISSIMILAR: UncertainReason
LOW_ANSWER_MASS: UncertainReason

class PcmAudio(_message.Message):
    __slots__ = ("data", "encoding", "sample_rate_hz", "channels")
    DATA_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    encoding: PcmEncoding
    sample_rate_hz: int
    channels: int
    def __init__(self, data: _Optional[bytes] = ..., encoding: _Optional[_Union[PcmEncoding, str]] = ..., sample_rate_hz: _Optional[int] = ..., channels: _Optional[int] = ...) -> None: ...

class Audio(_message.Message):
    __slots__ = ("encoded", "pcm")
    ENCODED_FIELD_NUMBER: _ClassVar[int]
    PCM_FIELD_NUMBER: _ClassVar[int]
    encoded: bytes
    pcm: PcmAudio
    def __init__(self, encoded: _Optional[bytes] = ..., pcm: _Optional[_Union[PcmAudio, _Mapping]] = ...) -> None: ...

class CheckOptions(_message.Message):
    __slots__ = ("encoder", "method", "threshold_set", "threshold", "detect_drift", "similarity_matrix")
    ENCODER_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_SET_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    DETECT_DRIFT_FIELD_NUMBER: _ClassVar[int]
    SIMILARITY_MATRIX_FIELD_NUMBER: _ClassVar[int]
    encoder: str
    method: Method
    threshold_set: ThresholdSet
    threshold: float
    detect_drift: bool
    similarity_matrix: bool
    def __init__(self, encoder: _Optional[str] = ..., method: _Optional[_Union[Method, str]] = ..., threshold_set: _Optional[_Union[ThresholdSet, str]] = ..., threshold: _Optional[float] = ..., detect_drift: _Optional[bool] = ..., similarity_matrix: _Optional[bool] = ...) -> None: ...

class Turn(_message.Message):
    __slots__ = ("turn_id", "speaker", "text", "audio")
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    SPEAKER_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    turn_id: str
    speaker: str
    text: str
    audio: Audio
    def __init__(self, turn_id: _Optional[str] = ..., speaker: _Optional[str] = ..., text: _Optional[str] = ..., audio: _Optional[_Union[Audio, _Mapping]] = ...) -> None: ...

class SpeakerReference(_message.Message):
    __slots__ = ("speaker", "audio", "voice_id")
    SPEAKER_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    VOICE_ID_FIELD_NUMBER: _ClassVar[int]
    speaker: str
    audio: Audio
    voice_id: str
    def __init__(self, speaker: _Optional[str] = ..., audio: _Optional[_Union[Audio, _Mapping]] = ..., voice_id: _Optional[str] = ...) -> None: ...

class CheckDialogueRequest(_message.Message):
    __slots__ = ("dialogue_id", "turns", "references", "options")
    DIALOGUE_ID_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    REFERENCES_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    dialogue_id: str
    turns: _containers.RepeatedCompositeFieldContainer[Turn]
    references: _containers.RepeatedCompositeFieldContainer[SpeakerReference]
    options: CheckOptions
    def __init__(self, dialogue_id: _Optional[str] = ..., turns: _Optional[_Iterable[_Union[Turn, _Mapping]]] = ..., references: _Optional[_Iterable[_Union[SpeakerReference, _Mapping]]] = ..., options: _Optional[_Union[CheckOptions, _Mapping]] = ...) -> None: ...

class TurnVerdict(_message.Message):
    __slots__ = ("turn_id", "speaker", "status", "score", "score_scale", "threshold", "pairwise_mean_cosine", "centroid_cosine_distance", "reference_cosine", "audio_seconds", "speech_seconds", "detail", "inconsistency_probability", "reason", "closest_speaker", "closest_speaker_margin", "drift_segments", "drift_score", "judge_probability", "judge_answer_mass", "judge_model", "judge_calibrated", "encoder_scores", "uncertain_reason", "bandwidth_hz", "compared_below_hz", "clipped_fraction", "compared_clipped_fraction", "snr_db", "compared_snr_db", "low_band_db", "compared_above_hz")
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    SPEAKER_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SCORE_SCALE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    PAIRWISE_MEAN_COSINE_FIELD_NUMBER: _ClassVar[int]
    CENTROID_COSINE_DISTANCE_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_COSINE_FIELD_NUMBER: _ClassVar[int]
    AUDIO_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SPEECH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    INCONSISTENCY_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CLOSEST_SPEAKER_FIELD_NUMBER: _ClassVar[int]
    CLOSEST_SPEAKER_MARGIN_FIELD_NUMBER: _ClassVar[int]
    DRIFT_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    DRIFT_SCORE_FIELD_NUMBER: _ClassVar[int]
    JUDGE_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    JUDGE_ANSWER_MASS_FIELD_NUMBER: _ClassVar[int]
    JUDGE_MODEL_FIELD_NUMBER: _ClassVar[int]
    JUDGE_CALIBRATED_FIELD_NUMBER: _ClassVar[int]
    ENCODER_SCORES_FIELD_NUMBER: _ClassVar[int]
    UNCERTAIN_REASON_FIELD_NUMBER: _ClassVar[int]
    BANDWIDTH_HZ_FIELD_NUMBER: _ClassVar[int]
    COMPARED_BELOW_HZ_FIELD_NUMBER: _ClassVar[int]
    CLIPPED_FRACTION_FIELD_NUMBER: _ClassVar[int]
    COMPARED_CLIPPED_FRACTION_FIELD_NUMBER: _ClassVar[int]
    SNR_DB_FIELD_NUMBER: _ClassVar[int]
    COMPARED_SNR_DB_FIELD_NUMBER: _ClassVar[int]
    LOW_BAND_DB_FIELD_NUMBER: _ClassVar[int]
    COMPARED_ABOVE_HZ_FIELD_NUMBER: _ClassVar[int]
    turn_id: str
    speaker: str
    status: TurnStatus
    score: float
    score_scale: str
    threshold: float
    pairwise_mean_cosine: float
    centroid_cosine_distance: float
    reference_cosine: float
    audio_seconds: float
    speech_seconds: float
    detail: str
    inconsistency_probability: float
    reason: FlagReason
    closest_speaker: str
    closest_speaker_margin: float
    drift_segments: _containers.RepeatedCompositeFieldContainer[DriftSegment]
    drift_score: float
    judge_probability: float
    judge_answer_mass: float
    judge_model: str
    judge_calibrated: bool
    encoder_scores: _containers.RepeatedCompositeFieldContainer[EncoderScores]
    uncertain_reason: UncertainReason
    bandwidth_hz: float
    compared_below_hz: float
    clipped_fraction: float
    compared_clipped_fraction: float
    snr_db: float
    compared_snr_db: float
    low_band_db: float
    compared_above_hz: float
    def __init__(self, turn_id: _Optional[str] = ..., speaker: _Optional[str] = ..., status: _Optional[_Union[TurnStatus, str]] = ..., score: _Optional[float] = ..., score_scale: _Optional[str] = ..., threshold: _Optional[float] = ..., pairwise_mean_cosine: _Optional[float] = ..., centroid_cosine_distance: _Optional[float] = ..., reference_cosine: _Optional[float] = ..., audio_seconds: _Optional[float] = ..., speech_seconds: _Optional[float] = ..., detail: _Optional[str] = ..., inconsistency_probability: _Optional[float] = ..., reason: _Optional[_Union[FlagReason, str]] = ..., closest_speaker: _Optional[str] = ..., closest_speaker_margin: _Optional[float] = ..., drift_segments: _Optional[_Iterable[_Union[DriftSegment, _Mapping]]] = ..., drift_score: _Optional[float] = ..., judge_probability: _Optional[float] = ..., judge_answer_mass: _Optional[float] = ..., judge_model: _Optional[str] = ..., judge_calibrated: _Optional[bool] = ..., encoder_scores: _Optional[_Iterable[_Union[EncoderScores, _Mapping]]] = ..., uncertain_reason: _Optional[_Union[UncertainReason, str]] = ..., bandwidth_hz: _Optional[float] = ..., compared_below_hz: _Optional[float] = ..., clipped_fraction: _Optional[float] = ..., compared_clipped_fraction: _Optional[float] = ..., snr_db: _Optional[float] = ..., compared_snr_db: _Optional[float] = ..., low_band_db: _Optional[float] = ..., compared_above_hz: _Optional[float] = ...) -> None: ...

class EncoderScores(_message.Message):
    __slots__ = ("encoder", "pairwise_mean_cosine", "centroid_cosine_distance", "reference_cosine")
    ENCODER_FIELD_NUMBER: _ClassVar[int]
    PAIRWISE_MEAN_COSINE_FIELD_NUMBER: _ClassVar[int]
    CENTROID_COSINE_DISTANCE_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_COSINE_FIELD_NUMBER: _ClassVar[int]
    encoder: str
    pairwise_mean_cosine: float
    centroid_cosine_distance: float
    reference_cosine: float
    def __init__(self, encoder: _Optional[str] = ..., pairwise_mean_cosine: _Optional[float] = ..., centroid_cosine_distance: _Optional[float] = ..., reference_cosine: _Optional[float] = ...) -> None: ...

class DriftSegment(_message.Message):
    __slots__ = ("start_seconds", "end_seconds", "score")
    START_SECONDS_FIELD_NUMBER: _ClassVar[int]
    END_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    start_seconds: float
    end_seconds: float
    score: float
    def __init__(self, start_seconds: _Optional[float] = ..., end_seconds: _Optional[float] = ..., score: _Optional[float] = ...) -> None: ...

class SpeakerVerdict(_message.Message):
    __slots__ = ("speaker", "consistent", "judged", "inconsistent_turn_ids", "scored_turns", "unscored_turns", "uncertain_turn_ids")
    SPEAKER_FIELD_NUMBER: _ClassVar[int]
    CONSISTENT_FIELD_NUMBER: _ClassVar[int]
    JUDGED_FIELD_NUMBER: _ClassVar[int]
    INCONSISTENT_TURN_IDS_FIELD_NUMBER: _ClassVar[int]
    SCORED_TURNS_FIELD_NUMBER: _ClassVar[int]
    UNSCORED_TURNS_FIELD_NUMBER: _ClassVar[int]
    UNCERTAIN_TURN_IDS_FIELD_NUMBER: _ClassVar[int]
    speaker: str
    consistent: bool
    judged: bool
    inconsistent_turn_ids: _containers.RepeatedScalarFieldContainer[str]
    scored_turns: int
    unscored_turns: int
    uncertain_turn_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, speaker: _Optional[str] = ..., consistent: _Optional[bool] = ..., judged: _Optional[bool] = ..., inconsistent_turn_ids: _Optional[_Iterable[str]] = ..., scored_turns: _Optional[int] = ..., unscored_turns: _Optional[int] = ..., uncertain_turn_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DialogueVerdict(_message.Message):
    __slots__ = ("dialogue_id", "turns", "speakers", "encoder", "method", "threshold_set", "similarity")
    DIALOGUE_ID_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    SPEAKERS_FIELD_NUMBER: _ClassVar[int]
    ENCODER_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_SET_FIELD_NUMBER: _ClassVar[int]
    SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    dialogue_id: str
    turns: _containers.RepeatedCompositeFieldContainer[TurnVerdict]
    speakers: _containers.RepeatedCompositeFieldContainer[SpeakerVerdict]
    encoder: str
    method: Method
    threshold_set: ThresholdSet
    similarity: SimilarityMatrix
    def __init__(self, dialogue_id: _Optional[str] = ..., turns: _Optional[_Iterable[_Union[TurnVerdict, _Mapping]]] = ..., speakers: _Optional[_Iterable[_Union[SpeakerVerdict, _Mapping]]] = ..., encoder: _Optional[str] = ..., method: _Optional[_Union[Method, str]] = ..., threshold_set: _Optional[_Union[ThresholdSet, str]] = ..., similarity: _Optional[_Union[SimilarityMatrix, _Mapping]] = ...) -> None: ...

class SimilarityMatrix(_message.Message):
    __slots__ = ("turn_ids", "cosines")
    TURN_IDS_FIELD_NUMBER: _ClassVar[int]
    COSINES_FIELD_NUMBER: _ClassVar[int]
    turn_ids: _containers.RepeatedScalarFieldContainer[str]
    cosines: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, turn_ids: _Optional[_Iterable[str]] = ..., cosines: _Optional[_Iterable[float]] = ...) -> None: ...

class Candidate(_message.Message):
    __slots__ = ("candidate_id", "audio")
    CANDIDATE_ID_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    candidate_id: str
    audio: Audio
    def __init__(self, candidate_id: _Optional[str] = ..., audio: _Optional[_Union[Audio, _Mapping]] = ...) -> None: ...

class RankCandidatesRequest(_message.Message):
    __slots__ = ("speaker", "context", "reference", "reference_voice_id", "candidates", "options")
    SPEAKER_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_VOICE_ID_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    speaker: str
    context: _containers.RepeatedCompositeFieldContainer[Audio]
    reference: Audio
    reference_voice_id: str
    candidates: _containers.RepeatedCompositeFieldContainer[Candidate]
    options: CheckOptions
    def __init__(self, speaker: _Optional[str] = ..., context: _Optional[_Iterable[_Union[Audio, _Mapping]]] = ..., reference: _Optional[_Union[Audio, _Mapping]] = ..., reference_voice_id: _Optional[str] = ..., candidates: _Optional[_Iterable[_Union[Candidate, _Mapping]]] = ..., options: _Optional[_Union[CheckOptions, _Mapping]] = ...) -> None: ...

class RankedCandidate(_message.Message):
    __slots__ = ("candidate_id", "rank", "score", "score_scale", "higher_is_better", "speech_seconds", "fit_probability", "judge_answer_mass", "judge_calibrated", "judge_model", "fit_status", "fit_detail")
    CANDIDATE_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SCORE_SCALE_FIELD_NUMBER: _ClassVar[int]
    HIGHER_IS_BETTER_FIELD_NUMBER: _ClassVar[int]
    SPEECH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FIT_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    JUDGE_ANSWER_MASS_FIELD_NUMBER: _ClassVar[int]
    JUDGE_CALIBRATED_FIELD_NUMBER: _ClassVar[int]
    JUDGE_MODEL_FIELD_NUMBER: _ClassVar[int]
    FIT_STATUS_FIELD_NUMBER: _ClassVar[int]
    FIT_DETAIL_FIELD_NUMBER: _ClassVar[int]
    candidate_id: str
    rank: int
    score: float
    score_scale: str
    higher_is_better: bool
    speech_seconds: float
    fit_probability: float
    judge_answer_mass: float
    judge_calibrated: bool
    judge_model: str
    fit_status: TurnStatus
    fit_detail: str
    def __init__(self, candidate_id: _Optional[str] = ..., rank: _Optional[int] = ..., score: _Optional[float] = ..., score_scale: _Optional[str] = ..., higher_is_better: _Optional[bool] = ..., speech_seconds: _Optional[float] = ..., fit_probability: _Optional[float] = ..., judge_answer_mass: _Optional[float] = ..., judge_calibrated: _Optional[bool] = ..., judge_model: _Optional[str] = ..., fit_status: _Optional[_Union[TurnStatus, str]] = ..., fit_detail: _Optional[str] = ...) -> None: ...

class RankCandidatesResponse(_message.Message):
    __slots__ = ("candidates", "encoder", "method", "usable_context")
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    ENCODER_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    USABLE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    candidates: _containers.RepeatedCompositeFieldContainer[RankedCandidate]
    encoder: str
    method: Method
    usable_context: int
    def __init__(self, candidates: _Optional[_Iterable[_Union[RankedCandidate, _Mapping]]] = ..., encoder: _Optional[str] = ..., method: _Optional[_Union[Method, str]] = ..., usable_context: _Optional[int] = ...) -> None: ...

class PcmFormat(_message.Message):
    __slots__ = ("encoding", "sample_rate_hz", "channels")
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    encoding: PcmEncoding
    sample_rate_hz: int
    channels: int
    def __init__(self, encoding: _Optional[_Union[PcmEncoding, str]] = ..., sample_rate_hz: _Optional[int] = ..., channels: _Optional[int] = ...) -> None: ...

class StreamOpen(_message.Message):
    __slots__ = ("dialogue_id", "references", "options")
    DIALOGUE_ID_FIELD_NUMBER: _ClassVar[int]
    REFERENCES_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    dialogue_id: str
    references: _containers.RepeatedCompositeFieldContainer[SpeakerReference]
    options: CheckOptions
    def __init__(self, dialogue_id: _Optional[str] = ..., references: _Optional[_Iterable[_Union[SpeakerReference, _Mapping]]] = ..., options: _Optional[_Union[CheckOptions, _Mapping]] = ...) -> None: ...

class TurnStart(_message.Message):
    __slots__ = ("turn_id", "speaker", "text", "index", "pcm")
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    SPEAKER_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PCM_FIELD_NUMBER: _ClassVar[int]
    turn_id: str
    speaker: str
    text: str
    index: int
    pcm: PcmFormat
    def __init__(self, turn_id: _Optional[str] = ..., speaker: _Optional[str] = ..., text: _Optional[str] = ..., index: _Optional[int] = ..., pcm: _Optional[_Union[PcmFormat, _Mapping]] = ...) -> None: ...

class TurnAudio(_message.Message):
    __slots__ = ("turn_id", "data", "final")
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    turn_id: str
    data: bytes
    final: bool
    def __init__(self, turn_id: _Optional[str] = ..., data: _Optional[bytes] = ..., final: _Optional[bool] = ...) -> None: ...

class StreamDialogueRequest(_message.Message):
    __slots__ = ("open", "turn_start", "audio")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    TURN_START_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    open: StreamOpen
    turn_start: TurnStart
    audio: TurnAudio
    def __init__(self, open: _Optional[_Union[StreamOpen, _Mapping]] = ..., turn_start: _Optional[_Union[TurnStart, _Mapping]] = ..., audio: _Optional[_Union[TurnAudio, _Mapping]] = ...) -> None: ...

class TurnUpdate(_message.Message):
    __slots__ = ("verdict", "revision", "trigger_turn_id", "speaker")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_TURN_ID_FIELD_NUMBER: _ClassVar[int]
    SPEAKER_FIELD_NUMBER: _ClassVar[int]
    verdict: TurnVerdict
    revision: bool
    trigger_turn_id: str
    speaker: SpeakerVerdict
    def __init__(self, verdict: _Optional[_Union[TurnVerdict, _Mapping]] = ..., revision: _Optional[bool] = ..., trigger_turn_id: _Optional[str] = ..., speaker: _Optional[_Union[SpeakerVerdict, _Mapping]] = ...) -> None: ...

class StreamDialogueResponse(_message.Message):
    __slots__ = ("turn", "final")
    TURN_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    turn: TurnUpdate
    final: DialogueVerdict
    def __init__(self, turn: _Optional[_Union[TurnUpdate, _Mapping]] = ..., final: _Optional[_Union[DialogueVerdict, _Mapping]] = ...) -> None: ...

class GetServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EncoderInfo(_message.Message):
    __slots__ = ("name", "embedding_size", "min_speech_seconds", "default_thresholds", "default_method", "execution_provider", "sha256", "components")
    class DefaultThresholdsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_SIZE_FIELD_NUMBER: _ClassVar[int]
    MIN_SPEECH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_THRESHOLDS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_METHOD_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    embedding_size: int
    min_speech_seconds: float
    default_thresholds: _containers.ScalarMap[str, float]
    default_method: str
    execution_provider: str
    sha256: str
    components: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., embedding_size: _Optional[int] = ..., min_speech_seconds: _Optional[float] = ..., default_thresholds: _Optional[_Mapping[str, float]] = ..., default_method: _Optional[str] = ..., execution_provider: _Optional[str] = ..., sha256: _Optional[str] = ..., components: _Optional[_Iterable[str]] = ...) -> None: ...

class GetServerInfoResponse(_message.Message):
    __slots__ = ("version", "encoders", "default_encoder", "max_message_bytes", "paper_thresholds", "registry", "judge")
    class PaperThresholdsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ENCODERS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_ENCODER_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PAPER_THRESHOLDS_FIELD_NUMBER: _ClassVar[int]
    REGISTRY_FIELD_NUMBER: _ClassVar[int]
    JUDGE_FIELD_NUMBER: _ClassVar[int]
    version: str
    encoders: _containers.RepeatedCompositeFieldContainer[EncoderInfo]
    default_encoder: str
    max_message_bytes: int
    paper_thresholds: _containers.ScalarMap[str, float]
    registry: VoiceRegistryInfo
    judge: JudgeInfo
    def __init__(self, version: _Optional[str] = ..., encoders: _Optional[_Iterable[_Union[EncoderInfo, _Mapping]]] = ..., default_encoder: _Optional[str] = ..., max_message_bytes: _Optional[int] = ..., paper_thresholds: _Optional[_Mapping[str, float]] = ..., registry: _Optional[_Union[VoiceRegistryInfo, _Mapping]] = ..., judge: _Optional[_Union[JudgeInfo, _Mapping]] = ...) -> None: ...

class JudgeInfo(_message.Message):
    __slots__ = ("model_name", "backend", "architecture", "device", "dtype", "max_clip_seconds", "weights_sha256", "calibrated_detection", "calibrated_discrimination", "prompt_version", "max_context_clips", "orderings", "decision_threshold", "min_answer_mass")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    MAX_CLIP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_SHA256_FIELD_NUMBER: _ClassVar[int]
    CALIBRATED_DETECTION_FIELD_NUMBER: _ClassVar[int]
    CALIBRATED_DISCRIMINATION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_CLIPS_FIELD_NUMBER: _ClassVar[int]
    ORDERINGS_FIELD_NUMBER: _ClassVar[int]
    DECISION_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    MIN_ANSWER_MASS_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    backend: str
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
    decision_threshold: float
    min_answer_mass: float
    def __init__(self, model_name: _Optional[str] = ..., backend: _Optional[str] = ..., architecture: _Optional[str] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., max_clip_seconds: _Optional[float] = ..., weights_sha256: _Optional[str] = ..., calibrated_detection: _Optional[bool] = ..., calibrated_discrimination: _Optional[bool] = ..., prompt_version: _Optional[str] = ..., max_context_clips: _Optional[int] = ..., orderings: _Optional[int] = ..., decision_threshold: _Optional[float] = ..., min_answer_mass: _Optional[float] = ...) -> None: ...

class RegisterVoiceRequest(_message.Message):
    __slots__ = ("voice_id", "clips", "metadata", "replace", "keep_audio")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VOICE_ID_FIELD_NUMBER: _ClassVar[int]
    CLIPS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    KEEP_AUDIO_FIELD_NUMBER: _ClassVar[int]
    voice_id: str
    clips: _containers.RepeatedCompositeFieldContainer[Audio]
    metadata: _containers.ScalarMap[str, str]
    replace: bool
    keep_audio: bool
    def __init__(self, voice_id: _Optional[str] = ..., clips: _Optional[_Iterable[_Union[Audio, _Mapping]]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., replace: _Optional[bool] = ..., keep_audio: _Optional[bool] = ...) -> None: ...

class VoiceClip(_message.Message):
    __slots__ = ("sha256", "size_bytes", "audio_seconds", "speech_seconds", "bandwidth_hz", "clipped_fraction", "snr_db", "low_band_db")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    AUDIO_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SPEECH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BANDWIDTH_HZ_FIELD_NUMBER: _ClassVar[int]
    CLIPPED_FRACTION_FIELD_NUMBER: _ClassVar[int]
    SNR_DB_FIELD_NUMBER: _ClassVar[int]
    LOW_BAND_DB_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    size_bytes: int
    audio_seconds: float
    speech_seconds: float
    bandwidth_hz: float
    clipped_fraction: float
    snr_db: float
    low_band_db: float
    def __init__(self, sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ..., audio_seconds: _Optional[float] = ..., speech_seconds: _Optional[float] = ..., bandwidth_hz: _Optional[float] = ..., clipped_fraction: _Optional[float] = ..., snr_db: _Optional[float] = ..., low_band_db: _Optional[float] = ...) -> None: ...

class VoiceEmbedding(_message.Message):
    __slots__ = ("encoder", "weights_sha256", "dimension", "created_at", "loaded")
    ENCODER_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_SHA256_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LOADED_FIELD_NUMBER: _ClassVar[int]
    encoder: str
    weights_sha256: str
    dimension: int
    created_at: _timestamp_pb2.Timestamp
    loaded: bool
    def __init__(self, encoder: _Optional[str] = ..., weights_sha256: _Optional[str] = ..., dimension: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., loaded: _Optional[bool] = ...) -> None: ...

class Voice(_message.Message):
    __slots__ = ("voice_id", "metadata", "created_at", "updated_at", "revision", "speech_seconds", "audio_kept", "clips", "embeddings")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VOICE_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SPEECH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    AUDIO_KEPT_FIELD_NUMBER: _ClassVar[int]
    CLIPS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    voice_id: str
    metadata: _containers.ScalarMap[str, str]
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    revision: int
    speech_seconds: float
    audio_kept: bool
    clips: _containers.RepeatedCompositeFieldContainer[VoiceClip]
    embeddings: _containers.RepeatedCompositeFieldContainer[VoiceEmbedding]
    def __init__(self, voice_id: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., revision: _Optional[int] = ..., speech_seconds: _Optional[float] = ..., audio_kept: _Optional[bool] = ..., clips: _Optional[_Iterable[_Union[VoiceClip, _Mapping]]] = ..., embeddings: _Optional[_Iterable[_Union[VoiceEmbedding, _Mapping]]] = ...) -> None: ...

class GetVoiceRequest(_message.Message):
    __slots__ = ("voice_id",)
    VOICE_ID_FIELD_NUMBER: _ClassVar[int]
    voice_id: str
    def __init__(self, voice_id: _Optional[str] = ...) -> None: ...

class ListVoicesRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListVoicesResponse(_message.Message):
    __slots__ = ("voices", "next_page_token", "total_size")
    VOICES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    voices: _containers.RepeatedCompositeFieldContainer[Voice]
    next_page_token: str
    total_size: int
    def __init__(self, voices: _Optional[_Iterable[_Union[Voice, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., total_size: _Optional[int] = ...) -> None: ...

class DeleteVoiceRequest(_message.Message):
    __slots__ = ("voice_id",)
    VOICE_ID_FIELD_NUMBER: _ClassVar[int]
    voice_id: str
    def __init__(self, voice_id: _Optional[str] = ...) -> None: ...

class DeleteVoiceResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class VoiceRegistryInfo(_message.Message):
    __slots__ = ("backend", "keep_audio", "max_voices", "max_clips_per_voice", "max_clip_bytes", "max_voice_bytes", "max_clip_seconds", "max_metadata_entries", "max_metadata_bytes", "max_total_bytes")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    KEEP_AUDIO_FIELD_NUMBER: _ClassVar[int]
    MAX_VOICES_FIELD_NUMBER: _ClassVar[int]
    MAX_CLIPS_PER_VOICE_FIELD_NUMBER: _ClassVar[int]
    MAX_CLIP_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_VOICE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_CLIP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_METADATA_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    MAX_METADATA_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    backend: str
    keep_audio: bool
    max_voices: int
    max_clips_per_voice: int
    max_clip_bytes: int
    max_voice_bytes: int
    max_clip_seconds: float
    max_metadata_entries: int
    max_metadata_bytes: int
    max_total_bytes: int
    def __init__(self, backend: _Optional[str] = ..., keep_audio: _Optional[bool] = ..., max_voices: _Optional[int] = ..., max_clips_per_voice: _Optional[int] = ..., max_clip_bytes: _Optional[int] = ..., max_voice_bytes: _Optional[int] = ..., max_clip_seconds: _Optional[float] = ..., max_metadata_entries: _Optional[int] = ..., max_metadata_bytes: _Optional[int] = ..., max_total_bytes: _Optional[int] = ...) -> None: ...
