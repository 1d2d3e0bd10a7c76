"""The shared registry: the same tables in PostgreSQL, for replicas behind one load balancer.

Needs the ``postgres`` extra (``pip install 'sleuthd[postgres]'``, psycopg 3). Writes take one
transaction-scoped advisory lock, so registrations from all replicas are serialised (they are rare) and
the duplicate check and the voice-count bound hold across replicas; reads run in a REPEATABLE READ
snapshot. Durability is PostgreSQL's: a COMMIT that returned is on the server's disk (with the server's
default ``synchronous_commit=on``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sleuthd.config import ConfigError, RegistryConfig
from sleuthd.registry.location import unreachable_message
from sleuthd.registry.pool import ConnectionPool
from sleuthd.registry.sql import Cursor, SqlStore
from sleuthd.registry.store import RegistryUnavailable

logger = logging.getLogger(__name__)

# Any fixed 64-bit number; every sleuthd writer of one database takes this lock for its transaction.
_WRITE_LOCK = 0x736C65757468  # "sleuth"


class _QmarkCursor:
    """A psycopg cursor that takes the ``?`` placeholders the shared SQL is written with."""

    def __init__(self, cur: Any) -> None:
        self._cur = cur

    @property
    def rowcount(self) -> int:
        return int(self._cur.rowcount)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._cur.execute(sql.replace("?", "%s"), tuple(params))

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        return list(self._cur.fetchall())


class PostgresStore(SqlStore):
    backend = "postgresql"
    id_type = 'TEXT COLLATE "C"'  # bytewise order, the same pages as SQLite whatever the database's locale
    blob_type = "BYTEA"

    def __init__(self, url: str, config: RegistryConfig) -> None:
        try:
            import psycopg
        except ImportError:
            raise ConfigError("--registry postgresql://... needs psycopg: pip install 'sleuthd[postgres]'") from None
        super().__init__(config)
        self._psycopg = psycopg
        self._url = url
        self._pool: ConnectionPool[Any] = ConnectionPool(self._connect, self._close)
        try:
            self._create_schema()
            with self._pool.connection() as conn:
                where = f"{conn.info.host}:{conn.info.port}/{conn.info.dbname}"  # never the URL: it may hold a password
        except RegistryUnavailable as exc:  # at start-up: one line for `sleuthd serve`, URL without password
            self._pool.close()
            raise RegistryUnavailable(unreachable_message(url, exc)) from exc
        logger.info("voice registry: PostgreSQL %s", where)

    def _connect(self) -> Any:
        try:
            return self._psycopg.connect(
                self._url,
                autocommit=True,  # transactions are explicit: conn.transaction()
                connect_timeout=max(2, math.ceil(self.config.registry_connect_timeout_s)),
                application_name="sleuthd-registry",
            )
        except self._psycopg.Error as exc:
            raise RegistryUnavailable(f"cannot connect to the PostgreSQL voice registry: {exc}") from exc

    @contextmanager
    def _transaction(self, write: bool) -> Iterator[Cursor]:
        psycopg = self._psycopg
        with self._pool.connection() as conn:
            try:
                with conn.transaction(), conn.cursor() as cur:
                    if write:
                        # READ COMMITTED after the lock: each statement then sees every earlier writer's commit.
                        cur.execute(f"SELECT pg_advisory_xact_lock({_WRITE_LOCK})")
                    else:
                        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    yield _QmarkCursor(cur)
            except psycopg.Error as exc:
                raise RegistryUnavailable(f"PostgreSQL voice registry failed: {exc}") from exc

    def close(self) -> None:
        self._pool.close()

    def _close(self, conn: Any) -> None:
        try:
            conn.close()
        except self._psycopg.Error:
            logger.exception("closing a registry connection failed")
