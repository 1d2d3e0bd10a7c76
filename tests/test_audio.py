"""Decoding, downmixing, resampling and silence trimming (no server needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr
from sleuthd.audio.decode import AudioError, PcmEncoding, PcmSpec, decode_encoded, decode_pcm, normalize_loudness
from sleuthd.audio.vad import SileroVad
from sleuthd.audio.windows import WindowSpec, make_windows, window_starts
from sleuthd.domain import AudioInput
from sleuthd.encoders.clips import decode
from sleuthd.encoders.manifest import vad_model_path

from .support import VOICE_A, Speech, encode_wav


@pytest.mark.parametrize(
    ("fmt", "subtype"),
    [("WAV", "PCM_16"), ("WAV", "FLOAT"), ("FLAC", None), ("OGG", "VORBIS"), ("MP3", "MPEG_LAYER_III")],
)
def test_encoded_formats_decode_to_16k_mono(speech: Speech, fmt: str, subtype: str | None) -> None:
    samples, rate = sf.read(speech.clips[VOICE_A][0], dtype="float32")
    stereo = np.stack([samples, samples * 0.5], axis=1)
    data = encode_wav(soxr.resample(stereo, rate, 44_100), 44_100, fmt, subtype)  # 44.1 kHz stereo file
    wave = decode(AudioInput(data=data), max_seconds=60)
    assert wave.sample_rate_hz == 16_000
    assert wave.samples.ndim == 1 and wave.samples.dtype == np.float32
    assert abs(wave.seconds - len(samples) / rate) < 0.15  # codecs may pad a frame
    # Downmix averages channels: (x + x/2) / 2 = 0.75 x in amplitude.
    expect = 0.75 * float(np.sqrt(np.mean(samples**2)))
    assert float(np.sqrt(np.mean(wave.samples**2))) == pytest.approx(expect, rel=0.1)


def test_pcm_s16_and_f32_agree() -> None:
    t = np.arange(16_000) / 16_000
    x = (0.5 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)
    s16 = decode_pcm((x * 32767).astype("<i2").tobytes(), PcmSpec(PcmEncoding.S16LE, 16_000, 1), 60)
    f32 = decode_pcm(x.astype("<f4").tobytes(), PcmSpec(PcmEncoding.F32LE, 16_000, 1), 60)
    assert np.max(np.abs(s16.samples - f32.samples)) < 1e-3
    stereo = np.stack([x, -x], axis=1).astype("<f4").tobytes()
    mixed = decode_pcm(stereo, PcmSpec(PcmEncoding.F32LE, 16_000, 2), 60)
    assert len(mixed.samples) == 16_000 and np.max(np.abs(mixed.samples)) < 1e-6


def test_clip_length_limit_is_checked_before_decoding() -> None:
    data = encode_wav(np.zeros(16_000 * 5, np.float32), 16_000, "FLAC")
    with pytest.raises(AudioError, match="limit is 2 s"):
        decode_encoded(data, max_seconds=2)
    with pytest.raises(AudioError, match="limit is 2 s"):
        decode_pcm(b"\x00\x00" * 16_000 * 3, PcmSpec(PcmEncoding.S16LE, 16_000, 1), 2)


def test_loudness_only_raises() -> None:
    quiet = np.full(1000, 0.001, np.float32)
    loud = np.full(1000, 0.5, np.float32)
    raised = normalize_loudness(quiet, -30.0)
    assert 20 * np.log10(np.sqrt(np.mean(raised**2))) == pytest.approx(-30.0, abs=0.01)
    assert np.array_equal(normalize_loudness(loud, -30.0), loud)
    assert np.array_equal(normalize_loudness(np.zeros(10, np.float32)), np.zeros(10, np.float32))


def test_vad_finds_speech_between_silences(models_dir: Path, speech: Speech) -> None:
    vad = SileroVad(vad_model_path(models_dir))
    samples, rate = sf.read(speech.clips[VOICE_A][1], dtype="float32")
    assert rate == 16_000
    gap = np.zeros(rate * 2, np.float32)
    padded = np.concatenate([gap, samples, gap])
    mask = vad.speech_mask(padded)
    alone = vad.speech_mask(samples)
    assert mask.speech_seconds == pytest.approx(alone.speech_seconds, abs=0.15)
    # The 2 s silences are trimmed (a little padding is kept), the speech is kept.
    assert not mask.keep[:rate].any() and not mask.keep[-rate:].any()
    assert mask.keep[2 * rate : 2 * rate + len(samples)].mean() > 0.8
    assert vad.speech_mask(gap).speech_seconds == 0.0


def test_window_placement_matches_ge2e_partials() -> None:
    spec = WindowSpec()
    # 3 s at 16 kHz: GE2E's rule gives windows at frames 0, 77, 154 (step round(16000/1.3/160) = 77).
    assert window_starts(48_000, spec).tolist() == [0, 77, 154]
    # Very short clips still get one (zero-padded) window.
    assert window_starts(1_000, spec).tolist() == [0]
    x = np.arange(48_000, dtype=np.float32)
    windows, _ = make_windows(x, spec)
    assert windows.shape == (3, 25840)
    # Window k starts 200 samples (the STFT's centring pad) before frame starts[k].
    assert windows[1, 200] == x[77 * 160] and windows[0, 199] == 0.0


def test_energy_vad_trims_silence_and_agrees_with_silero(models_dir: Path, speech: Speech) -> None:
    from sleuthd.audio.vad import EnergyVad

    samples, rate = sf.read(speech.clips[VOICE_A][1], dtype="float32")
    gap = np.zeros(rate * 2, np.float32)
    padded = np.concatenate([gap, normalize_loudness(samples), gap])
    energy = EnergyVad().speech_mask(padded)
    silero = SileroVad(vad_model_path(models_dir)).speech_mask(padded)
    assert not energy.keep[:rate].any() and not energy.keep[-rate:].any()
    assert energy.speech_seconds == pytest.approx(silero.speech_seconds, rel=0.15)
    assert EnergyVad().speech_mask(gap).speech_seconds == 0.0
    # Quiet hiss under the floor is not speech, even though it is the loudest thing in the clip.
    hiss = (np.random.default_rng(0).normal(0, 10 ** (-70 / 20), rate * 3)).astype(np.float32)
    assert EnergyVad().speech_mask(hiss).speech_seconds == 0.0
