"""The two judges behind one interface: speaker encoders (every method but lalm) and the LALM judge.

Each opens a :class:`~sleuthd.judgment.dialogue.Dialogue` for a request's options, with its references
heard and a listener for its turns, and ranks candidates. The engine façade picks one by the request's
method, once; nothing after that asks which it holds.

  encoders: references -> embeddings (registered voices looked up) -> EncoderDialogue, listener:
            ClipEmbedder.embed (cache, single flight, decode, VAD, windows, micro-batcher); under the fused
            auto, a second one for channel matching: ClipEmbedder.copies (the clips clipped and/or low-passed,
            then the same)
  lalm:     references -> waveform + embedding -> LalmDialogue, listener: ClipEmbedder.hear (one decode
            for the judge's waveform and the encoder's windows), then the judge's prompts
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np

from sleuthd.aio import gather_or_cancel
from sleuthd.audio import SAMPLE_RATE
from sleuthd.config import JudgeConfig
from sleuthd.domain import (
    AudioInput,
    CandidateInput,
    RankedCandidateResult,
    RankRequest,
    RankResult,
    Reference,
    TurnResult,
    VoiceRef,
)
from sleuthd.encoders.clips import ClipEmbedding, Heard
from sleuthd.encoders.embedder import ClipEmbedder, Placements
from sleuthd.encoders.runner import WindowEncoder
from sleuthd.engine.loading import start_judge
from sleuthd.engine.memory import KeptAudio
from sleuthd.errors import InvalidRequest, Unsupported
from sleuthd.judgment.calibration import Calibration, candidate_fit
from sleuthd.judgment.channel_matching import ReferenceClip, RegisteredReference
from sleuthd.judgment.dialogue import Dialogue, EncoderDialogue, TurnAudio
from sleuthd.judgment.lalm_dialogue import LalmDialogue
from sleuthd.judgment.options import LALM_THRESHOLD, ResolvedOptions
from sleuthd.judgment.pool import stack_embeddings
from sleuthd.judgment.ranking import check_evidence, rank_candidates, usable_context
from sleuthd.judgment.scoring import Method
from sleuthd.lalm.judge import NO_JUDGE, Judge
from sleuthd.ops.observe import EngineObserver, JudgeObserver
from sleuthd.registry.voices import VoiceRegistry

logger = logging.getLogger(__name__)


class Judging(Protocol):
    """What the engine façade asks of a judge."""

    async def open_dialogue(
        self,
        dialogue_id: str,
        references: Mapping[str, Reference],
        opts: ResolvedOptions,
        deadline: float | None,
        stream: bool = False,
    ) -> Dialogue:
        """An empty dialogue judged under ``opts``, its speakers' references heard. ``stream``: its turns will
        arrive one by one (StreamDialogue), so what it keeps between turns is bounded by the stream bounds."""

    async def rank(self, request: RankRequest, opts: ResolvedOptions, deadline: float | None) -> RankResult:
        """RankCandidates (the request was validated by the engine)."""


class EncoderJudging:
    """The speaker encoders judge (pairwise, centroid, reference, auto)."""

    def __init__(
        self,
        embedder: ClipEmbedder,
        voices: Callable[[], VoiceRegistry],
        observer: EngineObserver,
        kept: KeptAudio | None = None,
        max_kept_stream_bytes: int = 0,
    ) -> None:
        """``voices``: the voice registry (raises Unsupported when the server has none); ``kept`` and
        ``max_kept_stream_bytes``: where streams hold the turn audio kept for band matching, and how much one
        stream may (EngineConfig.band_match_kept_mb, band_match_stream_mb; None: streams keep nothing)."""
        self._embedder = embedder
        self._voices = voices
        self._observer = observer
        self._kept = kept
        self._max_kept_stream_bytes = max_kept_stream_bytes

    async def open_dialogue(
        self,
        dialogue_id: str,
        references: Mapping[str, Reference],
        opts: ResolvedOptions,
        deadline: float | None,
        stream: bool = False,
    ) -> Dialogue:
        return (await self._dialogues(references, opts, deadline, stream))(dialogue_id)

    async def _dialogues(
        self,
        references: Mapping[str, Reference],
        opts: ResolvedOptions,
        deadline: float | None,
        stream: bool = False,
    ) -> Callable[[str], EncoderDialogue]:
        """The speakers' references heard once (embedded; a registered voice's channels read, measured if they were
        never recorded), and what opens empty dialogues judged with them: one for a request, one per candidate for
        RankCandidates' slot verdicts, which would otherwise read the same voice once per candidate."""
        embedded, clips = await self._reference_clips(references, opts.encoder, deadline)
        embed = functools.partial(self._embed, opts.encoder, opts.placements)
        copies = functools.partial(self._embedder.copies, opts.encoder)  # used if the judgment channel-matches
        # The references sent as audio are copied as the turns are; a registered voice brings its clips' channels
        # as registered and the reads of its copies (each made only if its speaker turns out mixed that way).
        reference_clips = {
            s: ReferenceClip(a, clips[s].channel, clips[s].speech_seconds)
            for s, a in references.items()
            if isinstance(a, AudioInput)
        }
        registered = {}
        if opts.judgment.channel_matching:
            for s, r in references.items():
                if isinstance(r, VoiceRef):
                    voices = self._voices()
                    registered[s] = RegisteredReference(
                        r.voice_id,
                        await voices.channels(r.voice_id),
                        functools.partial(voices.embedding, r.voice_id, opts.encoder, narrow=True),
                        functools.partial(voices.copy_embedding, r.voice_id, opts.encoder),
                        functools.partial(voices.noisiest_clip, r.voice_id),
                    )
        # A stream holds what it keeps in the process's keeper; a CheckDialogue's audio is its request's.
        keeper, bound = (self._kept, self._max_kept_stream_bytes) if stream else (None, 0)
        pitches = self._embedder.pitches  # used if the judgment pitch-matches
        kept = functools.partial(self._embedder.kept_samples, opts.encoder)  # used if it length-matches
        return lambda dialogue_id: EncoderDialogue(
            dialogue_id,
            opts,
            embedded,
            self._observer,
            embed,
            copies,
            reference_clips,
            registered,
            keeper,
            bound,
            pitches,
            kept,
        )

    async def _embed(
        self,
        encoder: WindowEncoder,
        placements: Placements,
        audios: Sequence[tuple[AudioInput, str]],
        deadline: float | None,
    ) -> list[list[ClipEmbedding]]:
        return await self._embedder.embed(encoder, audios, deadline, placements)

    async def _reference_clips(
        self, references: Mapping[str, Reference], encoder: WindowEncoder, deadline: float | None
    ) -> tuple[dict[str, np.ndarray], dict[str, ClipEmbedding]]:
        """Each speaker's reference embedding under ``encoder``, and the clip embeddings of those sent as audio:
        a registered voice is looked up first (its embedding for exactly this encoder's weights; a read, so an
        unknown id fails before any audio is embedded), then the clips are embedded together."""
        embedded = {
            s: await self._voices().embedding(r.voice_id, encoder, deadline)
            for s, r in references.items()
            if isinstance(r, VoiceRef)
        }
        clips = [(s, r) for s, r in references.items() if isinstance(r, AudioInput)]
        embedded_clips = await self._embedder.embed_audio(
            encoder, [(a, f"reference of speaker {s!r}") for s, a in clips], deadline
        )
        for (s, _), clip in zip(clips, embedded_clips, strict=True):
            if clip.embedding is None:
                raise InvalidRequest(f"reference of speaker {s!r} is unusable: {clip.detail}")
            embedded[s] = clip.embedding
        audio = {s: clip for (s, _), clip in zip(clips, embedded_clips, strict=True)}
        return {s: embedded[s] for s in references}, audio

    async def rank(self, request: RankRequest, opts: ResolvedOptions, deadline: float | None) -> RankResult:
        manifest = opts.encoder.manifest
        check_evidence(opts.method, len(request.context), request.reference is not None)
        audios = [(c.audio, f"candidate {c.candidate_id!r}") for c in request.candidates]
        audios += [(a, f"context clip #{n}") for n, a in enumerate(request.context)]
        reference: np.ndarray | None = None
        if isinstance(request.reference, VoiceRef):
            reference = await self._voices().embedding(request.reference.voice_id, opts.encoder, deadline)
        elif request.reference is not None:
            audios.append((request.reference, "reference"))
        clips = await self._embedder.embed_audio(opts.encoder, audios, deadline)
        n_cand, n_ctx = len(request.candidates), len(request.context)
        reference_clip = clips[-1] if isinstance(request.reference, AudioInput) else None
        context = usable_context(
            opts.method,
            [(c.candidate_id, clip) for c, clip in zip(request.candidates, clips[:n_cand], strict=True)],
            clips[n_cand : n_cand + n_ctx],
            reference_clip,
            request.reference is not None,
            manifest.min_speech_seconds,
        )
        if reference_clip is not None:
            reference = reference_clip.embedding
        fits = await self._slot_verdicts(request, opts, deadline) if opts.judgment.calibration is not None else None
        ranked = rank_candidates(
            opts.method, [c.candidate_id for c in request.candidates], clips[:n_cand], context, reference, fits
        )
        return RankResult(candidates=ranked, encoder=manifest.name, method=opts.method, usable_context=len(context))

    async def _slot_verdicts(
        self, request: RankRequest, opts: ResolvedOptions, deadline: float | None
    ) -> list[TurnResult]:
        """Each candidate's verdict as CheckDialogue's auto gives it in the slot: a dialogue of the speaker's context
        clips and the candidate (last), with the reference, judged the same way (the fused encoder's blend and channel
        matching included), so a candidate called fit is one the gate passes. Its fit had been the calibration's
        alone on the clips as sent: a telephone candidate of the speaker's own voice beside full-band context got
        0.000 where CheckDialogue, comparing at the telephone band, gives 0.94. The clips' embeddings and copies
        come from the cache after the first candidate."""
        references = {} if request.reference is None else {request.speaker: request.reference}
        open_dialogue = await self._dialogues(references, opts.as_auto(), deadline)
        context = [TurnAudio(f"context clip #{n}", request.speaker, n, a) for n, a in enumerate(request.context)]

        async def in_slot(candidate: CandidateInput) -> TurnResult:
            slot = TurnAudio(f"candidate {candidate.candidate_id!r}", request.speaker, len(context), candidate.audio)
            dialogue = open_dialogue("rank-candidates")
            try:
                await dialogue.add_turns([*context, slot], deadline)
                verdict = await dialogue.result(deadline)
            finally:
                dialogue.close()
            return next(t for t in verdict.turns if t.turn_id == slot.turn_id)

        return await gather_or_cancel(in_slot(c) for c in request.candidates)


class LalmJudging:
    """The LALM judge of this server (None until :meth:`start`, and when none is configured)."""

    def __init__(self, config: JudgeConfig, embedder: ClipEmbedder, observer: EngineObserver) -> None:
        self.config = config
        self.judge: Judge | None = None
        self.decision_threshold = LALM_THRESHOLD
        self._embedder = embedder  # its per-request bound on decoded audio applies here too
        self._observer = observer

    async def start(self, observer: JudgeObserver | None = None) -> None:
        """Load the configured judge (on a thread: weights take minutes) and check a remote one serves its
        model. Raises ConfigError (a one-line startup failure) when it cannot work."""
        self.judge = await start_judge(self.config, observer)

    async def aclose(self) -> None:
        if self.judge is not None:
            await self.judge.aclose()

    def require(self) -> Judge:
        """The judge; FAILED_PRECONDITION with the fix when the server has none."""
        if self.judge is None:
            if self.config.enabled:  # configured, still loading (health is NOT_SERVING until it is up)
                raise Unsupported("the LALM judge is still loading; retry when the server reports SERVING")
            raise Unsupported(NO_JUDGE)
        return self.judge

    # ------------------------------------------------------------------ hearing

    async def hear_all(
        self,
        encoder: WindowEncoder,
        placements: Placements,
        audios: Sequence[tuple[AudioInput, str]],
        deadline: float | None,
    ) -> list[Heard]:
        """Clips admitted together (the request's bound on decoded audio), each decoded once for the judge's
        waveform and the encoder's windows."""
        await self._embedder.admit(audios)
        heard = await gather_or_cancel(self._embedder.hear(encoder, a, lbl, deadline, placements) for a, lbl in audios)
        for h, (_, label) in zip(heard, audios, strict=True):
            self._check_length(h.samples, label)
        return heard

    def _check_length(self, samples: np.ndarray, label: str) -> None:
        """Refuse, naming the client's clip, what the judge would refuse: it never cuts a clip."""
        if self.judge is None or not self.judge.info.max_clip_seconds:
            return
        seconds, info = len(samples) / SAMPLE_RATE, self.judge.info
        if seconds > info.max_clip_seconds:
            raise InvalidRequest(
                f"{label} is {seconds:.1f} s; the judge {info.model_name} hears at most {info.max_clip_seconds:g} s "
                "per clip and never cuts clips: send a shorter excerpt, or use an embedding method"
            )

    async def _references(
        self, references: Mapping[str, Reference], encoder: WindowEncoder, deadline: float | None
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Each speaker's reference: its embedding (for the paper scores) and its waveform (for the judge)."""
        voices = [s for s, r in references.items() if isinstance(r, VoiceRef)]
        if voices:
            raise InvalidRequest(
                f"method lalm hears reference audio, and a registered voice is kept as embeddings: send the "
                f"reference clip of {', '.join(repr(s) for s in voices)} as audio, or use an embedding method"
            )
        clips = [(s, r) for s, r in references.items() if isinstance(r, AudioInput)]
        heard = await self.hear_all(encoder, (None,), [(a, f"reference of speaker {s!r}") for s, a in clips], deadline)
        embeddings, waves = {}, {}
        for (s, _), h in zip(clips, heard, strict=True):
            if h.clip.embedding is None:
                raise InvalidRequest(f"reference of speaker {s!r} is unusable: {h.clip.detail}")
            embeddings[s], waves[s] = h.clip.embedding, h.samples
        return embeddings, waves

    # ------------------------------------------------------------------ CheckDialogue, StreamDialogue, RankCandidates

    async def open_dialogue(
        self,
        dialogue_id: str,
        references: Mapping[str, Reference],
        opts: ResolvedOptions,
        deadline: float | None,
        stream: bool = False,
    ) -> Dialogue:
        judge = self.require()
        embeddings, waves = await self._references(references, opts.encoder, deadline)
        hear = functools.partial(self.hear_all, opts.encoder, opts.placements)
        return LalmDialogue(
            dialogue_id, opts, embeddings, waves, judge, self._observer, hear, self.config.max_stream_audio_bytes
        )

    async def rank(self, request: RankRequest, opts: ResolvedOptions, deadline: float | None) -> RankResult:
        """The candidates as labelled options to the judge, who also hears the reference and the usable
        context clips; each candidate scores the judge's probability that it is the speaker's voice (and,
        when the encoder is calibrated, auto's fit probability)."""
        judge = self.require()
        check_evidence(Method.LALM, len(request.context), request.reference is not None)
        if isinstance(request.reference, VoiceRef):
            raise InvalidRequest(
                "method lalm hears reference audio, and a registered voice is kept as embeddings: send the "
                "reference clip as audio, or use an embedding method"
            )
        audios = [(c.audio, f"candidate {c.candidate_id!r}") for c in request.candidates]
        audios += [(a, f"context clip #{n}") for n, a in enumerate(request.context)]
        if request.reference is not None:
            audios.append((request.reference, "reference"))
        heard = await self.hear_all(opts.encoder, (None,), audios, deadline)
        n_cand, n_ctx = len(request.candidates), len(request.context)
        candidates = heard[:n_cand]
        reference = heard[-1] if request.reference is not None else None
        usable_context(
            Method.LALM,
            [(c.candidate_id, h.clip) for c, h in zip(request.candidates, candidates, strict=True)],
            [h.clip for h in heard[n_cand : n_cand + n_ctx]],
            reference.clip if reference is not None else None,
            reference is not None,
            opts.encoder.manifest.min_speech_seconds,
        )
        context = [h for h in heard[n_cand : n_cand + n_ctx] if h.clip.usable]
        ranking = await judge.rank(
            [h.samples for h in candidates],
            reference.samples if reference is not None else None,
            [h.samples for h in context],
            deadline,
        )
        ids = [c.candidate_id for c in request.candidates]
        fit = _fit(opts, ids, candidates, context, reference)
        ranked = tuple(
            RankedCandidateResult(
                candidate_id=ids[o.index],
                rank=o.rank,
                score=o.probability,
                score_scale="probability",
                higher_is_better=True,
                speech_seconds=candidates[o.index].clip.speech_seconds,
                fit_probability=fit.get(ids[o.index]),
                judge_answer_mass=o.answer_mass,
                judge_calibrated=ranking.calibrated,
                judge_model=ranking.model_name,
            )
            for o in sorted(ranking.options, key=lambda o: o.rank)
        )
        return RankResult(ranked, opts.encoder.manifest.name, Method.LALM, usable_context=len(context))


def _fit(
    opts: ResolvedOptions,
    ids: Sequence[str],
    candidates: Sequence[Heard],
    context: Sequence[Heard],
    reference: Heard | None,
) -> dict[str, float]:
    """auto's P(each candidate belongs to the speaker), when the encoder is calibrated ("whatever the
    method", as RankedCandidate.fit_probability promises); empty otherwise. The judge's encoder is a single one
    (resolve() takes a fusion's first), whose auto is its calibration alone, as CheckDialogue's is."""
    cal = opts.entry.calibration
    if not isinstance(cal, Calibration):
        return {}
    if not context and reference is None:
        return {}
    cand = stack_embeddings([h.clip for h in candidates])
    fit, _ = candidate_fit(
        cal,
        cand,
        np.array([h.clip.speech_seconds for h in candidates]),
        stack_embeddings([h.clip for h in context]) if context else np.zeros((0, cand.shape[1]), np.float32),
        np.array([h.clip.speech_seconds for h in context]),
        reference.clip.embedding if reference is not None else None,
    )
    return dict(zip(ids, map(float, fit), strict=True))
