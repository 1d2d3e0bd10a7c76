"""A clip's effective bandwidth, and a low-pass that brings clips of different channels to a common band.

Why: a low-bitrate Opus or MP3 turn (or a telephone one) keeps only the band below 4-6 kHz, and both speaker
encoders place it away from the same speaker's full-band turns, so a judgment reads the channel as another
voice. In the robustness matrix the turn flagged in a consistent speaker under Opus was that speaker's
bandwidth outlier in 55 of 55 cases; comparing every piece of such a speaker at a common 3.6 kHz band lifted
Opus's balanced accuracy from 71.8 to 90.9 (docs/research/robustness.md, "Phase 3").

NumPy only (the serving path has no SciPy): the low-pass applies the magnitude a zero-phase (forward and
backward) Butterworth filter has, in the frequency domain.
"""

from __future__ import annotations

import numpy as np

from sleuthd.audio import SAMPLE_RATE

# The common band: what every codec and the telephone keep.
NARROW_CUTOFF_HZ = 3600.0
# Order of the digital Butterworth response whose squared magnitude the low-pass applies (what scipy's
# sosfiltfilt of butter(8, cutoff) does: 1 / (1 + (tan(pi f / rate) / tan(pi fc / rate))^16)).
ORDER = 8
# Bandwidth: the highest frequency whose long-term level is within this many dB of the spectrum's peak.
FLOOR_DB = 45.0
# The telephone band's low edge: a telephone clip keeps nothing below it, every other channel does.
TELEPHONE_LOW_HZ = 300.0
_FRAME, _HOP = 512, 256
_LOUD = 1e-3  # frames within 30 dB of the loudest frame's energy make the long-term spectrum
_PAD = 1024  # samples of zeros on each side: the filter's response dies out well within them


def effective_bandwidth_hz(samples: np.ndarray, rate: int = SAMPLE_RATE) -> float | None:
    """The clip's bandwidth in Hz (at most rate / 2), or None for a clip too short or silent to tell.

    Long-term power spectrum over the louder frames (Hann, 32 ms at 16 kHz, half overlap), smoothed over five
    bins; the answer is the highest bin within FLOOR_DB of its peak."""
    return band_measures(samples, rate)[0]


def band_measures(samples: np.ndarray, rate: int = SAMPLE_RATE) -> tuple[float | None, float | None]:
    """(effective bandwidth in Hz, low band level in dB) from one long-term spectrum (each None for a clip too short
    or silent to tell). The low band level: the power at 60-250 Hz over that at 300-3400 Hz, about -28 dB for a
    telephone clip and above -16 dB for speech that kept its low band (on the robustness matrix's drift turns:
    telephone at most -19.4 dB, every other channel at least -19.9)."""
    power = _long_term_power(samples)
    if power is None:
        return None, None
    db = np.convolve(10 * np.log10(power + 1e-20), np.ones(5) / 5, mode="same")
    edge = np.nonzero(db > db.max() - FLOOR_DB)[0].max()
    f = np.fft.rfftfreq(_FRAME, 1.0 / rate)
    low, band = power[(f >= 60) & (f < 250)].sum(), power[(f >= TELEPHONE_LOW_HZ) & (f < 3400)].sum()
    level = float(10 * np.log10(max(low, 1e-20) / band)) if band > 0 else None
    return float(edge * rate / _FRAME), level


def _long_term_power(samples: np.ndarray) -> np.ndarray | None:
    """The mean power spectrum of the clip's louder frames (Hann, 32 ms at 16 kHz, half overlap), or None."""
    x = np.asarray(samples, np.float64)
    n = (len(x) - _FRAME) // _HOP
    if n < 4:
        return None
    frames = x[np.arange(n)[:, None] * _HOP + np.arange(_FRAME)[None, :]] * np.hanning(_FRAME)
    energy = (frames**2).sum(axis=1)
    if not energy.max() > 0:
        return None
    frames = frames[energy > energy.max() * _LOUD]
    power: np.ndarray = (np.abs(np.fft.rfft(frames, axis=1)) ** 2).mean(axis=0)
    return power


def low_pass(samples: np.ndarray, cutoff_hz: float = NARROW_CUTOFF_HZ, rate: int = SAMPLE_RATE) -> np.ndarray:
    """``samples`` (float32) with the band above ``cutoff_hz`` removed, zero-phase: the squared magnitude of an
    order-ORDER digital Butterworth response, as a forward-and-backward filter applies it (the same response as
    scipy.signal.sosfiltfilt of butter(ORDER, cutoff_hz), away from the clip's ends, where that pads by
    reflection and this by zeros)."""
    x = np.asarray(samples, np.float64)
    if not len(x):
        return np.asarray(samples, np.float32)
    padded = np.concatenate([np.zeros(_PAD), x, np.zeros(_PAD)])
    size = 1 << int(np.ceil(np.log2(len(padded))))
    spectrum = np.fft.rfft(padded, size)
    f = np.fft.rfftfreq(size, 1.0 / rate)
    # The digital Butterworth's response (bilinear transform: frequencies warped by tan), squared by the two passes.
    with np.errstate(over="ignore"):
        ratio = np.tan(np.pi * np.minimum(f, rate / 2 * 0.999999) / rate) / np.tan(np.pi * cutoff_hz / rate)
        spectrum *= 1.0 / (1.0 + ratio ** (2 * ORDER))
    return np.fft.irfft(spectrum, size)[_PAD : _PAD + len(x)].astype(np.float32)
