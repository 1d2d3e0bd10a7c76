"""The judge's vocabulary: clips in, answer probabilities out. Plain frozen dataclasses, no torch."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from sleuthd.audio import SAMPLE_RATE as SAMPLE_RATE  # re-exported: the judge modules take it from here
from sleuthd.errors import EngineFailure, InvalidRequest

# Every judge hears 16 kHz mono float32 audio; the engine decodes and resamples before it gets here.


class JudgeUnanswered(EngineFailure):
    """The model put none of the answer tokens among the first-token log-probabilities it returned
    (a remote endpoint reports only its top 20): the model or its chat template does not follow the
    judge's prompt, which is a deployment fault, not the client's (UNAVAILABLE)."""


class BatchTooLarge(RuntimeError):
    """A model call ran out of accelerator memory; the batcher splits the batch and retries the halves."""


@dataclass(frozen=True, eq=False)
class Clip:
    """One audio input of a prompt: 16 kHz mono float32 samples and a content hash.

    ``key`` identifies the samples (SHA-1 of their bytes), so a reference heard by many prompts is encoded
    once per batch and can be served from the encoder cache.
    """

    samples: np.ndarray  # (n_samples,) float32 at SAMPLE_RATE
    key: str

    @classmethod
    def of(cls, samples: np.ndarray, what: str = "clip") -> Clip:
        """Validate a waveform and wrap it. ``what`` names the clip in error messages."""
        wave = np.asarray(samples)
        if wave.ndim != 1:
            raise InvalidRequest(f"{what}: expected a mono waveform of shape (n,), got shape {wave.shape}")
        if wave.dtype != np.float32:
            raise InvalidRequest(f"{what}: expected float32 samples at {SAMPLE_RATE} Hz, got {wave.dtype}")
        if len(wave) < SAMPLE_RATE // 10:
            raise InvalidRequest(f"{what}: {len(wave) / SAMPLE_RATE:.3f} s of audio; the judge needs at least 0.1 s")
        if not np.all(np.isfinite(wave)):
            raise InvalidRequest(f"{what}: contains NaN or infinite samples")
        wave = np.ascontiguousarray(wave)
        return cls(wave, hashlib.sha1(wave.tobytes()).hexdigest())

    @property
    def seconds(self) -> float:
        return len(self.samples) / SAMPLE_RATE


@dataclass(frozen=True)
class AnswerScores:
    """What one prompt's first answer token says, before calibration.

    ``log_probs[i]`` is the log-probability (natural log, full vocabulary) of option ``i`` — the sum over
    that option's spellings ("Yes", "yes", …). ``answer_mass`` is the total probability on all options: near
    1 when the model answers the question, near 0 when it wants to say something else.
    """

    log_probs: tuple[float, ...]
    answer_mass: float  # probability, 0–1

    def shares(self) -> np.ndarray:
        """Each option's probability among the options only (sums to 1)."""
        lp = np.asarray(self.log_probs, np.float64)
        e = np.exp(lp - lp.max())
        return e / e.sum()


@dataclass(frozen=True)
class JudgeProbability:
    """The judge's answer for one turn under test.

    Fields:
        probability: P(the turn is NOT the reference speaker), 0–1. Calibrated when ``calibrated`` is true,
            otherwise the model's raw share of "No" among the answers "Yes"/"No".
        raw_probability: the model's raw share of "No", whatever the calibration.
        answer_mass: probability the model put on any answer token (0–1); low values mean the model wanted
            to say something else and ``probability`` rests on little.
        calibrated: whether ``probability`` went through a calibration fitted for these weights.
        model_name: the judge model's name (folder name or the endpoint's model name).
    """

    probability: float
    raw_probability: float
    answer_mass: float
    calibrated: bool
    model_name: str


@dataclass(frozen=True)
class RankedOption:
    """One candidate's place in a ranking.

    Fields:
        index: the candidate's position in the caller's list (0-based).
        rank: 1 = best fit to the speaker.
        probability: P(this candidate is the speaker's voice) among the candidates (0–1; the candidates'
            probabilities sum to 1), averaged over the orderings asked; temperature-calibrated when the
            ranking says ``calibrated``.
        answer_mass: mean probability the model put on any option letter (0–1).
    """

    index: int
    rank: int
    probability: float
    answer_mass: float


@dataclass(frozen=True)
class JudgeRanking:
    """The judge's ranking of candidates, best first.

    ``orderings`` is how many prompts (candidate orders, rotated so each candidate takes each letter once
    when all are asked) the probabilities average over; the order of options biases LALMs.
    """

    options: tuple[RankedOption, ...]
    calibrated: bool
    model_name: str
    orderings: int


@dataclass(frozen=True)
class JudgeInfo:
    """What GetServerInfo can say about the configured judge."""

    model_name: str
    backend: str  # "in-process" or "remote"
    architecture: str  # "qwen2-audio", "qwen2.5-omni", or "" when remote
    device: str  # "cuda:0", "cpu", or the endpoint URL
    dtype: str  # "bfloat16", "float16", "float32", or "" when remote
    max_clip_seconds: float  # longest clip the model hears whole; 0 when the remote does not say
    weights_sha256: str  # "" when unknown (a remote without --judge-weights-sha256)
    calibrated_detection: bool
    calibrated_discrimination: bool
    prompt_version: str
    notes: tuple[str, ...] = field(default_factory=tuple)
