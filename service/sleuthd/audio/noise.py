"""How noisy a clip is, and noise from a clip's own quiet frames that brings a speaker's clips to a common SNR.

Why: a turn recorded or rendered with background noise sounds to both speaker encoders like another voice. Judging
a speaker whose clips differ in SNR on copies of every clip with the noisiest clip's own noise added until each is
as noisy lifted d-noise's balanced accuracy on the robustness matrix (docs/research/robustness.md, "Screen 5"):
the analogue of band and clip matching (sleuthd.audio.bandwidth, sleuthd.audio.clipping).

The SNR is estimated per clip from 20 ms frames: speech power is the mean of the louder half, noise power the
mean of the quietest tenth of the frames that are not digital silence; above CAP_DB a clip counts as clean, so
that clean clips with and without pauses (or a reverberant tail) compare equal. The noise added to a copy is the
noisiest clip's quietest tenth of frames, tiled: its own noise, whatever its colour.
"""

from __future__ import annotations

import numpy as np

FRAME = 320  # 20 ms at 16 kHz
CAP_DB = 20.0  # a clip cleaner than this counts as clean (SNR CAP_DB)
QUIET_PARTS = 10  # the quietest tenth of the frames is the noise
SILENCE = 1e-9  # frames this far below the speech power (90 dB) are digital silence, not noise
PEAK_LIMIT = 1.99  # a noisy copy is clipped inside the decoder's float PCM limit (FLOAT_PEAK_LIMIT, 2.0)


def _frames(x: np.ndarray) -> np.ndarray:
    """(n, FRAME): the clip's whole 20 ms frames (a partial last one is left out)."""
    return x[: len(x) // FRAME * FRAME].reshape(-1, FRAME)


def _frame_powers(samples: np.ndarray) -> np.ndarray:
    return np.sort((_frames(np.asarray(samples, np.float64)) ** 2).mean(axis=1))


def _powers(samples: np.ndarray) -> tuple[float, float] | None:
    """(speech power, noise power), or None for a clip shorter than two frames or silent."""
    e = _frame_powers(samples)
    if len(e) < 2:
        return None
    speech = float(e[len(e) // 2 :].mean())
    if not speech > 0:
        return None
    live = e[e > speech * SILENCE]
    return speech, float(live[: max(1, len(live) // QUIET_PARTS)].mean())


def snr_db(samples: np.ndarray) -> float | None:
    """The clip's estimated SNR in dB, at most CAP_DB; None for a clip too short or silent to tell."""
    found = _powers(samples)
    if found is None:
        return None
    speech, noise = found
    return min(CAP_DB, 10 * float(np.log10(speech / max(noise, 1e-20))))


def copy_snr(value: float) -> float:
    """The SNR copies are brought to for a speaker whose noisiest piece has ``value`` dB."""
    return round(value, 1)


def noise_bed(samples: np.ndarray) -> np.ndarray:
    """The clip's quietest tenth of 20 ms frames, in order: its noise, to be tiled into another clip."""
    frames = _frames(np.asarray(samples, np.float32))
    e = (frames**2).mean(axis=1)
    return frames[e <= np.quantile(e, 1 / QUIET_PARTS)].reshape(-1)


def add_noise(samples: np.ndarray, target_db: float, bed: np.ndarray) -> np.ndarray:
    """A copy with ``bed`` (tiled, scaled) added so that its estimated SNR falls to ``target_db``; a clip already
    that noisy (or one too short or silent to tell) is returned as it is."""
    x = np.asarray(samples, np.float64)
    found = _powers(x)
    if found is None or not len(bed):
        return x.astype(np.float32)
    speech, noise = found
    add = speech / 10 ** (target_db / 10) - noise
    if add <= 0:
        return x.astype(np.float32)
    source = np.tile(np.asarray(bed, np.float64), int(np.ceil(len(x) / len(bed))))[: len(x)]
    source = source / (source.std() + 1e-12)
    return np.clip(x + source * np.sqrt(add), -PEAK_LIMIT, PEAK_LIMIT).astype(np.float32)
