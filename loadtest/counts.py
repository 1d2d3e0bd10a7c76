"""Requests that are small on the wire but huge in count, and one just under the transport limit.

Each probe goes to a fresh `sleuthd serve` process (defaults unless ``--serve-args``); while it runs, a
second connection asks for health every 100 ms. Printed per probe: the request's size, the status it got
and after how long, the server's RSS growth (peak sampled every 50 ms, minus its idle RSS before), and the
longest health-check latency seen (how long the event loop was blocked)::

    .venv/bin/python -m loadtest.counts                 # every probe
    .venv/bin/python -m loadtest.counts --probe turns   # one of: turns, context, stream_refs, transport
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sleuthd.v1 import sleuthd_pb2 as pb

from loadtest.overload import RssSampler, ServerProcess

_BIG = 1 << 30
_OPTIONS = [("grpc.max_send_message_length", _BIG), ("grpc.max_receive_message_length", _BIG)]


def empty_turns(n: int) -> bytes:
    """A CheckDialogueRequest with ``n`` empty turns, serialized directly (2 bytes a turn: building it
    as a message first would cost the client gigabytes)."""
    return b"\x12\x00" * n


def context_clips(n: int) -> bytes:
    """A RankCandidatesRequest with ``n`` one-byte context clips (5 bytes each) and two candidates."""
    head = pb.RankCandidatesRequest(speaker="A")
    for k in range(2):
        head.candidates.add(candidate_id=f"c{k}", audio=pb.Audio(encoded=b"x"))
    clip = pb.RankCandidatesRequest(context=[pb.Audio(encoded=b"x")]).SerializeToString()
    return head.SerializeToString() + clip * n


def stream_references(n: int) -> bytes:
    """A StreamDialogueRequest `open` with ``n`` references of one byte each, each for its own speaker."""
    one_byte = pb.Audio(encoded=b"x")
    refs = pb.StreamOpen(references=[pb.SpeakerReference(speaker=f"{k:x}", audio=one_byte) for k in range(n)])
    body = refs.SerializeToString()
    return b"\x0a" + _varint(len(body)) + body  # field 1 (open), length-delimited


def just_under(limit_bytes: int) -> bytes:
    """A CheckDialogueRequest of one turn whose PCM makes the request ``limit_bytes - 1024`` bytes."""
    req = pb.CheckDialogueRequest(turns=[pb.Turn(turn_id="t", speaker="A")])
    req.turns[0].audio.pcm.encoding = pb.PCM_S16LE
    req.turns[0].audio.pcm.sample_rate_hz = 16000
    req.turns[0].audio.pcm.channels = 1
    req.turns[0].audio.pcm.data = b"\x00" * (limit_bytes - 1024 - 64)
    return req.SerializeToString()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


@dataclass
class ProbeResult:
    probe: str
    request_mb: float
    status: str
    seconds: float  # until the status came back
    rss_before_mb: float
    rss_growth_mb: float  # peak during the call minus idle before
    health_max_s: float  # the slowest health check while the call ran


async def _health_probe(target: str, stop: asyncio.Event) -> float:
    worst = 0.0
    async with grpc.aio.insecure_channel(target) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                await stub.Check(health_pb2.HealthCheckRequest(), timeout=120)
            except grpc.aio.AioRpcError:
                pass
            worst = max(worst, time.perf_counter() - t0)
            try:
                await asyncio.wait_for(stop.wait(), 0.1)
            except TimeoutError:
                pass
    return worst


async def _unary(target: str, method: str, raw: bytes, timeout: float) -> str:
    async with grpc.aio.insecure_channel(target, options=_OPTIONS) as ch:
        call = ch.unary_unary(method, request_serializer=None, response_deserializer=None)
        try:
            await call(raw, timeout=timeout)
            return "OK"
        except grpc.aio.AioRpcError as err:
            return f"{err.code().name}: {err.details()[:100]}"


async def _stream(target: str, raw: bytes, timeout: float) -> str:
    async with grpc.aio.insecure_channel(target, options=_OPTIONS) as ch:
        call = ch.stream_stream(
            "/sleuthd.v1.Sleuth/StreamDialogue", request_serializer=None, response_deserializer=None
        )

        async def messages() -> AsyncIterator[bytes]:
            yield raw

        try:
            async for _ in call(messages(), timeout=timeout):
                pass
            return "OK"
        except grpc.aio.AioRpcError as err:
            return f"{err.code().name}: {err.details()[:100]}"


PROBES: dict[str, tuple[Callable[[int], bytes], str]] = {
    "turns": (lambda _: empty_turns(16_000_000), "/sleuthd.v1.Sleuth/CheckDialogue"),
    "context": (lambda _: context_clips(500_000), "/sleuthd.v1.Sleuth/RankCandidates"),
    "stream_refs": (lambda _: stream_references(500_000), ""),
    "transport": (just_under, "/sleuthd.v1.Sleuth/CheckDialogue"),
}


def probe(name: str, serve_args: Sequence[str], transport_limit: int, timeout: float, log: Path) -> ProbeResult:
    make, method = PROBES[name]
    raw = make(transport_limit)
    server = ServerProcess(serve_args, log)
    sampler = RssSampler(server.proc.pid, kill_mb=8000)
    try:
        time.sleep(1.0)
        before = sampler.rss_mb()
        sampler.reset_peak()
        sampler.start()

        async def go() -> tuple[str, float, float]:
            stop = asyncio.Event()
            health = asyncio.ensure_future(_health_probe(server.target, stop))
            await asyncio.sleep(0.3)
            t0 = time.perf_counter()
            if method:
                status = await _unary(server.target, method, raw, timeout)
            else:
                status = await _stream(server.target, raw, timeout)
            took = time.perf_counter() - t0
            await asyncio.sleep(0.3)
            stop.set()
            return status, took, await health

        status, took, worst = asyncio.run(go())
        return ProbeResult(name, len(raw) / 2**20, status, took, before, sampler.peak_mb - before, worst)
    finally:
        sampler.stop()
        server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probe", choices=sorted(PROBES), action="append", help="run only these (repeatable)")
    parser.add_argument("--serve-args", default="", help="extra `sleuthd serve` flags")
    parser.add_argument(
        "--transport-limit-mb", type=float, default=128.0, help="the server's transport limit, MiB (128: 2 x 64)"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="deadline of each probe call, seconds")
    parser.add_argument("--log", type=Path, default=Path("runs/counts/server.log"), help="the servers' output")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    results = []
    for name in args.probe or list(PROBES):
        r = probe(name, shlex.split(args.serve_args), int(args.transport_limit_mb * 2**20), args.timeout, args.log)
        results.append(r)
        print(
            f"{r.probe:12s} {r.request_mb:8.2f} MiB  {r.seconds:7.2f} s  RSS {r.rss_before_mb:.0f} MB "
            f"+{r.rss_growth_mb:.0f} MB  health max {r.health_max_s:.2f} s  {r.status}",
            flush=True,
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
