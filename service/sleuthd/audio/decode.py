"""Decoding client audio into the 16 kHz mono float32 waveform every encoder here expects.

Accepted: encoded files (WAV, FLAC, OGG/Vorbis, OGG/Opus, MP3; sniffed from the bytes, everything else
refused before it reaches libsndfile, see :mod:`sleuthd.audio.containers`) and headerless PCM (s16le or f32le
with a stated rate and channel count). Every failure raises :class:`AudioError` with a message that says
what to fix; nothing here returns made-up audio.

Cost is bounded before decoding: :func:`probe` reads a clip's header only, so a caller can refuse a
clip (or a whole request, :func:`check_request_budget`) by the samples it would decode to. A clip's
decoded samples (frames × channels) are bounded as well as its seconds, because a small FLAC of
8-channel 48 kHz silence decodes to hundreds of MiB. Decoding reads in blocks and downmixes each block,
so it holds one mono copy of the clip, not all its channels.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import soundfile as sf
import soxr

from sleuthd.audio import SAMPLE_RATE
from sleuthd.audio.containers import ACCEPTED, Container, looks_like, open_sound, sniff
from sleuthd.domain import PcmEncoding, PcmSpec
from sleuthd.errors import InvalidRequest, LimitExceeded

logger = logging.getLogger(__name__)

MIN_SAMPLE_RATE = 8_000
MAX_SAMPLE_RATE = 48_000
MAX_CHANNELS = 8
# Loudness target of the GE2E training pipeline: quiet clips are raised to -30 dBFS (never lowered).
LOUDNESS_TARGET_DBFS = -30.0
# Quieter than this (RMS) is no usable sound: below the quantisation noise of 16-bit audio (-101 dBFS).
# It is left as it is, so it reads as silence, instead of being raised by hundreds of dB into overflow.
SILENCE_RMS_DBFS = -100.0
# Float samples are documented in [-1, 1]. Up to 6 dB over full scale is tolerated (unclipped
# synthesizer output sometimes peaks a little over 1); further out is a scaling mistake, refused.
FLOAT_PEAK_LIMIT = 2.0
# Decoded samples (frames × channels) a clip may cost, per second of the clip-length limit: as much as
# 48 kHz stereo. A longer limit scales it; :func:`clip_sample_limit`.
CLIP_SAMPLES_PER_SECOND = 2 * MAX_SAMPLE_RATE
# Default per-request bound for :func:`check_request_budget`: 64 Mi decoded samples (about 11 min of
# 48 kHz stereo, or 70 min of 16 kHz mono): twice what a 64 MiB request of 16-bit WAV carries, as
# FLAC holds speech in about half the bytes.
DEFAULT_REQUEST_SAMPLES = 64 * 1024 * 1024
BLOCK_FRAMES = 65_536
# CPU seconds per million decoded samples (frames x channels) to decode and prepare a clip, by container:
# measured on the 2-core development machine (thread CPU time, 30 s of speech at 16 and 48 kHz, mono and
# stereo): WAV and FLAC 9-26 ms, MP3 18, OGG/Vorbis 30-39, OGG/Opus 90. What admission estimates a request's
# decoding by (sleuthd.engine.admission.WorkQueue): a 70 KiB FLAC of 300 s of 48 kHz stereo is 29 M
# samples, about 0.7 s of work, however small it is on the wire.
DECODE_SECONDS_PER_MSAMPLE = {"OGG/Opus": 0.09, "OGG/Vorbis": 0.035}
_DEFAULT_DECODE_SECONDS_PER_MSAMPLE = 0.025
# Subtypes that decode to floats which may lie outside [-1, 1] (integer PCM cannot).
_FLOAT_SUBTYPES = frozenset({"FLOAT", "DOUBLE", "VORBIS", "OPUS", "MPEG_LAYER_I", "MPEG_LAYER_II", "MPEG_LAYER_III"})


class AudioError(InvalidRequest):
    """The client's audio cannot be used; the message says why and what to send instead."""


@dataclass(frozen=True)
class Waveform:
    """Mono float32 samples in [-FLOAT_PEAK_LIMIT, FLOAT_PEAK_LIMIT] (nominally [-1, 1]) at ``sample_rate_hz``."""

    samples: np.ndarray  # (n_samples,) float32
    sample_rate_hz: int

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.sample_rate_hz


@dataclass(frozen=True)
class AudioProbe:
    """What a clip's header says, read without decoding it."""

    container: str  # "WAV", "FLAC", "OGG/Vorbis", "OGG/Opus", "MP3", "PCM s16le", "PCM f32le"
    sample_rate_hz: int
    channels: int
    frames: int  # samples per channel the header announces; decoding never gives more (libsndfile stops there)
    exact: bool  # False for MP3: libsndfile estimates the count (Xing/LAME tag or bitrate); fewer may decode

    @property
    def seconds(self) -> float:
        return self.frames / self.sample_rate_hz

    @property
    def samples(self) -> int:
        """Decoded samples (frames × channels), an upper bound: the unit of the per-clip and per-request bounds."""
        return self.frames * self.channels

    @property
    def decode_seconds(self) -> float:
        """Estimated CPU seconds to decode and prepare the clip (decode, downmix, resample, loudness, VAD,
        windows): its decoded samples at the container's cost (see ``DECODE_SECONDS_PER_MSAMPLE``)."""
        per_million = DECODE_SECONDS_PER_MSAMPLE.get(self.container, _DEFAULT_DECODE_SECONDS_PER_MSAMPLE)
        return self.samples / 1e6 * per_million


def clip_sample_limit(max_seconds: float) -> int:
    """Default bound on one clip's decoded samples (frames × channels): ``max_seconds`` of 48 kHz stereo."""
    return int(max_seconds * CLIP_SAMPLES_PER_SECOND)


def _check_rate(rate: int) -> None:
    if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise AudioError(f"sample rate {rate} Hz is not supported: expected {MIN_SAMPLE_RATE}–{MAX_SAMPLE_RATE} Hz")


def _check_channels(channels: int) -> None:
    if not 1 <= channels <= MAX_CHANNELS:
        raise AudioError(f"channel count {channels} is not supported: expected 1–{MAX_CHANNELS}")


def _check_duration(n_frames: int, rate: int, max_seconds: float) -> None:
    if n_frames / rate > max_seconds:
        raise AudioError(f"clip is {n_frames / rate:.1f} s long; the limit is {max_seconds:.0f} s per clip: split it")


def _check_samples(n_frames: int, channels: int, rate: int, max_samples: int) -> None:
    if n_frames * channels > max_samples:
        raise AudioError(
            f"clip decodes to {n_frames * channels:,} samples ({n_frames / rate:.1f} s × {channels} channels at "
            f"{rate} Hz); the limit is {max_samples:,} decoded samples per clip: downmix it to mono and resample "
            f"it to {SAMPLE_RATE} Hz (what the server uses), or split it"
        )


def _check_header(head: AudioProbe, max_seconds: float, max_samples: int) -> None:
    _check_rate(head.sample_rate_hz)
    _check_channels(head.channels)
    _check_duration(head.frames, head.sample_rate_hz, max_seconds)
    _check_samples(head.frames, head.channels, head.sample_rate_hz, max_samples)


def _float_range_error(samples: np.ndarray, peak: float, source: str) -> AudioError:
    """Why float samples with this ``peak`` cannot be used, naming the likely mistake. ``source`` is
    "PCM_F32LE" for raw PCM, else the container of a file that decodes to floats."""
    pcm = source == "PCM_F32LE"
    what = "PCM_F32LE" if pcm else f"the {source} file's"
    if not math.isfinite(peak):
        bad = int(np.count_nonzero(~np.isfinite(samples)))
        return AudioError(f"{what} audio contains {bad} NaN or infinite samples; send finite samples in [-1, 1]")
    sent = "sent as PCM_F32LE" if pcm else "written as floats"
    if peak <= 32_768.0:
        guess = f"int16 values {sent}: divide them by 32768 first" + (", or send them as PCM_S16LE" if pcm else "")
    elif peak <= 2.0**31:
        guess = f"24- or 32-bit integer values {sent}: divide them by 2^23 or 2^31 first"
    else:
        guess = "bytes that are not little-endian float32 samples: check the encoding and byte order"
    return AudioError(
        f"{what} samples reach {peak:.6g}, outside the documented [-1, 1] (up to ±{FLOAT_PEAK_LIMIT:g} is "
        f"tolerated): this looks like {guess}"
    )


def _check_float_range(samples: np.ndarray, source: str) -> None:
    if samples.size == 0:
        return
    peak = float(np.max(np.abs(samples)))  # NaN and inf propagate into the peak
    if not peak <= FLOAT_PEAK_LIMIT:
        raise _float_range_error(samples, peak, source)


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


def _undecodable(exc: Exception) -> AudioError:
    # "Error opening '/proc/self/fd/7': Format not recognised." -> "Format not recognised."
    reason = str(exc).split(": ", 1)[-1].strip() if str(exc).startswith("Error opening") else str(exc)
    return AudioError(
        f"audio could not be decoded ({reason}); send a complete {ACCEPTED} file, "
        "or raw PCM with its encoding, sample rate and channel count"
    )


def _sniffed(data: bytes) -> Container:
    if not data:
        raise AudioError(f"audio is empty: send a complete {ACCEPTED} file, or raw PCM")
    container = sniff(data)
    if container is None:
        raise AudioError(
            f"audio could not be decoded: its format is not accepted (the bytes look like {looks_like(data)}); "
            f"send {ACCEPTED}, or raw PCM with its encoding, sample rate and channel count"
        )
    return container


# libsndfile's count for a file that does not state its length (SF_COUNT_MAX), e.g. FLAC written to a pipe.
_UNKNOWN_FRAMES = 2**62


def _header(f: sf.SoundFile, container: Container) -> AudioProbe:
    frames = int(f.frames)
    if frames >= _UNKNOWN_FRAMES:
        raise AudioError(
            f"this {container.value} file does not state its length (written to a pipe?), so its cost cannot "
            "be checked before decoding: re-encode it to a file (e.g. `sox in.flac out.flac`) or send WAV"
        )
    return AudioProbe(container.value, int(f.samplerate), int(f.channels), frames, container is not Container.MP3)


def probe_encoded(data: bytes, max_seconds: float, max_samples: int | None = None) -> AudioProbe:
    """Read an encoded file's header (nothing is decoded) and refuse it if it breaks the per-clip
    bounds: ``max_seconds`` and ``max_samples`` decoded samples (default :func:`clip_sample_limit`)."""
    container = _sniffed(data)
    if container is Container.WAV:
        _check_riff_length(data)
    try:
        with open_sound(data, container) as f:
            head = _header(f, container)
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise _undecodable(exc) from exc
    _check_header(head, max_seconds, clip_sample_limit(max_seconds) if max_samples is None else max_samples)
    return head


def probe_pcm(data: bytes, spec: PcmSpec, max_seconds: float, max_samples: int | None = None) -> AudioProbe:
    """:func:`probe_encoded` for headerless PCM: the spec and the byte count say everything."""
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
    head = AudioProbe(f"PCM {spec.encoding.value}", spec.sample_rate_hz, spec.channels, len(data) // frame_bytes, True)
    _check_header(head, max_seconds, clip_sample_limit(max_seconds) if max_samples is None else max_samples)
    return head


def probe(data: bytes, pcm: PcmSpec | None, max_seconds: float, max_samples: int | None = None) -> AudioProbe:
    """A clip's rate, channels and length from its header alone (encoded when ``pcm`` is None), after
    the per-clip checks decoding would make first. Cheap (no decoding); raises :class:`AudioError`."""
    return probe_pcm(data, pcm, max_seconds, max_samples) if pcm else probe_encoded(data, max_seconds, max_samples)


def check_request_budget(clips: Sequence[tuple[str, AudioProbe]], max_samples: int) -> None:
    """Refuse a request whose clips (label, probe) would decode to more than ``max_samples`` in all.

    Raises :class:`LimitExceeded` naming the largest clips. Each probe's count is an upper bound on
    what its clip decodes to, so the request cannot decode to more than it was admitted for."""
    total = sum(p.samples for _, p in clips)
    if total <= max_samples:
        return
    largest = sorted(clips, key=lambda c: -c[1].samples)[:3]
    named = ", ".join(
        f"{label} {p.samples:,} ({p.seconds:.0f} s × {p.channels} ch at {p.sample_rate_hz} Hz)" for label, p in largest
    )
    raise LimitExceeded(
        f"the request's audio decodes to {total:,} samples (frames × channels) in all; the limit is "
        f"{max_samples:,} per request (largest: {named}): send fewer or shorter clips per call, or mono audio at "
        f"{SAMPLE_RATE} Hz"
    )


def _read_mono(f: sf.SoundFile, head: AudioProbe, max_seconds: float, max_samples: int) -> np.ndarray:
    """Decode block by block into one mono buffer, refusing as soon as the clip runs past its bounds."""
    rate, channels = head.sample_rate_hz, head.channels
    cap = min(head.frames, int(max_seconds * rate), max_samples // channels)
    floats = f.subtype in _FLOAT_SUBTYPES
    mono = np.empty(cap, np.float32)  # pages are committed only as they are written
    block = np.empty((min(BLOCK_FRAMES, cap), channels), np.float32) if channels > 1 else None
    pos = 0
    while pos < cap:
        want = min(BLOCK_FRAMES, cap - pos)
        # Mono decodes straight into the clip's buffer; more channels into one reused block, downmixed.
        got = f.read(want, dtype="float32", out=mono[pos : pos + want] if block is None else block[:want])
        n = len(got)
        if n == 0:
            break
        if floats:
            _check_float_range(got, head.container)
        if block is not None:
            np.mean(got, axis=1, dtype=np.float32, out=mono[pos : pos + n])
        pos += n
    if pos == cap and len(f.read(1, dtype="float32", always_2d=True)):  # more than the bound allows
        _check_duration(cap + 1, rate, max_seconds)
        _check_samples(cap + 1, channels, rate, max_samples)
        raise AudioError(
            f"this {head.container} file decodes to more than the {head.frames:,} frames its header announces: "
            "it is damaged; re-encode it or send WAV or FLAC"
        )
    return mono[:pos]  # an MP3 shorter than its estimate: the unused tail was never written, so never resident


def decode_encoded(data: bytes, max_seconds: float, max_samples: int | None = None) -> Waveform:
    """Decode a complete WAV/FLAC/OGG/MP3 file to mono float32 at its own sample rate.

    Bounds: ``max_seconds`` and ``max_samples`` decoded samples (default :func:`clip_sample_limit`),
    both checked against the header before decoding and again while decoding."""
    limit = clip_sample_limit(max_seconds) if max_samples is None else max_samples
    container = _sniffed(data)
    if container is Container.WAV:
        _check_riff_length(data)
    try:
        with open_sound(data, container) as f:
            head = _header(f, container)
            _check_header(head, max_seconds, limit)
            samples = _read_mono(f, head, max_seconds, limit)
    except AudioError:
        raise
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise _undecodable(exc) from exc
    if len(samples) == 0:
        raise AudioError("audio file decodes to zero samples: the file holds no sound")
    # Only formats with an exact length: an MP3's count is an estimate (padding, no Xing tag).
    if head.exact and len(samples) < head.frames:
        raise AudioError(
            f"audio is truncated: its header announces {head.frames} samples but only "
            f"{len(samples)} could be decoded; send the complete file"
        )
    return Waveform(samples, head.sample_rate_hz)


def decode_pcm(data: bytes, spec: PcmSpec, max_seconds: float, max_samples: int | None = None) -> Waveform:
    """Interpret headerless interleaved PCM bytes (same bounds as :func:`decode_encoded`)."""
    probe_pcm(data, spec, max_seconds, max_samples)
    if spec.encoding is PcmEncoding.S16LE:
        samples = np.frombuffer(data, dtype="<i2").astype(np.float32) / np.float32(32768.0)
    else:
        samples = np.frombuffer(data, dtype="<f4").astype(np.float32)
        _check_float_range(samples, "PCM_F32LE")
    frames = samples.reshape(-1, spec.channels)
    mono = frames[:, 0] if spec.channels == 1 else frames.mean(axis=1, dtype=np.float32)
    return Waveform(mono, spec.sample_rate_hz)


def to_model_rate(wave: Waveform) -> Waveform:
    """Resample to 16 kHz with soxr (high quality)."""
    if wave.sample_rate_hz == SAMPLE_RATE:
        return wave
    out = soxr.resample(wave.samples, wave.sample_rate_hz, SAMPLE_RATE, quality="HQ")
    return Waveform(np.ascontiguousarray(out, dtype=np.float32), SAMPLE_RATE)


def normalize_loudness(samples: np.ndarray, target_dbfs: float = LOUDNESS_TARGET_DBFS) -> np.ndarray:
    """Raise quiet audio to ``target_dbfs`` RMS; never lower it (as GE2E was trained).

    Audio quieter than :data:`SILENCE_RMS_DBFS` (digital silence, denormal-only or near-zero samples)
    is returned unchanged: there is no sound to scale, and it then reads as silence.
    """
    rms = float(np.sqrt(np.mean(np.square(samples, dtype=np.float64)))) if len(samples) else 0.0
    if not rms > 10.0 ** (SILENCE_RMS_DBFS / 20.0):
        return samples
    gain_db = target_dbfs - 20.0 * np.log10(rms)
    if gain_db <= 0.0:
        return samples
    return (samples * np.float32(10.0 ** (gain_db / 20.0))).astype(np.float32)
