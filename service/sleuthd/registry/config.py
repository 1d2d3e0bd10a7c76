"""The voice registry's options, written once (the lead moves this dataclass into sleuthd.config).

Every field is an :func:`sleuthd.config.option`, so ``sleuthd.config.add_cli_args`` turns it into a flag
(``--registry``, ``--registry-max-voices``, ...) with a ``SLEUTHD_REGISTRY_*`` environment default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from sleuthd.config import ConfigError, option


@dataclass(frozen=True)
class RegistryConfig:
    """Where registered voices live and how large a registration may be."""

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
        for name in ("registry_max_voices", "registry_max_clips_per_voice", "registry_max_metadata_entries"):
            _positive(self, name)
        for name in ("registry_max_clip_mb", "registry_max_voice_mb", "registry_max_clip_seconds"):
            _positive(self, name)
        for name in ("registry_max_metadata_bytes", "registry_busy_timeout_ms", "registry_connect_timeout_s"):
            _positive(self, name)
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


def _positive(config: RegistryConfig, name: str) -> None:
    value = getattr(config, name)
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):  # also refuses NaN
        raise ConfigError(f"{name} must be more than 0, got {value!r}")
