"""The in-process scoring backend: a :class:`~sleuthd.lalm.local.LocalModel` behind the prompt batcher.

prompt → prepare (tokens, placeholder expansion; a worker thread) → batcher queue → one model call per
batch on the model thread → :class:`~sleuthd.lalm.types.AnswerScores` back to each caller.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path

from sleuthd.lalm.batcher import PromptBatcher, PromptBatcherConfig, PromptBatcherStats
from sleuthd.lalm.local import LocalModel, Prepared
from sleuthd.lalm.prompts import Prompt
from sleuthd.lalm.types import AnswerScores
from sleuthd.ops.observe import JudgeObserver
from sleuthd.threads import start_threads

logger = logging.getLogger(__name__)


class LocalScorer:
    """Scores prompts with an in-process model; concurrent callers share batched model calls."""

    backend = "in-process"

    def __init__(
        self,
        model: LocalModel,
        batching: PromptBatcherConfig | None = None,
        observer: JudgeObserver | None = None,
        prepare_executor: Executor | None = None,
    ) -> None:
        self.model = model
        self.model_name = model.name
        self.max_clip_seconds = model.max_clip_seconds
        self.weights_sha256 = model.weights_sha256
        # One thread owns the model: calls never overlap (one accelerator, an unsynchronised encoder cache).
        self._model_thread = ThreadPoolExecutor(1, thread_name_prefix="judge-model")
        # Started at the loading thread's priority, above the serving loop's (sleuthd.threads).
        start_threads(self._model_thread)
        self._own_prepare = prepare_executor is None
        if prepare_executor is None:
            prepare_executor = ThreadPoolExecutor(2, thread_name_prefix="judge-prepare")
            start_threads(prepare_executor)
        self._prepare: Executor = prepare_executor
        self.batcher: PromptBatcher[Prepared, AnswerScores] = PromptBatcher(
            model.run, lambda p: p.tokens, self._model_thread, batching, observer, name=f"judge {model.name}"
        )

    @classmethod
    def load(
        cls,
        folder: Path,
        device: str = "auto",
        dtype: str = "auto",
        encoder_cache_entries: int = 64,
        batching: PromptBatcherConfig | None = None,
        observer: JudgeObserver | None = None,
        weights: str = "",
    ) -> LocalScorer:
        """Load a model folder (blocking: call it from a thread at server start); ``weights`` is the
        folder's weights hash when the caller computed it already."""
        model = LocalModel.load(folder, device, dtype, encoder_cache_entries, weights)
        return cls(model, batching, observer)

    async def score(self, prompt: Prompt, deadline: float | None = None) -> AnswerScores:
        """The answer log-probabilities of one prompt. Raises InvalidRequest for a clip longer than the
        model's window, Overloaded when the queue is full, DeadlineExceeded past ``deadline``."""
        prepared = await asyncio.get_running_loop().run_in_executor(self._prepare, self.model.prepare, prompt)
        return await self.batcher.submit(prepared, deadline)

    @property
    def max_request_prompts(self) -> int:
        """Prompts one request may have waiting at once: the batcher's queue."""
        return self.batcher.config.max_queue_prompts

    def stats(self) -> PromptBatcherStats:
        return self.batcher.stats()

    @property
    def device(self) -> str:
        return str(self.model.device)

    @property
    def dtype(self) -> str:
        return str(self.model.dtype).removeprefix("torch.")

    @property
    def architecture(self) -> str:
        return self.model.arch

    async def aclose(self) -> None:
        await self.batcher.close()
        self._model_thread.shutdown(wait=True)
        if self._own_prepare:
            self._prepare.shutdown(wait=False)
