"""The judge's vocabulary: clips in, answer probabilities out. Plain frozen dataclasses, no torch."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from sleuthd.audio import SAMPLE_RATE as SAMPLE_RATE  # re-exported: the judge modules take it from here
from sleuthd.errors import InvalidRequest, Unsupported

# Every judge hears 16 kHz mono float32 audio; the engine decodes and resamples before it gets here.


class JudgeDeploymentError(Unsupported):
    """The judge's deployment cannot answer this prompt, and another try or another replica of sleuthd would
    not either: the remote server refused it (HTTP 4xx: too many audios per prompt for its
    --limit-mm-per-prompt, a prompt longer than its context, a chat template that renders no audio
    placeholder, an unknown model) or answers in a shape the judge cannot read. FAILED_PRECONDITION, with the
    server's own reason and the fix in the message."""


class JudgeUnanswered(JudgeDeploymentError):
    """None of the answer tokens is among the first-token log-probabilities a remote server returned (an
    older server that reports only its top k): the model or its chat template does not follow the judge's
    prompt."""


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

    Exact, except from a remote server that reported only its k most likely first tokens (one that ignores
    ``logprob_token_ids``): a spelling outside that list is unknown, not 0. Then ``log_probs`` and
    ``answer_mass`` count the spellings it reported (lower bounds) and ``upper_log_probs[i]`` adds, for each
    missing spelling, the k-th token's probability (no missing one can be more likely).
    """

    log_probs: tuple[float, ...]
    answer_mass: float  # probability, 0–1
    upper_log_probs: tuple[float, ...] | None = None  # None: exact

    @property
    def exact(self) -> bool:
        return self.upper_log_probs is None

    def shares(self) -> np.ndarray:
        """Each option's probability among the options only (sums to 1; from the lower bounds when inexact)."""
        lp = np.asarray(self.log_probs, np.float64)
        e = np.exp(lp - lp.max())
        return e / e.sum()

    def share_bounds(self, option: int) -> tuple[float, float]:
        """The least and the most ``option``'s share among the options can be (equal when exact)."""
        low = np.exp(np.asarray(self.log_probs, np.float64))
        high = low if self.upper_log_probs is None else np.exp(np.asarray(self.upper_log_probs, np.float64))
        others_low, others_high = low.sum() - low[option], high.sum() - high[option]
        lo = low[option] / (low[option] + others_high) if low[option] > 0 else 0.0
        hi = high[option] / (high[option] + others_low) if high[option] > 0 else 0.0
        return float(lo), float(hi)


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
        bounds: None when the answer is exact; else (least, most) ``probability`` can be, when a remote
            server reported only its top-k tokens and an answer spelling was not among them
            (``probability`` is then the most).
    """

    probability: float
    raw_probability: float
    answer_mass: float
    calibrated: bool
    model_name: str
    bounds: tuple[float, float] | None = None


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
    min_answer_mass: float = 0.0  # detection turns with less answer mass are UNCERTAIN (LOW_ANSWER_MASS)
    notes: tuple[str, ...] = field(default_factory=tuple)
