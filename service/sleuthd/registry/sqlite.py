"""The embedded registry: one SQLite file in WAL mode.

Durability: every write is one ``BEGIN IMMEDIATE … COMMIT`` transaction; SQLite's journal makes it all
or nothing, whatever kills the process. WAL lets readers run while one writer commits, and several
sleuthd processes on one machine may share the file (writers wait up to the busy timeout for the lock).
``synchronous=FULL`` (the default) fsyncs the WAL at every commit, so an acknowledged registration also
survives power loss; ``NORMAL`` skips that fsync and still survives a crash of sleuthd itself, because
the committed WAL frames are in the OS page cache. Registrations are rare, so FULL costs nothing that
matters. The file must be on a local disk: WAL does not work over network file systems.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sleuthd.config import ConfigError, RegistryConfig
from sleuthd.registry.pool import ConnectionPool
from sleuthd.registry.sql import Cursor, SqlStore
from sleuthd.registry.store import RegistryUnavailable

logger = logging.getLogger(__name__)


class SqliteStore(SqlStore):
    backend = "sqlite"

    def __init__(self, path: Path, config: RegistryConfig) -> None:
        super().__init__(config)
        self.path = Path(path)
        _create_private(self.path)
        self._pool: ConnectionPool[sqlite3.Connection] = ConnectionPool(self._connect, _close)
        self._enter_wal()
        self._create_schema()
        logger.info("voice registry: SQLite %s (WAL, synchronous=%s)", self.path, config.registry_sqlite_synchronous)

    def _connect(self) -> sqlite3.Connection:
        try:
            # isolation_level=None: no implicit transactions; every one is an explicit BEGIN … COMMIT here.
            # check_same_thread=False: the pool hands a connection to one thread at a time, not always the same.
            conn = sqlite3.connect(
                self.path,
                timeout=self.config.registry_busy_timeout_ms / 1000,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:  # no such folder, no permission
            raise RegistryUnavailable(f"cannot open the voice registry {self.path}: {exc}") from exc
        try:
            conn.execute(f"PRAGMA synchronous = {self.config.registry_sqlite_synchronous.upper()}")
            conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.Error as exc:
            conn.close()
            if isinstance(exc, sqlite3.OperationalError):  # locked, I/O error
                raise RegistryUnavailable(f"cannot open the voice registry {self.path}: {exc}") from exc
            raise ConfigError(f"registry {self.path} is not a SQLite database ({exc}); name a new file") from exc
        return conn

    def _enter_wal(self) -> None:
        """Switch the file to WAL (persistent, so only the first open changes it). Changing the journal
        mode needs the file to itself and does not wait on the busy handler, so retry for the busy timeout
        when another process is opening it at the same moment."""
        deadline = time.monotonic() + self.config.registry_busy_timeout_ms / 1000
        while True:
            try:
                with self._pool.connection() as conn:
                    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise RegistryUnavailable(f"cannot switch the voice registry {self.path} to WAL: {exc}") from exc
                time.sleep(0.05)
        if mode.lower() != "wal":
            raise ConfigError(
                f"SQLite could not put the voice registry {self.path} in WAL mode (it reports {mode!r}); keep it "
                "on a local disk, or use PostgreSQL"
            )

    @contextmanager
    def _transaction(self, write: bool) -> Iterator[Cursor]:
        with self._pool.connection() as conn:
            try:
                # IMMEDIATE takes the write lock up front (waiting up to the busy timeout) instead of
                # failing at the first write when another writer got there first.
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                yield conn.cursor()
                conn.execute("COMMIT")
            except BaseException as exc:
                _rollback(conn)
                if isinstance(exc, sqlite3.Error):  # locked past the busy timeout, disk full, I/O error
                    raise RegistryUnavailable(f"voice registry {self.path}: {exc}") from exc
                raise

    def close(self) -> None:
        self._pool.close()


def _create_private(path: Path) -> None:
    """Create the registry file readable by its owner only (0600) when it does not exist yet: it keeps
    voice audio. SQLite creates its -wal and -shm files with the database's mode. An existing file keeps
    its mode; one that others can read is reported."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        return
    except FileExistsError:
        pass
    except OSError:  # no permission, read-only folder: the connection reports it with the path
        return
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        logger.warning(
            "the voice registry %s is readable by other users (mode %04o) and keeps voice audio: chmod 600 it",
            path,
            mode,
        )


def _rollback(conn: sqlite3.Connection) -> None:
    if not conn.in_transaction:
        return
    try:
        conn.execute("ROLLBACK")
    except sqlite3.Error:
        logger.exception("rollback failed; the connection is dropped and SQLite's journal undoes the transaction")


def _close(conn: sqlite3.Connection) -> None:
    try:
        conn.close()
    except sqlite3.Error:
        logger.exception("closing a registry connection failed")
