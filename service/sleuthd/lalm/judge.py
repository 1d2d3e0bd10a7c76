"""The LALM judge: per-turn detection and candidate ranking from answer-token probabilities.

The engine talks to :class:`Judge`; :class:`LalmJudge` implements it over either scoring backend
(:class:`~sleuthd.lalm.inprocess.LocalScorer` or :class:`~sleuthd.lalm.remote.RemoteScorer`), which both
turn one :class:`~sleuthd.lalm.prompts.Prompt` into :class:`~sleuthd.lalm.types.AnswerScores`:

    waveforms → validated clips → prompts (reference, context turns, the turn or the candidates; audio only)
              → scorer (batched in-process model, or HTTP) → raw answer probabilities
              → calibration for these weights (or none, and every result says so) → results

:func:`load_judge` builds one from a :class:`~sleuthd.config.JudgeConfig`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol, TypeVar

import numpy as np

from sleuthd.config import JudgeConfig
from sleuthd.errors import InvalidRequest, LimitExceeded
from sleuthd.lalm import prompts
from sleuthd.lalm.batcher import PromptBatcherConfig
from sleuthd.lalm.calibration import JudgeCalibration, select, weights_sha256
from sleuthd.lalm.types import AnswerScores, Clip, JudgeInfo, JudgeProbability, JudgeRanking, RankedOption
from sleuthd.ops.observe import JudgeObserver

logger = logging.getLogger(__name__)

# What a server without a judge answers to `method: lalm` (FAILED_PRECONDITION).
NO_JUDGE = (
    "method lalm needs an LALM judge, and this server has none: start it with --judge-model DIR (an in-process "
    "Qwen2-Audio or Qwen2.5-Omni folder; needs the judge extra: pip install 'sleuthd[judge]') or with "
    "--judge-endpoint URL --judge-model-name NAME (an OpenAI-compatible server such as vLLM)"
)

T = TypeVar("T")

# The answer mass (0-1) below which a detection turn is UNCERTAIN when neither the options nor the
# calibration set a floor: the model put more probability on saying something other than Yes or No.
DEFAULT_MIN_ANSWER_MASS = 0.5


class PromptScorer(Protocol):
    """A backend: one prompt in, its answer options' log-probabilities out."""

    @property
    def backend(self) -> str: ...  # "in-process" or "remote"
    @property
    def model_name(self) -> str: ...
    @property
    def max_clip_seconds(self) -> float: ...  # longest clip the model hears whole
    @property
    def weights_sha256(self) -> str: ...  # "" when unknown
    @property
    def architecture(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def max_request_prompts(self) -> int: ...  # prompts one request can have waiting at once

    async def score(self, prompt: prompts.Prompt, deadline: float | None = None) -> AnswerScores: ...
    async def aclose(self) -> None: ...


class Judge(Protocol):
    """What the engine calls. Waveforms are 16 kHz mono float32; ``deadline`` is on ``loop.time()``."""

    info: JudgeInfo
    max_context_clips: int  # other turns heard with each turn by detect_turns (the nearest in the dialogue)

    def admit(self, prompts: int) -> None:
        """Refuse (LimitExceeded) a request that would ask more prompts at once than the judge's queue holds."""
        ...

    async def detect(
        self,
        test: np.ndarray,
        reference: np.ndarray | None,
        context: Sequence[np.ndarray] = (),
        deadline: float | None = None,
    ) -> JudgeProbability: ...

    async def detect_turns(
        self, turns: Sequence[np.ndarray], reference: np.ndarray | None, deadline: float | None = None
    ) -> list[JudgeProbability]: ...

    async def rank(
        self,
        candidates: Sequence[np.ndarray],
        reference: np.ndarray | None,
        context: Sequence[np.ndarray] = (),
        deadline: float | None = None,
    ) -> JudgeRanking: ...

    async def aclose(self) -> None: ...


def nearest_context(n: int, i: int, k: int) -> list[int]:
    """Up to ``k`` indices of turns other than ``i`` among ``n``, nearest to ``i`` first (earlier on ties),
    returned in dialogue order."""
    others = sorted((j for j in range(n) if j != i), key=lambda j: (abs(j - i), j))[:k]
    return sorted(others)


def rotations(n: int, k: int) -> list[int]:
    """``k`` evenly spaced rotations of ``n`` candidates (all ``n`` when ``k`` is 0 or at least ``n``)."""
    k = n if k <= 0 or k >= n else k
    return sorted({round(j * n / k) % n for j in range(k)})


async def _all(aws: Sequence[Awaitable[T]]) -> list[T]:
    """Await all; on the first failure cancel the rest (their prompts leave the queue) and re-raise."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        raise


class LalmJudge:
    """:class:`Judge` over a :class:`PromptScorer`, with an optional calibration for its weights."""

    def __init__(
        self,
        scorer: PromptScorer,
        calibration: JudgeCalibration | None = None,
        max_context_clips: int = 4,
        orderings: int = 0,
        min_answer_mass: float = -1.0,
    ) -> None:
        """``min_answer_mass``: detection turns with less answer mass (0-1) are UNCERTAIN; negative = the
        calibration's floor, or :data:`DEFAULT_MIN_ANSWER_MASS`."""
        if calibration is not None and calibration.weights_sha256 != scorer.weights_sha256:
            raise ValueError("the calibration was fitted for other weights")  # select() refuses this earlier
        self.scorer = scorer
        self.calibration = calibration
        self.max_context_clips = max_context_clips
        self.orderings = orderings
        if min_answer_mass < 0:
            floor = calibration.min_answer_mass if calibration is not None else None
            min_answer_mass = DEFAULT_MIN_ANSWER_MASS if floor is None else floor
        self.min_answer_mass = min_answer_mass
        self.info = JudgeInfo(
            model_name=scorer.model_name,
            backend=scorer.backend,
            architecture=scorer.architecture,
            device=scorer.device,
            dtype=scorer.dtype,
            max_clip_seconds=scorer.max_clip_seconds,
            weights_sha256=scorer.weights_sha256,
            calibrated_detection=calibration is not None and calibration.detection is not None,
            calibrated_discrimination=calibration is not None and calibration.discrimination is not None,
            prompt_version=prompts.PROMPT_VERSION,
            min_answer_mass=min_answer_mass,
        )

    def _clip(self, wave: np.ndarray, what: str) -> Clip:
        clip = Clip.of(wave, what)
        if self.scorer.max_clip_seconds and clip.seconds > self.scorer.max_clip_seconds:
            raise InvalidRequest(
                f"{what} is {clip.seconds:.1f} s; the judge {self.scorer.model_name} hears at most "
                f"{self.scorer.max_clip_seconds:.0f} s per clip and never cuts clips: send a shorter excerpt "
                "or use an embedding method"
            )
        return clip

    def admit(self, prompts: int) -> None:
        """Refuse a request of more prompts than can wait at once (it would never fit; not "retry later")."""
        limit = self.scorer.max_request_prompts
        if prompts > limit:
            raise LimitExceeded(
                f"this request asks the judge {prompts} prompts at once (one per turn of each speaker) and the "
                f"judge's queue holds {limit} (--judge-max-queue-prompts"
                + (" plus --judge-max-concurrent-requests" if self.scorer.backend == "remote" else "")
                + "): send fewer turns per request"
            )

    async def start(self) -> str:
        """The start-up self-test (sleuthd.lalm.selftest); ConfigError (one line) when the judge cannot work."""
        from sleuthd.lalm.remote import RemoteScorer
        from sleuthd.lalm.selftest import run_self_test

        if isinstance(self.scorer, RemoteScorer):
            await self.scorer.check()
        found = await run_self_test(self.scorer, self.min_answer_mass)
        self.info = replace(self.info, architecture=self.scorer.architecture)
        return found

    def _probability(self, scores: AnswerScores) -> JudgeProbability:
        platt = self.calibration.detection if self.calibration else None
        low, high = scores.share_bounds(1)  # options are (Yes = same, No = different)
        # From a server that reported only its top tokens an answer may be unknown: report the most it can be.
        raw = float(scores.shares()[1]) if scores.exact else high
        bounds = None if scores.exact else ((platt.apply(low), platt.apply(high)) if platt else (low, high))
        return JudgeProbability(
            probability=platt.apply(raw) if platt else raw,
            raw_probability=raw,
            answer_mass=scores.answer_mass,
            calibrated=platt is not None,
            model_name=self.scorer.model_name,
            bounds=bounds,
        )

    async def detect(
        self,
        test: np.ndarray,
        reference: np.ndarray | None,
        context: Sequence[np.ndarray] = (),
        deadline: float | None = None,
    ) -> JudgeProbability:
        """P(``test`` is not the speaker of ``reference`` / of ``context``, the speaker's other turns)."""
        ref = self._clip(reference, "the reference") if reference is not None else None
        ctx = [self._clip(c, f"context turn {i + 1}") for i, c in enumerate(context)]
        prompt = prompts.detection(self._clip(test, "the turn under test"), ref, ctx)
        return self._probability(await self.scorer.score(prompt, deadline))

    async def detect_turns(
        self, turns: Sequence[np.ndarray], reference: np.ndarray | None, deadline: float | None = None
    ) -> list[JudgeProbability]:
        """One speaker's turns, each judged against the reference and its nearest other turns
        (up to ``max_context_clips``); the prompts share batched model calls."""
        clips = [self._clip(t, f"turn {i + 1} of the speaker") for i, t in enumerate(turns)]
        ref = self._clip(reference, "the reference") if reference is not None else None
        self.admit(len(clips))
        batch = []
        for i, clip in enumerate(clips):
            ctx = [clips[j] for j in nearest_context(len(clips), i, self.max_context_clips)]
            batch.append(prompts.detection(clip, ref, ctx))
        scores = await _all([self.scorer.score(p, deadline) for p in batch])
        return [self._probability(s) for s in scores]

    async def rank(
        self,
        candidates: Sequence[np.ndarray],
        reference: np.ndarray | None,
        context: Sequence[np.ndarray] = (),
        deadline: float | None = None,
    ) -> JudgeRanking:
        """Candidates ranked by how much they sound like the speaker of ``reference``/``context``.

        The candidates are asked in several orders (rotations) and each candidate's answer probability is
        averaged over them, so the letter a candidate happens to get does not decide its rank. The prompts
        hear the first ``max_context_clips`` context clips, as a detection prompt hears that many other turns
        (so a prompt never has more than reference + ``max_context_clips`` + 10 audio inputs: the number a
        vLLM server's --limit-mm-per-prompt must allow).
        """
        cands = [self._clip(c, f"candidate {i + 1}") for i, c in enumerate(candidates)]
        ref = self._clip(reference, "the reference") if reference is not None else None
        ctx = [self._clip(c, f"context clip {i + 1}") for i, c in enumerate(context[: self.max_context_clips])]
        n = len(cands)
        shifts = rotations(n, self.orderings)
        self.admit(len(shifts))
        orders = [[(j + r) % n for j in range(n)] for r in shifts]
        batch = [prompts.discrimination([cands[k] for k in order], ref, ctx) for order in orders]
        scores = await _all([self.scorer.score(p, deadline) for p in batch])
        shares = np.zeros(n)
        for order, s in zip(orders, scores, strict=True):
            # option j of this prompt is candidate order[j]; from a top-k-only server, the letters it reported
            shares[order] += s.shares()
        shares /= len(orders)
        temp = self.calibration.discrimination if self.calibration else None
        if temp is not None:
            shares = temp.apply(shares)
        mass = float(np.mean([s.answer_mass for s in scores]))
        best_first = sorted(range(n), key=lambda k: (-shares[k], k))
        ranks = {k: r for r, k in enumerate(best_first, 1)}
        options = tuple(RankedOption(k, ranks[k], float(shares[k]), mass) for k in range(n))
        return JudgeRanking(options, temp is not None, self.scorer.model_name, len(orders))

    async def aclose(self) -> None:
        await self.scorer.aclose()


def _calibration(config: JudgeConfig, weights: str) -> JudgeCalibration | None:
    if not config.judge_calibration:
        return None
    return select(Path(config.judge_calibration), weights, prompts.PROMPT_VERSION)


def load_judge(config: JudgeConfig, observer: JudgeObserver | None = None) -> LalmJudge:
    """The judge ``config`` describes (blocking: loads weights; call it from a thread at server start).

    Raises :class:`~sleuthd.config.ConfigError` when the judge cannot be built (no judge configured, a
    missing extra, an unsupported folder, or a calibration for other weights or another prompt version).
    """
    from sleuthd.config import ConfigError

    scorer: PromptScorer
    if config.judge_model:
        from sleuthd.lalm.checkpoint import detect_architecture
        from sleuthd.lalm.inprocess import LocalScorer

        folder = Path(config.judge_model)
        detect_architecture(folder)  # an unsupported folder is refused before anything is hashed or loaded
        weights = weights_sha256(folder)
        # The calibration is checked before the weights load: a wrong one fails in seconds, not minutes.
        calibration = _calibration(config, weights)
        batching = PromptBatcherConfig.from_config(config)
        scorer = LocalScorer.load(
            folder,
            config.judge_device,
            config.judge_dtype,
            config.judge_encoder_cache_entries,
            batching,
            observer,
            weights,
        )
    elif config.judge_endpoint:
        from sleuthd.lalm.remote import RemoteScorer

        calibration = _calibration(config, config.judge_weights_sha256)
        scorer = RemoteScorer(
            config.judge_endpoint,
            config.judge_model_name,
            max_clip_seconds=config.judge_remote_max_clip_seconds,
            weights_sha256=config.judge_weights_sha256,
            top_logprobs=config.judge_top_logprobs,
            max_concurrent_requests=config.judge_max_concurrent_requests,
            max_queue_prompts=config.judge_max_queue_prompts,
            request_timeout_s=config.judge_request_timeout_s,
            reuse_clips=config.judge_remote_reuse_clips == "on",
        )
    else:
        raise ConfigError(NO_JUDGE)
    if calibration is None:
        logger.warning(
            "judge %s runs uncalibrated: its probabilities are the model's raw answer shares", scorer.model_name
        )
    return LalmJudge(
        scorer, calibration, config.judge_max_context_clips, config.judge_orderings, config.judge_min_answer_mass
    )
