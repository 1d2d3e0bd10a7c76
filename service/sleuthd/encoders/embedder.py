"""Clip embeddings for the engine: cache key -> cache -> single flight -> prepare -> encode.

A clip is looked up by the hash of its bytes and the encoder's weights; a miss is prepared on a worker
thread (decode, resample, loudness, VAD, windows: sleuthd.encoders.clips) and its windows go through the
encoder (the micro-batcher merges the windows of all concurrent requests into few model calls).
Concurrent requests for the same clip share one computation.

The encoders of a fused request (GE2E and CAM++) each keep their own cache entry, single flight and
batcher, but decode and trim the clip once: the decoded, normalised and trimmed speech is a single flight
of its own, keyed by the clip's hash and the loudness target (the only encoder setting it depends on);
each encoder then cuts its windows from it. The windows are exactly those a component would cut alone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Any, TypeVar

from sleuthd.aio import gather_or_cancel
from sleuthd.audio.decode import DEFAULT_REQUEST_SAMPLES, AudioError, AudioProbe
from sleuthd.audio.vad import Vad
from sleuthd.audio.windows import WindowSpec
from sleuthd.domain import AudioInput
from sleuthd.encoders.cache import LruCache, audio_key
from sleuthd.encoders.clips import (
    NARROWBAND,
    UNMEASURED,
    Channel,
    ChannelCopy,
    ClipEmbedding,
    Heard,
    PreparedClip,
    Speech,
    channel_copy,
    check_request_audio,
    clip_channel,
    clip_pitch,
    copy_noise,
    cut_placements,
    decode_and_prepare,
    decode_and_trim,
    embedded_clip,
    kept_samples,
    prepare_placements,
    speech_cut,
)
from sleuthd.encoders.fusion import FusedEncoder
from sleuthd.encoders.runner import WindowEncoder
from sleuthd.encoders.single_flight import SingleFlight
from sleuthd.errors import DeadlineExceeded
from sleuthd.ops.observe import EngineObserver

# A clip under each window placement asked for; None is the encoder manifest's own placement.
Placements = Sequence[WindowSpec | None]
F = TypeVar("F", bound="asyncio.Future[Any]")


class ClipEmbedder:
    def __init__(
        self,
        vad: Vad,
        prep_pool: Executor,
        observer: EngineObserver,
        max_clip_seconds: float,
        cache_entries: int,
        max_request_samples: int = DEFAULT_REQUEST_SAMPLES,
        probe_pool: Executor | None = None,
    ) -> None:
        """``probe_pool``: where clips' headers are read before admission (default: ``prep_pool``). A pool of
        its own keeps the header reads of arriving requests, most of them refused under overload, from
        queueing ahead of the decoding of admitted ones."""
        self.vad = vad
        self.observer = observer
        self.max_clip_seconds = max_clip_seconds
        self.max_request_samples = max_request_samples
        self.cache: LruCache[ClipEmbedding] = LruCache(cache_entries)
        # Clips' median pitches by digest (pitch matching measures a flagged speaker's clips; RankCandidates judges
        # the same context once per candidate, and a regeneration loop sends it again).
        self._pitch_cache: LruCache[tuple[float | None]] = LruCache(cache_entries)
        self._prep_pool = prep_pool
        self._probe_pool = probe_pool or prep_pool
        # Cache misses in flight, by cache key(s): concurrent requests for the same clip share one computation.
        self._in_flight: SingleFlight[str, list[ClipEmbedding]] = SingleFlight()
        # Clips being decoded and trimmed, by digest and loudness target: the encoders of a fused request
        # (and concurrent requests for the same bytes) share one decode and VAD pass.
        self._trimming: SingleFlight[str, Speech] = SingleFlight()

    async def embed(
        self,
        encoder: WindowEncoder,
        audios: Sequence[tuple[AudioInput, str]],
        deadline: float | None = None,
        placements: Placements = (None,),
        remember: bool = True,
    ) -> list[list[ClipEmbedding]]:
        """Every clip (each with a label for error messages) under every placement, concurrently; results
        in input order, one list of placements per clip. ``remember``: look the clips up in the cache and keep
        them there (False: clips remembered under another key by the caller, :meth:`copies`).

        Raises AudioError naming the label of a clip whose bytes cannot be decoded, DeadlineExceeded when
        ``deadline`` (event-loop clock) passes first. One failure withdraws the other clips' queued work.
        """
        if deadline is not None and asyncio.get_running_loop().time() >= deadline:
            raise DeadlineExceeded("the deadline passed before the request could be started")
        await self.admit(audios)
        # One clip failed (or the RPC was cancelled): the others' queued work is withdrawn too.
        found = await gather_or_cancel(
            self._one(encoder, a, label, deadline, placements, remember=remember) for a, label in audios
        )
        for (clip, cached), *_ in found:
            self.observer.clip_embedded(clip.audio_seconds, cached=cached)
        return [[clip for clip, _ in clips] for clips in found]

    async def admit(self, audios: Sequence[tuple[AudioInput, str]]) -> list[AudioProbe]:
        """Refuse before any decoding a batch of clips that would decode to more than the per-request bound
        (headers only; on a worker thread: an MP3 header costs about 5 ms). Returns the headers."""
        if not audios:
            return []
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._probe_pool, check_request_audio, audios, self.max_clip_seconds, self.max_request_samples
        )

    async def cached(
        self, encoder: WindowEncoder, audios: Sequence[tuple[AudioInput, str]], placements: Placements = (None,)
    ) -> list[bool]:
        """Whether each clip's embeddings under ``encoder`` and ``placements`` are all in the cache now (hashing
        the clips on the header thread, ~1 ms per MB): such a clip costs no decoding and no model time, which is
        what admission estimates. All False when the cache is off. A clip may still be evicted before it is
        embedded; the estimate is an estimate."""
        if self.cache.max_entries <= 0 or not audios:
            return [False] * len(audios)

        def look() -> list[bool]:
            return [all(k in self.cache for k in self._keys(encoder, a.digest, placements)) for a, _ in audios]

        return await asyncio.get_running_loop().run_in_executor(self._probe_pool, look)

    def _keys(self, encoder: WindowEncoder, digest: str, placements: Placements) -> list[str]:
        """The cache keys of a clip's embeddings under ``encoder`` and each placement (a fusion: its first
        component's under every placement, the others' under the manifest's, as :meth:`_fused` embeds it)."""
        if isinstance(encoder, FusedEncoder):
            first, *rest = encoder.components
            return [*self._keys(first, digest, placements), *(k for c in rest for k in self._keys(c, digest, (None,)))]
        base = audio_key(encoder.manifest.sha256, digest)
        return [base + (f":{w}" if w else "") for w in placements]

    async def embed_audio(
        self, encoder: WindowEncoder, audios: Sequence[tuple[AudioInput, str]], deadline: float | None = None
    ) -> list[ClipEmbedding]:
        """:meth:`embed` under the manifest's placement only: one embedding per clip."""
        return [clips[0] for clips in await self.embed(encoder, audios, deadline)]

    async def copies(
        self,
        encoder: WindowEncoder,
        how: ChannelCopy,
        audios: Sequence[tuple[AudioInput, str]],
        deadline: float | None = None,
    ) -> list[ClipEmbedding]:
        """:meth:`embed_audio` of each clip's copy made as ``how`` says (:func:`channel_copy`, on a worker thread):
        what a speaker whose clips differ in channel (bandwidth, clipping, noise) is judged on. AudioError names the
        label."""
        loop = asyncio.get_running_loop()
        if deadline is not None and loop.time() >= deadline:
            raise DeadlineExceeded(f"the deadline passed before the clips' {how.describe()} could be made")

        # A copy's embedding is remembered by its clip's digest and how it was made (not by the copy's bytes), so a
        # dialogue sent again, a regeneration loop's context turns, does not make its copies again: decoding,
        # filtering and hashing ~1,000 copies were ~0.8 s of a 1000-turn check whose turns were all cached
        # (docs/research/cached-checks/). One entry per copy: its parts are not kept under the copy's bytes.
        found: list[ClipEmbedding | None] = [None] * len(audios)
        keys = [""] * len(audios)
        if self.cache.max_entries > 0:
            noise = "" if how.noise is None else how.noise.digest
            made_as = (
                f"copy:{how.narrow}:{how.telephone}:{how.plateau!r}:{how.snr_db!r}:{noise}:{how.pitch_steps}"
                f":{how.cut_samples}"
            )
            keys = [f"{audio_key(encoder.manifest.sha256, a.digest)}:{made_as}" for a, _ in audios]
            found = [self.cache.get(k) for k in keys]
        todo = [i for i, clip in enumerate(found) if clip is None]
        for clip in found:
            if clip is not None:
                self.observer.clip_embedded(clip.audio_seconds, cached=True)
        if todo:
            # A noisy copy's noise is decoded once for the batch (it is the same clip's for every copy).
            bed = None
            if how.snr_db is not None:
                bed = await loop.run_in_executor(self._prep_pool, copy_noise, how, self.max_clip_seconds)

            target = encoder.manifest.loudness_target_dbfs

            async def copy(audio: AudioInput, label: str) -> tuple[AudioInput, str]:
                try:
                    if how.cut_samples:
                        job = functools.partial(
                            speech_cut, audio, self.max_clip_seconds, how.cut_samples, target, self.vad
                        )
                    else:
                        job = functools.partial(channel_copy, audio, self.max_clip_seconds, how, bed)
                    made = await loop.run_in_executor(self._prep_pool, job)
                except AudioError as exc:
                    raise AudioError(f"{label}: {exc}") from exc
                return made, f"{label} ({how.describe()})"

            made = await gather_or_cancel(copy(*audios[i]) for i in todo)
            embedded = await self.embed(encoder, made, deadline, remember=False)
            for i, (clip, *_) in zip(todo, embedded, strict=True):
                found[i] = clip
                if keys[i]:
                    self.cache.put(keys[i], clip)
        return [clip for clip in found if clip is not None]

    async def narrowband(
        self, encoder: WindowEncoder, audios: Sequence[tuple[AudioInput, str]], deadline: float | None = None
    ) -> list[ClipEmbedding]:
        """:meth:`copies` at the common band (band matching's copies; what a registration stores)."""
        return await self.copies(encoder, NARROWBAND, audios, deadline)

    async def channels(self, audios: Sequence[tuple[AudioInput, str]]) -> list[Channel]:
        """Each clip's channel (bandwidth, plateau fraction, SNR, low band level), measured on a worker thread, as
        the fused encoder's shared decode measures it (what a registration records). AudioError names the label."""

        async def one(audio: AudioInput, label: str) -> Channel:
            try:
                return await self._channel(audio)
            except AudioError as exc:
                raise AudioError(f"{label}: {exc}") from exc

        return await gather_or_cancel(one(a, label) for a, label in audios)

    async def pitches(self, audios: Sequence[tuple[AudioInput, str]]) -> list[float | None]:
        """Each clip's median pitch, log2(Hz) (None: too little voiced; sleuthd.audio.pitch), on worker threads.
        AudioError names the label."""
        loop = asyncio.get_running_loop()

        async def one(audio: AudioInput, label: str) -> float | None:
            found = self._pitch_cache.get(audio.digest)
            if found is not None:
                return found[0]
            try:
                pitch = await loop.run_in_executor(self._prep_pool, clip_pitch, audio, self.max_clip_seconds)
            except AudioError as exc:
                raise AudioError(f"{label}: {exc}") from exc
            self._pitch_cache.put(audio.digest, (pitch,))
            return pitch

        return await gather_or_cancel(one(a, label) for a, label in audios)

    async def kept_samples(self, encoder: WindowEncoder, audios: Sequence[tuple[AudioInput, str]]) -> list[int]:
        """Each clip's trimmed speech in samples, at ``encoder``'s loudness target (:func:`kept_samples`: the length
        a cut copy is made to), on worker threads. AudioError names the label."""
        loop = asyncio.get_running_loop()
        target = encoder.manifest.loudness_target_dbfs

        async def one(audio: AudioInput, label: str) -> int:
            job = functools.partial(kept_samples, audio, self.max_clip_seconds, target, self.vad)
            try:
                return await loop.run_in_executor(self._prep_pool, job)
            except AudioError as exc:
                raise AudioError(f"{label}: {exc}") from exc

        return await gather_or_cancel(one(a, label) for a, label in audios)

    async def _channel(self, audio: AudioInput) -> Channel:
        """A clip's channel alone (a decode and a spectrum), on a worker thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._prep_pool, clip_channel, audio, self.max_clip_seconds)

    async def hear(
        self, encoder: WindowEncoder, audio: AudioInput, label: str, deadline: float | None, placements: Placements
    ) -> Heard:
        """Decode ``audio`` once and keep the waveform beside its embeddings under each placement (for the
        LALM judge, which hears the audio itself). The cache is not consulted: the waveform is needed
        anyway, and VAD plus encoding of a cached clip cost a few milliseconds. AudioError names ``label``."""
        loop = asyncio.get_running_loop()
        if deadline is not None and loop.time() >= deadline:
            raise DeadlineExceeded(f"{label}: the deadline passed before it could be decoded")
        try:
            samples, prepared = await loop.run_in_executor(
                self._prep_pool, decode_and_prepare, audio, encoder.manifest, self.vad, self.max_clip_seconds,
                placements,
            )  # fmt: skip
        except AudioError as exc:
            raise AudioError(f"{label}: {exc}") from exc
        clips = await gather_or_cancel(embed_prepared(encoder, p, deadline) for p in prepared)
        self.observer.clip_embedded(clips[0].audio_seconds, cached=False)
        return Heard(samples, list(clips))

    async def _one(
        self,
        encoder: WindowEncoder,
        audio: AudioInput,
        label: str,
        deadline: float | None,
        placements: Placements,
        digest: str = "",
        remember: bool = True,
    ) -> list[tuple[ClipEmbedding, bool]]:
        """A clip's embedding under each placement, each with whether it was already there (cached, or
        being computed for a concurrent request). The placement is part of the cache key; the placements
        not cached are prepared together, from one decode and VAD pass. ``digest``: the clip's
        ``AudioInput.digest``, given by a caller whose other encoders share the decode (the fusion); a clip
        embedded by one encoder alone is decoded in one job, hashed only for the cache. ``remember``: as
        :meth:`embed`'s."""
        if isinstance(encoder, FusedEncoder):
            return await self._fused(encoder, audio, label, deadline, placements, remember)
        shared = digest  # the decode is shared under this key; "" = decoded alone
        keyed = remember and self.cache.max_entries > 0
        # Hashing costs ~1 ms per MB; skip it when the cache is not used and nobody shares the decode.
        if not digest and keyed:
            digest = audio.digest
        keys = self._keys(encoder, digest, placements) if keyed else [""] * len(placements)
        found: list[ClipEmbedding | None] = [self.cache.get(k) if k else None for k in keys]
        missing = [i for i, clip in enumerate(found) if clip is None]
        joined = False
        if missing:
            todo = [placements[i] for i in missing]
            todo_keys = [keys[i] for i in missing]
            try:
                if keyed:  # a concurrent request for the same clip and placements shares the work
                    loop = asyncio.get_running_loop()
                    timeout = None if deadline is None else max(deadline - loop.time(), 0.0)

                    def start() -> asyncio.Task[list[ClipEmbedding]]:
                        work = self._compute(encoder, audio, todo, None, todo_keys, shared)
                        return _retrieving(asyncio.ensure_future(work))

                    computed, joined = await self._in_flight.run("|".join(todo_keys), start, timeout)
                else:
                    computed = await self._compute(encoder, audio, todo, deadline, todo_keys, shared)
            except AudioError as exc:
                raise AudioError(f"{label}: {exc}") from exc
            except TimeoutError as exc:
                if isinstance(exc, DeadlineExceeded):
                    raise
                raise DeadlineExceeded(f"{label}: the deadline passed before its embedding was ready") from exc
            for i, result in zip(missing, computed, strict=True):
                found[i] = result
        return [(clip, joined or i not in missing) for i, clip in enumerate(found) if clip is not None]

    async def _fused(
        self,
        encoder: FusedEncoder,
        audio: AudioInput,
        label: str,
        deadline: float | None,
        placements: Placements,
        remember: bool = True,
    ) -> list[tuple[ClipEmbedding, bool]]:
        """The clip through every component encoder (each with its own windows, cache and batcher), joined;
        the components share one decode and trim of the clip (keyed by its digest, computed once here).
        Other placements (drift windows) are the first component's: drift is found in one encoder's windows."""
        digest = audio.digest
        first, *rest = encoder.components
        parts = await gather_or_cancel(
            [self._one(first, audio, label, deadline, placements, digest, remember)]
            + [self._one(c, audio, label, deadline, (None,), digest, remember) for c in rest]
        )
        # The engine always asks for the manifest's placement (None) first; drift windows come beside it.
        at_manifest = [parts[0][placements.index(None)]] + [found[0] for found in parts[1:]]
        clip = encoder.combine([clip for clip, _ in at_manifest])
        if clip.usable and clip.channel == UNMEASURED:
            # Every part came from the cache, put there by requests to single encoders, which measure no channel;
            # channel matching needs it whatever the cache held (a decode and a spectrum, once per such request).
            clip = dataclasses.replace(clip, channel=await self._channel(audio))
        joined = (clip, all(cached for _, cached in at_manifest))
        return [joined if p is None else parts[0][i] for i, p in enumerate(placements)]

    async def _compute(
        self,
        encoder: WindowEncoder,
        audio: AudioInput,
        placements: Placements,
        deadline: float | None,
        keys: Sequence[str],
        digest: str = "",
    ) -> list[ClipEmbedding]:
        """Decode, trim and cut the clip once for all ``placements``, embed each and cache it under its
        key ("" when the cache is off). Raises AudioError without a label."""
        prepared = await self._prepare(encoder, audio, placements, digest)
        embedded = await gather_or_cancel(embed_prepared(encoder, clip, deadline) for clip in prepared)
        for key, result in zip(keys, embedded, strict=True):
            if key:
                self.cache.put(key, result)
        return list(embedded)

    async def _prepare(
        self, encoder: WindowEncoder, audio: AudioInput, placements: Placements, digest: str
    ) -> list[PreparedClip]:
        """The clip's windows for ``encoder`` under each placement. With a digest (the fusion's), the decoded
        and trimmed speech is shared with every other encoder (and fused request) preparing the same clip at
        the same loudness at the same time; without one, one job does it all."""
        loop = asyncio.get_running_loop()
        manifest = encoder.manifest
        if not digest:
            return await loop.run_in_executor(
                self._prep_pool, prepare_placements, audio, manifest, self.vad, self.max_clip_seconds, placements
            )
        target = manifest.loudness_target_dbfs

        def start() -> asyncio.Future[Speech]:
            job = functools.partial(decode_and_trim, audio, target, self.vad, self.max_clip_seconds)
            return _retrieving(loop.run_in_executor(self._prep_pool, job))

        speech, _ = await self._trimming.run(f"{digest}@{target}", start)
        return await loop.run_in_executor(self._prep_pool, cut_placements, speech, manifest, placements)


def _retrieving(task: F) -> F:
    """``task``, with its exception marked as retrieved when it ends. A shared (single-flight) computation
    can fail after every caller has stopped waiting for it, e.g. refused by a full queue just as the last
    caller's deadline passed; asyncio would then log "Task exception was never retrieved"."""
    task.add_done_callback(lambda t: None if t.cancelled() else t.exception())
    return task


async def embed_prepared(encoder: WindowEncoder, clip: PreparedClip, deadline: float | None = None) -> ClipEmbedding:
    """A prepared clip through the encoder; an unusable one keeps its reason and gets no embedding."""
    if clip.windows is None:
        return ClipEmbedding(
            clip.audio_seconds,
            clip.speech_seconds,
            None,
            None,
            None,
            clip.detail,
            clip.channel,
        )
    return embedded_clip(clip, await encoder.encode(clip.windows, deadline=deadline))
