"""Prometheus metrics, served on their own HTTP port (`sleuthd serve --metrics-port`, see sleuthd.rpc.ops_http).

Every metric, with its labels (all low-cardinality):

| name | type | labels | meaning |
| --- | --- | --- | --- |
| `sleuthd_rpc_total` | counter | method, code | finished RPCs by method and status code, refused and malformed too |
| `sleuthd_rpc_latency_seconds` | histogram | method, code | RPC wall time, seconds (streams: open to end) |
| `sleuthd_rpcs_in_flight` | gauge | | work RPCs running now (not health or reflection); drained on SIGTERM |
| `sleuthd_batch_queue_windows` | gauge | encoder | encoder windows waiting in the micro-batcher queue |
| `sleuthd_batch_queue_wait_seconds` | histogram | encoder | a request's wait until its first windows are batched |
| `sleuthd_batch_windows` | histogram | encoder | windows per model call (batch size in cost units) |
| `sleuthd_batch_requests` | histogram | encoder | requests contributing to one model call |
| `sleuthd_batch_execution_seconds` | histogram | encoder | wall time of one model call |
| `sleuthd_batch_failures_total` | counter | encoder | model calls that raised |
| `sleuthd_batch_rejected_total` | counter | encoder | requests refused: the queue was full (RESOURCE_EXHAUSTED) |
| `sleuthd_audio_seconds_total` | counter | cached | audio seconds embedded ("false") or cached or shared ("true") |
| `sleuthd_verdicts_total` | counter | status, reason | turn verdicts by status, and why flagged or uncertain |
| `sleuthd_streams_active` | gauge | | open StreamDialogue calls |
| `sleuthd_log_records_dropped_total` | counter | reason | log records dropped, never waited for: `queue`, `stderr` |
| `sleuthd_judge_queue_prompts` | gauge | | LALM judge prompts waiting in its batcher (in-process judge) |
| `sleuthd_judge_queue_wait_seconds` | histogram | | time from a prompt's arrival to its batch being cut |
| `sleuthd_judge_batch_prompts` | histogram | | prompts per judge model call |
| `sleuthd_judge_batch_padded_tokens` | histogram | | tokens per judge model call, padding included |
| `sleuthd_judge_batch_execution_seconds` | histogram | | wall time of one judge model call |
| `sleuthd_judge_batch_failures_total` | counter | | judge model calls that raised (their prompts failed) |
| `sleuthd_judge_batch_splits_total` | counter | | judge calls split in halves after running out of GPU memory |
| `sleuthd_judge_rejected_total` | counter | | judge prompts refused because its queue was full |
| `process_*` | | | the server process (Linux): resident and virtual memory, CPU seconds, open and max fds, start |

The ``encoder`` label is a model's manifest name (``ge2e``, ``campplus``, ...): one micro-batcher per model, so
the fused default shows two series. ``reason`` is one of none, score_threshold, speaker_confusion,
out_of_support, own_turns_dissimilar, low_answer_mass ("none": neither flagged nor uncertain). The ``process_*``
metrics come from prometheus_client's ProcessCollector.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from sleuthd.domain import TurnStatus
from sleuthd.ops import logs
from sleuthd.ops.observe import BatchObserver

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_WAIT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_TOKEN_BUCKETS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


class JudgeMetrics:
    """The LALM judge batcher's measurements (sleuthd.ops.observe.JudgeObserver), on the server's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.queue_prompts = Gauge("sleuthd_judge_queue_prompts", "Judge prompts waiting for a model call", registry=r)
        self.queue_wait_seconds = Histogram(
            "sleuthd_judge_queue_wait_seconds", "Judge prompt queue wait (s)", buckets=_WAIT_BUCKETS, registry=r
        )
        self.batch_prompts = Histogram(
            "sleuthd_judge_batch_prompts", "Prompts per judge model call", buckets=_SIZE_BUCKETS, registry=r
        )
        self.batch_tokens = Histogram(
            "sleuthd_judge_batch_padded_tokens", "Padded tokens per judge call", buckets=_TOKEN_BUCKETS, registry=r
        )
        self.batch_seconds = Histogram(
            "sleuthd_judge_batch_execution_seconds", "Judge call wall time (s)", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.failures = Counter("sleuthd_judge_batch_failures", "Judge model calls that raised", registry=r)
        self.splits = Counter("sleuthd_judge_batch_splits", "Judge calls split after running out of memory", registry=r)
        self.rejections = Counter("sleuthd_judge_rejected", "Judge prompts refused: queue full", registry=r)

    def queue_depth(self, prompts: int) -> None:
        self.queue_prompts.set(prompts)

    def queue_wait(self, seconds: float) -> None:
        self.queue_wait_seconds.observe(seconds)

    def batch_executed(self, prompts: int, padded_tokens: int, seconds: float) -> None:
        self.batch_prompts.observe(prompts)
        self.batch_tokens.observe(padded_tokens)
        self.batch_seconds.observe(seconds)

    def batch_failed(self, prompts: int) -> None:
        self.failures.inc()

    def batch_split(self, prompts: int) -> None:
        self.splits.inc()

    def rejected(self) -> None:
        self.rejections.inc()


class _DroppedLogRecords(Collector):
    """The process's dropped log records (sleuthd.ops.logs.dropped), read when scraped."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "sleuthd_log_records_dropped", "Log records dropped rather than waited for", labels=["reason"]
        )
        for reason, n in sorted(logs.dropped().items()):
            family.add_metric([reason], n)
        yield family


class EncoderBatchMetrics:
    """One encoder's micro-batcher's measurements (sleuthd.ops.observe.BatchObserver): the service's batch
    metrics, labelled with the encoder."""

    def __init__(self, metrics: ServiceMetrics, encoder: str) -> None:
        self.queue_windows = metrics.queue_windows.labels(encoder)
        self.queue_wait_seconds = metrics.queue_wait_seconds.labels(encoder)
        self.batch_windows = metrics.batch_windows.labels(encoder)
        self.batch_requests = metrics.batch_requests.labels(encoder)
        self.batch_seconds = metrics.batch_seconds.labels(encoder)
        self.batch_failures = metrics.batch_failures.labels(encoder)
        self.batch_rejected = metrics.batch_rejected.labels(encoder)

    def queue_depth(self, windows: int) -> None:
        self.queue_windows.set(windows)

    def queue_wait(self, seconds: float) -> None:
        self.queue_wait_seconds.observe(seconds)

    def batch_executed(self, windows: int, requests: int, seconds: float) -> None:
        self.batch_windows.observe(windows)
        self.batch_requests.observe(requests)
        self.batch_seconds.observe(seconds)

    def batch_failed(self, windows: int, requests: int) -> None:
        self.batch_failures.inc()

    def rejected(self) -> None:
        self.batch_rejected.inc()


class ServiceMetrics:
    """All metrics of one server, on their own registry (tests create several servers per process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.rpc_total = Counter("sleuthd_rpc", "Finished RPCs", ["method", "code"], registry=r)
        self.rpcs_in_flight = Gauge("sleuthd_rpcs_in_flight", "Work RPCs running now", registry=r)
        self.refusals_held = Counter(
            "sleuthd_refusals_held",
            "RESOURCE_EXHAUSTED answers held back: the client came straight back after one (--refusal-hold-seconds)",
            registry=r,
        )
        self.rpc_latency = Histogram(
            "sleuthd_rpc_latency_seconds", "RPC wall time (s)", ["method", "code"], buckets=_LATENCY_BUCKETS, registry=r
        )
        e = ["encoder"]  # one micro-batcher per encoder model: the fused default runs two
        self.queue_windows = Gauge("sleuthd_batch_queue_windows", "Windows waiting in the batch queue", e, registry=r)
        self.queue_wait_seconds = Histogram(
            "sleuthd_batch_queue_wait_seconds", "Queue wait before batching (s)", e, buckets=_WAIT_BUCKETS, registry=r
        )
        self.batch_windows = Histogram(
            "sleuthd_batch_windows", "Windows per model call", e, buckets=_SIZE_BUCKETS, registry=r
        )
        self.batch_requests = Histogram(
            "sleuthd_batch_requests", "Requests per model call", e, buckets=_SIZE_BUCKETS, registry=r
        )
        self.batch_seconds = Histogram(
            "sleuthd_batch_execution_seconds", "Model call wall time (s)", e, buckets=_LATENCY_BUCKETS, registry=r
        )
        self.batch_failures = Counter("sleuthd_batch_failures", "Model calls that raised", e, registry=r)
        self.batch_rejected = Counter("sleuthd_batch_rejected", "Requests refused: queue full", e, registry=r)
        self.audio_seconds = Counter(
            "sleuthd_audio_seconds", "Audio seconds embedded or cached", ["cached"], registry=r
        )
        self.verdicts = Counter(
            "sleuthd_verdicts", "Turn verdicts by status and why flagged or uncertain", ["status", "reason"], registry=r
        )
        self.streams_active = Gauge("sleuthd_streams_active", "Open StreamDialogue calls", registry=r)
        self.band_match_kept_bytes = Gauge(
            "sleuthd_band_match_kept_bytes",
            "Turn audio streams keep for band matching, all together (bytes; bounded by --band-match-kept-mb)",
            registry=r,
        )
        self.judge = JudgeMetrics(r)  # given to the LALM judge's batcher (Engine.start)
        # process_resident_memory_bytes, process_cpu_seconds_total, process_open_fds, ... (read from /proc on
        # Linux; elsewhere the collector reports nothing). On this registry, as every metric of the server.
        ProcessCollector(registry=r)
        r.register(_DroppedLogRecords())

    # -- RPCs (called by the RPC gate, sleuthd.rpc.gate; `method` is the short name for sleuthd's own
    # services and the full path for health and reflection, so its values are bounded by what is registered)
    def rpc_finished(self, method: str, code: str, seconds: float) -> None:
        self.rpc_total.labels(method, code).inc()
        self.rpc_latency.labels(method, code).observe(seconds)

    # -- EngineObserver (called by the engine, and by each encoder's micro-batcher through batcher())
    def batcher(self, encoder: str) -> BatchObserver:
        return EncoderBatchMetrics(self, encoder)

    def clip_embedded(self, audio_seconds: float, cached: bool) -> None:
        self.audio_seconds.labels("true" if cached else "false").inc(audio_seconds)

    def kept_audio(self, held_bytes: int) -> None:
        self.band_match_kept_bytes.set(held_bytes)

    def verdict(self, status: TurnStatus, reason: str) -> None:
        self.verdicts.labels(status.value, reason).inc()
