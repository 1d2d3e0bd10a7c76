"""Every server and engine option, written once.

Each option is a field of a frozen dataclass, with its default and its help text. :func:`add_cli_args`
makes the command-line flags from those fields and :func:`from_cli_args` builds the dataclass back from
the parsed arguments (the pattern of vLLM's ``EngineArgs``), so a default is never repeated in the CLI.
Every flag's default can also come from the environment: ``SLEUTHD_<FIELD>``, e.g.
``SLEUTHD_MAX_WAIT_MS=2`` or ``SLEUTHD_MODELS_DIR=/srv/models``; an explicit flag wins.

Only the standard library is imported here: the client and the tools read these defaults too.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

# Every encoder and the VAD run at this rate; audio is resampled to it on arrival.
SAMPLE_RATE = 16_000

ENV_PREFIX = "SLEUTHD_"


class ConfigError(ValueError):
    """An option has a value that cannot work; the message names the option and what it accepts."""


def option(default: Any = dataclasses.MISSING, *, help: str, factory: Any = None, flag: str = "") -> Any:
    """A config field: ``help`` becomes the flag's help text; ``flag`` overrides its name."""
    meta = {"help": help, "flag": flag}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def default_models_dir() -> Path:
    """$SLEUTHD_MODELS_DIR, else the repository's models/ when running from a checkout, else ./models."""
    if ENV_PREFIX + "MODELS_DIR" in os.environ:
        return Path(os.environ[ENV_PREFIX + "MODELS_DIR"])
    checkout = Path(__file__).resolve().parents[2] / "models"
    return checkout if checkout.is_dir() else Path("models")


@dataclass(frozen=True)
class BatcherConfig:
    """How encoder windows of concurrent requests are grouped into model calls (sleuthd.batcher)."""

    max_batch_windows: int = option(
        64,
        help="encoder windows per model call; a request with more is split across calls, never refused",
    )
    max_wait_ms: float = option(
        5.0, help="longest wait of the oldest queued request before its batch runs, milliseconds"
    )
    max_queue_windows: int = option(
        4096, help="windows allowed to wait; a request that would go over gets RESOURCE_EXHAUSTED at once"
    )
    max_concurrent_batches: int = option(
        1, help="model calls in flight at once (1 on a few CPU cores; 2 on a GPU overlaps copy and compute)"
    )

    def __post_init__(self) -> None:
        _at_least(self, "max_batch_windows", 1)
        _at_least(self, "max_wait_ms", 0)
        _at_least(self, "max_queue_windows", 1)
        _at_least(self, "max_concurrent_batches", 1)


@dataclass(frozen=True)
class AdmissionConfig:
    """Bounds that keep the process's memory and queues finite under overload and abuse (sleuthd.admission).

    Refusals here mean "busy, retry later" (RESOURCE_EXHAUSTED), except the stream timeouts, which end
    one stream that broke a per-stream bound.
    """

    max_audio_in_flight_mb: float = option(
        64.0,
        help="request audio held at once across all RPCs (being decoded and scored, or buffered by streams), "
        "MiB; a request that would go over is refused at once with RESOURCE_EXHAUSTED, before any decoding",
    )
    max_queued_decodes: int = option(
        2048,
        help="clips waiting for a decode thread; a clip beyond it fails its request at once with RESOURCE_EXHAUSTED "
        "(at least max-turns + max-references, so one request of the largest size always fits)",
    )
    max_streams: int = option(64, help="StreamDialogue calls open at once; the next gets RESOURCE_EXHAUSTED")
    stream_idle_seconds: float = option(
        60.0, help="a stream that sends no message for this long is ended (with turns open or not), seconds"
    )
    stream_lifetime_seconds: float = option(3600.0, help="longest a stream may stay open, seconds")
    stream_message_overhead_bytes: int = option(
        1024,
        help="bytes counted for every audio message on top of its data, against the stream's buffer bound and "
        "the audio in flight (so empty or tiny chunks are not free)",
    )

    def __post_init__(self) -> None:
        for name in ("max_audio_in_flight_mb", "stream_idle_seconds", "stream_lifetime_seconds"):
            _at_least(self, name, 1e-9)
        _at_least(self, "max_queued_decodes", 1)
        _at_least(self, "max_streams", 1)
        _at_least(self, "stream_message_overhead_bytes", 0)

    @property
    def max_audio_in_flight_bytes(self) -> int:
        return int(self.max_audio_in_flight_mb * 1024 * 1024)


@dataclass(frozen=True)
class EngineConfig:
    """What the engine loads and the limits it enforces on every request."""

    models_dir: Path = option(factory=default_models_dir, help="folder of model manifests")  # noqa: RUF009
    default_encoder: str = option("ge2e", help="encoder used when a request names none", flag="encoder")
    device: Literal["auto", "cpu", "cuda"] = option(
        "auto", help="where encoders run; auto = the CUDA execution provider when onnxruntime-gpu has it"
    )
    vad: Literal["energy", "silero"] = option(
        "energy",
        help="speech detection for silence trimming: energy (fast, clean synthesized audio) or silero "
        "(robust to background noise, about 2.4 ms per audio second)",
    )
    batching: Literal["on", "off"] = option(
        "on",
        help="on: merge the windows of all concurrent requests into shared model calls; off: one model call "
        "per clip, nothing shared (a baseline for `sleuthd-bench throughput`)",
    )
    batcher: BatcherConfig = option(factory=BatcherConfig, help="micro-batcher knobs")  # noqa: RUF009
    workers: int = option(0, help="threads for decoding and silence detection; 0 = the CPU count")
    embedding_cache_entries: int = option(
        4096, help="clip embeddings remembered by audio hash (about 2 KB each); 0 = off"
    )
    max_clip_seconds: float = option(300.0, help="longest single clip accepted, seconds")
    max_turns: int = option(1000, help="turns per dialogue and per stream")
    max_candidates: int = option(64, help="candidates per RankCandidates request")
    max_context: int = option(256, help="context clips per RankCandidates request")
    max_references: int = option(256, help="speaker references per CheckDialogue request and per stream")
    max_stream_buffer_mb: float = option(
        64.0, help="audio of a stream's unfinished turns held at once, MiB; finish turns to free it"
    )
    admission: AdmissionConfig = option(factory=AdmissionConfig, help="overload and abuse bounds")  # noqa: RUF009

    def __post_init__(self) -> None:
        for name in ("max_clip_seconds", "max_turns", "max_candidates", "max_context", "max_stream_buffer_mb"):
            _at_least(self, name, 1e-9)
        _at_least(self, "max_references", 0)
        _at_least(self, "workers", 0)
        _at_least(self, "embedding_cache_entries", 0)
        largest = max(self.max_turns + self.max_references, self.max_candidates + self.max_context + 1)
        if self.admission.max_queued_decodes < largest:
            # Otherwise the largest request allowed would be refused as "busy" even on an idle server.
            raise ConfigError(
                f"max_queued_decodes must be at least {largest} (the clips of the largest request allowed by "
                "max_turns + max_references or max_candidates + max_context + 1), "
                f"got {self.admission.max_queued_decodes}"
            )

    @property
    def max_stream_buffer_bytes(self) -> int:
        return int(self.max_stream_buffer_mb * 1024 * 1024)


@dataclass(frozen=True)
class ServerConfig:
    """Where the gRPC server listens and what it accepts."""

    host: str = option("127.0.0.1", help="interface to bind")
    port: int = option(50051, help="port; 0 picks a free one and prints `sleuthd listening on HOST:PORT`")
    max_message_mb: float = option(
        64.0,
        help="largest request accepted, MiB (INVALID_ARGUMENT above it, refused before it is parsed; gRPC "
        "refuses a message over 1/8 more than this unread)",
    )
    shutdown_grace_seconds: float = option(
        10.0, help="on SIGTERM, how long in-flight RPCs may run before they are cancelled"
    )
    metrics_port: int = option(9464, help="Prometheus /metrics port; 0 = any free port, -1 = off")
    metrics_host: str = option("127.0.0.1", help="interface for /metrics")
    max_streams_per_connection: int = option(
        100, help="concurrent calls one client connection may have open (HTTP/2 max concurrent streams)"
    )
    keepalive_seconds: float = option(
        60.0, help="ping a client connection after this long without traffic, to find peers that vanished"
    )
    keepalive_timeout_seconds: float = option(
        20.0, help="close the connection (and cancel its calls) when a ping is not answered within this long"
    )
    min_client_ping_seconds: float = option(
        60.0,
        help="clients may ping at most this often while no data flows; a client that pings more often is "
        "disconnected (GOAWAY too_many_pings)",
    )

    def __post_init__(self) -> None:
        _at_least(self, "max_message_mb", 1e-6)
        _at_least(self, "shutdown_grace_seconds", 0)
        _at_least(self, "max_streams_per_connection", 1)
        for name in ("keepalive_seconds", "keepalive_timeout_seconds", "min_client_ping_seconds"):
            _at_least(self, name, 1e-3)
        if not -1 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port must be -1 (off), 0 (any) or a port number, got {self.metrics_port}")

    @property
    def max_message_bytes(self) -> int:
        return int(self.max_message_mb * 1024 * 1024)

    @property
    def transport_limit_bytes(self) -> int:
        """What gRPC itself accepts: a little over max_message_bytes, so a request slightly too large is read
        (never parsed) and answered with advice, while one far too large is refused before it is read."""
        return self.max_message_bytes + max(64 * 1024, self.max_message_bytes // 8)


def _at_least(config: Any, name: str, low: float) -> None:
    value = getattr(config, name)
    if not value >= low:  # also refuses NaN
        bound = "0 or more" if low == 0 else ("more than 0" if low < 1 else f"at least {low:g}")
        raise ConfigError(f"{name} must be {bound}, got {value}")


# ---------------------------------------------------------------------------------------------- CLI


def _flag(f: dataclasses.Field[Any]) -> str:
    return "--" + (f.metadata.get("flag") or f.name).replace("_", "-")


def _env_name(f: dataclasses.Field[Any]) -> str:
    return ENV_PREFIX + (f.metadata.get("flag") or f.name).upper()


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[operator]


def _parse(kind: Any, text: str, what: str) -> Any:
    """A string (from the environment) as the field's type."""
    origin = typing.get_origin(kind)
    if origin is Literal:
        choices = typing.get_args(kind)
        if text not in choices:
            raise ConfigError(f"{what}={text!r} is not one of: {', '.join(choices)}")
        return text
    try:
        return {int: int, float: float, str: str, Path: Path}[kind](text)
    except (KeyError, ValueError):
        raise ConfigError(f"{what}={text!r} is not a valid {getattr(kind, '__name__', kind)}") from None


def add_cli_args(parser: argparse.ArgumentParser, cls: type, env: Mapping[str, str] | None = None) -> None:
    """Add one flag per field of config dataclass ``cls`` (nested config dataclasses are flattened).

    Defaults come from ``SLEUTHD_<FIELD>`` in ``env`` (default: the process environment), else from
    the dataclass; the help text shows the default and the variable's name. A malformed environment
    value raises :class:`ConfigError` naming the variable.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            add_cli_args(parser, kind, environ)
            continue
        default = _default(f)
        if _env_name(f) in environ:
            default = _parse(kind, environ[_env_name(f)], _env_name(f))
        choices = typing.get_args(kind) if typing.get_origin(kind) is Literal else None
        parser.add_argument(
            _flag(f),
            dest=f.name,
            type=str if choices else kind,
            choices=choices,
            default=default,
            help=f"{f.metadata['help']} (default: {default}; env {_env_name(f)})",
        )


def from_cli_args(cls: type, args: argparse.Namespace) -> Any:
    """Build config dataclass ``cls`` from arguments parsed with :func:`add_cli_args`."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        nested = isinstance(kind, type) and dataclasses.is_dataclass(kind)
        values[f.name] = from_cli_args(kind, args) if nested else getattr(args, f.name)
    try:
        return cls(**values)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc
