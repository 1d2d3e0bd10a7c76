"""The engine façade: dialogue and candidate requests in, verdicts out. Never imports grpc.

The request path, stage by stage ("X -> Y": what goes in and what comes out):
  options (judgment.options)         request options -> encoder, method, threshold, calibration
  -> judge (engine.judging)          the method's judge: the speaker encoders, or the LALM judge
  -> dialogue (judgment.dialogue)    references heard -> one Dialogue; its turns heard by its listener
                                     (encoders.embedder: cache, single flight, decode, VAD, windows,
                                     micro-batcher) -> verdicts (judgment.verdicts), drift, metrics
     or ranking (judgment.ranking)   candidates, context, reference heard -> candidates best first
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager

from sleuthd.config import EngineConfig
from sleuthd.domain import (
    AudioInput,
    CheckOptions,
    DialogueRequest,
    DialogueResult,
    RankRequest,
    RankResult,
    Reference,
)
from sleuthd.encoders.embedder import ClipEmbedder
from sleuthd.encoders.runner import WindowEncoder
from sleuthd.engine.admission import WorkQueue
from sleuthd.engine.judging import EncoderJudging, Judging, LalmJudging
from sleuthd.engine.loading import LoadedModels, load_models, open_registry
from sleuthd.engine.memory import KeptAudio
from sleuthd.errors import Unsupported
from sleuthd.judgment.dialogue import Dialogue, audio_turns, require_references, validate_dialogue
from sleuthd.judgment.options import EncoderEntry, ResolvedOptions, resolve
from sleuthd.judgment.ranking import validate_rank
from sleuthd.judgment.scoring import Method
from sleuthd.ops.observe import EngineObserver, JudgeObserver, NullObserver
from sleuthd.registry.store import AsyncVoiceStore, VoiceStore
from sleuthd.registry.voices import VoiceRegistry

logger = logging.getLogger(__name__)


class Engine:
    def __init__(
        self,
        models: LoadedModels,
        config: EngineConfig,
        observer: EngineObserver | None = None,
        registry: VoiceStore | None = None,
    ) -> None:
        """``registry``: the voice store (sleuthd.engine.loading.open_registry); the engine closes it in
        :meth:`aclose`."""
        self.models = models
        self.config = config
        self.observer: EngineObserver = observer or NullObserver()
        self.entries = {name: EncoderEntry.from_encoder(enc) for name, enc in models.encoders.items()}
        self.embedder = ClipEmbedder(
            models.vad,
            models.prep_pool,
            self.observer,
            config.max_clip_seconds,
            config.embedding_cache_entries,
            config.admission.max_request_decoded_samples,
            models.probe_pool,
        )
        self.registry = (
            None
            if registry is None
            else VoiceRegistry(
                AsyncVoiceStore(registry),
                models.encoders,
                self.embedder,
                models.default_encoder,
                # A registration stores the narrowband embeddings band matching compares with, where it can happen
                # (the fused encoder's blend).
                narrowband=config.band_match_octaves > 0 and any(e.evidence for e in self.entries.values()),
            )
        )
        self.kept_audio = KeptAudio(config.band_match_kept_bytes, self.observer.kept_audio)
        self.encoder_judging = EncoderJudging(
            self.embedder, lambda: self.voices, self.observer, self.kept_audio, config.band_match_stream_bytes
        )
        self.lalm = LalmJudging(config.judge, self.embedder, self.observer)
        # Every request's work is admitted by its estimated cost and deadline (sleuthd.engine.admission).
        self.work = WorkQueue(max_queued_s=config.admission.max_queued_work_seconds)

    @classmethod
    def load(cls, config: EngineConfig, observer: EngineObserver | None = None) -> Engine:
        """Open the voice registry (when ``--registry`` names one), then load every encoder manifest under
        ``config.models_dir`` and the VAD, and warm them up."""
        store = open_registry(config.voice_registry)  # first: a bad location fails before the models load
        try:
            return cls(load_models(config, observer), config, observer, store)
        except BaseException:
            if store is not None:
                store.close()
            raise

    @property
    def encoders(self) -> dict[str, WindowEncoder]:
        return self.models.encoders

    @property
    def voices(self) -> VoiceRegistry:
        """The voice registry; Unsupported (FAILED_PRECONDITION) with the fix when the server has none."""
        if self.registry is None:
            raise Unsupported(
                "this server has no voice registry: start it with --registry FILE (SQLite) or --registry "
                "postgresql://..., or send reference audio instead of a voice id"
            )
        return self.registry

    async def start(self, judge_observer: JudgeObserver | None = None) -> None:
        """Before the server reports SERVING: load the LALM judge when one is configured (ConfigError if it
        cannot work)."""
        await self.models.start()
        await self.lalm.start(judge_observer)

    async def aclose(self) -> None:
        await self.lalm.aclose()
        await self.models.aclose()
        await self.close_registry()

    async def close_registry(self) -> None:
        """Wait for registry calls in flight, then close the store (after the server has drained)."""
        if self.registry is not None:
            await self.registry.store.close()

    def resolve(self, options: CheckOptions) -> ResolvedOptions:
        config = self.config
        return resolve(
            options,
            self.entries,
            self.models.default_encoder,
            config.band_match_octaves,
            config.clip_match_spread,
            config.noise_match_db,
            config.noise_compose_db,
            config.telephone_band_db,
            config.pitch_match_octaves,
            config.length_match_ratio,
        )

    def _judging(self, opts: ResolvedOptions) -> Judging:
        """The judge of the request's method: the one place that tells the two apart."""
        return self.lalm if opts.method is Method.LALM else self.encoder_judging

    # ------------------------------------------------------------------ CheckDialogue, StreamDialogue

    async def check_dialogue(self, request: DialogueRequest, deadline: float | None = None) -> DialogueResult:
        validate_dialogue(request, self.config.max_turns)
        opts = self.resolve(request.options)
        turns = audio_turns(request)
        require_references(opts, [t.speaker for t in turns], request.references)
        audios = [(t.audio, f"turn {t.turn_id!r}") for t in turns] + _reference_audio(request.references)
        async with self.admitted(audios, opts, deadline, "CheckDialogue"):
            dialogue = await self.open_dialogue(request.dialogue_id, request.references, opts, deadline)
            await dialogue.add_turns(turns, deadline)
            return await dialogue.result(deadline)

    @asynccontextmanager
    async def admitted(
        self, audios: Sequence[tuple[AudioInput, str]], opts: ResolvedOptions, deadline: float | None, kind: str
    ) -> AsyncIterator[None]:
        """The block runs as one unit of work, admitted by its estimated cost (the clips' headers under the
        request's encoder and window placements) and its deadline: at once, after a wait in the queue, or
        not at all (Overloaded). The headers are checked against the per-request bounds first. A clip whose
        embeddings the cache holds costs nothing to embed: a regeneration loop's context turns, sent again
        unchanged, are not counted as work (a 1000-turn check of cached turns queued a stream's turn ~0.9 s
        behind its 20 minutes of audio: docs/research/cached-checks/). The LALM judge hears every clip."""
        probes = await self.embedder.admit(audios)
        if opts.method is not Method.LALM:
            cached = await self.embedder.cached(opts.encoder, audios, opts.placements)
            probes = [p for p, hit in zip(probes, cached, strict=True) if not hit]
        cost = self.models.seconds_of_work(opts.encoder.manifest.name, probes, len(opts.placements))
        async with self.work.admit(cost, deadline, f"this {kind}", kind):
            yield

    async def open_dialogue(
        self,
        dialogue_id: str,
        references: Mapping[str, Reference],
        opts: ResolvedOptions,
        deadline: float | None,
        stream: bool = False,
    ) -> Dialogue:
        """An empty dialogue judged under ``opts``, with its speakers' references heard (``stream``: for
        StreamDialogue, whose turns arrive one by one)."""
        return await self._judging(opts).open_dialogue(dialogue_id, references, opts, deadline, stream)

    # ------------------------------------------------------------------ RankCandidates

    async def rank_candidates(self, request: RankRequest, deadline: float | None = None) -> RankResult:
        validate_rank(request, self.config.max_candidates, self.config.max_context)
        opts = self.resolve(request.options)
        audios = [(c.audio, f"candidate {c.candidate_id!r}") for c in request.candidates]
        audios += [(a, f"context clip #{n}") for n, a in enumerate(request.context)]
        audios += _reference_audio({"": request.reference} if request.reference is not None else {})
        async with self.admitted(audios, opts, deadline, "RankCandidates"):
            return await self._judging(opts).rank(request, opts, deadline)


def _reference_audio(references: Mapping[str, Reference]) -> list[tuple[AudioInput, str]]:
    return [(r, f"reference of speaker {s!r}" if s else "reference") for s, r in references.items()
            if isinstance(r, AudioInput)]  # fmt: skip
