"""sleuthd.audio.bandwidth: a clip's effective bandwidth tells a low-bitrate Opus turn from the same voice's
full-band turn, and the NumPy low-pass is the zero-phase Butterworth the robustness screen used (SciPy's
sosfiltfilt, which the serving path does not have)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf
from scipy.signal import butter, sosfiltfilt
from sleuthd.audio import SAMPLE_RATE
from sleuthd.audio.bandwidth import NARROW_CUTOFF_HZ, ORDER, effective_bandwidth_hz, low_pass
from sleuthd.audio.decode import decode_encoded, to_model_rate

from .support import VOICE_A, Speech


def _decoded(data: bytes) -> np.ndarray:
    return np.asarray(to_model_rate(decode_encoded(data, 60.0)).samples)


def test_the_low_pass_is_scipys_zero_phase_butterworth_away_from_the_ends() -> None:
    x = np.random.default_rng(0).standard_normal(3 * SAMPLE_RATE)
    ours = low_pass(x)
    theirs = sosfiltfilt(butter(ORDER, NARROW_CUTOFF_HZ, fs=SAMPLE_RATE, output="sos"), x)
    inner = slice(2000, -2000)  # the ends differ: scipy pads by reflection, we by zeros
    np.testing.assert_allclose(ours[inner], theirs[inner], atol=1e-5)
    assert ours.dtype == np.float32 and len(ours) == len(x)


@pytest.mark.parametrize(("hz", "low_db", "high_db"), [(1000.0, -0.01, 0.01), (6000.0, -400.0, -60.0)])
def test_the_low_pass_keeps_the_speech_band_and_drops_what_codecs_drop(
    hz: float, low_db: float, high_db: float
) -> None:
    t = np.arange(2 * SAMPLE_RATE) / SAMPLE_RATE
    tone = np.sin(2 * np.pi * hz * t)
    out = low_pass(tone)
    inner = slice(4000, -4000)
    gain_db = 10 * np.log10(np.mean(out[inner].astype(np.float64) ** 2) / np.mean(tone[inner] ** 2))
    assert low_db <= gain_db <= high_db


def test_a_low_bitrate_opus_turn_is_narrower_than_the_same_voice_in_wav(speech: Speech) -> None:
    """Real (synthesized) speech: the WAV clip is full band at 16 kHz; the same clip as Opus at libsndfile's
    lowest bitrate (as the robustness matrix's d-opus renders it) keeps about 4 kHz: well over the 0.3 octave
    the screen used to call a speaker's pieces mixed."""
    wav = speech.wav_bytes(VOICE_A, 0)
    clean = _decoded(wav)
    buf = io.BytesIO()
    sf.write(buf, clean, SAMPLE_RATE, format="OGG", subtype="OPUS", compression_level=1.0)
    opus = _decoded(buf.getvalue())
    wide, narrow = effective_bandwidth_hz(clean), effective_bandwidth_hz(opus)
    assert wide is not None and narrow is not None
    assert wide >= 6000.0
    assert np.log2(wide / narrow) > 0.5, (wide, narrow)
    # Low-passed, both sit in the same band.
    a, b = effective_bandwidth_hz(low_pass(clean)), effective_bandwidth_hz(low_pass(opus))
    assert a is not None and b is not None and abs(np.log2(a / b)) < 0.3, (a, b)


def test_no_bandwidth_for_a_clip_too_short_or_silent() -> None:
    assert effective_bandwidth_hz(np.zeros(SAMPLE_RATE, np.float32)) is None
    assert effective_bandwidth_hz(np.ones(600, np.float32)) is None
    assert len(low_pass(np.zeros(0, np.float32))) == 0
