"""Every server and engine option, written once.

Each option is a field of a frozen dataclass, with its default and its help text. :func:`add_cli_args`
makes the command-line flags from those fields and :func:`from_cli_args` builds the dataclass back from
the parsed arguments (the pattern of vLLM's ``EngineArgs``), so a default is never repeated in the CLI.
Every flag's default can also come from the environment: ``SLEUTHD_<FIELD>``, e.g.
``SLEUTHD_MAX_WAIT_MS=2`` or ``SLEUTHD_MODELS_DIR=/srv/models``; an explicit flag wins.

Only the standard library is imported here: the client and the tools read these defaults too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sleuthd.config.admission import AdmissionConfig
from sleuthd.config.base import (
    DEFAULT_TARGET,
    ENV_PREFIX,
    ConfigError,
    _at_least,
    add_cli_args,
    default_models_dir,
    from_cli_args,
    option,
)
from sleuthd.config.judge import JudgeConfig
from sleuthd.config.registry import RegistryConfig
from sleuthd.config.triton import EncoderBackendConfig

__all__ = [
    "DEFAULT_TARGET",
    "ENV_PREFIX",
    "PITCH_CEILING_OCTAVES",
    "AdmissionConfig",
    "BatcherConfig",
    "ConfigError",
    "ConnectConfig",
    "EncoderBackendConfig",
    "EngineConfig",
    "JudgeConfig",
    "RegistryConfig",
    "ServerConfig",
    "add_cli_args",
    "default_models_dir",
    "from_cli_args",
    "option",
]

# Pitch matching never moves a turn this far or farther from its speaker (sleuthd.judgment.pitch_matching): a jump of
# about an octave is another gender's voice. Here, so that the option's bound and the rule share one number.
PITCH_CEILING_OCTAVES = 0.5


@dataclass(frozen=True)
class BatcherConfig:
    """How encoder windows of concurrent requests are grouped into model calls (sleuthd.encoders.batcher)."""

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
    gpu_light_windows: int = option(
        16,
        help="on the CUDA provider, where every model call is padded to one shape: a call of at most this many "
        "windows (one client, a streamed turn) is padded to this many on a second session of the encoder, not to "
        "max_batch_windows; 0 (or not under max_batch_windows) = one shape",
    )

    def __post_init__(self) -> None:
        _at_least(self, "max_batch_windows", 1)
        _at_least(self, "gpu_light_windows", 0)
        _at_least(self, "max_wait_ms", 0)
        _at_least(self, "max_queue_windows", 1)
        _at_least(self, "max_concurrent_batches", 1)


@dataclass(frozen=True)
class EngineConfig:
    """What the engine loads and the limits it enforces on every request."""

    models_dir: Path = option(factory=default_models_dir, help="folder of model manifests")  # noqa: RUF009
    default_encoder: str = option(
        "auto",
        help="encoder used when a request names none; auto = fused when GE2E and CAM++ are both loaded, else ge2e",
        flag="encoder",
    )
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
    backend: EncoderBackendConfig = option(  # noqa: RUF009
        factory=EncoderBackendConfig, help="in-process ONNX Runtime or a Triton server (sleuthd.encoders.triton)"
    )
    workers: int = option(0, help="threads for decoding and silence detection; 0 = the CPU count")
    intra_op_threads: int = option(
        0, help="threads inside one model call (ONNX Runtime intra-op, per encoder session); 0 = the CPU count"
    )
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
    band_match_octaves: float = option(
        0.3,
        help="under the fused encoder's auto, a speaker whose turns (and reference clip) span more than this many "
        "octaves of bandwidth (a low-bitrate or telephone turn among full-band ones) is judged on copies of every "
        "clip low-passed at 3.6 kHz, so the channel is not read as another voice; 0 = off",
    )
    clip_match_spread: float = option(
        0.005,
        help="under the fused encoder's auto, a speaker whose turns (and reference clip) differ by more than this "
        "in plateau fraction (the share of a clip's samples at its peak: ~0 unclipped) is judged on copies of "
        "every clip clipped as hard as its most-clipped one, so clipping is not read as another voice; 0 = off",
    )
    noise_match_db: float = option(
        3.0,
        help="under the fused encoder's auto, a speaker matched neither by band nor by clipping whose turns (and "
        "reference clip) differ by more than this in estimated SNR (dB; 20 and cleaner count as clean) is judged on "
        "copies of every clip with its noisiest clip's own noise added until each is as noisy; 0 = off",
    )
    noise_compose_db: float = option(
        6.0,
        help="under the fused encoder's auto, a speaker matched by band or by clipping whose turns (and reference "
        "clip) also differ by more than this in estimated SNR (dB) has its noisiest clip's noise added to those "
        "copies too (a channel that drifts from turn to turn); 0 = never",
    )
    telephone_band_db: float = option(
        -20.0,
        help="under the fused encoder's auto, a clip whose power at 60-250 Hz is more than this many dB under its "
        "power at 300-3400 Hz counts as a telephone clip; a band-matched speaker with one among clips that kept "
        "their low band is compared on copies band-passed at 0.3-3.6 kHz; 0 = never",
    )
    pitch_match_octaves: float = option(
        0.25,
        help="under the fused encoder's auto with channel matching on, a speaker with a flagged turn whose median "
        f"pitch lies this many octaves or more (and under {PITCH_CEILING_OCTAVES:g}) from the speaker's other clips is "
        "judged again with that turn moved to their pitch, spectral envelope with it, so a resampling pitch control "
        "(or audio played at the wrong rate) is not read as another voice; it only clears turns, and only where the "
        "moved copy comes back to the speaker's own CAM++ level. 0.25 leaves the dev benchmark's sox-variant similar "
        "speakers (150-300 cents) flagged; 0 = off",
    )
    length_match_ratio: float = option(
        0.5,
        help="under the fused encoder's auto with channel matching on, a speaker judged on its clips as sent with a "
        "flagged turn whose speech is under this share of the median of the speaker's other clips is judged again "
        "for that turn against copies of those clips cut to its length, so a short turn is not read as another voice "
        "for being short; it only clears turns, and only where the turn is then clearly consistent (probability "
        "under 0.2) and within pitch matching's CAM++ guard; a speaker of more than 50 clips is left alone; 0 = off",
    )
    band_match_stream_mb: float = option(
        128.0,
        help="channel matching: a stream keeps its turns' audio until this many MiB, so that a speaker who becomes "
        "mixed later can be compared on copies; past it, each later turn's narrowband copy is embedded as it "
        "arrives instead (one more encoder pass per turn, no more memory) and a speaker whose clipping target "
        "moves afterwards is compared without clip matching",
    )
    band_match_kept_mb: float = option(
        512.0,
        help="channel matching: the turn audio all streams together may keep, MiB (passive memory, apart from the "
        "decoding budget); a stream that finds it full keeps no more, as past --band-match-stream-mb",
    )
    voice_registry: RegistryConfig = option(  # noqa: RUF009
        factory=RegistryConfig, help="voice registry (RegisterVoice, voice ids in place of reference audio)"
    )
    judge: JudgeConfig = option(factory=JudgeConfig, help="the LALM judge (method lalm)")  # noqa: RUF009
    admission: AdmissionConfig = option(factory=AdmissionConfig, help="overload and abuse bounds")  # noqa: RUF009

    def __post_init__(self) -> None:
        for name in ("max_clip_seconds", "max_turns", "max_candidates", "max_context", "max_stream_buffer_mb"):
            _at_least(self, name, 1e-9)
        _at_least(self, "max_references", 0)
        _at_least(self, "band_match_octaves", 0)
        _at_least(self, "clip_match_spread", 0)
        _at_least(self, "noise_match_db", 0)
        _at_least(self, "noise_compose_db", 0)
        if not self.telephone_band_db <= 0:  # also refuses NaN
            raise ConfigError(f"telephone_band_db must be 0 (off) or negative (dB), got {self.telephone_band_db}")
        if not 0 <= self.pitch_match_octaves < PITCH_CEILING_OCTAVES:  # also refuses NaN
            raise ConfigError(
                f"pitch_match_octaves must be 0 (off) or under {PITCH_CEILING_OCTAVES:g} octave (a larger jump is "
                f"never moved), got {self.pitch_match_octaves}"
            )
        if not 0 <= self.length_match_ratio < 1:  # also refuses NaN
            raise ConfigError(
                f"length_match_ratio must be 0 (off) or a share under 1 of the speaker's median speech, "
                f"got {self.length_match_ratio}"
            )
        _at_least(self, "band_match_stream_mb", 0)
        _at_least(self, "band_match_kept_mb", 0)
        _at_least(self, "workers", 0)
        _at_least(self, "intra_op_threads", 0)
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

    @property
    def band_match_stream_bytes(self) -> int:
        return int(self.band_match_stream_mb * 1024 * 1024)

    @property
    def band_match_kept_bytes(self) -> int:
        return int(self.band_match_kept_mb * 1024 * 1024)


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
        10.0,
        help="on SIGTERM, health says NOT_SERVING and new RPCs get UNAVAILABLE while in-flight RPCs (streams "
        "included) get this long to finish; then the rest are cancelled",
    )
    metrics_port: int = option(9464, help="HTTP port for /metrics, /healthz and /readyz; 0 = any free port, -1 = off")
    metrics_host: str = option("127.0.0.1", help="interface for the metrics HTTP port")
    metrics_auth: Literal["token", "open"] = option(
        "token",
        help="with auth_token_file: /metrics needs the bearer token (token) or not (open); "
        "/healthz and /readyz are always open",
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
    max_streams_per_connection: int = option(
        100, help="concurrent calls one client connection may have open (HTTP/2 max concurrent streams)"
    )
    keepalive_seconds: float = option(
        60.0, help="ping a client connection after this long without traffic, to find peers that vanished"
    )
    keepalive_timeout_seconds: float = option(
        20.0, help="close the connection (and cancel its calls) when a ping is not answered within this long"
    )
    max_connection_age_seconds: float = option(
        300.0,
        help="ask each client connection to close (GOAWAY) this long after it opened; its calls finish first "
        "(up to max_connection_age_grace_seconds) and new ones reconnect, so clients balancing over a DNS name "
        "re-resolve it and reach replicas added since (Kubernetes autoscaling); 0 = never",
    )
    max_connection_age_grace_seconds: float = option(
        3600.0, help="how long calls on a connection past its age may still run (longer than the longest stream)"
    )
    intake_niceness: int = option(
        10,
        help="`sleuthd serve` runs the thread that reads, admits and refuses requests this much below the "
        "threads that decode and run the models (nice value, Linux), so that under overload finishing admitted "
        "work comes first; matters only while threads compete for cores; 0 = the same priority",
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
        _at_least(self, "max_connection_age_seconds", 0)
        _at_least(self, "max_connection_age_grace_seconds", 0)
        if not 0 <= self.intake_niceness <= 19:
            raise ConfigError(f"intake_niceness must be 0 to 19 (nice values), got {self.intake_niceness}")
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

    @property
    def transport_limit_bytes(self) -> int:
        """What gRPC itself accepts: a little over max_message_bytes, so a request slightly too large is read
        (never parsed) and answered with advice, while one far too large is refused before it is read."""
        return self.max_message_bytes + max(64 * 1024, self.max_message_bytes // 8)


@dataclass(frozen=True)
class ConnectConfig:
    """How a client reaches a server: `sleuthd check`, `rank`, `health` and `voices` take these flags, and
    sleuthd.client.channels.Dialer builds the channel from them."""

    target: str = option(
        DEFAULT_TARGET, help="server host:port, or several replicas (dns:///name:port, ipv4:a:port,b:port)"
    )
    tls: Literal["off", "on"] = option(
        "off", help="on: TLS with gRPC's bundled roots; any tls_* file below turns TLS on as well"
    )
    tls_root_ca: str = option("", help="PEM CA bundle to verify the server's certificate with")
    tls_client_cert: str = option("", help="PEM client certificate, for servers that require mutual TLS")
    tls_client_key: str = option("", help="PEM private key of tls_client_cert")
    tls_server_name: str = option("", help="name to expect in the server's certificate instead of the target host")
    auth_token_file: str = option("", help="file whose first token line is sent as `authorization: Bearer <token>`")

    def __post_init__(self) -> None:
        if bool(self.tls_client_cert) != bool(self.tls_client_key):
            raise ConfigError("tls_client_cert and tls_client_key go together: set both or neither")

    @property
    def use_tls(self) -> bool:
        return self.tls == "on" or bool(self.tls_root_ca or self.tls_client_cert or self.tls_server_name)
