"""What the voice registry stores, as frozen dataclasses, and the checks a registration must pass.

A voice is an id, a little metadata, the clips it was enrolled from (their SHA-256, layout and, by
default, their bytes) and one embedding per (encoder name, encoder weights SHA-256). Embeddings made
with different weights are different spaces: nothing here ever hands out one in place of another.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from sleuthd.audio.bandwidth import NARROW_CUTOFF_HZ
from sleuthd.audio.decode import PcmEncoding, PcmSpec
from sleuthd.config import RegistryConfig
from sleuthd.errors import InvalidRequest, LimitExceeded

VOICE_ID_MAX = 128
_VOICE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}")
_ENCODER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_META_KEY = re.compile(r"[A-Za-z0-9_.:/-]{1,64}")
EMBEDDING_DTYPES = ("float16", "float32", "float64")
MAX_EMBEDDING_DIM = 8192
# Suffix of the encoder key under which a voice's embedding of its clips' narrowband copies is stored (what band
# matching compares a speaker heard through different channels with: sleuthd.judgment.channel_matching).
NARROWBAND_SUFFIX = f"+band{NARROW_CUTOFF_HZ:.0f}"


# A clip's channel as measured: bandwidth (Hz), plateau fraction, SNR (dB), low band level (dB); None where not
# measured (the fields of sleuthd.encoders.clips.Channel, which is one).
ClipChannel = tuple[float | None, float | None, float | None, float | None]


@dataclass(frozen=True)
class ClipInput:
    """One enrolment clip as the server received and decoded it."""

    data: bytes  # as sent: an encoded file (WAV/FLAC/OGG/MP3) or headerless PCM
    pcm: PcmSpec | None  # None: ``data`` is an encoded file
    audio_seconds: float  # length after decoding, seconds
    speech_seconds: float  # detected speech in it (VAD), seconds
    bandwidth_hz: float | None = None  # its effective bandwidth (sleuthd.audio.bandwidth); None: not measured
    plateau: float | None = None  # its plateau fraction (sleuthd.audio.clipping); None: not measured, or silent
    snr_db: float | None = None  # its estimated SNR (sleuthd.audio.noise); None: not measured, or too short to tell
    # Its low band level, 60-250 Hz over 300-3400 Hz in dB (sleuthd.audio.bandwidth.band_measures): what tells a
    # telephone clip; None: not measured, or too short or silent to tell.
    low_band_db: float | None = None


@dataclass(frozen=True)
class StoredClip:
    """A registered clip. ``data`` is None when the audio was not kept or not asked for."""

    sha256: str  # of the bytes as sent
    n_bytes: int
    pcm: PcmSpec | None
    audio_seconds: float
    speech_seconds: float
    data: bytes | None = field(default=None, repr=False)
    # Its effective bandwidth, what band matching compares a voice's turns with; None for a clip registered
    # before schema version 2 recorded it.
    bandwidth_hz: float | None = None
    # Its plateau fraction and estimated SNR (dB), what clip and noise matching compare a voice's turns with; None
    # for a clip registered before schema version 3 recorded them (or silent, or too short to tell).
    plateau: float | None = None
    snr_db: float | None = None
    # Its low band level (dB), what telephone-band matching compares a voice's turns with; None for a clip registered
    # before schema version 4 recorded it (or too short or silent to tell).
    low_band_db: float | None = None


@dataclass(frozen=True, eq=False)
class Embedding:
    """A voice's embedding under one encoder's weights. Compare only with embeddings of the same
    ``(encoder, weights_sha256)``."""

    encoder: str  # encoder name, e.g. "ge2e"
    weights_sha256: str  # SHA-256 of the encoder's model file (its manifest's sha256)
    vector: np.ndarray = field(repr=False)  # (dim,) float16/32/64
    created_at: datetime | None = None  # set by the store; None on input

    @property
    def dim(self) -> int:
        return int(self.vector.shape[0])

    @property
    def dtype(self) -> str:
        return str(self.vector.dtype)


@dataclass(frozen=True, eq=False)
class Voice:
    """A registered voice. ``revision`` goes up by one each time it is replaced."""

    voice_id: str
    metadata: Mapping[str, str]
    created_at: datetime  # first registration of this id (kept on replace), UTC
    updated_at: datetime  # last registration or replacement, UTC
    revision: int
    speech_seconds: float  # over all clips
    audio_kept: bool  # False: clip bytes were not stored; re-embedding needs a re-registration
    clips: tuple[StoredClip, ...]
    embeddings: tuple[Embedding, ...]

    def embedding(self, encoder: str, weights_sha256: str) -> Embedding | None:
        for e in self.embeddings:
            if e.encoder == encoder and e.weights_sha256 == weights_sha256:
                return e
        return None


@dataclass(frozen=True, eq=False)
class VoicePage:
    """One page of :meth:`VoiceStore.list_voices`, in voice id order (bytewise); clips carry no audio."""

    voices: tuple[Voice, ...]
    next_page_token: str  # "" on the last page


def narrowband_key(encoder: str) -> str:
    """The encoder key of a voice's narrowband embedding under ``encoder``'s weights (e.g. "campplus+band3600")."""
    return encoder + NARROWBAND_SUFFIX


def base_encoder(key: str) -> str:
    """The encoder a stored embedding's key belongs to ("campplus+band3600" -> "campplus")."""
    return key.removesuffix(NARROWBAND_SUFFIX)


def now() -> datetime:
    return datetime.now(UTC)


def to_micros(t: datetime) -> int:
    return round(t.timestamp() * 1_000_000)


def from_micros(us: int) -> datetime:
    return datetime.fromtimestamp(us / 1_000_000, UTC)


# ---------------------------------------------------------------------------------------------- checks


def check_voice_id(voice_id: str) -> str:
    if not isinstance(voice_id, str) or not _VOICE_ID.fullmatch(voice_id):
        # Echo a bounded prefix: a huge id in the error would overflow gRPC's metadata limit.
        shown = (
            repr(voice_id)
            if not isinstance(voice_id, str) or len(voice_id) <= 80
            else (f"{voice_id[:64]!r}… ({len(voice_id)} characters)")
        )
        raise InvalidRequest(
            f"voice id {shown} is not valid: use 1–{VOICE_ID_MAX} characters of letters, digits and _ . : @ -, "
            "starting with a letter or digit"
        )
    return voice_id


def check_encoder_key(encoder: str, weights_sha256: str) -> None:
    if not isinstance(encoder, str) or not _ENCODER.fullmatch(encoder):
        raise InvalidRequest(f"encoder name {encoder!r} is not valid: use 1–64 letters, digits and _ . + -")
    if not isinstance(weights_sha256, str) or not _SHA256.fullmatch(weights_sha256):
        raise InvalidRequest(
            f"weights_sha256 {weights_sha256!r} is not a SHA-256: expected 64 lowercase hex digits "
            "(the encoder manifest's sha256)"
        )


def check_metadata(metadata: Mapping[str, str] | None, config: RegistryConfig) -> dict[str, str]:
    items = dict(metadata or {})
    if len(items) > config.registry_max_metadata_entries:
        raise LimitExceeded(
            f"metadata has {len(items)} keys; the registry allows {config.registry_max_metadata_entries} "
            "(registry_max_metadata_entries)"
        )
    size = 0
    for key, value in items.items():
        if not isinstance(key, str) or not _META_KEY.fullmatch(key):
            raise InvalidRequest(f"metadata key {key!r} is not valid: use 1–64 letters, digits and _ . : / -")
        if not isinstance(value, str) or "\x00" in value:
            raise InvalidRequest(f"metadata value of {key!r} must be text without NUL characters")
        size += len(key.encode()) + len(value.encode())
    if size > config.registry_max_metadata_bytes:
        raise LimitExceeded(
            f"metadata is {size} bytes (keys and values, UTF-8); the registry allows "
            f"{config.registry_max_metadata_bytes} (registry_max_metadata_bytes)"
        )
    return items


def check_clips(clips: Sequence[ClipInput], config: RegistryConfig) -> list[StoredClip]:
    """Validate a registration's clips and hash them; the result carries the bytes (``data``)."""
    if not clips:
        raise InvalidRequest("a voice needs at least one clip")
    if len(clips) > config.registry_max_clips_per_voice:
        raise LimitExceeded(
            f"{len(clips)} clips sent; a voice may have at most {config.registry_max_clips_per_voice} "
            "(registry_max_clips_per_voice)"
        )
    total = sum(len(c.data) for c in clips)
    if total > config.max_voice_bytes:
        raise LimitExceeded(
            f"the clips are {total / 2**20:.1f} MiB together; a voice may hold {config.registry_max_voice_mb:g} MiB "
            "(registry_max_voice_mb): send fewer or shorter clips"
        )
    seen: dict[str, int] = {}
    stored = []
    for k, clip in enumerate(clips):
        if not isinstance(clip.data, bytes | bytearray | memoryview) or len(clip.data) == 0:
            raise InvalidRequest(f"clip {k} is empty")
        if len(clip.data) > config.max_clip_bytes:
            raise LimitExceeded(
                f"clip {k} is {len(clip.data) / 2**20:.1f} MiB; the limit is {config.registry_max_clip_mb:g} MiB "
                "per clip (registry_max_clip_mb)"
            )
        if not (math.isfinite(clip.audio_seconds) and clip.audio_seconds > 0):
            raise InvalidRequest(f"clip {k}: audio_seconds must be a positive number, got {clip.audio_seconds}")
        if clip.audio_seconds > config.registry_max_clip_seconds:
            raise LimitExceeded(
                f"clip {k} is {clip.audio_seconds:.1f} s long; registered clips may be "
                f"{config.registry_max_clip_seconds:g} s (registry_max_clip_seconds): split it"
            )
        if not (math.isfinite(clip.speech_seconds) and 0 <= clip.speech_seconds <= clip.audio_seconds + 1e-6):
            raise InvalidRequest(
                f"clip {k}: speech_seconds must be between 0 and its audio_seconds ({clip.audio_seconds}), "
                f"got {clip.speech_seconds}"
            )
        if clip.pcm is not None and not isinstance(clip.pcm.encoding, PcmEncoding):
            raise InvalidRequest(f"clip {k}: pcm.encoding must be a PcmEncoding, got {clip.pcm.encoding!r}")
        data = bytes(clip.data)
        digest = hashlib.sha256(data).hexdigest()
        if digest in seen:
            raise InvalidRequest(f"clip {k} has the same bytes as clip {seen[digest]}; send each clip once")
        seen[digest] = k
        channel = check_channel(k, clip.bandwidth_hz, clip.plateau, clip.snr_db, clip.low_band_db)
        stored.append(StoredClip(digest, len(data), clip.pcm, clip.audio_seconds, clip.speech_seconds, data, *channel))
    return stored


def check_channel(
    k: int, width: float | None, plateau: float | None, snr: float | None, low_band: float | None
) -> ClipChannel:
    """Validate clip ``k``'s channel as measured: bandwidth (Hz), plateau fraction, SNR (dB), low band level (dB);
    None: not measured."""
    if width is not None and not (math.isfinite(width) and width > 0):
        raise InvalidRequest(f"clip {k}: bandwidth_hz must be a positive number or None, got {width}")
    if plateau is not None and not (math.isfinite(plateau) and 0 <= plateau <= 1):
        raise InvalidRequest(f"clip {k}: plateau must be a fraction from 0 to 1 or None, got {plateau}")
    if snr is not None and not math.isfinite(snr):
        raise InvalidRequest(f"clip {k}: snr_db must be a finite number or None, got {snr}")
    if low_band is not None and not math.isfinite(low_band):
        raise InvalidRequest(f"clip {k}: low_band_db must be a finite number or None, got {low_band}")
    return width, plateau, snr, low_band


def check_embedding(e: Embedding) -> np.ndarray:
    """Validate an embedding; returns its vector as a contiguous little-endian array."""
    check_encoder_key(e.encoder, e.weights_sha256)
    v = np.asarray(e.vector)
    if v.ndim != 1 or not 1 <= v.shape[0] <= MAX_EMBEDDING_DIM:
        raise InvalidRequest(
            f"embedding for {e.encoder} must be a vector of 1–{MAX_EMBEDDING_DIM} values, got shape {v.shape}"
        )
    if v.dtype.name not in EMBEDDING_DTYPES:
        raise InvalidRequest(f"embedding dtype {v.dtype} is not supported: use one of {', '.join(EMBEDDING_DTYPES)}")
    if not np.all(np.isfinite(v)):
        raise InvalidRequest(f"embedding for {e.encoder} contains NaN or infinite values")
    return np.ascontiguousarray(v, dtype=v.dtype.newbyteorder("<"))


def decode_vector(data: bytes, dtype: str, dim: int) -> np.ndarray:
    v = np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<"))
    if v.shape != (dim,):
        raise RuntimeError(f"stored embedding has {v.shape[0]} values, its row says {dim}: the registry is corrupt")
    return v.astype(np.dtype(dtype))  # native byte order, a fresh writable copy


def pcm_columns(pcm: PcmSpec | None) -> tuple[str | None, int | None, int | None]:
    if pcm is None:
        return None, None, None
    return pcm.encoding.value, pcm.sample_rate_hz, pcm.channels


def pcm_from_columns(encoding: str | None, rate: int | None, channels: int | None) -> PcmSpec | None:
    if encoding is None:
        return None
    return PcmSpec(PcmEncoding(encoding), int(rate or 0), int(channels or 0))
