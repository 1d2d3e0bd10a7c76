"""The shape of a request, bounded before it is parsed or converted: its size and the count of every field.

A protobuf request is cheap to send and can be dear to read: an empty ``Turn`` is 2 bytes on the wire
but about 80 bytes once parsed and a few hundred once converted to Python objects, so 16 million of them
(32 MB) cost gigabytes and tens of seconds of event-loop time. One check stops that early:

- :meth:`RequestLimits.check_wire` walks the serialized bytes (tags and lengths only, nothing is copied)
  and stops at the first field over its count: the RPC gate runs it before the message is parsed
  (sleuthd.rpc.gate), on the event loop.

The walk is pure Python (about 1 µs a field on a loaded 2-core machine), so its cost is bounded twice: a
request may hold at most :meth:`RequestLimits.max_fields` fields at every depth together (twice those of
the largest valid request of its type: a CheckDialogue of 1,000 turns and 256 references is about 14,000),
so refusing one costs at most a few tens of milliseconds whatever its size; and :class:`WalkPace` bounds
the fields walked per second by the whole process, so no number of such requests at once can hold the
event loop (health included) for long. Before these bounds a 60 MiB CheckDialogue inside every count
limit (each nested message carrying 256 unknown 2-byte fields, each submessage sent 16 times: 31 million
fields) took 19-60 s to walk, and every RPC waited for it.

Every repeated field has a limit (named ones from the engine config, others ``default_repeated``); a
singular field may appear at most ``max_singular_repeats`` times (protobuf merges repeats, legitimate
encoders never send them), and a message at most ``max_unknown_fields`` fields this server does not know.
Bytes that are not valid protobuf stop the walk without a verdict: the parser reports those.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from sleuthd.config import EngineConfig
from sleuthd.errors import InvalidRequest, LimitExceeded, Overloaded
from sleuthd.v1 import sleuthd_pb2 as pb

_PACKAGE = "sleuthd.v1."
# Nested messages deeper than this are not walked (ours are 4 deep; the parser itself stops at 100).
_MAX_DEPTH = 32
_VARINT, _I64, _LEN, _SGROUP, _EGROUP, _I32 = 0, 1, 2, 3, 4, 5
# A request may carry this many times the fields of the largest valid request of its type (room for
# fields of a newer .proto and for singular fields sent twice), and never fewer than _MIN_FIELDS.
FIELD_ALLOWANCE = 2
_MIN_FIELDS = 4096


def oversize_advice(request_bytes: int, limit: int) -> str:
    return (
        f"request is {request_bytes} bytes; this server accepts at most {limit} bytes per request: send "
        "compressed audio (FLAC/OGG), fewer turns per call, or shorter clips"
    )


@dataclass(frozen=True)
class RequestLimits:
    """Size and count bounds of every request message (field names are protobuf full names)."""

    max_bytes: int  # a serialized message larger than this is refused unparsed
    repeated: Mapping[str, int] = field(default_factory=dict)  # repeated field -> most entries
    advice: Mapping[str, str] = field(default_factory=dict)  # repeated field -> what to do instead
    default_repeated: int = 4096  # repeated fields not named above
    max_singular_repeats: int = 16
    max_unknown_fields: int = 256  # per message: fields from a newer .proto, or noise
    _max_fields: dict[str, int] = field(default_factory=dict, compare=False, repr=False)  # by message type

    @classmethod
    def from_config(cls, config: EngineConfig, max_bytes: int) -> RequestLimits:
        per_dialogue = "split the dialogue into several requests"
        refs = "send references only for the dialogue's speakers"
        return cls(
            max_bytes=max_bytes,
            repeated={
                _PACKAGE + "CheckDialogueRequest.turns": config.max_turns,
                _PACKAGE + "CheckDialogueRequest.references": config.max_references,
                _PACKAGE + "StreamOpen.references": config.max_references,
                _PACKAGE + "RankCandidatesRequest.candidates": config.max_candidates,
                _PACKAGE + "RankCandidatesRequest.context": config.max_context,
                _PACKAGE + "RegisterVoiceRequest.clips": config.voice_registry.registry_max_clips_per_voice,
                _PACKAGE + "RegisterVoiceRequest.metadata": config.voice_registry.registry_max_metadata_entries,
            },
            advice={
                _PACKAGE + "CheckDialogueRequest.turns": per_dialogue,
                _PACKAGE + "CheckDialogueRequest.references": refs,
                _PACKAGE + "StreamOpen.references": refs,
                _PACKAGE + "RankCandidatesRequest.candidates": "rank fewer candidates per call",
                _PACKAGE + "RankCandidatesRequest.context": "send fewer context clips",
                _PACKAGE + "RegisterVoiceRequest.clips": "enrol the voice from fewer clips",
                _PACKAGE + "RegisterVoiceRequest.metadata": "send fewer metadata keys",
            },
        )

    def max_fields(self, desc: Descriptor) -> int:
        """The most fields (at every depth, unknown ones included) a ``desc`` message may carry:
        :data:`FIELD_ALLOWANCE` times those of the largest valid one, at least :data:`_MIN_FIELDS`."""
        known = self._max_fields.get(desc.full_name)
        if known is None:
            known = max(_MIN_FIELDS, FIELD_ALLOWANCE * self._valid_fields(desc, 0))
            self._max_fields[desc.full_name] = known
        return known

    def largest_max_fields(self) -> int:
        """:meth:`max_fields` of the largest request type of the service."""
        methods = pb.DESCRIPTOR.services_by_name["Sleuth"].methods
        return max(self.max_fields(m.input_type) for m in methods)

    def _valid_fields(self, desc: Descriptor, depth: int) -> int:
        """Fields of the largest valid ``desc`` message: every field set, every repeated one at its limit
        (an upper bound: the fields of a oneof are all counted)."""
        total = 0
        for f in desc.fields:
            inside = (
                0 if f.message_type is None or depth >= _MAX_DEPTH else self._valid_fields(f.message_type, depth + 1)
            )
            total += (self.limit_of(f) if f.is_repeated else 1) * (1 + inside)
        return total

    def limit_of(self, f: FieldDescriptor) -> int:
        if f.is_repeated:
            return self.repeated.get(f.full_name, self.default_repeated)
        return self.max_singular_repeats

    def unknown_over(self, desc: Descriptor) -> LimitExceeded:
        return LimitExceeded(
            f"{desc.name} has more than {self.max_unknown_fields} fields this server does not know: is the client "
            "built from a different sleuthd.proto?"
        )

    def _over(self, f: FieldDescriptor, n: int, exact: bool) -> LimitExceeded:
        limit = self.limit_of(f)
        where = f"{f.containing_type.name}.{f.name}"
        count = f"{n}" if exact else f"more than {limit}"
        advice = self.advice.get(f.full_name, "send fewer")
        return LimitExceeded(f"{where} has {count} entries; the limit is {limit}: {advice}")

    # ------------------------------------------------------------------ serialized messages

    def check_wire(self, data: bytes, desc: Descriptor, pace: WalkPace | None = None) -> int:
        """Raise InvalidRequest when ``data`` is over ``max_bytes``, LimitExceeded at the first field over
        its count or past :meth:`max_fields`, InvalidRequest for a singular field sent too often; return
        quietly for a message within bounds and for bytes that are not valid protobuf (the parser says what
        is wrong with those). With ``pace``, the walk also stops where the process's walking budget runs out
        (Overloaded: busy, retry later) and its fields are charged to it. Returns the fields walked."""
        if len(data) > self.max_bytes:
            raise InvalidRequest(oversize_advice(len(data), self.max_bytes))
        cap = self.max_fields(desc)
        allowed = cap if pace is None else min(cap, pace.available())
        if allowed <= 0:
            assert pace is not None
            raise pace.busy()
        walk = _Walk(self, data, allowed)
        try:
            walk.message(0, len(data), desc, 0)
        except _Malformed:
            pass
        except _OutOfFields:
            if allowed < cap:  # the process's budget ran out, not the request's
                assert pace is not None
                raise pace.busy() from None
            raise LimitExceeded(
                f"{desc.name} has more than {cap} fields (counted at every depth, unknown ones included), the most "
                f"this server reads in one message ({FIELD_ALLOWANCE}x a valid one of the largest size): is the "
                "client built from a different sleuthd.proto, or does it send fields many times over?"
            ) from None
        finally:
            walked = allowed - max(walk.left, 0)
            if pace is not None:
                pace.spend(walked)
        return walked


class WalkPace:
    """Fields the wire walk may go through per second, all requests together: a token bucket holding at
    most ``burst`` fields, refilled at ``fields_per_second``. Used from the event loop only.

    When it is empty a request's walk stops and the request is refused as busy (RESOURCE_EXHAUSTED),
    so the event loop spends at most about ``fields_per_second`` x (1 µs a field) of each second walking,
    however many requests arrive at once; health and reflection are not walked against it."""

    def __init__(self, fields_per_second: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = fields_per_second
        self.burst = burst
        self.refused = 0
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def available(self) -> int:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
        self._at = now
        return int(self._tokens)

    def spend(self, fields: int) -> None:
        self._tokens -= fields

    def busy(self) -> Overloaded:
        self.refused += 1
        return Overloaded(
            "the server is busy checking the shape of other requests (their fields are walked at a bounded "
            "pace, so no request can hold the server); retry with backoff"
        )


class _Walk:
    """One walk over a serialized message: ``left`` fields may still be visited (at every depth)."""

    __slots__ = ("data", "left", "limits")

    def __init__(self, limits: RequestLimits, data: bytes, allowed: int) -> None:
        self.limits = limits
        self.data = data
        self.left = allowed

    def message(self, pos: int, end: int, desc: Descriptor, depth: int) -> None:
        left = self.left  # a local: the loop runs once per field, and attribute access costs
        try:
            left = self._fields(pos, end, desc, depth, left)
        finally:
            # Each nested walk leaves its count in ``self.left``; however this one ends, keep the lower.
            self.left = min(self.left, left)

    def _fields(self, pos: int, end: int, desc: Descriptor, depth: int, left: int) -> int:
        data = self.data
        limits = self.limits
        counts: dict[int, int] = {}
        unknown = 0
        by_number = desc.fields_by_number
        while pos < end:
            left -= 1
            if left < 0:
                self.left = left
                raise _OutOfFields
            key = data[pos]  # most tags are one byte
            if key < 0x80:
                pos += 1
            else:
                key, pos = _varint(data, pos, end)
            number, wire = key >> 3, key & 7
            if number == 0:
                raise _Malformed
            f = by_number.get(number)
            if f is None:
                unknown += 1
                if unknown > limits.max_unknown_fields:
                    raise limits.unknown_over(desc)
            else:
                n = counts.get(number, 0) + 1
                counts[number] = n
                if n > limits.limit_of(f):
                    if f.is_repeated:
                        raise limits._over(f, n, exact=False)
                    raise InvalidRequest(f"{desc.name}.{f.name} is sent {n} times in one message; send it once")
            if wire == _VARINT:
                if pos < end and data[pos] < 0x80:
                    pos += 1
                else:
                    _, pos = _varint(data, pos, end)
            elif wire == _LEN:
                length = data[pos] if pos < end else 0x80
                if length < 0x80:
                    pos += 1
                else:
                    length, pos = _varint(data, pos, end)
                stop = pos + length
                if stop > end:
                    raise _Malformed
                if f is not None and f.message_type is not None and depth < _MAX_DEPTH:
                    self.left = left
                    self.message(pos, stop, f.message_type, depth + 1)
                    left = self.left
                pos = stop
            elif wire == _I64:
                pos += 8
            elif wire == _I32:
                pos += 4
            elif wire == _SGROUP:
                self.left = left
                pos, inside = self.group(pos, end, number, depth)
                left = self.left
                unknown += inside
                if unknown > limits.max_unknown_fields:
                    raise limits.unknown_over(desc)
            else:
                raise _Malformed
        if pos > end:
            raise _Malformed
        return left

    def group(self, pos: int, end: int, number: int, depth: int) -> tuple[int, int]:
        """Skip a (deprecated) group field: the position after its end tag and how many fields it held."""
        if depth >= _MAX_DEPTH:
            raise _Malformed
        data = self.data
        inside = 0
        while pos < end:
            self.left -= 1
            if self.left < 0:
                raise _OutOfFields
            key, pos = _varint(data, pos, end)
            wire = key & 7
            if wire == _EGROUP:
                if key >> 3 != number:
                    raise _Malformed
                return pos, inside
            inside += 1
            if wire == _VARINT:
                _, pos = _varint(data, pos, end)
            elif wire == _I64:
                pos += 8
            elif wire == _I32:
                pos += 4
            elif wire == _LEN:
                length, pos = _varint(data, pos, end)
                pos += length
            elif wire == _SGROUP:
                pos, nested = self.group(pos, end, key >> 3, depth + 1)
                inside += nested
            else:
                raise _Malformed
        raise _Malformed


class _OutOfFields(Exception):
    """The walk visited as many fields as it was allowed."""


class _Malformed(Exception):
    """Not valid protobuf: stop walking and let the parser report it."""


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while pos < end and shift < 64:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    raise _Malformed
