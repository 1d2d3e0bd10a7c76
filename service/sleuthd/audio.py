"""Decoding client audio into the 16 kHz mono float32 waveform every encoder here expects.

Accepted: encoded files (WAV, FLAC, OGG/Vorbis, MP3 — whatever libsndfile decodes, sniffed from the
bytes) and headerless PCM (s16le or f32le with a stated rate and channel count). Every failure raises
:class:`AudioError` with a message that says what to fix; nothing here returns made-up audio.
"""

from __future__ import annotations

import io
import logging
import re
from dataclasses import dataclass

import numpy as np
import soundfile as sf
import soxr

from sleuthd.config import SAMPLE_RATE
from sleuthd.domain import PcmEncoding, PcmSpec
from sleuthd.errors import InvalidRequest

logger = logging.getLogger(__name__)

MIN_SAMPLE_RATE = 8_000
MAX_SAMPLE_RATE = 48_000
MAX_CHANNELS = 8
# Loudness target of the GE2E training pipeline: quiet clips are raised to -30 dBFS (never lowered).
LOUDNESS_TARGET_DBFS = -30.0


class AudioError(InvalidRequest):
    """The client's audio cannot be used; the message says why and what to send instead."""


@dataclass(frozen=True)
class Waveform:
    """Mono float32 samples in [-1, 1] at ``sample_rate_hz``."""

    samples: np.ndarray  # (n_samples,) float32
    sample_rate_hz: int

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.sample_rate_hz


def _check_rate(rate: int) -> None:
    if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise AudioError(f"sample rate {rate} Hz is not supported: expected {MIN_SAMPLE_RATE}–{MAX_SAMPLE_RATE} Hz")


def _check_channels(channels: int) -> None:
    if not 1 <= channels <= MAX_CHANNELS:
        raise AudioError(f"channel count {channels} is not supported: expected 1–{MAX_CHANNELS}")


def _check_finite(samples: np.ndarray) -> None:
    if not np.all(np.isfinite(samples)):
        bad = int(np.count_nonzero(~np.isfinite(samples)))
        raise AudioError(f"audio contains {bad} NaN or infinite samples; send finite PCM in [-1, 1]")


def _check_duration(n_frames: int, rate: int, max_seconds: float) -> None:
    if n_frames / rate > max_seconds:
        raise AudioError(f"clip is {n_frames / rate:.1f} s long; the limit is {max_seconds:.0f} s per clip: split it")


def _check_riff_length(data: bytes) -> None:
    """libsndfile quietly decodes a cut-off WAV; its RIFF header says how long it should be."""
    if data[:4] != b"RIFF" or len(data) < 8:
        return
    declared = int.from_bytes(data[4:8], "little") + 8
    streaming = declared in (8, 0xFFFFFFFF + 8)  # writers that did not know the length up front
    if not streaming and declared > len(data):
        raise AudioError(
            f"WAV file is truncated: its header announces {declared} bytes but {len(data)} arrived; "
            "send the complete file"
        )


def _libsndfile_reason(exc: Exception) -> str:
    # "Error opening <_io.BytesIO object at 0x...>: Format not recognised." -> "Format not recognised."
    return re.sub(r"Error opening <[^>]*>: ", "", str(exc)).strip()


def decode_encoded(data: bytes, max_seconds: float) -> Waveform:
    """Decode a complete WAV/FLAC/OGG/MP3 file to mono float32 at its own sample rate."""
    if not data:
        raise AudioError("audio is empty: send a complete WAV, FLAC, OGG or MP3 file, or raw PCM")
    _check_riff_length(data)
    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            rate, channels = int(f.samplerate), int(f.channels)
            _check_rate(rate)
            _check_channels(channels)
            announced = int(f.frames)
            if announced > 0:  # known up front for most containers: refuse before decoding
                _check_duration(announced, rate, max_seconds)
            samples = f.read(dtype="float32", always_2d=True)
            if 0 < announced and samples.shape[0] < announced:
                raise AudioError(
                    f"audio is truncated: its header announces {announced} samples but only "
                    f"{samples.shape[0]} could be decoded; send the complete file"
                )
    except AudioError:
        raise
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise AudioError(
            f"audio could not be decoded ({_libsndfile_reason(exc)}); send a complete WAV, FLAC, OGG or MP3 file, "
            "or raw PCM with its encoding, sample rate and channel count"
        ) from exc
    if samples.shape[0] == 0:
        raise AudioError("audio file decodes to zero samples: the file holds no sound")
    _check_duration(samples.shape[0], rate, max_seconds)
    _check_finite(samples)
    return Waveform(samples.mean(axis=1, dtype=np.float32), rate)


def decode_pcm(data: bytes, spec: PcmSpec, max_seconds: float) -> Waveform:
    """Interpret headerless interleaved PCM bytes."""
    _check_rate(spec.sample_rate_hz)
    _check_channels(spec.channels)
    width = 2 if spec.encoding is PcmEncoding.S16LE else 4
    frame_bytes = width * spec.channels
    if not data:
        raise AudioError("PCM audio is empty")
    if len(data) % frame_bytes:
        raise AudioError(
            f"PCM length {len(data)} bytes is not a multiple of {frame_bytes} "
            f"({width}-byte {spec.encoding.value} samples × {spec.channels} channels): the data is truncated"
        )
    _check_duration(len(data) // frame_bytes, spec.sample_rate_hz, max_seconds)
    if spec.encoding is PcmEncoding.S16LE:
        samples = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
    else:
        samples = np.frombuffer(data, dtype="<f4").astype(np.float32)
        _check_finite(samples)
    frames = samples.reshape(-1, spec.channels)
    return Waveform(frames.mean(axis=1, dtype=np.float32), spec.sample_rate_hz)


def to_model_rate(wave: Waveform) -> Waveform:
    """Resample to 16 kHz with soxr (high quality)."""
    if wave.sample_rate_hz == SAMPLE_RATE:
        return wave
    out = soxr.resample(wave.samples, wave.sample_rate_hz, SAMPLE_RATE, quality="HQ")
    return Waveform(np.ascontiguousarray(out, dtype=np.float32), SAMPLE_RATE)


def normalize_loudness(samples: np.ndarray, target_dbfs: float = LOUDNESS_TARGET_DBFS) -> np.ndarray:
    """Raise quiet audio to ``target_dbfs`` RMS; never lower it (as GE2E was trained).

    Digital silence is returned unchanged (there is nothing to scale).
    """
    rms = float(np.sqrt(np.mean(np.square(samples, dtype=np.float64))))
    if rms <= 0.0:
        return samples
    gain_db = target_dbfs - 20.0 * np.log10(rms)
    if gain_db <= 0.0:
        return samples
    return (samples * np.float32(10.0 ** (gain_db / 20.0))).astype(np.float32)
