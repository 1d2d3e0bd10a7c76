"""Cutting a 16 kHz clip into the fixed-length windows the encoder embeds.

The mel front end lives inside the ONNX graph, so a window here is raw samples: ``window_frames``
STFT frames of ``hop_samples`` each, plus ``context_samples`` on both sides so the first and last
frames see the same (zero-padded, centred) context they would see in a whole-clip STFT.
Window placement follows GE2E's partial-utterance scheme: one window every 1/rate seconds, the last
kept only if the clip covers at least ``min_coverage`` of it, and never fewer than one window.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sleuthd.audio import SAMPLE_RATE


@dataclass(frozen=True)
class WindowSpec:
    """Geometry of encoder windows (samples at 16 kHz)."""

    window_frames: int = 160  # 1.6 s of 10 ms frames
    hop_samples: int = 160
    context_samples: int = 200  # n_fft // 2: the centred STFT's padding
    rate_per_second: float = 1.3  # windows started per second of audio
    min_coverage: float = 0.75

    @property
    def window_samples(self) -> int:
        """Samples fed to the encoder per window: (window_frames - 1) * hop + 2 * context."""
        return (self.window_frames - 1) * self.hop_samples + 2 * self.context_samples

    @property
    def span_samples(self) -> int:
        """Audio a window stands for (its frames' hops), used for placement and timing."""
        return self.window_frames * self.hop_samples


def step_frames(spec: WindowSpec) -> int:
    """STFT frames from one window's start to the next."""
    step = int(np.round((SAMPLE_RATE / spec.rate_per_second) / spec.hop_samples))
    if not 0 < step <= spec.window_frames:
        raise ValueError(f"window rate {spec.rate_per_second}/s gives a step of {step} frames")
    return step


def window_starts(n_samples: int, spec: WindowSpec) -> np.ndarray:
    """First STFT frame of each window, (n_windows,) int. Mirrors GE2E's partial-slice placement."""
    n_frames = int(np.ceil((n_samples + 1) / spec.hop_samples))
    step = step_frames(spec)
    steps = max(1, n_frames - spec.window_frames + step + 1)
    starts = np.arange(0, steps, step)
    last = starts[-1] * spec.hop_samples
    coverage = (n_samples - last) / spec.span_samples
    if coverage < spec.min_coverage and len(starts) > 1:
        starts = starts[:-1]
    return starts


def make_windows(samples: np.ndarray, spec: WindowSpec) -> tuple[np.ndarray, np.ndarray]:
    """Cut a clip into encoder windows.

    Returns ``(windows, starts)``: windows is (n_windows, spec.window_samples) float32, starts the
    first frame of each (multiply by hop_samples for the start sample).
    """
    starts = window_starts(len(samples), spec)
    end = int(starts[-1]) * spec.hop_samples + spec.span_samples
    padded = np.zeros(spec.context_samples + max(end, len(samples)) + spec.context_samples, np.float32)
    padded[spec.context_samples : spec.context_samples + len(samples)] = samples
    idx = starts[:, None] * spec.hop_samples + np.arange(spec.window_samples)[None, :]
    return padded[idx], starts
