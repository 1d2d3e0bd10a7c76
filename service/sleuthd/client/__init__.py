"""The sleuthd client library: check dialogues, rank candidates and manage registered voices on a server.

    from sleuthd.client import SleuthClient

    sleuth = SleuthClient("127.0.0.1:50051")
    verdict = sleuth.check([("Maya", "t1.wav"), ("Tom", "t2.wav"), ("Maya", "t3.wav")])
    print(verdict.consistent, verdict.inconsistent_turns)

:class:`SleuthClient` blocks, :class:`AsyncSleuthClient` is its asyncio twin; both return frozen
dataclasses (:class:`Verdict`, :class:`Ranking`, :class:`VoiceInfo`, :class:`ServerInfo`; a stream yields
:class:`TurnUpdate` then the final :class:`Verdict`). Audio is a file path, an encoded
file's bytes or NumPy samples with their sample rate. Lower level, for tools that build protobufs
themselves: :class:`Dialer` (:func:`channel`), :func:`stub`, :func:`make_options`, :func:`audio_file`,
:func:`dialogue_request_from_file`.

Imports only grpc, protobuf and the generated stubs (NumPy only once samples are passed as an array), so a
pipeline that talks to a server never loads the engine, ONNX Runtime or audio libraries.
"""

from sleuthd.client.channels import (
    DEFAULT_TARGET,
    RETRY_POLICY,
    SERVICE_NAME,
    CredentialsError,
    Dialer,
    channel,
    channel_options,
    read_token,
    stub,
    sync_channel,
    tls_credentials,
)
from sleuthd.client.clients import AsyncSleuthClient, SleuthClient, StreamResult
from sleuthd.client.requests import (
    METHODS,
    THRESHOLD_SETS,
    DialogueFileError,
    MissingAudioError,
    Turn,
    audio_file,
    check_request,
    dialogue_request,
    dialogue_request_from_dict,
    dialogue_request_from_file,
    make_options,
    rank_candidates_request,
    rank_request,
    read_dialogue_text,
    register_request,
    stream_open,
    stream_turn,
    to_audio,
    turn_id_or_default,
)
from sleuthd.client.results import (
    DriftSegment,
    EncoderInfo,
    JudgeInfo,
    RankedCandidate,
    Ranking,
    RegistryInfo,
    ServerInfo,
    SimilarityMatrix,
    SpeakerVerdict,
    TurnUpdate,
    TurnVerdict,
    Verdict,
    VoiceClip,
    VoiceEmbedding,
    VoiceInfo,
    VoicePage,
)

__all__ = [
    "DEFAULT_TARGET",
    "METHODS",
    "RETRY_POLICY",
    "SERVICE_NAME",
    "THRESHOLD_SETS",
    "AsyncSleuthClient",
    "CredentialsError",
    "Dialer",
    "DialogueFileError",
    "DriftSegment",
    "EncoderInfo",
    "JudgeInfo",
    "MissingAudioError",
    "RankedCandidate",
    "Ranking",
    "RegistryInfo",
    "ServerInfo",
    "SimilarityMatrix",
    "SleuthClient",
    "SpeakerVerdict",
    "StreamResult",
    "Turn",
    "TurnUpdate",
    "TurnVerdict",
    "Verdict",
    "VoiceClip",
    "VoiceEmbedding",
    "VoiceInfo",
    "VoicePage",
    "audio_file",
    "channel",
    "channel_options",
    "check_request",
    "dialogue_request",
    "dialogue_request_from_dict",
    "dialogue_request_from_file",
    "make_options",
    "rank_candidates_request",
    "rank_request",
    "read_dialogue_text",
    "read_token",
    "register_request",
    "stream_open",
    "stream_turn",
    "stub",
    "sync_channel",
    "tls_credentials",
    "to_audio",
    "turn_id_or_default",
]
