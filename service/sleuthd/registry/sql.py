"""The voice store in SQL that SQLite and PostgreSQL both run; each backend supplies connections and
transactions (:mod:`sleuthd.registry.sqlite`, :mod:`sleuthd.registry.postgres`).

Statements are written with ``?`` placeholders (PostgreSQL's adapter rewrites them). Writes run in one
transaction that the backend serialises (SQLite ``BEGIN IMMEDIATE``, a PostgreSQL advisory lock), so
the duplicate check and the voice-count bound cannot race with another writer; reads run in one
snapshot, so a voice is never read half replaced.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from sleuthd.config import RegistryConfig
from sleuthd.errors import Duplicate, InvalidRequest, OutOfSequence, RegistryFull, UnknownName, Unsupported
from sleuthd.registry import model as m
from sleuthd.registry.store import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, RegistryUnavailable

logger = logging.getLogger(__name__)

SCHEMA_VERSION = "4"
_TOKEN_PREFIX = "v1."

# {id}: the voice id column type (PostgreSQL pins the "C" collation so ids sort bytewise, as in SQLite);
# {blob}: the binary column type.
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS registry_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS registry_voices (
        voice_id {id} PRIMARY KEY,
        metadata TEXT NOT NULL,
        created_us BIGINT NOT NULL,
        updated_us BIGINT NOT NULL,
        revision BIGINT NOT NULL,
        speech_seconds DOUBLE PRECISION NOT NULL,
        audio_kept INTEGER NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS registry_clips (
        voice_id {id} NOT NULL REFERENCES registry_voices (voice_id) ON DELETE CASCADE,
        idx INTEGER NOT NULL,
        sha256 TEXT NOT NULL,
        n_bytes BIGINT NOT NULL,
        pcm_encoding TEXT,
        sample_rate_hz INTEGER,
        channels INTEGER,
        audio_seconds DOUBLE PRECISION NOT NULL,
        speech_seconds DOUBLE PRECISION NOT NULL,
        data {blob},
        bandwidth_hz DOUBLE PRECISION,
        plateau DOUBLE PRECISION,
        snr_db DOUBLE PRECISION,
        low_band_db DOUBLE PRECISION,
        PRIMARY KEY (voice_id, idx))""",
    """CREATE TABLE IF NOT EXISTS registry_embeddings (
        voice_id {id} NOT NULL REFERENCES registry_voices (voice_id) ON DELETE CASCADE,
        encoder TEXT NOT NULL,
        weights_sha256 TEXT NOT NULL,
        dim INTEGER NOT NULL,
        dtype TEXT NOT NULL,
        vector {blob} NOT NULL,
        created_us BIGINT NOT NULL,
        PRIMARY KEY (voice_id, encoder, weights_sha256))""",
    "CREATE INDEX IF NOT EXISTS registry_embeddings_by_weights ON registry_embeddings (encoder, weights_sha256)",
    # The audio kept, summed at every registration (registry_max_total_mb) from this index alone.
    "CREATE INDEX IF NOT EXISTS registry_clips_kept ON registry_clips (voice_id, n_bytes) WHERE data IS NOT NULL",
    "INSERT INTO registry_meta (key, value) VALUES ('schema_version', "
    f"'{SCHEMA_VERSION}') ON CONFLICT (key) DO NOTHING",
)
# Upgrades of a registry written by an earlier sleuthd, from the version each starts at. They only add, so a
# sleuthd of the earlier version still running against the upgraded store keeps working (it names its columns);
# a restarted one refuses the newer version and says to upgrade.
MIGRATIONS = {
    # 1 -> 2: each clip's effective bandwidth (band matching); NULL for the clips registered before.
    "1": ("ALTER TABLE registry_clips ADD COLUMN bandwidth_hz DOUBLE PRECISION",),
    # 2 -> 3: each clip's plateau fraction and SNR (clip and noise matching); NULL for the clips registered before.
    "2": (
        "ALTER TABLE registry_clips ADD COLUMN plateau DOUBLE PRECISION",
        "ALTER TABLE registry_clips ADD COLUMN snr_db DOUBLE PRECISION",
    ),
    # 3 -> 4: each clip's low band level (telephone-band matching); NULL for the clips registered before.
    "3": ("ALTER TABLE registry_clips ADD COLUMN low_band_db DOUBLE PRECISION",),
}

_VOICE_COLS = "voice_id, metadata, created_us, updated_us, revision, speech_seconds, audio_kept"
_CLIP_COLS = (
    "voice_id, sha256, n_bytes, pcm_encoding, sample_rate_hz, channels, audio_seconds, speech_seconds, bandwidth_hz, "
    "plateau, snr_db, low_band_db"
)
_EMB_COLS = "voice_id, encoder, weights_sha256, dim, dtype, vector, created_us"


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


def encode_page_token(last_id: str) -> str:
    return _TOKEN_PREFIX + base64.urlsafe_b64encode(last_id.encode()).decode()


def decode_page_token(token: str) -> str:
    if not token:
        return ""
    try:
        if not token.startswith(_TOKEN_PREFIX):
            raise ValueError(token)
        return m.check_voice_id(base64.urlsafe_b64decode(token[len(_TOKEN_PREFIX) :].encode()).decode())
    except (ValueError, binascii.Error, InvalidRequest):
        raise InvalidRequest(
            "page_token is not one this registry issued; pass the next_page_token of the previous page"
        ) from None


def _require_revision(cur: Cursor, voice_id: str, revision: int | None, meanwhile: str) -> None:
    """In a write: UnknownName when the voice is gone; OutOfSequence when it was replaced since it was read at
    ``revision`` (None: any), so what was made from its old clips never lands on its new ones."""
    cur.execute("SELECT revision FROM registry_voices WHERE voice_id = ?", (voice_id,))
    row = cur.fetchone()
    if row is None:
        raise _unknown(voice_id)
    if revision is not None and int(row[0]) != revision:
        raise OutOfSequence(
            f"voice {voice_id!r} was replaced (revision {row[0]}, read at {revision}) while {meanwhile}"
        )


def _in_list(n: int) -> str:
    return ",".join("?" * n)


class SqlStore(ABC):
    """A :class:`~sleuthd.registry.store.VoiceStore` over any SQL backend with the shared schema."""

    backend = "sql"
    id_type = "TEXT"
    blob_type = "BLOB"

    def __init__(self, config: RegistryConfig) -> None:
        self.config = config

    @abstractmethod
    def _transaction(self, write: bool) -> AbstractContextManager[Cursor]:
        """One transaction: serialised with every other writer when ``write``, a snapshot when not."""

    @abstractmethod
    def close(self) -> None: ...

    def _create_schema(self) -> None:
        with self._transaction(write=True) as cur:
            for statement in SCHEMA:
                cur.execute(statement.format(id=self.id_type, blob=self.blob_type))
            cur.execute("SELECT value FROM registry_meta WHERE key = 'schema_version'")
            version = cur.fetchone()[0]
            while version in MIGRATIONS:  # in the same transaction: every replica sees the old or the new schema
                for statement in MIGRATIONS[version]:
                    cur.execute(statement)
                upgraded = str(int(version) + 1)
                cur.execute("UPDATE registry_meta SET value = ? WHERE key = 'schema_version'", (upgraded,))
                logger.info("upgraded the registry's schema from version %s to %s", version, upgraded)
                version = upgraded
        if version != SCHEMA_VERSION:
            raise RegistryUnavailable(
                f"the registry's schema is version {version}; this sleuthd reads version {SCHEMA_VERSION}: "
                "upgrade sleuthd or point --registry elsewhere"
            )

    # ------------------------------------------------------------------------------------------ writes

    def register(
        self,
        voice_id: str,
        clips: Sequence[m.ClipInput],
        *,
        metadata: Mapping[str, str] | None = None,
        embeddings: Sequence[m.Embedding] = (),
        replace: bool = False,
        keep_audio: bool | None = None,
    ) -> m.Voice:
        m.check_voice_id(voice_id)
        meta = m.check_metadata(metadata, self.config)
        stored = m.check_clips(clips, self.config)
        vectors = [m.check_embedding(e) for e in embeddings]
        keys = [(e.encoder, e.weights_sha256) for e in embeddings]
        if len(set(keys)) != len(keys):
            raise InvalidRequest("two embeddings for the same encoder weights; send one per (encoder, weights_sha256)")
        keep = self.config.keep_audio if keep_audio is None else keep_audio
        speech = sum(c.speech_seconds for c in stored)
        t = m.to_micros(m.now())
        meta_json = json.dumps(meta, sort_keys=True)
        with self._transaction(write=True) as cur:
            cur.execute("SELECT created_us, revision FROM registry_voices WHERE voice_id = ?", (voice_id,))
            old = cur.fetchone()
            if old is not None and not replace:
                raise Duplicate(
                    f"voice {voice_id!r} is already registered (revision {old[1]}); set replace to overwrite it "
                    "or delete it first"
                )
            if keep:
                self._check_total(cur, voice_id, sum(c.n_bytes for c in stored))
            if old is not None:
                created, revision = int(old[0]), int(old[1]) + 1
                cur.execute("DELETE FROM registry_embeddings WHERE voice_id = ?", (voice_id,))
                cur.execute("DELETE FROM registry_clips WHERE voice_id = ?", (voice_id,))
                cur.execute(
                    "UPDATE registry_voices SET metadata = ?, updated_us = ?, revision = ?, speech_seconds = ?, "
                    "audio_kept = ? WHERE voice_id = ?",
                    (meta_json, t, revision, speech, int(keep), voice_id),
                )
            else:
                cur.execute("SELECT COUNT(*) FROM registry_voices")
                n = int(cur.fetchone()[0])
                if n >= self.config.registry_max_voices:
                    raise RegistryFull(
                        f"the registry holds {n} voices, its limit (registry_max_voices); delete voices no "
                        "longer needed or raise the limit"
                    )
                created, revision = t, 1
                cur.execute(
                    f"INSERT INTO registry_voices ({_VOICE_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (voice_id, meta_json, t, t, revision, speech, int(keep)),
                )
            for k, c in enumerate(stored):
                cur.execute(
                    "INSERT INTO registry_clips (voice_id, idx, sha256, n_bytes, pcm_encoding, sample_rate_hz, "
                    "channels, audio_seconds, speech_seconds, bandwidth_hz, plateau, snr_db, low_band_db, data) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (voice_id, k, c.sha256, c.n_bytes, *m.pcm_columns(c.pcm), c.audio_seconds, c.speech_seconds,
                     c.bandwidth_hz, c.plateau, c.snr_db, c.low_band_db, c.data if keep else None),
                )  # fmt: skip
            for e, v in zip(embeddings, vectors, strict=True):
                self._upsert_embedding(cur, voice_id, e, v, t)
        logger.info("registered voice %s (revision %d, %d clips, %.1f s speech)", voice_id, revision, len(stored),
                    speech)  # fmt: skip
        return m.Voice(
            voice_id=voice_id,
            metadata=meta,
            created_at=m.from_micros(created),
            updated_at=m.from_micros(t),
            revision=revision,
            speech_seconds=speech,
            audio_kept=keep,
            clips=tuple(dataclasses.replace(c, data=None) for c in stored),
            embeddings=tuple(
                m.Embedding(e.encoder, e.weights_sha256, v.astype(v.dtype.newbyteorder("=")), m.from_micros(t))
                # in the order a read returns them
                for e, v in sorted(
                    zip(embeddings, vectors, strict=True), key=lambda ev: (ev[0].encoder, ev[0].weights_sha256)
                )
            ),
        )

    def _check_total(self, cur: Cursor, voice_id: str, adding: int) -> None:
        """Refuse (RegistryFull) a registration whose kept audio would take the registry's past
        ``registry_max_total_mb`` (a voice being replaced no longer counts its old clips)."""
        cur.execute(
            "SELECT COALESCE(SUM(n_bytes), 0) FROM registry_clips WHERE data IS NOT NULL AND voice_id <> ?",
            (voice_id,),
        )
        kept = int(cur.fetchone()[0])
        limit = self.config.max_total_bytes
        if kept + adding > limit:
            raise RegistryFull(
                f"the registry keeps {kept / 2**20:.1f} MiB of clip audio and this voice's clips add "
                f"{adding / 2**20:.1f} MiB, over its limit of {limit / 2**20:g} MiB (registry_max_total_mb): delete "
                "voices no longer needed, register without keeping the audio (keep_audio off), or raise the limit"
            )

    @staticmethod
    def _upsert_embedding(cur: Cursor, voice_id: str, e: m.Embedding, v: Any, t: int) -> None:
        cur.execute(
            f"INSERT INTO registry_embeddings ({_EMB_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (voice_id, encoder, weights_sha256) DO UPDATE SET dim = excluded.dim, "
            "dtype = excluded.dtype, vector = excluded.vector, created_us = excluded.created_us",
            (voice_id, e.encoder, e.weights_sha256, int(v.shape[0]), v.dtype.name, v.tobytes(), t),
        )

    def delete(self, voice_id: str) -> None:
        m.check_voice_id(voice_id)
        with self._transaction(write=True) as cur:
            cur.execute("DELETE FROM registry_embeddings WHERE voice_id = ?", (voice_id,))
            cur.execute("DELETE FROM registry_clips WHERE voice_id = ?", (voice_id,))
            cur.execute("DELETE FROM registry_voices WHERE voice_id = ?", (voice_id,))
            if cur.rowcount == 0:
                raise _unknown(voice_id)
        logger.info("deleted voice %s", voice_id)

    def put_embedding(self, voice_id: str, embedding: m.Embedding, *, revision: int | None = None) -> m.Embedding:
        m.check_voice_id(voice_id)
        v = m.check_embedding(embedding)
        t = m.to_micros(m.now())
        with self._transaction(write=True) as cur:
            _require_revision(cur, voice_id, revision, "it was being embedded; read it again and embed its new clips")
            self._upsert_embedding(cur, voice_id, embedding, v, t)
        return m.Embedding(embedding.encoder, embedding.weights_sha256, v.astype(v.dtype.newbyteorder("=")),
                           m.from_micros(t))  # fmt: skip

    def put_channels(self, voice_id: str, channels: Sequence[m.ClipChannel], *, revision: int) -> None:
        m.check_voice_id(voice_id)
        checked = [m.check_channel(k, *c) for k, c in enumerate(channels)]
        with self._transaction(write=True) as cur:
            _require_revision(cur, voice_id, revision, "its clips' channels were measured; read it again")
            cur.execute("SELECT COUNT(*) FROM registry_clips WHERE voice_id = ?", (voice_id,))
            n = int(cur.fetchone()[0])
            if n != len(checked):
                raise InvalidRequest(f"voice {voice_id!r} has {n} clips; {len(checked)} channels were sent")
            for k, (width, plateau, snr, low_band) in enumerate(checked):
                cur.execute(
                    "UPDATE registry_clips SET bandwidth_hz = ?, plateau = ?, snr_db = ?, low_band_db = ? "
                    "WHERE voice_id = ? AND idx = ?",
                    (width, plateau, snr, low_band, voice_id, k),
                )

    # ------------------------------------------------------------------------------------------- reads

    def get(self, voice_id: str, *, with_audio: bool = False) -> m.Voice:
        m.check_voice_id(voice_id)
        with self._transaction(write=False) as cur:
            voices = self._load(cur, "voice_id = ?", (voice_id,), 1, with_audio)
        if not voices:
            raise _unknown(voice_id)
        return voices[0]

    def list_voices(self, *, page_size: int = 0, page_token: str = "") -> m.VoicePage:
        if not 0 <= page_size <= MAX_PAGE_SIZE:
            raise InvalidRequest(
                f"page_size must be 0 (default {DEFAULT_PAGE_SIZE}) to {MAX_PAGE_SIZE}, got {page_size}"
            )
        size = page_size or DEFAULT_PAGE_SIZE
        after = decode_page_token(page_token)
        with self._transaction(write=False) as cur:
            # one row more than the page tells whether another page follows
            voices = self._load(cur, "voice_id > ?", (after,), size + 1, with_audio=False)
        more = len(voices) > size
        voices = voices[:size]
        return m.VoicePage(tuple(voices), encode_page_token(voices[-1].voice_id) if more else "")

    def _load(self, cur: Cursor, where: str, params: tuple[Any, ...], limit: int, with_audio: bool) -> list[m.Voice]:
        cur.execute(
            f"SELECT {_VOICE_COLS} FROM registry_voices WHERE {where} ORDER BY voice_id LIMIT ?", (*params, limit)
        )
        rows = cur.fetchall()
        if not rows:
            return []
        ids = [r[0] for r in rows]
        data_col = "data" if with_audio else "NULL"
        cur.execute(
            f"SELECT {_CLIP_COLS}, {data_col} FROM registry_clips WHERE voice_id IN ({_in_list(len(ids))}) "
            "ORDER BY voice_id, idx",
            ids,
        )
        clips: dict[str, list[m.StoredClip]] = {i: [] for i in ids}
        for vid, sha, n, enc, rate, ch, audio_s, speech_s, width, plateau, snr, low_band, data in cur.fetchall():
            pcm = m.pcm_from_columns(enc, rate, ch)
            blob = None if data is None else bytes(data)
            channel = (None if x is None else float(x) for x in (width, plateau, snr, low_band))
            clips[vid].append(m.StoredClip(sha, int(n), pcm, float(audio_s), float(speech_s), blob, *channel))
        cur.execute(
            f"SELECT {_EMB_COLS} FROM registry_embeddings WHERE voice_id IN ({_in_list(len(ids))}) "
            "ORDER BY voice_id, encoder, weights_sha256",
            ids,
        )
        embs: dict[str, list[m.Embedding]] = {i: [] for i in ids}
        for row in cur.fetchall():
            embs[row[0]].append(_embedding(row))
        return [
            m.Voice(
                voice_id=vid,
                metadata=json.loads(meta),
                created_at=m.from_micros(int(created)),
                updated_at=m.from_micros(int(updated)),
                revision=int(revision),
                speech_seconds=float(speech),
                audio_kept=bool(kept),
                clips=tuple(clips[vid]),
                embeddings=tuple(embs[vid]),
            )
            for vid, meta, created, updated, revision, speech, kept in rows
        ]

    def embedding(self, voice_id: str, encoder: str, weights_sha256: str) -> m.Embedding | None:
        m.check_voice_id(voice_id)
        m.check_encoder_key(encoder, weights_sha256)
        with self._transaction(write=False) as cur:
            cur.execute("SELECT 1 FROM registry_voices WHERE voice_id = ?", (voice_id,))
            if cur.fetchone() is None:
                raise _unknown(voice_id)
            cur.execute(
                f"SELECT {_EMB_COLS} FROM registry_embeddings "
                "WHERE voice_id = ? AND encoder = ? AND weights_sha256 = ?",
                (voice_id, encoder, weights_sha256),
            )
            row = cur.fetchone()
        return None if row is None else _embedding(row)

    def require_embedding(self, voice_id: str, encoder: str, weights_sha256: str) -> m.Embedding:
        found = self.embedding(voice_id, encoder, weights_sha256)
        if found is not None:
            return found
        voice = self.get(voice_id)
        others = [e.weights_sha256[:12] for e in voice.embeddings if e.encoder == encoder]
        had = (
            f"it was enrolled under other {encoder} weights ({', '.join(others)}…), and embeddings from different "
            "weights are not comparable"
            if others
            else f"it has no {encoder} embedding"
        )
        fix = (
            "re-embed it from its stored clips, or register it again with replace"
            if voice.audio_kept
            else "its clips were not kept (registry_keep_audio off), so register it again with its clips and replace"
        )
        raise Unsupported(
            f"voice {voice_id!r} cannot be used with {encoder} weights {weights_sha256[:12]}…: {had}; {fix}"
        )

    def lacking_embedding(self, encoder: str, weights_sha256: str, *, limit: int = 100, after: str = "") -> list[str]:
        m.check_encoder_key(encoder, weights_sha256)
        if after:
            m.check_voice_id(after)
        if not 1 <= limit <= MAX_PAGE_SIZE:
            raise InvalidRequest(f"limit must be 1 to {MAX_PAGE_SIZE}, got {limit}")
        with self._transaction(write=False) as cur:
            cur.execute(
                "SELECT v.voice_id FROM registry_voices v WHERE v.voice_id > ? AND NOT EXISTS (SELECT 1 FROM "
                "registry_embeddings e WHERE e.voice_id = v.voice_id AND e.encoder = ? AND e.weights_sha256 = ?) "
                "ORDER BY v.voice_id LIMIT ?",
                (after, encoder, weights_sha256, limit),
            )
            return [r[0] for r in cur.fetchall()]

    def count(self) -> int:
        with self._transaction(write=False) as cur:
            cur.execute("SELECT COUNT(*) FROM registry_voices")
            return int(cur.fetchone()[0])


def _unknown(voice_id: str) -> UnknownName:
    return UnknownName(f"no voice {voice_id!r} is registered; register it first (ListVoices shows what is there)")


def _embedding(row: Sequence[Any]) -> m.Embedding:
    _vid, encoder, sha, dim, dtype, vector, created = row
    return m.Embedding(encoder, sha, m.decode_vector(bytes(vector), dtype, int(dim)), m.from_micros(int(created)))
