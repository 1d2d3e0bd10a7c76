"""Method lalm for the engine façade: the LALM judge (sleuthd.lalm) hears the turns or the candidates.

The request path under method lalm:
  hear (worker thread)    audio -> one decode to 16 kHz mono -> waveform (for the judge)
                                                             -> loudness, VAD, windows (sleuthd.encoders.clips)
  -> encoder              windows -> the shared micro-batcher -> embedding (for INSUFFICIENT_AUDIO, the paper
                          scores, attribution, drift: what every method's verdict carries)
  -> judge                waveforms -> P(different speaker) per turn (LalmDialogue), or a ranking (rank)

One decode serves both: decoding once more for the judge would cost about 0.4 ms per second of 22 kHz
audio (soxr resampling dominates; docs/judge.md), small beside a judge prompt, but the waveform would be
made twice and held twice while the request runs. The embedding cache is not consulted: the judge needs
the waveform anyway, and VAD plus encoding of a cached clip cost a few milliseconds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor

import numpy as np

from sleuthd.aio import gather_or_cancel
from sleuthd.audio import SAMPLE_RATE
from sleuthd.audio.decode import AudioError
from sleuthd.audio.vad import Vad
from sleuthd.config import JudgeConfig
from sleuthd.domain import (
    AudioInput,
    DialogueRequest,
    DialogueResult,
    RankedCandidateResult,
    RankRequest,
    RankResult,
    Reference,
    VoiceRef,
)
from sleuthd.encoders.clips import PreparedClip, decode, prepare_waveform_placements
from sleuthd.encoders.embedder import ClipEmbedder, Placements, embed_prepared
from sleuthd.encoders.manifest import EncoderManifest
from sleuthd.encoders.runner import WindowEncoder
from sleuthd.engine.loading import start_judge
from sleuthd.errors import DeadlineExceeded, InvalidRequest, Unsupported
from sleuthd.judgment.calibration import Calibration
from sleuthd.judgment.drift import drift_window
from sleuthd.judgment.lalm_dialogue import Heard, LalmDialogue
from sleuthd.judgment.options import LALM_THRESHOLD, ResolvedOptions
from sleuthd.judgment.ranking import rank_candidates
from sleuthd.judgment.scoring import Method
from sleuthd.lalm.judge import NO_JUDGE, Judge
from sleuthd.ops.observe import EngineObserver, JudgeObserver

logger = logging.getLogger(__name__)


def decode_and_prepare(
    audio: AudioInput, manifest: EncoderManifest, vad: Vad, max_seconds: float, placements: Placements
) -> tuple[np.ndarray, list[PreparedClip]]:
    """One decode for both listeners: the 16 kHz mono waveform, and the encoder's windows cut from it."""
    samples = decode(audio, max_seconds).samples
    return samples, prepare_waveform_placements(samples, manifest, vad, placements)


class LalmJudging:
    """The judge of this server (None until :meth:`start`, and when none is configured) and the hearing stage."""

    def __init__(
        self, config: JudgeConfig, vad: Vad, prep_pool: Executor, observer: EngineObserver, embedder: ClipEmbedder
    ) -> None:
        self.config = config
        self.judge: Judge | None = None
        self.decision_threshold = LALM_THRESHOLD
        self._vad = vad
        self._prep_pool = prep_pool
        self._observer = observer
        self._embedder = embedder  # its per-request bound on decoded audio applies here too
        self._max_clip_seconds = embedder.max_clip_seconds

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

    async def hear(
        self, encoder: WindowEncoder, audio: AudioInput, label: str, deadline: float | None, placements: Placements
    ) -> Heard:
        """Decode ``audio`` once and embed it under each placement; AudioError names ``label``."""
        loop = asyncio.get_running_loop()
        if deadline is not None and loop.time() >= deadline:
            raise DeadlineExceeded(f"{label}: the deadline passed before it could be decoded")
        try:
            samples, prepared = await loop.run_in_executor(
                self._prep_pool, decode_and_prepare, audio, encoder.manifest, self._vad, self._max_clip_seconds,
                placements,
            )  # fmt: skip
        except AudioError as exc:
            raise AudioError(f"{label}: {exc}") from exc
        self._check_length(samples, label)
        clips = await asyncio.gather(*(embed_prepared(encoder, p, deadline) for p in prepared))
        self._observer.clip_embedded(clips[0].audio_seconds, cached=False)
        return Heard(samples, list(clips))

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

    async def _hear_all(
        self,
        encoder: WindowEncoder,
        audios: Sequence[tuple[AudioInput, str]],
        deadline: float | None,
        placements: Placements = (None,),
    ) -> list[Heard]:
        await self._embedder.admit(audios)
        return await gather_or_cancel([self.hear(encoder, a, label, deadline, placements) for a, label in audios])

    @staticmethod
    def _placements(opts: ResolvedOptions) -> Placements:
        if opts.detect_drift and opts.entry.drift is not None:
            return (None, drift_window(opts.encoder.manifest.window, opts.entry.drift))
        return (None,)

    async def _references(
        self, references: Mapping[str, Reference], opts: ResolvedOptions, deadline: float | None
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Each speaker's reference: its embedding (for the paper scores) and its waveform (for the judge)."""
        voices = [s for s, r in references.items() if isinstance(r, VoiceRef)]
        if voices:
            raise InvalidRequest(
                f"method lalm hears reference audio, and a registered voice is kept as embeddings: send the "
                f"reference clip of {', '.join(repr(s) for s in voices)} as audio, or use an embedding method"
            )
        clips = [(s, r) for s, r in references.items() if isinstance(r, AudioInput)]
        heard = await self._hear_all(opts.encoder, [(a, f"reference of speaker {s!r}") for s, a in clips], deadline)
        embeddings, waves = {}, {}
        for (s, _), h in zip(clips, heard, strict=True):
            if h.clip.embedding is None:
                raise InvalidRequest(f"reference of speaker {s!r} is unusable: {h.clip.detail}")
            embeddings[s], waves[s] = h.clip.embedding, h.samples
        return embeddings, waves

    # ------------------------------------------------------------------ CheckDialogue and StreamDialogue

    async def open_dialogue(
        self, dialogue_id: str, references: Mapping[str, Reference], opts: ResolvedOptions, deadline: float | None
    ) -> LalmDialogue:
        """An empty dialogue judged by the judge (a stream's state), its references heard."""
        judge = self.require()
        embeddings, waves = await self._references(references, opts, deadline)
        placements = self._placements(opts)

        async def hear(audio: AudioInput, label: str, turn_deadline: float | None) -> Heard:
            await self._embedder.admit([(audio, label)])
            return await self.hear(opts.encoder, audio, label, turn_deadline, placements)

        return LalmDialogue(
            dialogue_id, opts, embeddings, waves, judge, self._observer, hear, self.config.max_stream_audio_bytes
        )

    async def check_dialogue(
        self, request: DialogueRequest, opts: ResolvedOptions, deadline: float | None
    ) -> DialogueResult:
        """CheckDialogue under method lalm (the request was validated by the engine)."""
        judge = self.require()
        embeddings, waves = await self._references(request.references, opts, deadline)
        turns = [t for t in request.turns if t.audio is not None]
        heard = await self._hear_all(
            opts.encoder,
            [(t.audio, f"turn {t.turn_id!r}") for t in turns if t.audio is not None],
            deadline,
            self._placements(opts),
        )
        state = LalmDialogue(request.dialogue_id, opts, embeddings, waves, judge, self._observer)
        for position, (turn, h) in enumerate(zip(turns, heard, strict=True)):
            state.add_turn(turn.turn_id, turn.speaker, position, h)
        await state.judge_speakers([t.speaker for t in turns], deadline)
        return state.result()

    # ------------------------------------------------------------------ RankCandidates

    async def rank(self, request: RankRequest, opts: ResolvedOptions, deadline: float | None) -> RankResult:
        """RankCandidates under method lalm: the candidates as labelled options to the judge, who also hears
        the reference and the usable context clips; each candidate scores the judge's probability that it
        is the speaker's voice (and, when the encoder is calibrated, auto's fit probability)."""
        judge = self.require()
        if not request.context and request.reference is None:
            raise InvalidRequest("method lalm needs context clips of the speaker, a reference, or both")
        if isinstance(request.reference, VoiceRef):
            raise InvalidRequest(
                "method lalm hears reference audio, and a registered voice is kept as embeddings: send the "
                "reference clip as audio, or use an embedding method"
            )
        audios = [(c.audio, f"candidate {c.candidate_id!r}") for c in request.candidates]
        audios += [(a, f"context clip #{n}") for n, a in enumerate(request.context)]
        if request.reference is not None:
            audios.append((request.reference, "reference"))
        heard = await self._hear_all(opts.encoder, audios, deadline)
        n_cand, n_ctx = len(request.candidates), len(request.context)
        candidates, context = heard[:n_cand], [h for h in heard[n_cand : n_cand + n_ctx] if h.clip.usable]
        for c, h in zip(request.candidates, candidates, strict=True):
            if not h.clip.usable:
                raise InvalidRequest(f"candidate {c.candidate_id!r} cannot be scored: {h.clip.detail}")
        reference = heard[-1] if request.reference is not None else None
        if reference is not None and reference.clip.embedding is None:
            raise InvalidRequest(f"reference is unusable: {reference.clip.detail}")
        if not context and reference is None:
            raise InvalidRequest(
                f"none of the {n_ctx} context clips has enough speech and there is no reference: method lalm has "
                "nothing to compare the candidates with"
            )
        ranking = await judge.rank(
            [h.samples for h in candidates],
            reference.samples if reference is not None else None,
            [h.samples for h in context],
            deadline,
        )
        ids = [c.candidate_id for c in request.candidates]
        fit = self._fit(opts, ids, candidates, context, reference)
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

    @staticmethod
    def _fit(
        opts: ResolvedOptions,
        ids: Sequence[str],
        candidates: Sequence[Heard],
        context: Sequence[Heard],
        reference: Heard | None,
    ) -> dict[str, float]:
        """auto's P(each candidate belongs to the speaker), when the encoder is calibrated ("whatever the
        method", as RankedCandidate.fit_probability promises); empty otherwise."""
        cal = opts.entry.calibration
        if not isinstance(cal, Calibration):
            return {}
        ranked = rank_candidates(
            Method.AUTO,
            ids,
            [h.clip for h in candidates],
            [h.clip for h in context],
            reference.clip.embedding if reference is not None else None,
            cal,
        )
        return {r.candidate_id: r.fit_probability for r in ranked if r.fit_probability is not None}
