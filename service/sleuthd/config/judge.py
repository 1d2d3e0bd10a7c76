"""The LALM judge's options (sleuthd.lalm): which model, where it runs, how prompts are batched."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sleuthd.config.base import ConfigError, option


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
    judge_min_answer_mass: float = option(
        -1.0,
        help="detection turns whose judge answer mass (0-1: the probability the model put on Yes/No) is below this "
        "are UNCERTAIN (LOW_ANSWER_MASS), never a verdict; negative = the calibration's floor, or 0.5 without one",
    )
    judge_remote_reuse_clips: Literal["on", "off"] = option(
        "on",
        help="remote: send a clip in full once and by reference (vLLM media uuid) in later prompts when the server "
        "takes that (probed at start); off: every prompt carries its clips in full (several servers behind one URL)",
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
        if not self.judge_min_answer_mass <= 1:  # also refuses NaN
            raise ConfigError(f"judge_min_answer_mass is a probability (0-1), got {self.judge_min_answer_mass}")
        if self.judge_top_logprobs > 20:
            raise ConfigError(f"judge_top_logprobs must be at most 20 (OpenAI's limit), got {self.judge_top_logprobs}")

    @property
    def enabled(self) -> bool:
        return bool(self.judge_model or self.judge_endpoint)

    @property
    def max_stream_audio_bytes(self) -> int:
        return int(self.judge_max_stream_audio_mb * 1024 * 1024)
