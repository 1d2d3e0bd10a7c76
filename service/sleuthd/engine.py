"""The scoring engine: dialogue and candidate requests in, verdicts out. Never imports grpc.

Work per request: validate -> look up or prepare every clip on worker threads (decode, resample, VAD,
windows) -> embed each clip through the shared encoder (the micro-batcher merges the windows of all
concurrent requests into few model calls) -> pure judgment (sleuthd.judge, sleuthd.scoring).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Collection, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from sleuthd import scoring
from sleuthd.audio import AudioError
from sleuthd.batcher import BatcherConfig, BatchObserver, MicroBatcher, NullObserver
from sleuthd.calibration import Calibration, CalibrationError, candidate_fit, reliability
from sleuthd.clips import ClipEmbedding, PreparedClip, embedded_clip, prepare_placements
from sleuthd.domain import (
    AudioInput,
    CheckOptions,
    DialogueRequest,
    DialogueResult,
    RankedCandidateResult,
    RankRequest,
    RankResult,
    SpeakerResult,
    ThresholdSet,
    TurnResult,
    TurnStatus,
)
from sleuthd.drift import DriftConfig, DriftResult, detect_drift
from sleuthd.embedding_cache import LruCache, audio_key
from sleuthd.encoder import OnnxEncoder, ThreadedEncoder, WindowEncoder
from sleuthd.errors import DeadlineExceeded, InvalidRequest, LimitExceeded, UnknownName, Unsupported
from sleuthd.features import WindowSpec
from sleuthd.judge import Judgment, judge_dialogue, stack_embeddings
from sleuthd.manifest import (
    PAPER_THRESHOLDS,
    find_encoders,
    load_encoder_manifest,
    vad_model_path,
)
from sleuthd.scoring import METHODS, Method
from sleuthd.single_flight import SingleFlight
from sleuthd.vad import EnergyVad, SileroVad, Vad

logger = logging.getLogger(__name__)

MAX_ID_CHARS = 128


@dataclass(frozen=True)
class EngineConfig:
    """Engine limits and placement. Every field is a documented server option."""

    models_dir: Path
    default_encoder: str = "ge2e"
    device: str = "auto"  # "cpu", "cuda" or "auto"
    max_clip_seconds: float = 300.0  # longest single clip accepted, seconds
    max_turns: int = 1000  # turns per dialogue (and per stream)
    max_candidates: int = 64  # candidates per RankCandidates
    max_context: int = 256  # context clips per RankCandidates
    workers: int = 0  # threads for decoding/VAD and model calls; 0 = CPU count
    # Clip embeddings remembered by audio hash (about 2 KB each); 0 disables the cache.
    embedding_cache_entries: int = 4096
    # "on": merge the windows of concurrent requests into shared model calls (sleuthd.batcher).
    # "off": no batching, every window is its own model call. "clip": each clip's windows in one call
    # (as resemblyzer's embed_utterance does) but nothing shared across clips or requests.
    batching: Literal["on", "off", "clip"] = "on"
    batcher: BatcherConfig = field(default_factory=BatcherConfig)
    # Speech detection for silence trimming and the minimum-speech check (sleuthd.vad).
    vad: Literal["silero", "energy"] = "energy"


class EngineObserver(BatchObserver, Protocol):
    """What the engine reports for monitoring (implemented with Prometheus in sleuthd.metrics)."""

    def clip_embedded(self, audio_seconds: float, cached: bool) -> None: ...

    def verdict(self, status: TurnStatus) -> None: ...


class NullEngineObserver(NullObserver):
    def clip_embedded(self, audio_seconds: float, cached: bool) -> None:
        pass

    def verdict(self, status: TurnStatus) -> None:
        pass


@dataclass(frozen=True)
class ResolvedOptions:
    encoder: WindowEncoder
    judgment: Judgment
    threshold_set: ThresholdSet

    @property
    def method(self) -> Method:
        return self.judgment.method

    def result(
        self, dialogue_id: str, turns: Sequence[TurnResult], speakers: Sequence[SpeakerResult]
    ) -> DialogueResult:
        """The dialogue verdict, stating which encoder, method and threshold set judged it."""
        return DialogueResult(
            dialogue_id=dialogue_id,
            turns=tuple(turns),
            speakers=tuple(speakers),
            encoder=self.encoder.manifest.name,
            method=self.method,
            threshold_set=self.threshold_set,
        )


class Engine:
    def __init__(
        self,
        encoders: dict[str, WindowEncoder],
        vad: Vad,
        config: EngineConfig,
        executor: Executor,
        observer: EngineObserver | None = None,
        model_executor: Executor | None = None,
    ) -> None:
        if config.default_encoder not in encoders:
            raise ValueError(f"default encoder {config.default_encoder!r} is not loaded ({sorted(encoders)})")
        self.encoders = encoders
        self.vad = vad
        self.config = config
        self.observer: EngineObserver = observer or NullEngineObserver()
        self._executor = executor
        self._model_executor = model_executor
        self.cache: LruCache[ClipEmbedding] = LruCache(config.embedding_cache_entries)
        # Cache misses in flight, by cache key(s): concurrent requests for the same clip share one computation.
        self._in_flight: SingleFlight[str, list[ClipEmbedding]] = SingleFlight()
        self.active_streams = 0
        # An encoder without a usable calibration still serves the paper methods; auto then fails
        # with the reason instead of quietly falling back to a fixed threshold.
        self.calibrations: dict[str, Calibration | CalibrationError] = {}
        self.drift_configs: dict[str, DriftConfig] = {}
        for name, enc in encoders.items():
            try:
                self.calibrations[name] = Calibration.from_manifest(enc.manifest.raw, name)
            except CalibrationError as exc:
                logger.warning("%s", exc)
                self.calibrations[name] = exc
            if "drift" in enc.manifest.raw:
                self.drift_configs[name] = DriftConfig.from_manifest(enc.manifest.raw["drift"])

    @classmethod
    def load(cls, config: EngineConfig, observer: EngineObserver | None = None) -> Engine:
        """Load every encoder manifest under ``config.models_dir`` and the VAD, and warm them up."""
        # Two pools, so model calls never queue behind a backlog of decoding/VAD jobs: with one shared
        # FIFO pool a batch ready to run would wait for every clip queued before it.
        executor = ThreadPoolExecutor(max_workers=config.workers or (os.cpu_count() or 1), thread_name_prefix="prep")
        if config.batching not in ("on", "off", "clip"):
            raise ValueError(f"batching must be on, off or clip, not {config.batching!r}")
        batched = config.batching == "on"
        model_threads = config.batcher.max_concurrent_batches if batched else (os.cpu_count() or 1)
        model_executor = ThreadPoolExecutor(max_workers=model_threads, thread_name_prefix="model")
        vad: Vad = SileroVad(vad_model_path(config.models_dir)) if config.vad == "silero" else EnergyVad()
        encoders: dict[str, WindowEncoder] = {}
        for model_dir in find_encoders(config.models_dir):
            runner = OnnxEncoder(load_encoder_manifest(model_dir), device=config.device)
            runner.warm_up()
            if batched:
                encoders[runner.manifest.name] = MicroBatcher(runner, model_executor, config.batcher, observer)
            else:
                per_call = 1 if config.batching == "off" else None
                encoders[runner.manifest.name] = ThreadedEncoder(runner, model_executor, per_call)
            logger.info("encoder %s on %s, batching %s", runner.manifest.name, runner.provider, config.batching)
        if not encoders:
            raise InvalidRequest(f"no encoder manifests under {config.models_dir}: run `sleuthd models export ge2e`")
        return cls(encoders, vad, config, executor, observer, model_executor)

    async def aclose(self) -> None:
        for enc in self.encoders.values():
            if isinstance(enc, MicroBatcher):
                await enc.close()
        self.close()

    def close(self) -> None:
        for executor in (self._executor, self._model_executor):
            if isinstance(executor, ThreadPoolExecutor):
                executor.shutdown(wait=True, cancel_futures=True)

    # ------------------------------------------------------------------ options

    def resolve(self, options: CheckOptions) -> ResolvedOptions:
        """Apply defaults: encoder, method, threshold (explicit > threshold set > manifest)."""
        name = options.encoder or self.config.default_encoder
        if name not in self.encoders:
            raise UnknownName(f"unknown encoder {name!r}; this server has: {', '.join(sorted(self.encoders))}")
        encoder = self.encoders[name]
        manifest = encoder.manifest
        method = options.method or Method(manifest.default_method)
        info = METHODS[method]
        calibration = self.calibrations[name]
        if method is Method.AUTO and isinstance(calibration, CalibrationError):
            raise Unsupported(str(calibration))
        if options.threshold is not None:
            lo, hi = info.threshold_range
            if not (np.isfinite(options.threshold) and lo <= options.threshold <= hi):
                raise InvalidRequest(
                    f"threshold {options.threshold} is outside the {method.value} scale ({info.scale}, {lo}–{hi})"
                )
            threshold = float(options.threshold)
        elif method is Method.AUTO:
            if options.threshold_set is ThresholdSet.PAPER:
                raise InvalidRequest("the paper has no threshold for method auto: use the default threshold set")
            assert isinstance(calibration, Calibration)
            threshold = calibration.decision_threshold
        elif options.threshold_set is ThresholdSet.PAPER:
            threshold = PAPER_THRESHOLDS[method.value]
        else:
            if method.value not in manifest.default_thresholds:
                raise InvalidRequest(f"encoder {name!r} has no default threshold for method {method.value!r}")
            threshold = manifest.default_thresholds[method.value]
        if options.detect_drift and name not in self.drift_configs:
            raise Unsupported(f"encoder {name!r} has no drift settings in its manifest, so detect_drift is unavailable")
        usable_calibration = calibration if isinstance(calibration, Calibration) else None
        return ResolvedOptions(encoder, Judgment(method, threshold, usable_calibration), options.threshold_set)

    # ------------------------------------------------------------------ embedding

    async def _embed_one(
        self,
        encoder: WindowEncoder,
        audio: AudioInput,
        label: str,
        deadline: float | None,
        windows: Sequence[WindowSpec | None],
    ) -> list[tuple[ClipEmbedding, bool]]:
        """A clip's embedding under each window placement (None: the manifest's; drift analysis asks
        for denser windows too), each with whether it was already there (cached, or being computed
        for a concurrent request). The placement is part of the cache key; the placements not cached
        are prepared together, from one decode and VAD pass."""
        # Hashing costs ~1 ms per MB; skip it when the cache is off.
        base = audio_key(encoder.manifest.sha256, audio) if self.cache.max_entries > 0 else ""
        keys = [base + (f":{w}" if w else "") if base else "" for w in windows]
        found: list[ClipEmbedding | None] = [self.cache.get(k) if k else None for k in keys]
        missing = [i for i, clip in enumerate(found) if clip is None]
        joined = False
        if missing:
            todo = [windows[i] for i in missing]
            todo_keys = [keys[i] for i in missing]
            try:
                if base:  # a concurrent request for the same clip and placements shares the work
                    loop = asyncio.get_running_loop()
                    timeout = None if deadline is None else max(deadline - loop.time(), 0.0)
                    computed, joined = await self._in_flight.run(
                        "|".join(todo_keys), lambda: self._compute(encoder, audio, todo, None, todo_keys), timeout
                    )
                else:
                    computed = await self._compute(encoder, audio, todo, deadline, todo_keys)
            except AudioError as exc:
                raise AudioError(f"{label}: {exc}") from exc
            except TimeoutError as exc:
                if isinstance(exc, DeadlineExceeded):
                    raise
                raise DeadlineExceeded(f"{label}: the deadline passed before its embedding was ready") from exc
            for i, result in zip(missing, computed, strict=True):
                found[i] = result
        return [(clip, joined or i not in missing) for i, clip in enumerate(found) if clip is not None]

    async def _compute(
        self,
        encoder: WindowEncoder,
        audio: AudioInput,
        windows: Sequence[WindowSpec | None],
        deadline: float | None,
        keys: Sequence[str],
    ) -> list[ClipEmbedding]:
        """Decode, trim and cut the clip once for all ``windows``, embed each placement and cache
        it under its key ("" when the cache is off). Raises AudioError without a label."""
        loop = asyncio.get_running_loop()
        prepared = await loop.run_in_executor(
            self._executor, prepare_placements, audio, encoder.manifest, self.vad, self.config.max_clip_seconds, windows
        )
        embedded = await asyncio.gather(*(self._embed_prepared(encoder, clip, deadline) for clip in prepared))
        for key, result in zip(keys, embedded, strict=True):
            if key:
                self.cache.put(key, result)
        return list(embedded)

    @staticmethod
    async def _embed_prepared(encoder: WindowEncoder, clip: PreparedClip, deadline: float | None) -> ClipEmbedding:
        if clip.windows is None:
            return ClipEmbedding(clip.audio_seconds, clip.speech_seconds, None, None, None, clip.detail)
        window_emb = await encoder.encode(clip.windows, deadline=deadline)
        return embedded_clip(clip, window_emb)

    async def embed_audio(
        self,
        encoder: WindowEncoder,
        audios: Sequence[tuple[AudioInput, str]],
        deadline: float | None = None,
    ) -> list[ClipEmbedding]:
        """Embed clips (each with a label for error messages) concurrently; results in input order.

        Raises AudioError naming the label of a clip whose bytes cannot be decoded, DeadlineExceeded
        when ``deadline`` (event-loop clock) passes first.
        """
        return [clip for clip, _ in await self.embed_placements(encoder, audios, deadline, with_drift=False)]

    async def embed_placements(
        self,
        encoder: WindowEncoder,
        audios: Sequence[tuple[AudioInput, str]],
        deadline: float | None,
        with_drift: bool,
    ) -> list[tuple[ClipEmbedding, ClipEmbedding | None]]:
        """:meth:`embed_audio`, and with ``with_drift`` each clip's embedding on the denser drift
        windows too (else None), both from one decode of the clip."""
        if deadline is not None and asyncio.get_running_loop().time() >= deadline:
            raise DeadlineExceeded("the deadline passed before the request could be started")
        windows = (None, self.drift_window(encoder)) if with_drift else (None,)
        tasks = [asyncio.ensure_future(self._embed_one(encoder, a, label, deadline, windows)) for a, label in audios]
        try:
            found = await asyncio.gather(*tasks)
        except BaseException:
            # One clip failed (or the RPC was cancelled): withdraw the others' queued work too.
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        for (clip, cached), *_ in found:
            self.observer.clip_embedded(clip.audio_seconds, cached=cached)
        return [(placements[0][0], placements[1][0] if with_drift else None) for placements in found]

    def drift_window(self, encoder: WindowEncoder) -> WindowSpec:
        """The denser window placement drift analysis uses (the manifest's ``drift`` block)."""
        config = self.drift_configs[encoder.manifest.name]
        return replace(encoder.manifest.window, rate_per_second=config.window_rate_per_second)

    def find_drift(self, encoder: WindowEncoder, dense: ClipEmbedding) -> DriftResult | None:
        """Voice changes inside one turn (sleuthd.drift), from its embedding on the drift windows.

        None when the turn has too little speech to search (fewer windows than the detector needs):
        "too short to tell" is not "no drift"."""
        config = self.drift_configs[encoder.manifest.name]
        if (
            dense.window_embeddings is None
            or dense.window_times is None
            or len(dense.window_times) < config.min_windows
        ):
            return None
        return detect_drift(dense.window_embeddings, dense.window_times, config)

    def apply_drift(
        self, opts: ResolvedOptions, turns: Sequence[TurnResult], drift: dict[str, DriftResult | None]
    ) -> list[TurnResult]:
        """Attach drift results to the turns that were searched; a None result (too little speech)
        becomes a note in the turn's detail rather than a score."""
        config = self.drift_configs[opts.encoder.manifest.name]
        needed = config.min_windows / config.window_rate_per_second
        too_short = f"drift: too little speech to search (about {needed:.0f} s needed)"
        out = []
        for t in turns:
            if t.turn_id in drift:
                result = drift[t.turn_id]
                t = replace(t, drift=result) if result is not None else replace(t, detail=f"{t.detail}; {too_short}")
            out.append(t)
        return out

    # ------------------------------------------------------------------ CheckDialogue

    async def check_dialogue(self, request: DialogueRequest, deadline: float | None = None) -> DialogueResult:
        self._validate_dialogue(request)
        opts = self.resolve(request.options)
        audio_turns = [t for t in request.turns if t.audio is not None]
        self.require_references(opts, [t.speaker for t in audio_turns], request.references)
        references = await self.embed_references(opts, request.references, deadline)
        with_drift = request.options.detect_drift
        embedded = await self.embed_placements(
            opts.encoder,
            [(t.audio, f"turn {t.turn_id!r}") for t in audio_turns if t.audio is not None],
            deadline,
            with_drift,
        )
        turns, speakers = judge_dialogue(
            [(t.turn_id, t.speaker) for t in audio_turns], [clip for clip, _ in embedded], references, opts.judgment
        )
        if with_drift:
            dense = {t.turn_id: d for t, (_, d) in zip(audio_turns, embedded, strict=True) if d is not None}
            drift = {
                t.turn_id: self.find_drift(opts.encoder, dense[t.turn_id])
                for t in turns
                if t.status is not TurnStatus.INSUFFICIENT_AUDIO
            }
            turns = self.apply_drift(opts, turns, drift)
        for t in turns:
            self.observer.verdict(t.status)
        return opts.result(request.dialogue_id, turns, speakers)

    @staticmethod
    def require_references(opts: ResolvedOptions, speakers: Sequence[str], with_reference: Collection[str]) -> None:
        """Method reference cannot judge a speaker without a reference clip: say which are missing."""
        if opts.method is Method.REFERENCE:
            missing = [s for s in dict.fromkeys(speakers) if s not in with_reference]
            if missing:
                raise InvalidRequest(
                    f"method reference needs a reference clip for every speaker; missing for: {', '.join(missing)}"
                )

    async def embed_references(
        self, opts: ResolvedOptions, references: dict[str, AudioInput], deadline: float | None
    ) -> dict[str, np.ndarray]:
        speakers = list(references)
        clips = await self.embed_audio(
            opts.encoder, [(references[s], f"reference of speaker {s!r}") for s in speakers], deadline
        )
        out = {}
        for s, clip in zip(speakers, clips, strict=True):
            if clip.embedding is None:
                raise InvalidRequest(f"reference of speaker {s!r} is unusable: {clip.detail}")
            out[s] = clip.embedding
        return out

    def _validate_dialogue(self, request: DialogueRequest) -> None:
        if not request.turns:
            raise InvalidRequest("dialogue has no turns")
        if len(request.turns) > self.config.max_turns:
            raise LimitExceeded(
                f"dialogue has {len(request.turns)} turns; the limit is {self.config.max_turns}: split it"
            )
        seen: set[str] = set()
        for n, t in enumerate(request.turns):
            check_id(t.turn_id, f"turn #{n} turn_id")
            check_id(t.speaker, f"turn {t.turn_id!r} speaker")
            if t.turn_id in seen:
                raise InvalidRequest(f"turn_id {t.turn_id!r} appears twice; turn ids must be unique")
            seen.add(t.turn_id)
        if not any(t.audio is not None for t in request.turns):
            raise InvalidRequest("dialogue has no turn with audio: attach audio to the turns to be judged")
        audio_speakers = {t.speaker for t in request.turns if t.audio is not None}
        for s in request.references:
            if s not in audio_speakers:
                raise UnknownName(f"reference given for speaker {s!r}, who has no turn with audio in this dialogue")

    # ------------------------------------------------------------------ RankCandidates

    async def rank_candidates(self, request: RankRequest, deadline: float | None = None) -> RankResult:
        self._validate_rank(request)
        opts = self.resolve(request.options)
        manifest = opts.encoder.manifest
        if opts.method is Method.REFERENCE and request.reference is None:
            raise InvalidRequest("method reference needs the speaker's reference clip")
        if opts.method in (Method.PAIRWISE, Method.CENTROID) and not request.context:
            raise InvalidRequest(f"method {opts.method.value} needs at least one context clip of the speaker")
        if opts.method is Method.AUTO and not request.context and request.reference is None:
            raise InvalidRequest("method auto needs context clips of the speaker, a reference, or both")
        audios = [(c.audio, f"candidate {c.candidate_id!r}") for c in request.candidates]
        audios += [(a, f"context clip #{n}") for n, a in enumerate(request.context)]
        if request.reference is not None:
            audios.append((request.reference, "reference"))
        clips = await self.embed_audio(opts.encoder, audios, deadline)
        n_cand, n_ctx = len(request.candidates), len(request.context)
        for c, clip in zip(request.candidates, clips[:n_cand], strict=True):
            if not clip.usable:
                raise InvalidRequest(f"candidate {c.candidate_id!r} cannot be scored: {clip.detail}")
        if request.reference is not None and not clips[-1].usable:
            raise InvalidRequest(f"reference is unusable: {clips[-1].detail}")
        context = [c for c in clips[n_cand : n_cand + n_ctx] if c.usable]
        if opts.method in (Method.PAIRWISE, Method.CENTROID) and not context:
            raise InvalidRequest(
                f"none of the {n_ctx} context clips has enough speech "
                f"(at least {manifest.min_speech_seconds:.2f} s each) for method {opts.method.value}"
            )
        reference = clips[-1].embedding if request.reference is not None else None
        if opts.method is Method.AUTO and not context and reference is None:
            raise InvalidRequest(
                f"none of the {n_ctx} context clips has enough speech and there is no reference: method auto has "
                "nothing to compare the candidates with"
            )
        candidates = stack_embeddings(clips[:n_cand])
        context_emb = stack_embeddings(context) if context else np.zeros((0, candidates.shape[1]), np.float32)
        scores = scoring.candidate_scores(opts.method, candidates, context_emb, reference)
        fit: np.ndarray | None = None
        if opts.judgment.calibration is not None and (context or reference is not None):
            fit, _ = candidate_fit(
                opts.judgment.calibration,
                candidates,
                np.array([c.speech_seconds for c in clips[:n_cand]]),
                context_emb,
                np.array([c.speech_seconds for c in context]),
                reference,
                *reliability([*context, *clips[:n_cand]]),
            )
        info = METHODS[opts.method]
        order = scoring.rank_order(scores, info.higher_is_better)
        ranked = tuple(
            RankedCandidateResult(
                candidate_id=request.candidates[j].candidate_id,
                rank=r + 1,
                score=float(scores[j]),
                score_scale=info.candidate_scale,
                higher_is_better=info.higher_is_better,
                speech_seconds=clips[j].speech_seconds,
                fit_probability=None if fit is None else float(fit[j]),
            )
            for r, j in enumerate(order)
        )
        return RankResult(candidates=ranked, encoder=manifest.name, method=opts.method, usable_context=len(context))

    def _validate_rank(self, request: RankRequest) -> None:
        n = len(request.candidates)
        if n < 2:
            raise InvalidRequest(f"ranking needs at least 2 candidates, got {n}")
        if n > self.config.max_candidates:
            raise LimitExceeded(f"{n} candidates; the limit is {self.config.max_candidates}")
        if len(request.context) > self.config.max_context:
            raise LimitExceeded(f"{len(request.context)} context clips; the limit is {self.config.max_context}")
        seen: set[str] = set()
        for k, c in enumerate(request.candidates):
            check_id(c.candidate_id, f"candidate #{k} candidate_id")
            if c.candidate_id in seen:
                raise InvalidRequest(f"candidate_id {c.candidate_id!r} appears twice; candidate ids must be unique")
            seen.add(c.candidate_id)


def check_id(value: str, what: str) -> None:
    if not value:
        raise InvalidRequest(f"{what} is empty")
    if len(value) > MAX_ID_CHARS:
        raise InvalidRequest(f"{what} is {len(value)} characters; at most {MAX_ID_CHARS} allowed")
