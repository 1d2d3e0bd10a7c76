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

import argparse
import asyncio
import contextlib
import io
import json
import logging
import os
import random
import shlex
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import soundfile as sf
import soxr
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

from loadtest import overload
from loadtest.overload import (
    RATE,
    RequestBytes,
    RssSampler,
    ServerProcess,
    hoarding_stream,
    long_turns,
    make_request,
)

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


# ---------------------------------------------------------------------------------------------- probes


CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.use_local_subchannel_pool", 1),  # a connection of its own, as a separate client would have
]


@dataclass
class Probe:
    """One probe's figures (seconds, MB); ``rss_after_mb`` is the server's RSS ``after_s`` after its load ended."""

    name: str
    server: str  # which checkout served it
    figures: dict[str, Any] = field(default_factory=dict)
    rss_idle_mb: float | None = None
    rss_peak_mb: float | None = None
    rss_end_mb: float | None = None  # when the load ended
    rss_after_mb: float | None = None
    after_s: float = 0.0


class _Health:
    """gRPC health every ``interval`` s on a connection of its own, with a long deadline so that the true
    time to an answer is measured (not the deadline)."""

    def __init__(self, target: str, interval: float = 0.05) -> None:
        self.target = target
        self.interval = interval
        self.latencies: list[float] = []
        self._stop = asyncio.Event()

    async def run(self) -> None:
        async with grpc.aio.insecure_channel(self.target, options=CHANNEL_OPTIONS) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while not self._stop.is_set():
                t0 = time.perf_counter()
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await stub.Check(health_pb2.HealthCheckRequest(), timeout=300)
                self.latencies.append(time.perf_counter() - t0)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.interval)

    def stop(self) -> None:
        self._stop.set()


async def _call(method: Any, request: Any, timeout: float) -> tuple[str, float, str]:
    t0 = time.perf_counter()
    try:
        await method(request, timeout=timeout)
        return "OK", time.perf_counter() - t0, ""
    except grpc.aio.AioRpcError as err:
        return err.code().name, time.perf_counter() - t0, (err.details() or "")[:200]


async def wirewalk(target: str, concurrent: int, size_mb: float) -> dict[str, Any]:
    """``concurrent`` wire-walk requests of ``size_mb`` at once, health probed every 50 ms meanwhile."""
    data = wire_walk_request(int(size_mb * 2**20))
    health = _Health(target)
    watcher = asyncio.ensure_future(health.run())
    await asyncio.sleep(0.5)
    channels = [grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) for _ in range(concurrent)]
    try:
        calls = [ch.unary_unary("/sleuthd.v1.Sleuth/CheckDialogue", request_serializer=None) for ch in channels]
        results = await asyncio.gather(*(_call(c, data, 300) for c in calls))
        await asyncio.sleep(0.5)
    finally:
        health.stop()
        await watcher
        for ch in channels:
            await ch.close()
    return {
        "requests": concurrent,
        "request_mib": round(len(data) / 2**20, 1),
        "codes": dict(Counter(code for code, _, _ in results)),
        "answer_s_max": round(max(t for _, t, _ in results), 2),
        "health_worst_s": round(max(health.latencies), 3),
        "health_checks": len(health.latencies),
        "details": sorted({d for _, _, d in results})[:2],
    }


def _small_dialogue(mb: float) -> bytes:
    """A CheckDialogue of about ``mb`` MB of real speech (4 turns, two speakers), tagged so it is never cached."""
    turns = long_turns(4, mb * 2**20 / 4 / (2 * RATE))
    return RequestBytes(turns).template


async def hoard(target: str, hoarders: int, seconds: float, trickle_s: float, hoard_mib: float) -> dict[str, Any]:
    """``hoarders`` streams (a connection each) each send ``hoard_mib`` of one turn they never finish, then a
    2-byte chunk every ``trickle_s``; meanwhile another client sends a 0.5 MB and a 3.66 MiB CheckDialogue
    in turn, one every 2 s, for ``seconds``."""
    stop = asyncio.Event()
    streams = [asyncio.ensure_future(hoarding_stream(target, hoard_mib, trickle_s, stop)) for _ in range(hoarders)]
    await asyncio.sleep(5.0)  # the hoard is in place
    small, large = _small_dialogue(0.5), RequestBytes(long_turns(4, 30.0)).template
    results: list[tuple[str, str, float, str]] = []
    async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as ch:
        check = ch.unary_unary("/sleuthd.v1.Sleuth/CheckDialogue", request_serializer=None)
        started = time.perf_counter()
        k = 0
        while time.perf_counter() - started < seconds:
            size, data = ("0.5 MB", small) if k % 2 == 0 else ("3.66 MiB", large)
            code, took, detail = await _call(check, data, 60)
            results.append((size, code, took, detail))
            k += 1
            await asyncio.sleep(max(0.0, 2.0 * k - (time.perf_counter() - started)))
    stop.set()
    ended = await asyncio.gather(*streams)
    by_size = {size: dict(Counter(code for s, code, _, _ in results if s == size)) for size in ("0.5 MB", "3.66 MiB")}
    return {
        "hoarders": hoarders,
        "hoarded_mib_each": hoard_mib,
        "hoarders_ended": dict(Counter(ended)),
        "probes": by_size,
        "probe_ok_latency_max_s": round(max((t for _, c, t, _ in results if c == "OK"), default=0.0), 2),
        "details": sorted({d for _, _, _, d in results if d})[:2],
    }


def run_probe(name: str, args: argparse.Namespace) -> Probe:
    env = (
        {"PYTHONPATH": os.pathsep.join([args.pythonpath, os.environ.get("PYTHONPATH", "")])}
        if args.pythonpath
        else None
    )
    log = args.out / f"{name}-{args.label}.log"
    probe = Probe(name, args.label, after_s=args.after_seconds)
    if name == "overload":  # loadtest.overload starts its own server and samples its memory
        r = overload.run(
            clients=args.clients, seconds=args.seconds, deadline_s=args.deadline, turns=4, turn_seconds=30.0,
            serve_args=shlex.split(args.serve_args), log=log, kill_rss_mb=args.kill_rss_mb, settle_s=args.after_seconds,
            capacity_clients=args.capacity_clients, capacity_seconds=args.capacity_seconds, env=env,
        )  # fmt: skip
        probe.figures = asdict(r)
        probe.rss_idle_mb, probe.rss_peak_mb, probe.rss_after_mb = r.rss_before_mb, r.rss_peak_mb, r.rss_after_mb
        return probe
    server = ServerProcess(shlex.split(args.serve_args), log, env)
    sampler = RssSampler(server.proc.pid, kill_mb=args.kill_rss_mb)
    try:
        asyncio.run(_warm(server.target))
        probe.rss_idle_mb = round(sampler.rss_mb())
        sampler.reset_peak()
        sampler.start()
        if name == "wirewalk":
            probe.figures = {
                f"x{n}": asyncio.run(wirewalk(server.target, n, args.wirewalk_mib)) for n in args.wirewalk_requests
            }
        elif name == "hoard":
            probe.figures = {
                f"{n} hoarders": asyncio.run(
                    hoard(server.target, n, args.hoard_seconds, args.trickle_seconds, args.hoard_mib)
                )
                for n in args.hoarders
            }
        else:
            raise SystemExit(f"no probe {name!r}: wirewalk, hoard or overload")
        probe.rss_peak_mb = round(sampler.peak_mb)
        probe.rss_end_mb = round(sampler.rss_mb())
        time.sleep(args.after_seconds)
        probe.rss_after_mb = round(sampler.rss_mb())
        if sampler.killed:
            probe.figures["killed_by_watchdog"] = True
    finally:
        sampler.stop()
        server.stop()
    return probe


async def _warm(target: str) -> None:
    async with grpc.aio.insecure_channel(target) as ch:
        await pb_grpc.SleuthStub(ch).CheckDialogue(make_request(long_turns(2, 3.0), 0), timeout=120)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("probes", nargs="+", help="wirewalk, hoard, overload (each on a fresh server)")
    parser.add_argument("--pythonpath", default="", help="serve from this service/ folder (e.g. an older checkout)")
    parser.add_argument("--label", default="", help="what to call this server in the output (default: after/before)")
    parser.add_argument("--serve-args", default=os.environ.get("SLEUTHD_SERVE_ARGS", ""), help="extra serve flags")
    parser.add_argument("--after-seconds", type=float, default=60.0, help="RSS this long after each load (60)")
    parser.add_argument("--kill-rss-mb", type=float, default=6000.0)
    parser.add_argument("--wirewalk-mib", type=float, default=60.0)
    parser.add_argument("--wirewalk-requests", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--hoarders", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--hoard-mib", type=float, default=63.5, help="each hoarder's unfinished turn, MiB")
    parser.add_argument("--hoard-seconds", type=float, default=40.0, help="how long the other client probes")
    parser.add_argument("--trickle-seconds", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--deadline", type=float, default=5.0)
    parser.add_argument("--capacity-clients", type=int, default=2)
    parser.add_argument("--capacity-seconds", type=float, default=30.0)
    parser.add_argument("--out", type=Path, default=Path("runs/abuse"))
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    args.label = args.label or ("before" if args.pythonpath else "after")
    args.out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    results = []
    for name in args.probes:
        probe = run_probe(name, args)
        results.append(asdict(probe))
        print(json.dumps(asdict(probe), indent=1), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
