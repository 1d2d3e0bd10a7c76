"""Voice activity detection and silence trimming: Silero VAD (MIT) run by ONNX Runtime, or a frame
energy detector.

Silero: we use the "sequence" export that ships in the ``silero-vad`` wheel; it takes a whole block of
32 ms frames in one call, so a clip costs one ONNX call (about 2.4 ms per second of audio on one core).
Energy: frames within ``relative_db`` of the clip's loud frames and above an absolute floor are speech
(about 0.05 ms per second of audio). Both feed the same hysteresis, minimum-run and padding rules.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import onnxruntime as ort

from sleuthd.audio import SAMPLE_RATE

logger = logging.getLogger(__name__)

FRAME_SAMPLES = 512  # 32 ms at 16 kHz
CONTEXT_SAMPLES = 64  # the model sees the tail of the previous frame
MAX_FRAMES_PER_CALL = 512  # ~16 s per ONNX call; longer clips carry the LSTM state across calls
STATE_SIZE = 128


@dataclass(frozen=True)
class VadOptions:
    """Speech/silence decisions from per-frame speech probabilities (all in [0, 1] or milliseconds)."""

    # A frame starts speech at this probability...
    onset: float = 0.5
    # ...and speech continues until the probability falls below this (hysteresis).
    offset: float = 0.35
    # Speech runs shorter than this are clicks or breaths, not speech.
    min_speech_ms: float = 96.0
    # Silence kept on each side of a speech run, so word edges are not clipped.
    pad_ms: float = 64.0


@dataclass(frozen=True)
class SpeechMask:
    """Which samples of a 16 kHz clip to keep, and how much of it is speech."""

    keep: np.ndarray  # (n_samples,) bool: speech runs plus padding
    speech_seconds: float  # summed length of the detected speech runs, without padding


class Vad(Protocol):
    """Finds the speech in a 16 kHz mono clip."""

    name: str

    def speech_mask(self, samples: np.ndarray) -> SpeechMask: ...


class SileroVad:
    """Runs the Silero VAD sequence model. One instance per process; thread-safe (ORT sessions are)."""

    name = "silero"

    def __init__(self, model_path: Path, options: VadOptions | None = None) -> None:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        self._session = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
        self.options = options or VadOptions()

    def frame_probabilities(self, samples: np.ndarray) -> np.ndarray:
        """Speech probability of each 32 ms frame, (ceil(n/512),) float32 in [0, 1]."""
        n_frames = (len(samples) + FRAME_SAMPLES - 1) // FRAME_SAMPLES
        if n_frames == 0:
            return np.zeros(0, np.float32)
        frames = np.zeros((n_frames, FRAME_SAMPLES), np.float32)
        frames.reshape(-1)[: len(samples)] = samples
        context = np.zeros((n_frames, CONTEXT_SAMPLES), np.float32)
        context[1:] = frames[:-1, -CONTEXT_SAMPLES:]
        blocks = np.concatenate([context, frames], axis=1)
        h = np.zeros((1, 1, STATE_SIZE), np.float32)
        c = np.zeros((1, 1, STATE_SIZE), np.float32)
        out = []
        for start in range(0, n_frames, MAX_FRAMES_PER_CALL):
            probs, h, c = self._session.run(
                ["speech_probs", "hn", "cn"],
                {"input": blocks[start : start + MAX_FRAMES_PER_CALL], "h": h, "c": c},
            )
            out.append(probs)
        return np.concatenate(out).astype(np.float32)

    def speech_mask(self, samples: np.ndarray) -> SpeechMask:
        """Speech runs of a 16 kHz mono clip, see :class:`VadOptions`."""
        return mask_from_probabilities(self.frame_probabilities(samples), len(samples), self.options)


def mask_from_probabilities(probs: np.ndarray, n_samples: int, options: VadOptions) -> SpeechMask:
    """Turn per-frame probabilities into a sample mask with hysteresis, a minimum run and padding."""
    runs: list[tuple[int, int]] = []
    start: int | None = None
    for i, p in enumerate(probs):
        if start is None and p >= options.onset:
            start = i
        elif start is not None and p < options.offset:
            runs.append((start, i))
            start = None
    if start is not None:
        runs.append((start, len(probs)))

    min_frames = options.min_speech_ms / 1000 * SAMPLE_RATE / FRAME_SAMPLES
    runs = [(a, b) for a, b in runs if b - a >= min_frames]
    keep = np.zeros(n_samples, bool)
    pad = int(options.pad_ms / 1000 * SAMPLE_RATE)
    speech_samples = 0
    for a, b in runs:
        s, e = a * FRAME_SAMPLES, min(b * FRAME_SAMPLES, n_samples)
        speech_samples += max(0, e - s)
        keep[max(0, s - pad) : min(n_samples, e + pad)] = True
    return SpeechMask(keep=keep, speech_seconds=speech_samples / SAMPLE_RATE)


@dataclass(frozen=True)
class EnergyOptions:
    """Frame-energy speech detection (levels in dBFS of the loudness-normalised clip)."""

    # Frames quieter than this are never speech, however quiet the whole clip is.
    floor_dbfs: float = -55.0
    # A frame is speech when it is within this many dB of the clip's loud frames (95th percentile)...
    relative_db: float = 30.0
    # ...and keeps being speech down to this much further below (hysteresis for word endings).
    hangover_db: float = 6.0


class EnergyVad:
    """Speech = frames loud relative to the clip. Fast and dependable on clean (synthesized) audio;
    unlike Silero it counts steady background noise as speech."""

    name = "energy"

    def __init__(self, options: VadOptions | None = None, energy: EnergyOptions | None = None) -> None:
        self.options = options or VadOptions()
        self.energy = energy or EnergyOptions()

    def frame_levels(self, samples: np.ndarray) -> np.ndarray:
        """dBFS of each 32 ms frame, (ceil(n/512),)."""
        n_frames = (len(samples) + FRAME_SAMPLES - 1) // FRAME_SAMPLES
        frames = np.zeros((n_frames, FRAME_SAMPLES), np.float32)
        frames.reshape(-1)[: len(samples)] = samples
        power = np.einsum("ij,ij->i", frames, frames) / FRAME_SAMPLES
        return np.asarray(10.0 * np.log10(np.maximum(power, 1e-12)))

    def speech_mask(self, samples: np.ndarray) -> SpeechMask:
        levels = self.frame_levels(samples)
        if len(levels) == 0:
            return SpeechMask(np.zeros(len(samples), bool), 0.0)
        loud = float(np.percentile(levels, 95))
        onset = max(self.energy.floor_dbfs, loud - self.energy.relative_db)
        # Map levels onto the [0, 1] scale the shared hysteresis rule reads: 1 = clearly speech,
        # between the offset and onset thresholds = continuing speech, 0 = silence.
        probs = np.where(
            levels >= onset, 1.0, np.where(levels >= onset - self.energy.hangover_db, self.options.offset, 0.0)
        )
        return mask_from_probabilities(probs, len(samples), self.options)
