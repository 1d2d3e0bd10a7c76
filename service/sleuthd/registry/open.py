"""Opening the voice store a ``--registry`` option names: the one place that knows every backend.

Kept apart from sleuthd.registry.store (the protocol and its asyncio wrapper), which the backends import:
choosing among the backends there would make each of them import the module that imports it.
"""

from __future__ import annotations

from pathlib import Path

from sleuthd.config import ConfigError, RegistryConfig
from sleuthd.registry.store import SQLITE_FILE, VoiceStore


def is_postgres_url(location: str) -> bool:
    return location.startswith(("postgresql://", "postgres://"))


def sqlite_path(location: str) -> Path:
    """The SQLite file a ``--registry`` path names: the path itself, or ``registry.sqlite3`` inside it
    when it is a directory. Its folder must exist (a typo should not create a new empty registry)."""
    path = Path(location.removeprefix("sqlite:")).expanduser()
    if path.is_dir() or location.endswith("/"):
        path = path / SQLITE_FILE
    if not path.parent.is_dir():
        raise ConfigError(f"registry {location!r}: folder {path.parent} does not exist; create it first")
    return path


def open_store(config: RegistryConfig) -> VoiceStore | None:
    """The store ``config.registry`` names: None when empty, PostgreSQL for a ``postgresql://`` URL,
    else a SQLite file. Creates the tables on first use; raises ConfigError for a location that cannot
    work and RegistryUnavailable when the database does not answer."""
    location = config.registry.strip()
    if not location:
        return None
    if is_postgres_url(location):
        from sleuthd.registry.postgres import PostgresStore  # psycopg is an optional extra

        return PostgresStore(location, config)
    if "://" in location:
        scheme = location.split("://", 1)[0]
        raise ConfigError(
            f"registry {location!r}: scheme {scheme!r} is not supported; give a SQLite file path or a postgresql:// URL"
        )
    from sleuthd.registry.sqlite import SqliteStore

    return SqliteStore(sqlite_path(location), config)
