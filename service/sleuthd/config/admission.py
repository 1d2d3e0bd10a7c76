"""Admission and abuse bounds (sleuthd.engine.admission, the RPC gate, sleuthd.engine.stream): memory
and queues stay finite."""

from __future__ import annotations

from dataclasses import dataclass

from sleuthd.config.base import _at_least, option


@dataclass(frozen=True)
class AdmissionConfig:
    """Bounds that keep the process's memory and queues finite under overload and abuse (sleuthd.engine.admission).

    Refusals here mean "busy, retry later" (RESOURCE_EXHAUSTED), except the stream timeouts, which end
    one stream that broke a per-stream bound.
    """

    max_audio_in_flight_mb: float = option(
        64.0,
        help="request audio held at once across all RPCs (being decoded and scored, or buffered by streams), "
        "MiB; a request that would go over is refused at once with RESOURCE_EXHAUSTED, before any decoding",
    )
    max_audio_per_connection_mb: float = option(
        0.0,
        help="request audio one client connection may hold at once (its requests and streams together), MiB; 0 = a "
        "quarter of --max-audio-in-flight-mb. More is RESOURCE_EXHAUSTED while other clients hold audio too (alone, "
        "a client may use the whole budget), so one client cannot take the budget from the rest",
    )
    max_audio_per_token_mb: float = option(
        0.0,
        help="the same bound for all the connections of one bearer token together (with --auth-token-file), MiB; "
        "0 = half of --max-audio-in-flight-mb",
    )
    max_stream_buffers_mb: float = option(
        0.0,
        help="audio of unfinished turns that all streams together may buffer, MiB; 0 = half of "
        "--max-audio-in-flight-mb: streams slow to finish their turns never take the room unary requests need",
    )
    max_queued_decodes: int = option(
        2048,
        help="clips waiting for a decode thread; a clip beyond it fails its request at once with RESOURCE_EXHAUSTED "
        "(at least max-turns + max-references, so one request of the largest size always fits)",
    )
    max_request_decoded_samples: int = option(
        64 * 1024 * 1024,
        help="decoded samples (frames x channels) the clips of one call may come to, read from their headers "
        "before anything is decoded (64 Mi: about 23 min of 48 kHz mono); over it: INVALID_ARGUMENT",
    )
    wire_fields_per_second: int = option(
        250_000,
        help="protobuf fields the request checks may walk per second, all requests together (each walk runs on "
        "the event loop at about 1 µs a field); a request that arrives when they are spent gets RESOURCE_EXHAUSTED",
    )
    max_queued_work_seconds: float = option(
        30.0,
        help="work admitted and waiting to start, in seconds at the recent pace; a request that would queue more "
        "gets RESOURCE_EXHAUSTED at once (as does one that could not finish before its deadline)",
    )
    refusal_hold_seconds: float = option(
        1.0,
        help="a unary call refused RESOURCE_EXHAUSTED whose client (connection, or token) was refused within the "
        "last second is answered this much later (at most until shortly before its deadline), so clients that "
        "resend at once cannot keep the server busy refusing; a first refusal is answered at once; 0: all at once",
    )
    max_streams: int = option(64, help="StreamDialogue calls open at once; the next gets RESOURCE_EXHAUSTED")
    stream_idle_seconds: float = option(
        60.0, help="a stream that sends no message for this long is ended (with turns open or not), seconds"
    )
    stream_lifetime_seconds: float = option(3600.0, help="longest a stream may stay open, seconds")
    stream_turn_seconds: float = option(
        600.0,
        help="longest a streamed turn may stay unfinished (from its turn_start to its final chunk), seconds; the "
        "stream is then ended with INVALID_ARGUMENT, freeing what the turn buffered",
    )
    stream_message_overhead_bytes: int = option(
        1024,
        help="bytes counted for every audio message on top of its data, against the stream's buffer bound and "
        "the audio in flight (so empty or tiny chunks are not free)",
    )

    def __post_init__(self) -> None:
        for name in (
            "max_audio_in_flight_mb",
            "stream_idle_seconds",
            "stream_lifetime_seconds",
            "stream_turn_seconds",
            "max_queued_work_seconds",
        ):
            _at_least(self, name, 1e-9)
        for name in ("max_audio_per_connection_mb", "max_audio_per_token_mb", "max_stream_buffers_mb",
                     "refusal_hold_seconds"):  # fmt: skip
            _at_least(self, name, 0)
        _at_least(self, "max_queued_decodes", 1)
        _at_least(self, "max_streams", 1)
        _at_least(self, "wire_fields_per_second", 1)
        _at_least(self, "max_request_decoded_samples", 1)
        _at_least(self, "stream_message_overhead_bytes", 0)

    @property
    def max_audio_in_flight_bytes(self) -> int:
        return int(self.max_audio_in_flight_mb * 1024 * 1024)

    def _share(self, mb: float, fraction: float) -> int:
        return int(mb * 1024 * 1024) if mb > 0 else int(self.max_audio_in_flight_bytes * fraction)

    @property
    def audio_shares(self) -> dict[str, int]:
        """What one client may hold, by the kind of its identity (sleuthd.engine.admission.AudioBudget)."""
        return {
            "peer": self._share(self.max_audio_per_connection_mb, 0.25),
            "token": self._share(self.max_audio_per_token_mb, 0.5),
        }

    @property
    def max_stream_buffers_bytes(self) -> int:
        return self._share(self.max_stream_buffers_mb, 0.5)
