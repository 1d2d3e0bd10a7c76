"""The engine façade: dialogue and candidate requests in, verdicts out. Never imports grpc.

The request path, stage by stage:
  options (sleuthd.options)            request options -> encoder, method, threshold, calibration
  -> clip embedder (sleuthd.embedder)  audio -> cache / single flight -> decode, VAD, windows -> micro-batcher
  -> dialogue state (sleuthd.dialogue) embeddings -> verdicts (sleuthd.judge), drift, verdict metrics
     or ranking (sleuthd.ranking)      embeddings -> candidates best first
  method lalm: sleuthd.lalm_judging    audio -> waveform + embedding -> the LALM judge -> verdicts, ranking
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np

from sleuthd.clips import ClipEmbedding
from sleuthd.config import EngineConfig
from sleuthd.dialogue import DialogueState, require_references, validate_dialogue
from sleuthd.domain import (
    AudioInput,
    CheckOptions,
    DialogueRequest,
    DialogueResult,
    RankRequest,
    RankResult,
    Reference,
    VoiceRef,
)
from sleuthd.drift import drift_window
from sleuthd.embedder import ClipEmbedder, Placements
from sleuthd.encoder import WindowEncoder
from sleuthd.errors import InvalidRequest, Unsupported
from sleuthd.lalm.batcher import JudgeObserver
from sleuthd.lalm_dialogue import LalmDialogue
from sleuthd.lalm_judging import LalmJudging
from sleuthd.loading import LoadedModels, load_models, open_registry
from sleuthd.observe import EngineObserver, NullObserver
from sleuthd.options import EncoderEntry, ResolvedOptions, resolve
from sleuthd.ranking import check_evidence, rank_candidates, validate_rank
from sleuthd.registry.store import AsyncVoiceStore, VoiceStore
from sleuthd.registry.voices import VoiceRegistry
from sleuthd.scoring import Method

logger = logging.getLogger(__name__)


class Engine:
    def __init__(
        self,
        models: LoadedModels,
        config: EngineConfig,
        observer: EngineObserver | None = None,
        registry: VoiceStore | None = None,
    ) -> None:
        """``registry``: the voice store (sleuthd.loading.open_registry); the engine closes it in :meth:`aclose`."""
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
        )
        self.registry = (
            None
            if registry is None
            else VoiceRegistry(AsyncVoiceStore(registry), models.encoders, self.embedder, models.default_encoder)
        )
        self.lalm = LalmJudging(config.judge, models.vad, models.prep_pool, self.observer, self.embedder)

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
        return resolve(options, self.entries, self.models.default_encoder)

    # ------------------------------------------------------------------ CheckDialogue

    async def check_dialogue(self, request: DialogueRequest, deadline: float | None = None) -> DialogueResult:
        validate_dialogue(request, self.config.max_turns)
        opts = self.resolve(request.options)
        if opts.method is Method.LALM:
            return await self.lalm.check_dialogue(request, opts, deadline)
        audio_turns = [t for t in request.turns if t.audio is not None]
        require_references(opts, [t.speaker for t in audio_turns], request.references)
        state = await self.open_dialogue(request.dialogue_id, request.references, opts, deadline)
        assert isinstance(state, DialogueState)  # method lalm was handed over above
        embedded = await self.embedder.embed(
            opts.encoder,
            [(t.audio, f"turn {t.turn_id!r}") for t in audio_turns if t.audio is not None],
            deadline,
            self._placements(opts),
        )
        for position, (turn, clips) in enumerate(zip(audio_turns, embedded, strict=True)):
            state.add_turn(turn.turn_id, turn.speaker, position, clips[0], clips[1] if len(clips) > 1 else None)
        return state.result()

    # ------------------------------------------------------------------ StreamDialogue

    async def open_dialogue(
        self, dialogue_id: str, references: Mapping[str, Reference], opts: ResolvedOptions, deadline: float | None
    ) -> DialogueState | LalmDialogue:
        """An empty dialogue judged under ``opts``, with its speakers' references embedded."""
        if opts.method is Method.LALM:
            return await self.lalm.open_dialogue(dialogue_id, references, opts, deadline)
        embedded = await self.reference_embeddings(references, opts, deadline)
        return DialogueState(dialogue_id, opts, embedded, self.observer)

    async def reference_embeddings(
        self, references: Mapping[str, Reference], opts: ResolvedOptions, deadline: float | None
    ) -> dict[str, np.ndarray]:
        """Each speaker's reference under ``opts.encoder``: a registered voice is looked up first (its
        embedding for exactly this encoder's weights; a read, so an unknown id fails before any audio is
        embedded), then the clips are embedded together."""
        embedded = {
            s: await self.voices.embedding(r.voice_id, opts.encoder, deadline)
            for s, r in references.items()
            if isinstance(r, VoiceRef)
        }
        clips = [(s, r) for s, r in references.items() if isinstance(r, AudioInput)]
        embedded_clips = await self.embedder.embed_audio(
            opts.encoder, [(a, f"reference of speaker {s!r}") for s, a in clips], deadline
        )
        for (s, _), clip in zip(clips, embedded_clips, strict=True):
            if clip.embedding is None:
                raise InvalidRequest(f"reference of speaker {s!r} is unusable: {clip.detail}")
            embedded[s] = clip.embedding
        return {s: embedded[s] for s in references}

    async def embed_turn(
        self, opts: ResolvedOptions, audio: AudioInput, label: str, deadline: float | None
    ) -> tuple[ClipEmbedding, ClipEmbedding | None]:
        """One turn's embedding, and on the drift windows too when the dialogue asked for drift."""
        (clips,) = await self.embedder.embed(opts.encoder, [(audio, label)], deadline, self._placements(opts))
        return clips[0], clips[1] if len(clips) > 1 else None

    def _placements(self, opts: ResolvedOptions) -> Placements:
        """The manifest's windows, plus the denser drift windows when the request asked for drift."""
        if opts.detect_drift and opts.entry.drift is not None:
            return (None, drift_window(opts.encoder.manifest.window, opts.entry.drift))
        return (None,)

    # ------------------------------------------------------------------ RankCandidates

    async def rank_candidates(self, request: RankRequest, deadline: float | None = None) -> RankResult:
        validate_rank(request, self.config.max_candidates, self.config.max_context)
        opts = self.resolve(request.options)
        if opts.method is Method.LALM:
            return await self.lalm.rank(request, opts, deadline)
        manifest = opts.encoder.manifest
        check_evidence(opts.method, len(request.context), request.reference is not None)
        audios = [(c.audio, f"candidate {c.candidate_id!r}") for c in request.candidates]
        audios += [(a, f"context clip #{n}") for n, a in enumerate(request.context)]
        reference: np.ndarray | None = None
        if isinstance(request.reference, VoiceRef):
            reference = await self.voices.embedding(request.reference.voice_id, opts.encoder, deadline)
        elif request.reference is not None:
            audios.append((request.reference, "reference"))
        clips = await self.embedder.embed_audio(opts.encoder, audios, deadline)
        n_cand, n_ctx = len(request.candidates), len(request.context)
        for c, clip in zip(request.candidates, clips[:n_cand], strict=True):
            if not clip.usable:
                raise InvalidRequest(f"candidate {c.candidate_id!r} cannot be scored: {clip.detail}")
        if isinstance(request.reference, AudioInput):
            if clips[-1].embedding is None:
                raise InvalidRequest(f"reference is unusable: {clips[-1].detail}")
            reference = clips[-1].embedding
        context = [c for c in clips[n_cand : n_cand + n_ctx] if c.usable]
        if opts.method in (Method.PAIRWISE, Method.CENTROID) and not context:
            raise InvalidRequest(
                f"none of the {n_ctx} context clips has enough speech "
                f"(at least {manifest.min_speech_seconds:.2f} s each) for method {opts.method.value}"
            )
        if opts.method is Method.AUTO and not context and reference is None:
            raise InvalidRequest(
                f"none of the {n_ctx} context clips has enough speech and there is no reference: method auto has "
                "nothing to compare the candidates with"
            )
        ranked = rank_candidates(
            opts.method,
            [c.candidate_id for c in request.candidates],
            clips[:n_cand],
            context,
            reference,
            opts.judgment.calibration,
        )
        return RankResult(candidates=ranked, encoder=manifest.name, method=opts.method, usable_context=len(context))
