"""Where encoders run: in this process (ONNX Runtime) or on an NVIDIA Triton server (sleuthd.encoders.triton)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sleuthd.config.base import ConfigError, _at_least, option


@dataclass(frozen=True)
class EncoderBackendConfig:
    """The encoder backend (docs/deploy.md, "Scaling out").

    ``onnx``: every process runs its own ONNX Runtime sessions behind its micro-batcher. ``triton``: the
    windows go to a Triton Inference Server over gRPC, one model per encoder named as its manifest, whose
    dynamic batcher merges the windows of every replica; ``sleuthd models triton-repo`` writes its repository.
    """

    encoder_backend: Literal["onnx", "triton"] = option(
        "onnx", help="where encoders run: onnx = in this process; triton = on the Triton server at --triton-url"
    )
    triton_url: str = option(
        "",
        help="Triton's gRPC endpoint, HOST:PORT (e.g. triton.sleuthd.svc:8001); required with --encoder-backend triton",
    )
    triton_model_prefix: str = option(
        "", help="prefix of the encoders' model names on Triton (the repository's models are named PREFIX + encoder)"
    )
    triton_connect_timeout_s: float = option(
        10.0,
        help="at start, how long to wait for Triton to answer before serving anyway with those encoders' health "
        "NOT_SERVING (they recover when Triton answers), seconds",
    )
    triton_probe_interval_s: float = option(
        2.0, help="while Triton is unreachable, how often its readiness is asked again, seconds"
    )
    triton_call_timeout_s: float = option(
        30.0, help="longest wait for one Triton call when the RPC has no deadline of its own, seconds"
    )

    def __post_init__(self) -> None:
        if self.encoder_backend == "triton" and not self.triton_url:
            raise ConfigError("encoder_backend triton needs triton_url: Triton's gRPC HOST:PORT (e.g. 127.0.0.1:8001)")
        if self.triton_url and (":" not in self.triton_url or self.triton_url.startswith(("http://", "https://"))):
            raise ConfigError(
                f"triton_url must be HOST:PORT of Triton's gRPC port (8001 by default), got {self.triton_url!r}"
            )
        for name in ("triton_connect_timeout_s", "triton_probe_interval_s", "triton_call_timeout_s"):
            _at_least(self, name, 1e-3)
