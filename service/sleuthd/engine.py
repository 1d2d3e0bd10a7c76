"""The scoring engine: dialogue and candidate requests in, verdicts out. Never imports grpc.

Work per request: validate -> prepare every clip on worker threads (decode, resample, VAD, windows)
-> one encoder call for all windows of the request -> pure scoring (sleuthd.scoring).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from sleuthd import scoring
from sleuthd.audio import AudioError
from sleuthd.clips import ClipEmbedding, PreparedClip, pool, prepare
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
from sleuthd.embedding_cache import LruCache, audio_key
from sleuthd.encoder import OnnxEncoder, ThreadedEncoder, WindowEncoder
from sleuthd.errors import InvalidRequest, UnknownName
from sleuthd.manifest import (
    PAPER_THRESHOLDS,
    EncoderManifest,
    find_encoders,
    load_encoder_manifest,
    vad_model_path,
)
from sleuthd.scoring import METHODS, Method
from sleuthd.vad import SileroVad

logger = logging.getLogger(__name__)

MAX_ID_CHARS = 128


@dataclass(frozen=True)
class EngineConfig:
    """Engine limits and placement. Every field is a documented server option."""

    models_dir: Path
    default_encoder: str = "ge2e"
    device: str = "auto"  # "cpu", "cuda" or "auto"
    max_clip_seconds: float = 300.0  # longest single clip accepted, seconds
    max_turns: int = 1000  # turns per dialogue
    max_candidates: int = 64  # candidates per RankCandidates
    max_context: int = 256  # context clips per RankCandidates
    workers: int = 0  # threads for decoding/VAD; 0 = CPU count
    # Clip embeddings remembered by audio hash (about 2 KB each); 0 disables the cache.
    embedding_cache_entries: int = 4096


@dataclass(frozen=True)
class ResolvedOptions:
    encoder: WindowEncoder
    method: Method
    threshold: float
    threshold_set: ThresholdSet


class Engine:
    def __init__(
        self,
        encoders: dict[str, WindowEncoder],
        vad: SileroVad,
        config: EngineConfig,
        executor: Executor,
    ) -> None:
        if config.default_encoder not in encoders:
            raise ValueError(f"default encoder {config.default_encoder!r} is not loaded ({sorted(encoders)})")
        self.encoders = encoders
        self.vad = vad
        self.config = config
        self._executor = executor
        self.cache: LruCache[ClipEmbedding] = LruCache(config.embedding_cache_entries)

    @classmethod
    def load(cls, config: EngineConfig) -> Engine:
        """Load every encoder manifest under ``config.models_dir`` and the VAD, and warm them up."""
        executor = ThreadPoolExecutor(max_workers=config.workers or (os.cpu_count() or 1), thread_name_prefix="sleuthd")
        vad = SileroVad(vad_model_path(config.models_dir))
        encoders: dict[str, WindowEncoder] = {}
        for model_dir in find_encoders(config.models_dir):
            runner = OnnxEncoder(load_encoder_manifest(model_dir), device=config.device)
            runner.warm_up()
            encoders[runner.manifest.name] = ThreadedEncoder(runner, executor)
        if not encoders:
            raise InvalidRequest(f"no encoder manifests under {config.models_dir}: run `sleuthd models export ge2e`")
        return cls(encoders, vad, config, executor)

    def close(self) -> None:
        if isinstance(self._executor, ThreadPoolExecutor):
            self._executor.shutdown(wait=True, cancel_futures=True)

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
        if options.threshold is not None:
            lo, hi = info.threshold_range
            if not (np.isfinite(options.threshold) and lo <= options.threshold <= hi):
                raise InvalidRequest(
                    f"threshold {options.threshold} is outside the {method.value} scale ({info.scale}, {lo}–{hi})"
                )
            threshold = float(options.threshold)
        elif options.threshold_set is ThresholdSet.PAPER:
            threshold = PAPER_THRESHOLDS[method.value]
        else:
            if method.value not in manifest.default_thresholds:
                raise InvalidRequest(f"encoder {name!r} has no default threshold for method {method.value!r}")
            threshold = manifest.default_thresholds[method.value]
        return ResolvedOptions(encoder, method, threshold, options.threshold_set)

    # ------------------------------------------------------------------ shared steps

    async def _prepare(self, audio: AudioInput, manifest: EncoderManifest, label: str) -> PreparedClip:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                self._executor, prepare, audio, manifest, self.vad, self.config.max_clip_seconds
            )
        except AudioError as exc:
            raise AudioError(f"{label}: {exc}") from exc

    async def embed_audio(
        self, encoder: WindowEncoder, audios: Sequence[tuple[AudioInput, str]]
    ) -> list[ClipEmbedding]:
        """Embed clips (each with a label for error messages), all misses in one encoder call.

        Raises AudioError naming the label of the first clip whose bytes cannot be decoded.
        """
        manifest = encoder.manifest
        keys = [audio_key(manifest.sha256, a) for a, _ in audios]
        found = [self.cache.get(k) for k in keys]
        missing = [i for i, f in enumerate(found) if f is None]
        prepared = await asyncio.gather(*(self._prepare(audios[i][0], manifest, audios[i][1]) for i in missing))
        stacks = [c.windows for c in prepared if c.windows is not None]
        window_emb = await encoder.encode(np.concatenate(stacks)) if stacks else None
        offset = 0
        for i, clip in zip(missing, prepared, strict=True):
            if clip.windows is None or window_emb is None:
                result = ClipEmbedding(clip.audio_seconds, clip.speech_seconds, None, None, None, clip.detail)
            else:
                w = window_emb[offset : offset + len(clip.windows)]
                offset += len(clip.windows)
                result = ClipEmbedding(clip.audio_seconds, clip.speech_seconds, pool(w), w, clip.window_times)
            self.cache.put(keys[i], result)
            found[i] = result
        return [f for f in found if f is not None]

    # ------------------------------------------------------------------ CheckDialogue

    async def check_dialogue(self, request: DialogueRequest) -> DialogueResult:
        self._validate_dialogue(request)
        opts = self.resolve(request.options)
        manifest = opts.encoder.manifest
        audio_turns = [t for t in request.turns if t.audio is not None]
        speakers = list(dict.fromkeys(t.speaker for t in audio_turns))
        if opts.method is Method.REFERENCE:
            missing = [s for s in speakers if s not in request.references]
            if missing:
                raise InvalidRequest(
                    f"method reference needs a reference clip for every speaker; missing for: {', '.join(missing)}"
                )
        ref_speakers = list(request.references)
        clips = await self.embed_audio(
            opts.encoder,
            [(t.audio, f"turn {t.turn_id!r}") for t in audio_turns if t.audio is not None]
            + [(request.references[s], f"reference of speaker {s!r}") for s in ref_speakers],
        )
        turn_clips, ref_clips = clips[: len(audio_turns)], clips[len(audio_turns) :]
        for s, clip in zip(ref_speakers, ref_clips, strict=True):
            if not clip.usable:
                raise InvalidRequest(f"reference of speaker {s!r} is unusable: {clip.detail}")
        references = {s: c.embedding for s, c in zip(ref_speakers, ref_clips, strict=True)}

        results: dict[str, TurnResult] = {}
        speaker_results = []
        for speaker in speakers:
            idx = [i for i, t in enumerate(audio_turns) if t.speaker == speaker]
            turn_results = self._judge_speaker(
                [audio_turns[i].turn_id for i in idx],
                [turn_clips[i] for i in idx],
                references.get(speaker),
                speaker,
                opts,
            )
            for r in turn_results:
                results[r.turn_id] = r
            speaker_results.append(_speaker_verdict(speaker, turn_results))
        return DialogueResult(
            dialogue_id=request.dialogue_id,
            turns=tuple(results[t.turn_id] for t in audio_turns),
            speakers=tuple(speaker_results),
            encoder=manifest.name,
            method=opts.method,
            threshold_set=opts.threshold_set,
        )

    def _validate_dialogue(self, request: DialogueRequest) -> None:
        if not request.turns:
            raise InvalidRequest("dialogue has no turns")
        if len(request.turns) > self.config.max_turns:
            raise InvalidRequest(
                f"dialogue has {len(request.turns)} turns; the limit is {self.config.max_turns}: split it"
            )
        seen: set[str] = set()
        for n, t in enumerate(request.turns):
            _check_id(t.turn_id, f"turn #{n} turn_id")
            _check_id(t.speaker, f"turn {t.turn_id!r} speaker")
            if t.turn_id in seen:
                raise InvalidRequest(f"turn_id {t.turn_id!r} appears twice; turn ids must be unique")
            seen.add(t.turn_id)
        if not any(t.audio is not None for t in request.turns):
            raise InvalidRequest("dialogue has no turn with audio: attach audio to the turns to be judged")
        audio_speakers = {t.speaker for t in request.turns if t.audio is not None}
        for s in request.references:
            if s not in audio_speakers:
                raise UnknownName(f"reference given for speaker {s!r}, who has no turn with audio in this dialogue")

    def _judge_speaker(
        self,
        turn_ids: list[str],
        clips: list[ClipEmbedding],
        reference: np.ndarray | None,
        speaker: str,
        opts: ResolvedOptions,
    ) -> list[TurnResult]:
        usable = [i for i, c in enumerate(clips) if c.embedding is not None]
        emb = np.stack([clips[i].embedding for i in usable]) if usable else np.zeros((0, 1), np.float32)
        pw = scoring.pairwise_mean_cosine(emb) if len(usable) >= 2 else None
        cd = scoring.centroid_cosine_distance(emb) if len(usable) >= 2 else None
        rc = scoring.reference_cosine(emb, reference) if reference is not None and usable else None
        method_scores = {Method.PAIRWISE: pw, Method.CENTROID: cd, Method.REFERENCE: rc}[opts.method]
        info = METHODS[opts.method]
        out: list[TurnResult] = []
        for i, (turn_id, clip) in enumerate(zip(turn_ids, clips, strict=True)):
            result = TurnResult(
                turn_id=turn_id,
                speaker=speaker,
                status=TurnStatus.INSUFFICIENT_AUDIO,
                audio_seconds=clip.audio_seconds,
                speech_seconds=clip.speech_seconds,
                detail=clip.detail,
            )
            if not clip.usable:
                out.append(result)
                continue
            k = usable.index(i)
            result = replace(
                result,
                status=TurnStatus.INSUFFICIENT_CONTEXT,
                pairwise_mean_cosine=None if pw is None else float(pw[k]),
                centroid_cosine_distance=None if cd is None else float(cd[k]),
                reference_cosine=None if rc is None else float(rc[k]),
                detail=(
                    f"speaker {speaker!r} has no other usable turn to compare with; "
                    "send more turns, or a reference and use method reference"
                ),
            )
            if method_scores is not None:
                score = float(method_scores[k])
                bad = bool(scoring.flagged(opts.method, np.array([score]), opts.threshold)[0])
                relation = (">" if bad else "<=") if info.flag_above else ("<" if bad else ">=")
                result = replace(
                    result,
                    status=TurnStatus.INCONSISTENT if bad else TurnStatus.CONSISTENT,
                    score=score,
                    score_scale=info.scale,
                    threshold=opts.threshold,
                    detail=f"{opts.method.value}: {info.scale.replace('_', ' ')} {score:.3f} {relation} {opts.threshold:.3f}",
                )
            out.append(result)
        return out

    # ------------------------------------------------------------------ RankCandidates

    async def rank_candidates(self, request: RankRequest) -> RankResult:
        self._validate_rank(request)
        opts = self.resolve(request.options)
        manifest = opts.encoder.manifest
        if opts.method is Method.REFERENCE and request.reference is None:
            raise InvalidRequest("method reference needs the speaker's reference clip")
        if opts.method is not Method.REFERENCE and not request.context:
            raise InvalidRequest(f"method {opts.method.value} needs at least one context clip of the speaker")
        audios = [(c.audio, f"candidate {c.candidate_id!r}") for c in request.candidates]
        audios += [(a, f"context clip #{n}") for n, a in enumerate(request.context)]
        if request.reference is not None:
            audios.append((request.reference, "reference"))
        clips = await self.embed_audio(opts.encoder, audios)
        n_cand, n_ctx = len(request.candidates), len(request.context)
        for c, clip in zip(request.candidates, clips[:n_cand], strict=True):
            if not clip.usable:
                raise InvalidRequest(f"candidate {c.candidate_id!r} cannot be scored: {clip.detail}")
        if request.reference is not None and not clips[-1].usable:
            raise InvalidRequest(f"reference is unusable: {clips[-1].detail}")
        cand = np.stack([c.embedding for c in clips[:n_cand] if c.embedding is not None])
        context = [c.embedding for c in clips[n_cand : n_cand + n_ctx] if c.embedding is not None]
        reference = clips[-1].embedding if request.reference is not None else None
        if opts.method is not Method.REFERENCE and not context:
            raise InvalidRequest(
                f"none of the {n_ctx} context clips has enough speech "
                f"(at least {manifest.min_speech_seconds:.2f} s each) for method {opts.method.value}"
            )
        ctx = np.stack(context) if context else np.zeros((0, cand.shape[1]), np.float32)
        scores = scoring.candidate_scores(opts.method, cand, ctx, reference)
        info = METHODS[opts.method]
        order = scoring.rank_order(scores, info.higher_is_better)
        ranked = tuple(
            RankedCandidateResult(
                candidate_id=request.candidates[j].candidate_id,
                rank=r + 1,
                score=float(scores[j]),
                score_scale=info.scale,
                higher_is_better=info.higher_is_better,
                speech_seconds=clips[j].speech_seconds,
            )
            for r, j in enumerate(order)
        )
        return RankResult(candidates=ranked, encoder=manifest.name, method=opts.method, usable_context=len(context))

    def _validate_rank(self, request: RankRequest) -> None:
        n = len(request.candidates)
        if n < 2:
            raise InvalidRequest(f"ranking needs at least 2 candidates, got {n}")
        if n > self.config.max_candidates:
            raise InvalidRequest(f"{n} candidates; the limit is {self.config.max_candidates}")
        if len(request.context) > self.config.max_context:
            raise InvalidRequest(f"{len(request.context)} context clips; the limit is {self.config.max_context}")
        seen: set[str] = set()
        for k, c in enumerate(request.candidates):
            _check_id(c.candidate_id, f"candidate #{k} candidate_id")
            if c.candidate_id in seen:
                raise InvalidRequest(f"candidate_id {c.candidate_id!r} appears twice; candidate ids must be unique")
            seen.add(c.candidate_id)


def _check_id(value: str, what: str) -> None:
    if not value:
        raise InvalidRequest(f"{what} is empty")
    if len(value) > MAX_ID_CHARS:
        raise InvalidRequest(f"{what} is {len(value)} characters; at most {MAX_ID_CHARS} allowed")


def _speaker_verdict(speaker: str, turns: list[TurnResult]) -> SpeakerResult:
    scored = [t for t in turns if t.status in (TurnStatus.CONSISTENT, TurnStatus.INCONSISTENT)]
    bad = tuple(t.turn_id for t in scored if t.status is TurnStatus.INCONSISTENT)
    return SpeakerResult(
        speaker=speaker,
        judged=bool(scored),
        consistent=bool(scored) and not bad,
        inconsistent_turn_ids=bad,
        scored_turns=len(scored),
        unscored_turns=len(turns) - len(scored),
    )
