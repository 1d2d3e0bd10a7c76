"""The voice registry: voices enrolled once, kept durably, and used by id.

``open_store(RegistryConfig(registry=...))`` returns a :class:`VoiceStore` (SQLite for a file path,
PostgreSQL for a ``postgresql://`` URL, None when the option is empty); an asyncio server wraps it in
:class:`AsyncVoiceStore`. See docs/registry.md.
"""

from sleuthd.registry.config import RegistryConfig
from sleuthd.registry.model import ClipInput, Embedding, StoredClip, Voice, VoicePage
from sleuthd.registry.store import AsyncVoiceStore, RegistryUnavailable, VoiceStore, open_store

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
