"""A bounded LRU cache of clip embeddings keyed by the audio's bytes.

TTS regeneration loops re-send the same context turns many times while one turn changes, and a
benchmark replay sends each clip once per scenario and method: the cache turns those repeats into
a hash lookup. The key covers everything that determines the result (encoder file, audio bytes and
PCM layout), so a hit returns exactly what a fresh computation would.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

V = TypeVar("V")


def audio_key(encoder_sha256: str, digest: str) -> str:
    """The cache key of a clip's embedding by one encoder: the encoder file's hash and the clip's digest
    (AudioInput.digest: its bytes and PCM layout)."""
    return f"{encoder_sha256}:{digest}"


class LruCache(Generic[V]):
    """Thread-safe LRU map with a fixed number of entries; 0 entries disables it."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._items: OrderedDict[str, V] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> V | None:
        with self._lock:
            value = self._items.get(key)
            if value is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return value

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is held now (a look that neither counts as a hit or miss nor refreshes it)."""
        with self._lock:
            return key in self._items

    def put(self, key: str, value: V) -> None:
        if self.max_entries <= 0:
            return
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)
