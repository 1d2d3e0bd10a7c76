"""What decoding may cost and what float samples may hold: headers read before decoding, decoded
samples bounded per clip and per request, floats outside [-1, 1] refused, near-silence kept silent
(no server needed)."""

from __future__ import annotations

import io
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from sleuthd.audio.decode import AudioError, PcmEncoding, PcmSpec, decode_encoded, decode_pcm, normalize_loudness
from sleuthd.audio.vad import EnergyVad
from sleuthd.encoders.clips import prepare_waveform
from sleuthd.encoders.manifest import load_encoder_manifest
from sleuthd.errors import LimitExceeded

from .support import VOICE_A, Speech, encode_wav


def _flac(seconds: int, channels: int, rate: int, noise: float = 0.0) -> bytes:
    """``seconds`` of (near-)silence as 16-bit FLAC, written a second at a time."""
    buf = io.BytesIO()
    block = (np.random.default_rng(0).normal(0, noise, (rate, channels))).astype(np.int16)
    with sf.SoundFile(buf, "w", rate, channels, format="FLAC", subtype="PCM_16") as f:
        for _ in range(seconds):
            f.write(block)
    return buf.getvalue()


def _without_length(flac: bytes) -> bytes:
    """The same FLAC with STREAMINFO's total-samples field zeroed, as a writer to a pipe leaves it."""
    out = bytearray(flac)
    field = int.from_bytes(out[18:26], "big") & ~((1 << 36) - 1)  # low 36 bits of STREAMINFO bytes 10..17
    out[18:26] = field.to_bytes(8, "big")
    return bytes(out)


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """300 s of 8-channel 48 kHz silence: about 115 KiB of FLAC, 439 MiB once decoded."""
    return _flac(300, 8, 48_000)


def test_flac_bomb_is_refused_from_its_header(bomb: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    assert len(bomb) < 256 * 1024
    decoded: list[int] = []
    real_read = sf.SoundFile.read

    def counting_read(self: sf.SoundFile, *args: object, **kwargs: object) -> np.ndarray:
        out = real_read(self, *args, **kwargs)  # type: ignore[arg-type]
        decoded.append(len(out))
        return out

    monkeypatch.setattr(sf.SoundFile, "read", counting_read)
    with pytest.raises(AudioError, match="decoded samples per clip") as err:
        decode_encoded(bomb, max_seconds=300)
    assert "115,200,000 samples" in str(err.value) and "downmix it to mono" in str(err.value)
    assert sum(decoded) == 0  # refused from the header: nothing was decoded


def test_probe_reads_headers_without_decoding(bomb: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    from sleuthd.audio.decode import probe

    def no_decoding(*args: object, **kwargs: object) -> None:
        raise AssertionError("probe decoded audio")

    monkeypatch.setattr(sf.SoundFile, "read", no_decoding)
    p = probe(bomb, None, max_seconds=300, max_samples=10**9)
    assert (p.sample_rate_hz, p.channels, p.frames, p.exact) == (48_000, 8, 14_400_000, True)
    assert p.seconds == 300.0 and p.samples == 115_200_000 and p.container == "FLAC"
    with pytest.raises(AudioError, match="decoded samples per clip"):
        probe(bomb, None, max_seconds=300)  # the default per-clip bound: 300 s of 48 kHz stereo
    raw = probe(b"\x00\x00" * 48_000 * 2, PcmSpec(PcmEncoding.S16LE, 48_000, 2), max_seconds=60)
    assert (raw.frames, raw.channels, raw.samples, raw.seconds) == (48_000, 2, 96_000, 1.0)
    with pytest.raises(AudioError, match="sample rate 1000000 Hz"):
        probe(b"\x00\x00" * 10, PcmSpec(PcmEncoding.S16LE, 1_000_000, 1), max_seconds=60)


def test_request_budget_sums_probes(speech: Speech) -> None:
    from sleuthd.audio.decode import check_request_budget, probe

    clips = [(f"turns[{k}]", probe(speech.wav_bytes(VOICE_A, k), None, max_seconds=60)) for k in range(3)]
    total = sum(p.samples for _, p in clips)
    check_request_budget(clips, max_samples=total)
    with pytest.raises(LimitExceeded, match="per request") as err:
        check_request_budget(clips, max_samples=total - 1)
    assert f"{total:,} samples" in str(err.value) and "turns[" in str(err.value)
    assert "fewer or shorter clips" in str(err.value)


def test_decoding_holds_one_mono_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    # 20 s of 8-channel 48 kHz audio is 30.7 MB as float32; decoded block by block and downmixed as it
    # goes, the clip costs its mono copy (3.8 MB) plus a block.
    data = _flac(20, 8, 48_000, noise=300.0)
    tracemalloc.start()
    try:
        wave = decode_encoded(data, max_seconds=60, max_samples=10**8)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert wave.seconds == 20.0
    assert peak < 2 * 20 * 48_000 * 4 + 8 * 65_536 * 4 * 2


def test_flac_without_length_is_refused_with_advice() -> None:
    data = _without_length(_flac(3, 1, 16_000, noise=300.0))
    with pytest.raises(AudioError, match="does not state its length") as err:
        decode_encoded(data, max_seconds=60)
    assert "re-encode it" in str(err.value)


def test_pcm_decoded_samples_are_bounded() -> None:
    spec = PcmSpec(PcmEncoding.S16LE, 48_000, 8)
    data = bytes(2 * 8 * 48_000 * 10)  # 10 s × 8 channels
    with pytest.raises(AudioError, match="3,840,000 samples"):
        decode_pcm(data, spec, max_seconds=60, max_samples=1_000_000)
    assert decode_pcm(data, spec, max_seconds=60).seconds == 10.0  # default bound: 60 s of 48 kHz stereo


def _tone(seconds: float = 2.0, rate: int = 16_000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


F32 = PcmSpec(PcmEncoding.F32LE, 16_000, 1)


@pytest.mark.parametrize(
    ("scale", "expected"),
    [
        (32768.0, "looks like int16 values sent as PCM_F32LE: divide them by 32768 first, or send them as PCM_S16LE"),
        (2.0**31, "looks like 24- or 32-bit integer values sent as PCM_F32LE"),
        (3e38, "not little-endian float32"),
        (np.inf, "NaN or infinite"),
        (np.nan, "NaN or infinite"),
    ],
)
def test_out_of_range_float_pcm_is_refused(scale: float, expected: str) -> None:
    samples = _tone()
    if np.isfinite(scale):
        samples = samples / 0.5 * np.float32(scale)
    else:
        samples[100:110] = scale
    with pytest.raises(AudioError, match="PCM_F32LE") as err:
        decode_pcm(samples.astype("<f4").tobytes(), F32, max_seconds=60)
    assert expected in str(err.value)


def test_float_pcm_tolerance() -> None:
    hot = _tone() / 0.5 * np.float32(1.9)  # peaks at 1.9: unclipped synthesizer output, tolerated
    assert np.max(np.abs(decode_pcm(hot.astype("<f4").tobytes(), F32, max_seconds=60).samples)) == pytest.approx(1.9)
    with pytest.raises(AudioError, match=r"reach 2\.1"):
        decode_pcm((hot / 1.9 * 2.1).astype("<f4").tobytes(), F32, max_seconds=60)


def test_out_of_range_float_wav_is_refused() -> None:
    data = encode_wav(_tone() * np.float32(65536.0), 16_000, "WAV", "FLOAT")
    with pytest.raises(AudioError, match="looks like int16 values written as floats") as err:
        decode_encoded(data, max_seconds=60)
    assert "WAV" in str(err.value)
    data = encode_wav(np.where(np.arange(32_000) == 5, np.nan, _tone()).astype(np.float32), 16_000, "WAV", "FLOAT")
    with pytest.raises(AudioError, match="NaN or infinite"):
        decode_encoded(data, max_seconds=60)


def test_near_zero_audio_is_silence_without_warnings(models_dir: Path, speech: Speech) -> None:
    # Speech scaled by 1e-40 (denormal floats): loudness normalisation wanted +770 dB, overflowed to inf
    # with RuntimeWarnings, and the clip got a garbage score. It must read as silence instead.
    samples, _ = sf.read(speech.clips[VOICE_A][0], dtype="float32")
    tiny = (samples * np.float32(1e-40)).astype("<f4").tobytes()
    manifest = load_encoder_manifest(models_dir / "ge2e")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wave = decode_pcm(tiny, F32, max_seconds=60)
        assert np.array_equal(normalize_loudness(wave.samples), wave.samples)
        clip = prepare_waveform(wave.samples, manifest, EnergyVad())
    assert not clip.usable and clip.speech_seconds == 0.0
