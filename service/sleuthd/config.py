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
import math
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


def _positive(config: Any, name: str) -> None:
    value = getattr(config, name)
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):  # also refuses NaN
        raise ConfigError(f"{name} must be more than 0, got {value!r}")


@dataclass(frozen=True)
class JudgeConfig:
    """Which LALM judge the server runs (sleuthd.lalm, docs/judge.md), and how its work is batched.

    Paths are strings: "" means unset; with neither judge_model nor judge_endpoint there is no judge."""

    judge_model: str = option(
        "", help="model folder of an in-process judge (Qwen2-Audio or Qwen2.5-Omni, as save_pretrained writes it)"
    )
    judge_endpoint: str = option(
        "", help="base URL of an OpenAI-compatible server (e.g. vLLM) serving the judge, e.g. http://gpu1:8000/v1"
    )
    judge_model_name: str = option("", help="the model name the endpoint serves (required with --judge-endpoint)")
    judge_calibration: str = option(
        "",
        help="JSON file of judge calibrations keyed by weights hash; one for other weights is refused. "
        "Default: uncalibrated (every verdict says so)",
    )
    judge_weights_sha256: str = option(
        "",
        help="remote judge only: SHA-256 of the served weights (`sleuthd models judge-hash DIR` on the model "
        "folder); required to use a calibration with a remote judge",
    )
    judge_device: Literal["auto", "cpu", "cuda"] = option("auto", help="where an in-process judge runs")
    judge_dtype: Literal["auto", "float32", "bfloat16", "float16"] = option(
        "auto", help="in-process weights' precision; auto = bfloat16 on GPUs that have it, else float16; float32 on CPU"
    )
    judge_max_batch_tokens: int = option(
        16384, help="in-process: padded prompt tokens per model call (batch size × longest prompt)"
    )
    judge_max_batch_prompts: int = option(32, help="in-process: prompts per model call")
    judge_max_wait_ms: float = option(
        10.0, help="in-process: longest wait of the oldest queued prompt before its batch runs, milliseconds"
    )
    judge_max_queue_prompts: int = option(
        512, help="prompts allowed to wait (in-process queue, or remote requests waiting for a connection slot)"
    )
    judge_encoder_cache_entries: int = option(
        64, help="in-process: audio-encoder outputs of recent clips kept (references recur in every prompt); 0 = off"
    )
    judge_max_context_clips: int = option(
        4, help="other turns of the speaker heard with each turn under test (the nearest in the dialogue)"
    )
    judge_orderings: int = option(
        0, help="discrimination: candidate orders asked per ranking (rotations); 0 = one per candidate"
    )
    judge_remote_max_clip_seconds: float = option(
        30.0,
        help="remote: the served model's audio window, seconds; longer clips are refused, never cut "
        "(Qwen2-Audio: 30; Qwen2.5-Omni: 300)",
    )
    judge_max_concurrent_requests: int = option(16, help="remote: HTTP requests in flight at once")
    judge_request_timeout_s: float = option(120.0, help="remote: longest wait for one answer, seconds")
    judge_top_logprobs: int = option(
        20, help="remote: first-token log-probabilities asked for (vLLM allows up to --max-logprobs, default 20)"
    )
    judge_max_stream_audio_mb: float = option(
        256.0,
        help="method lalm: decoded audio of a stream's finished turns kept for the judge (it hears them again as "
        "context), MiB (16 kHz float32: 3.7 MiB per minute); a stream over it gets RESOURCE_EXHAUSTED",
    )

    def __post_init__(self) -> None:
        if self.judge_model and self.judge_endpoint:
            raise ConfigError("judge_model and judge_endpoint exclude each other: run the judge here or remotely")
        if self.judge_endpoint and not self.judge_model_name:
            raise ConfigError("judge_endpoint needs judge_model_name: the model name the endpoint serves")
        if self.judge_weights_sha256 and not self.judge_endpoint:
            raise ConfigError("judge_weights_sha256 is for a remote judge; an in-process judge hashes its own folder")
        if self.judge_weights_sha256 and len(self.judge_weights_sha256) != 64:
            raise ConfigError(f"judge_weights_sha256 must be 64 hex digits, got {self.judge_weights_sha256!r}")
        for name, low in (
            ("judge_max_batch_tokens", 1),
            ("judge_max_batch_prompts", 1),
            ("judge_max_wait_ms", 0),
            ("judge_max_queue_prompts", 1),
            ("judge_encoder_cache_entries", 0),
            ("judge_max_context_clips", 0),
            ("judge_orderings", 0),
            ("judge_remote_max_clip_seconds", 0.1),
            ("judge_max_concurrent_requests", 1),
            ("judge_request_timeout_s", 1e-3),
            ("judge_top_logprobs", 1),
            ("judge_max_stream_audio_mb", 1e-3),
        ):
            value = getattr(self, name)
            if not value >= low:  # also refuses NaN
                raise ConfigError(f"{name} must be at least {low:g}, got {value}")
        if self.judge_top_logprobs > 20:
            raise ConfigError(f"judge_top_logprobs must be at most 20 (OpenAI's limit), got {self.judge_top_logprobs}")

    @property
    def enabled(self) -> bool:
        return bool(self.judge_model or self.judge_endpoint)

    @property
    def max_stream_audio_bytes(self) -> int:
        return int(self.judge_max_stream_audio_mb * 1024 * 1024)


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
    max_stream_buffer_mb: float = option(
        64.0, help="audio of a stream's unfinished turns held at once, MiB; finish turns to free it"
    )
    voice_registry: RegistryConfig = option(  # noqa: RUF009
        factory=RegistryConfig, help="voice registry (RegisterVoice, voice ids in place of reference audio)"
    )
    judge: JudgeConfig = option(factory=JudgeConfig, help="the LALM judge (method lalm)")  # noqa: RUF009

    def __post_init__(self) -> None:
        for name in ("max_clip_seconds", "max_turns", "max_candidates", "max_context", "max_stream_buffer_mb"):
            _at_least(self, name, 1e-9)
        _at_least(self, "workers", 0)
        _at_least(self, "embedding_cache_entries", 0)

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
        help="largest request accepted, MiB (INVALID_ARGUMENT above it; gRPC refuses twice that unread)",
    )
    shutdown_grace_seconds: float = option(
        10.0,
        help="on SIGTERM, health says NOT_SERVING and new RPCs get UNAVAILABLE while in-flight RPCs (streams "
        "included) get this long to finish; then the rest are cancelled",
    )
    metrics_port: int = option(
        9464, help="HTTP port for /metrics, /healthz and /readyz; 0 = any free port, -1 = off"
    )
    metrics_host: str = option("127.0.0.1", help="interface for the metrics HTTP port")
    metrics_auth: Literal["token", "open"] = option(
        "token", help="with auth_token_file: /metrics needs the bearer token (token) or not (open); "
        "/healthz and /readyz are always open"
    )
    tls_cert: str = option("", help="PEM certificate chain; with tls_key the server speaks only TLS")
    tls_key: str = option("", help="PEM private key of tls_cert")
    tls_client_ca: str = option("", help="PEM CA bundle: clients must present a certificate it signed (mutual TLS)")
    auth_token_file: str = option(
        "",
        help="file of accepted bearer tokens, one per line (# comments); RPCs without `authorization: Bearer "
        "<token>` get UNAUTHENTICATED; gRPC health stays open",
    )
    reflection: Literal["on", "off"] = option(
        "on", help="gRPC reflection for grpcurl (needs the token when auth is on)"
    )
    log_format: Literal["text", "json"] = option(
        "text", help="log lines as text or as one JSON object each; every RPC gets a request id and an access-log line"
    )

    def __post_init__(self) -> None:
        _at_least(self, "max_message_mb", 1e-6)
        _at_least(self, "shutdown_grace_seconds", 0)
        if not -1 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port must be -1 (off), 0 (any) or a port number, got {self.metrics_port}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_cert and tls_key go together: set both (TLS) or neither (plaintext)")
        if self.tls_client_ca and not self.tls_cert:
            raise ConfigError("tls_client_ca (mutual TLS) needs tls_cert and tls_key too")

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)

    @property
    def max_message_bytes(self) -> int:
        return int(self.max_message_mb * 1024 * 1024)


@dataclass(frozen=True)
class ConnectConfig:
    """How a client reaches a server (`sleuthd health`; sleuthd.credentials builds the channel from it)."""

    target: str = option("127.0.0.1:50051", help="server host:port")
    tls: Literal["off", "on"] = option(
        "off", help="on: TLS with gRPC's bundled roots; any tls_* file below turns TLS on as well"
    )
    tls_root_ca: str = option("", help="PEM CA bundle to verify the server's certificate with")
    tls_client_cert: str = option("", help="PEM client certificate, for servers that require mutual TLS")
    tls_client_key: str = option("", help="PEM private key of tls_client_cert")
    tls_server_name: str = option("", help="name to expect in the server's certificate instead of the target host")
    auth_token_file: str = option("", help="file whose first token line is sent as `authorization: Bearer <token>`")
    timeout_seconds: float = option(5.0, help="how long to wait for the server's answer, seconds")

    def __post_init__(self) -> None:
        _at_least(self, "timeout_seconds", 1e-3)
        if bool(self.tls_client_cert) != bool(self.tls_client_key):
            raise ConfigError("tls_client_cert and tls_client_key go together: set both or neither")

    @property
    def use_tls(self) -> bool:
        return self.tls == "on" or bool(self.tls_root_ca or self.tls_client_cert or self.tls_server_name)


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
