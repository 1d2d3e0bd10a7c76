"""The voice store's interface, its asyncio wrapper, and the choice of backend from ``--registry``.

Every method of a :class:`VoiceStore` blocks on its database (an fsync on SQLite, a round trip to
PostgreSQL). An asyncio server must not call them on its event loop: it wraps the store in
:class:`AsyncVoiceStore`, which runs each call on the store's own small thread pool so a slow disk
or a lock wait never stalls the RPCs that do not touch the registry.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, TypeVar

from sleuthd.config import RegistryConfig
from sleuthd.errors import DependencyUnavailable
from sleuthd.registry.model import ClipChannel, ClipInput, Embedding, Voice, VoicePage

logger = logging.getLogger(__name__)

T = TypeVar("T")

SQLITE_FILE = "registry.sqlite3"  # the file created when --registry names a directory
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000


class RegistryUnavailable(DependencyUnavailable):
    """The registry's database cannot be reached or stayed locked; not the client's fault (UNAVAILABLE)."""


class VoiceStore(Protocol):
    """Registered voices, kept durably. Every write is one transaction: it lands whole or not at all,
    and once a method has returned, what it wrote survives a crash of this process."""

    backend: str  # "sqlite" or "postgresql"
    config: RegistryConfig

    def register(
        self,
        voice_id: str,
        clips: Sequence[ClipInput],
        *,
        metadata: Mapping[str, str] | None = None,
        embeddings: Sequence[Embedding] = (),
        replace: bool = False,
        keep_audio: bool | None = None,
    ) -> Voice:
        """Store a voice with its clips and the embeddings already computed for it (one per encoder
        weights). An id already registered raises Duplicate unless ``replace``; replacing drops the old
        clips and embeddings, keeps ``created_at`` and bumps ``revision``. ``keep_audio`` None = the
        config's. Bounds raise LimitExceeded; malformed input raises InvalidRequest."""
        ...

    def get(self, voice_id: str, *, with_audio: bool = False) -> Voice:
        """The voice (UnknownName if absent); clip bytes only when ``with_audio`` and they were kept."""
        ...

    def list_voices(self, *, page_size: int = 0, page_token: str = "") -> VoicePage:
        """Voices in id order, ``page_size`` (0 = 50, at most 1000) at a time, without clip bytes. Pass
        the returned ``next_page_token`` to get the next page; voices added meanwhile after the last id
        seen are included, none is listed twice."""
        ...

    def delete(self, voice_id: str) -> None:
        """Remove the voice, its clips and its embeddings (UnknownName if absent)."""
        ...

    def put_embedding(self, voice_id: str, embedding: Embedding, *, revision: int | None = None) -> Embedding:
        """Add or overwrite the voice's embedding for ``(encoder, weights_sha256)``. With ``revision``,
        refuse (OutOfSequence) if the voice was replaced since it was read at that revision, so an
        embedding of old clips never lands on new ones."""
        ...

    def put_channels(self, voice_id: str, channels: Sequence[ClipChannel], *, revision: int) -> None:
        """Record each of the voice's clips' channel (bandwidth Hz, plateau fraction, SNR dB, low band level dB), one
        per clip in order: for a voice registered before they were recorded, measured from its kept clips. Refused
        (OutOfSequence) if the voice was replaced since it was read at ``revision``."""
        ...

    def embedding(self, voice_id: str, encoder: str, weights_sha256: str) -> Embedding | None:
        """The voice's embedding under exactly these weights, or None (UnknownName if no such voice)."""
        ...

    def require_embedding(self, voice_id: str, encoder: str, weights_sha256: str) -> Embedding:
        """:meth:`embedding`, or Unsupported (FAILED_PRECONDITION) saying what the voice was enrolled
        with and how to re-enrol it: never an embedding from other weights."""
        ...

    def lacking_embedding(self, encoder: str, weights_sha256: str, *, limit: int = 100, after: str = "") -> list[str]:
        """Ids (in order, after ``after``) of voices with no embedding for these weights: the work list
        for re-embedding after an encoder changes. Check ``Voice.audio_kept`` before re-embedding one."""
        ...

    def count(self) -> int:
        """How many voices are registered."""
        ...

    def close(self) -> None:
        """Release connections; later calls raise RegistryUnavailable."""
        ...


class AsyncVoiceStore:
    """A :class:`VoiceStore` for asyncio code: each call runs on a private thread pool (``threads``
    at most at once; SQLite serialises writers anyway, readers run side by side in WAL mode)."""

    def __init__(self, store: VoiceStore, threads: int = 4) -> None:
        self.store = store
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sleuthd-registry")

    async def _run(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    async def register(
        self,
        voice_id: str,
        clips: Sequence[ClipInput],
        *,
        metadata: Mapping[str, str] | None = None,
        embeddings: Sequence[Embedding] = (),
        replace: bool = False,
        keep_audio: bool | None = None,
    ) -> Voice:
        return await self._run(
            self.store.register,
            voice_id,
            clips,
            metadata=metadata,
            embeddings=embeddings,
            replace=replace,
            keep_audio=keep_audio,
        )

    async def get(self, voice_id: str, *, with_audio: bool = False) -> Voice:
        return await self._run(self.store.get, voice_id, with_audio=with_audio)

    async def list_voices(self, *, page_size: int = 0, page_token: str = "") -> VoicePage:
        return await self._run(self.store.list_voices, page_size=page_size, page_token=page_token)

    async def delete(self, voice_id: str) -> None:
        await self._run(self.store.delete, voice_id)

    async def put_embedding(self, voice_id: str, embedding: Embedding, *, revision: int | None = None) -> Embedding:
        return await self._run(self.store.put_embedding, voice_id, embedding, revision=revision)

    async def put_channels(self, voice_id: str, channels: Sequence[ClipChannel], *, revision: int) -> None:
        await self._run(self.store.put_channels, voice_id, channels, revision=revision)

    async def embedding(self, voice_id: str, encoder: str, weights_sha256: str) -> Embedding | None:
        return await self._run(self.store.embedding, voice_id, encoder, weights_sha256)

    async def require_embedding(self, voice_id: str, encoder: str, weights_sha256: str) -> Embedding:
        return await self._run(self.store.require_embedding, voice_id, encoder, weights_sha256)

    async def lacking_embedding(
        self, encoder: str, weights_sha256: str, *, limit: int = 100, after: str = ""
    ) -> list[str]:
        return await self._run(self.store.lacking_embedding, encoder, weights_sha256, limit=limit, after=after)

    async def count(self) -> int:
        return await self._run(self.store.count)

    async def close(self) -> None:
        """Wait for calls in flight, then close the store."""
        await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown)
        self.store.close()
