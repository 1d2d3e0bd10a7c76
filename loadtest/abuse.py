"""Abuse probes: requests and clients that try to take more than their share of a server, with the figures
issue 33 asks for, measured against a `sleuthd serve` subprocess.

- ``wirewalk``: CheckDialogue requests inside every count limit whose nested messages each carry 256
  unknown 2-byte fields, every submessage sent 16 times (the wire walk's worst case: ~31 M fields in
  60 MiB). Measures each call's status and time and gRPC health's worst latency meanwhile.
- ``hoard``: one stream sends most of the audio budget as one turn it never finishes (a 2-byte chunk every
  ``--trickle-seconds`` keeps it under the idle timeout) while another client sends small CheckDialogues:
  how many are answered OK.
- ``overload``: the server's unloaded capacity (closed-loop clients without deadline pressure, OK answers
  per second) and then ``--clients`` clients sending the same payload back to back with ``--deadline``
  (loadtest.overload): OK count, goodput as a share of that capacity, time to RESOURCE_EXHAUSTED, peak RSS.

Each probe ends with the server's RSS ``--after-seconds`` after the load ended. ``--pythonpath`` runs the
server from another checkout's ``service/`` (the before figures), so both are measured in one run::

    .venv/bin/python -m loadtest.abuse wirewalk hoard overload --json runs/abuse/after.json
    .venv/bin/python -m loadtest.abuse overload --pythonpath /tmp/before/service --json runs/abuse/before.json
"""

from __future__ import annotations

import io
import random

import numpy as np
import soundfile as sf
import soxr
from sleuthd.v1 import sleuthd_pb2 as pb

# A field number none of our request messages uses, as a varint field of value 0: 2 bytes on the wire.
_UNKNOWN_FIELD = bytes([(15 << 3) | 0, 0])


def _length_delimited(number: int, body: bytes) -> bytes:
    n = len(body)
    out = bytearray([(number << 3) | 2])
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out) + body


def wire_walk_request(max_bytes: int, unknown: int = 256, repeats: int = 16) -> bytes:
    """A serialized CheckDialogueRequest of at most ``max_bytes`` inside every count limit of the server's
    defaults: turns whose ``audio`` is sent ``repeats`` times, each with its ``pcm`` sent ``repeats`` times,
    and every one of those messages carrying ``unknown`` unknown fields. A walk of its fields used to cost
    about a microsecond each (60 MiB: 31 million fields)."""
    fields = _UNKNOWN_FIELD * unknown
    pcm_number = pb.Audio.DESCRIPTOR.fields_by_name["pcm"].number
    audio_number = pb.Turn.DESCRIPTOR.fields_by_name["audio"].number
    turns_number = pb.CheckDialogueRequest.DESCRIPTOR.fields_by_name["turns"].number
    audio = _length_delimited(pcm_number, fields) * repeats + fields
    turn = _length_delimited(audio_number, audio) * repeats + fields
    entry = _length_delimited(turns_number, turn)
    return entry * max(1, max_bytes // len(entry))


def noisy_mp3s(wav: bytes, n: int, seed: int = 1, flips: int = 64) -> list[bytes]:
    """``n`` MP3 encodings of ``wav`` (resampled to 48 kHz) with ``flips`` random bits flipped past the first
    frame: libmpg123 writes a line to file descriptor 2 for every corrupt frame it meets (about 500
    bytes per clip at 64 flips), whatever the server's log settings."""
    samples, rate = sf.read(io.BytesIO(wav), dtype="float32")
    at48 = soxr.resample(samples, rate, 48_000).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, at48, 48_000, format="MP3")
    clean = buf.getvalue()
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        data = bytearray(clean)
        for _ in range(flips):
            data[rng.randrange(200, len(data))] ^= 1 << rng.randrange(8)
        out.append(bytes(data))
    return out
