"""A small pool of database connections shared by the store's threads (SQLite and PostgreSQL alike)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from sleuthd.errors import InvalidRequest
from sleuthd.registry.store import RegistryUnavailable

C = TypeVar("C")


class ConnectionPool(Generic[C]):
    """Connections kept for reuse, one per thread at a time, made on demand. A connection whose use
    raised anything but a request error (InvalidRequest) may be broken and is closed, not reused."""

    def __init__(self, connect: Callable[[], C], close: Callable[[C], None]) -> None:
        self._connect = connect
        self._close = close
        self._idle: list[C] = []
        self._lock = threading.Lock()
        self._closed = False

    @contextmanager
    def connection(self) -> Iterator[C]:
        with self._lock:
            if self._closed:
                raise RegistryUnavailable("the voice registry is closed")
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self._connect()
        keep = False
        try:
            yield conn
            keep = True
        except InvalidRequest:
            keep = True
            raise
        finally:
            with self._lock:
                keep = keep and not self._closed
                if keep:
                    self._idle.append(conn)
            if not keep:
                self._close(conn)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            self._close(conn)
