"""The shape of a request, bounded before it is parsed or converted: its size and the count of every field.

A protobuf request is cheap to send and can be dear to read: an empty ``Turn`` is 2 bytes on the wire
but about 80 bytes once parsed and a few hundred once converted to Python objects, so 16 million of them
(32 MB) cost gigabytes and tens of seconds of event-loop time. One check stops that early:

- :meth:`RequestLimits.check_wire` walks the serialized bytes (tags and lengths only, nothing is copied)
  and stops at the first field over its count, so refusing a request costs at most a few thousand steps
  whatever its size: the RPC gate runs it before the message is parsed (sleuthd.rpc.gate).

Every repeated field has a limit (named ones from the engine config, others ``default_repeated``); a
singular field may appear at most ``max_singular_repeats`` times (protobuf merges repeats, legitimate
encoders never send them), and a message at most ``max_unknown_fields`` fields this server does not know.
Bytes that are not valid protobuf stop the walk without a verdict: the parser reports those.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from sleuthd.config import EngineConfig
from sleuthd.errors import InvalidRequest, LimitExceeded

_PACKAGE = "sleuthd.v1."
# Nested messages deeper than this are not walked (ours are 4 deep; the parser itself stops at 100).
_MAX_DEPTH = 32
_VARINT, _I64, _LEN, _SGROUP, _EGROUP, _I32 = 0, 1, 2, 3, 4, 5


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

    def limit_of(self, f: FieldDescriptor) -> int:
        if f.is_repeated:
            return self.repeated.get(f.full_name, self.default_repeated)
        return self.max_singular_repeats

    def _over(self, f: FieldDescriptor, n: int, exact: bool) -> LimitExceeded:
        limit = self.limit_of(f)
        where = f"{f.containing_type.name}.{f.name}"
        count = f"{n}" if exact else f"more than {limit}"
        advice = self.advice.get(f.full_name, "send fewer")
        return LimitExceeded(f"{where} has {count} entries; the limit is {limit}: {advice}")

    # ------------------------------------------------------------------ serialized messages

    def check_wire(self, data: bytes, desc: Descriptor) -> None:
        """Raise InvalidRequest when ``data`` is over ``max_bytes``, LimitExceeded at the first field over
        its count, InvalidRequest for a singular field sent too often; return quietly for a message within
        bounds and for bytes that are not valid protobuf (the parser says what is wrong with those)."""
        if len(data) > self.max_bytes:
            raise InvalidRequest(oversize_advice(len(data), self.max_bytes))
        try:
            self._walk(data, 0, len(data), desc, 0)
        except _Malformed:
            pass

    def _walk(self, data: bytes, pos: int, end: int, desc: Descriptor, depth: int) -> None:
        counts: dict[int, int] = {}
        unknown = 0
        by_number = desc.fields_by_number
        while pos < end:
            key, pos = _varint(data, pos, end)
            number, wire = key >> 3, key & 7
            if number == 0:
                raise _Malformed
            f = by_number.get(number)
            if f is None:
                unknown += 1
            else:
                n = counts.get(number, 0) + 1
                counts[number] = n
                if n > self.limit_of(f):
                    if f.is_repeated:
                        raise self._over(f, n, exact=False)
                    raise InvalidRequest(f"{desc.name}.{f.name} is sent {n} times in one message; send it once")
            if wire == _VARINT:
                _, pos = _varint(data, pos, end)
            elif wire == _I64:
                pos += 8
            elif wire == _I32:
                pos += 4
            elif wire == _LEN:
                length, pos = _varint(data, pos, end)
                stop = pos + length
                if stop > end:
                    raise _Malformed
                if f is not None and f.message_type is not None and depth < _MAX_DEPTH:
                    self._walk(data, pos, stop, f.message_type, depth + 1)
                pos = stop
            elif wire == _SGROUP:
                pos, inside = _skip_group(data, pos, end, number, depth)
                unknown += inside
            else:
                raise _Malformed
            if unknown > self.max_unknown_fields:
                raise LimitExceeded(
                    f"{desc.name} has more than {self.max_unknown_fields} fields this server does not know: "
                    "is the client built from a different sleuthd.proto?"
                )
        if pos > end:
            raise _Malformed


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


def _skip_group(data: bytes, pos: int, end: int, number: int, depth: int) -> tuple[int, int]:
    """Skip a (deprecated) group field: the position after its end tag and how many fields it held."""
    if depth >= _MAX_DEPTH:
        raise _Malformed
    inside = 0
    while pos < end:
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
            pos, nested = _skip_group(data, pos, end, key >> 3, depth + 1)
            inside += nested
        else:
            raise _Malformed
    raise _Malformed
