"""The voice registry: voices enrolled once, kept durably, and used by id.

``open_store(RegistryConfig(registry=...))`` returns a :class:`VoiceStore` (SQLite for a file path,
PostgreSQL for a ``postgresql://`` URL, None when the option is empty); an asyncio server wraps it in
:class:`AsyncVoiceStore`. ``RegistryConfig`` lives in :mod:`sleuthd.config` with every other option
(re-exported here); the engine's side, enrolment and voice ids as references, is
:mod:`sleuthd.registry.voices`. See docs/registry.md.
"""

from sleuthd.config import RegistryConfig
from sleuthd.registry.model import ClipInput, Embedding, StoredClip, Voice, VoicePage
from sleuthd.registry.open import open_store
from sleuthd.registry.store import AsyncVoiceStore, RegistryUnavailable, VoiceStore

__all__ = [
    "AsyncVoiceStore",
    "ClipInput",
    "Embedding",
    "RegistryConfig",
    "RegistryUnavailable",
    "StoredClip",
    "Voice",
    "VoicePage",
    "VoiceStore",
    "open_store",
]
