"""The voice registry's options (sleuthd.registry): where it lives, what it keeps, its bounds."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from sleuthd.config.base import ConfigError, _positive, option


@dataclass(frozen=True)
class RegistryConfig:
    """Where registered voices live and how large a registration may be (sleuthd.registry, docs/registry.md)."""

    registry: str = option(
        "",
        help="voice registry: a SQLite file path (a directory gets registry.sqlite3 inside it), or a "
        "postgresql://user@host/db URL shared by replicas; empty = no registry (voice ids are refused)",
    )
    registry_keep_audio: Literal["on", "off"] = option(
        "on",
        help="on: keep each registered clip's bytes so voices can be re-embedded when an encoder's weights "
        "change; off: keep only hashes and embeddings (a voice must then be re-registered with its clips)",
    )
    registry_max_voices: int = option(100_000, help="voices the registry may hold; registering more is refused")
    registry_max_total_mb: float = option(
        1024.0,
        help="clip audio the registry keeps in all (clips as sent, of voices registered with their audio "
        "kept), MiB; a registration that would pass it is refused with FAILED_PRECONDITION (delete voices first)",
    )
    registry_max_clips_per_voice: int = option(32, help="clips per registered voice")
    registry_max_clip_mb: float = option(16.0, help="largest registered clip as sent (encoded or PCM), MiB")
    registry_max_voice_mb: float = option(64.0, help="all clips of one voice together as sent, MiB")
    registry_max_clip_seconds: float = option(120.0, help="longest registered clip after decoding, seconds")
    registry_max_metadata_entries: int = option(32, help="metadata keys per voice")
    registry_max_metadata_bytes: int = option(4096, help="metadata keys and values together, UTF-8 bytes")
    registry_busy_timeout_ms: int = option(
        10_000, help="how long a write waits for another writer's lock (SQLite busy timeout), milliseconds"
    )
    registry_sqlite_synchronous: Literal["full", "normal"] = option(
        "full",
        help="SQLite fsync policy: full = a registration acknowledged survives power loss; normal = it survives "
        "a crash of sleuthd (kill -9) but the last ones may be lost on power loss, for fewer fsyncs",
    )
    registry_connect_timeout_s: float = option(10.0, help="PostgreSQL connection timeout, seconds")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if f.name.startswith(("registry_max_", "registry_busy_", "registry_connect_")):
                _positive(self, f.name)
        if self.registry_max_voice_mb < self.registry_max_clip_mb:
            raise ConfigError(
                f"registry_max_voice_mb ({self.registry_max_voice_mb}) must be at least registry_max_clip_mb "
                f"({self.registry_max_clip_mb}): one clip has to fit in a voice"
            )

    @property
    def keep_audio(self) -> bool:
        return self.registry_keep_audio == "on"

    @property
    def max_clip_bytes(self) -> int:
        return int(self.registry_max_clip_mb * 1024 * 1024)

    @property
    def max_voice_bytes(self) -> int:
        return int(self.registry_max_voice_mb * 1024 * 1024)

    @property
    def max_total_bytes(self) -> int:
        return int(self.registry_max_total_mb * 1024 * 1024)
