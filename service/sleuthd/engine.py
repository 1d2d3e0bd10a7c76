"""The engine façade: dialogue and candidate requests in, verdicts out. Never imports grpc.

The request path, stage by stage:
  options (sleuthd.options)            request options -> encoder, method, threshold, calibration
  -> clip embedder (sleuthd.embedder)  audio -> cache / single flight -> decode, VAD, windows -> micro-batcher
  -> dialogue state (sleuthd.dialogue) embeddings -> verdicts (sleuthd.judge), drift, verdict metrics
     or ranking (sleuthd.ranking)      embeddings -> candidates best first
"""

from __future__ import annotations

import logging

import numpy as np

from sleuthd.clips import ClipEmbedding
from sleuthd.config import EngineConfig
from sleuthd.dialogue import DialogueState, require_references, validate_dialogue
from sleuthd.domain import AudioInput, CheckOptions, DialogueRequest, DialogueResult, RankRequest, RankResult
from sleuthd.drift import drift_window
from sleuthd.embedder import ClipEmbedder, Placements
from sleuthd.encoder import WindowEncoder
from sleuthd.errors import InvalidRequest
from sleuthd.loading import LoadedModels, load_models
from sleuthd.observe import EngineObserver, NullObserver
from sleuthd.options import EncoderEntry, ResolvedOptions, resolve
from sleuthd.ranking import check_evidence, rank_candidates, validate_rank
from sleuthd.scoring import Method

logger = logging.getLogger(__name__)


class Engine:
    def __init__(self, models: LoadedModels, config: EngineConfig, observer: EngineObserver | None = None) -> None:
        self.models = models
        self.config = config
        self.observer: EngineObserver = observer or NullObserver()
        self.entries = {name: EncoderEntry.from_encoder(enc) for name, enc in models.encoders.items()}
        self.embedder = ClipEmbedder(
            models.vad, models.prep_pool, self.observer, config.max_clip_seconds, config.embedding_cache_entries
        )

    @classmethod
    def load(cls, config: EngineConfig, observer: EngineObserver | None = None) -> Engine:
        """Load every encoder manifest under ``config.models_dir`` and the VAD, and warm them up."""
        return cls(load_models(config, observer), config, observer)

    @property
    def encoders(self) -> dict[str, WindowEncoder]:
        return self.models.encoders

    async def aclose(self) -> None:
        await self.models.aclose()

    def resolve(self, options: CheckOptions) -> ResolvedOptions:
        return resolve(options, self.entries, self.config.default_encoder)

    # ------------------------------------------------------------------ CheckDialogue

    async def check_dialogue(self, request: DialogueRequest, deadline: float | None = None) -> DialogueResult:
        validate_dialogue(request, self.config.max_turns)
        opts = self.resolve(request.options)
        audio_turns = [t for t in request.turns if t.audio is not None]
        require_references(opts, [t.speaker for t in audio_turns], request.references)
        state = await self.open_dialogue(request.dialogue_id, request.references, opts, deadline)
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
        self, dialogue_id: str, references: dict[str, AudioInput], opts: ResolvedOptions, deadline: float | None
    ) -> DialogueState:
        """An empty dialogue judged under ``opts``, with its speakers' references embedded."""
        speakers = list(references)
        clips = await self.embedder.embed_audio(
            opts.encoder, [(references[s], f"reference of speaker {s!r}") for s in speakers], deadline
        )
        embedded: dict[str, np.ndarray] = {}
        for s, clip in zip(speakers, clips, strict=True):
            if clip.embedding is None:
                raise InvalidRequest(f"reference of speaker {s!r} is unusable: {clip.detail}")
            embedded[s] = clip.embedding
        return DialogueState(dialogue_id, opts, embedded, self.observer)

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
        manifest = opts.encoder.manifest
        check_evidence(opts.method, len(request.context), request.reference is not None)
        audios = [(c.audio, f"candidate {c.candidate_id!r}") for c in request.candidates]
        audios += [(a, f"context clip #{n}") for n, a in enumerate(request.context)]
        if request.reference is not None:
            audios.append((request.reference, "reference"))
        clips = await self.embedder.embed_audio(opts.encoder, audios, deadline)
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
        ranked = rank_candidates(
            opts.method,
            [c.candidate_id for c in request.candidates],
            clips[:n_cand],
            context,
            reference,
            opts.judgment.calibration,
        )
        return RankResult(candidates=ranked, encoder=manifest.name, method=opts.method, usable_context=len(context))
