"""Overload: many concurrent clients sending large dialogues at once, for a bounded time.

Each client sends one ``CheckDialogue`` after another (closed loop, no pause) with a short deadline; every
request is a dialogue of ``--turns`` WAV turns of ``--turn-seconds`` each (real espeak-ng/flite speech from
loadtest.speech, repeated to length, tagged so the embedding cache never hits). Far more work is offered
than the server can do, so most requests must be refused; what matters is how:

- **peak RSS** of the server process (sampled every 50 ms from /proc, plus the kernel's high-water mark),
  against its RSS when idle before the run and after it;
- **time to RESOURCE_EXHAUSTED**: the latency of refused calls ("busy, retry later" should come at once);
- **goodput**: calls answered OK within their deadline, per second, and audio seconds scored per second.

Run from the repository root (it starts a server with ``$SLEUTHD_SERVE_ARGS`` or ``--serve-args``, unless
``--target`` names one; a watchdog kills a started server whose RSS passes ``--kill-rss-mb``)::

    .venv/bin/python -m loadtest.overload --clients 64 --seconds 30 --json runs/overload.json

The CI test (tests/test_overload.py) runs :func:`run` with a few clients for a few seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import itertools
import json
import logging
import os
import shlex
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
import numpy as np
import soundfile as sf
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc
from sleuthd_bench.footprint import cpu_seconds

from loadtest.speech import _TAG_BITS, _data_chunk, dialogues, tag_wav

logger = logging.getLogger(__name__)

RATE = 16_000


def long_turns(turns: int, turn_seconds: float) -> list[tuple[str, bytes]]:
    """``turns`` (speaker, WAV) turns of ``turn_seconds`` each, speakers A B A B ..., from the cached
    load-test speech: each speaker's clips of one dialogue joined and repeated to length."""
    (clips,) = dialogues(1)
    by_speaker: dict[str, list[np.ndarray]] = {"A": [], "B": []}
    for k, wav in enumerate(clips):
        samples, rate = sf.read(io.BytesIO(wav), dtype="int16")
        assert rate == RATE, rate
        by_speaker["A" if k % 2 == 0 else "B"].append(samples)
    out = []
    n = int(turn_seconds * RATE)
    for t in range(turns):
        speaker = "AB"[t % 2]
        joined = np.concatenate(by_speaker[speaker])
        samples = np.resize(joined, n)  # repeats the speaker's speech to the length asked for
        buf = io.BytesIO()
        sf.write(buf, samples, RATE, format="WAV", subtype="PCM_16")
        out.append((speaker, buf.getvalue()))
    return out


def make_request(turns: Sequence[tuple[str, bytes]], nonce: int) -> pb.CheckDialogueRequest:
    req = pb.CheckDialogueRequest(dialogue_id="overload")
    for k, (speaker, wav) in enumerate(turns):
        req.turns.add(turn_id=f"t{k}", speaker=speaker, audio=pb.Audio(encoded=tag_wav(wav, nonce * len(turns) + k)))
    return req


class RequestBytes:
    """Serialized requests with fresh audio each, cheaply: one template, the tag bits patched in place
    (building and serializing a 4 MB message per call would make the load generator the bottleneck)."""

    def __init__(self, turns: Sequence[tuple[str, bytes]]) -> None:
        self.template = make_request(turns, 0).SerializeToString()
        self.starts = []  # where each turn's samples begin in the serialized request
        for k, (_, wav) in enumerate(turns):
            at = self.template.find(tag_wav(wav, k))  # the template's turn k carries tag k
            self.starts.append(at + _data_chunk(wav)[0])

    def make(self, nonce: int) -> bytes:
        out = bytearray(self.template)
        for k, start in enumerate(self.starts):
            tag = nonce * len(self.starts) + k  # distinct for every turn of every request
            for bit in range(_TAG_BITS):
                i = start + 2 * bit  # the low byte of a little-endian int16 sample
                out[i] = (out[i] & 0xFE) | ((tag >> bit) & 1)
        return bytes(out)


# ---------------------------------------------------------------------------------------------- server


class RssSampler:
    """Samples a process's resident memory every ``interval`` seconds on a thread; optionally kills the
    process when it passes ``kill_mb`` (the machine is shared: an unbounded server must not take it down)."""

    def __init__(self, pid: int, interval: float = 0.05, kill_mb: float | None = None) -> None:
        self.pid = pid
        self.interval = interval
        self.kill_mb = kill_mb
        self.peak_mb = 0.0
        self.killed = False
        self.killed_at: float | None = None  # time.perf_counter() of the kill
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def rss_mb(self) -> float:
        return _status_kb(self.pid, "VmRSS") / 1024

    def hwm_mb(self) -> float:
        return _status_kb(self.pid, "VmHWM") / 1024

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def reset_peak(self) -> None:
        self.peak_mb = self.rss_mb()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                rss = self.rss_mb()
            except (FileNotFoundError, ProcessLookupError):
                return
            self.peak_mb = max(self.peak_mb, rss)
            if self.kill_mb is not None and rss > self.kill_mb and not self.killed:
                logger.error("server RSS %.0f MB passed the watchdog's %.0f MB: killing it", rss, self.kill_mb)
                self.killed = True
                self.killed_at = time.perf_counter()
                os.kill(self.pid, 9)


def _status_kb(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return float(line.split()[1])
    raise ProcessLookupError(pid)


class ServerProcess:
    """`sleuthd serve` in a subprocess on a free loopback port; its output goes to ``log`` (a file, so a
    chatty server can never block on a full pipe)."""

    def __init__(self, extra_args: Sequence[str], log: Path, env: dict[str, str] | None = None) -> None:
        cmd = [sys.executable, "-m", "sleuthd.cli", "--log-level", "warning", "serve", "--host", "127.0.0.1",
               "--port", "0", "--metrics-port", "-1", *extra_args]  # fmt: skip
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = log
        self._log_file = log.open("w")
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=self._log_file, text=True, env={**os.environ, **(env or {})}
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("sleuthd listening on "):
            self.stop()
            raise RuntimeError(f"server did not start: {line!r}\n{log.read_text()}")
        self.target = line.split()[-1]
        # Drain the rest of stdout into the log, so the server never blocks writing to it.
        self._drain = threading.Thread(target=self._copy_stdout, daemon=True)
        self._drain.start()

    def _copy_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._log_file.write(line)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log_file.close()


# ---------------------------------------------------------------------------------------------- the run


@dataclass
class OverloadResult:
    clients: int
    seconds: float  # sending time; calls in flight at the end are waited for
    deadline_s: float
    request_mb: float  # size of one request, MiB
    requests: int = 0
    codes: dict[str, int] = field(default_factory=dict)
    ok_per_s: float = 0.0  # goodput: OK answers per second of the run
    audio_s_per_s: float = 0.0  # audio seconds scored (OK answers only) per second of the run
    ok_latency_p50_s: float | None = None
    exhausted_latency_p50_s: float | None = None  # time to RESOURCE_EXHAUSTED
    exhausted_latency_p95_s: float | None = None
    exhausted_latency_max_s: float | None = None
    exhausted_first_latency_p50_s: float | None = None  # of clients' first refusals (not straight after one)
    exhausted_first: int = 0  # how many refusals were such first ones
    health_p50_s: float | None = None  # health checks during the run (every 100 ms, own connection)
    health_max_s: float | None = None
    rss_before_mb: float | None = None  # idle, after one warm-up call
    rss_peak_mb: float | None = None  # sampled every 50 ms during the run
    rss_hwm_mb: float | None = None  # the kernel's high-water mark (VmHWM) over the process's life
    rss_after_mb: float | None = None  # idle, ``settle_s`` after the last call ended
    killed_by_watchdog: bool = False
    killed_after_s: float | None = None  # seconds into the run when the watchdog killed the server
    after_status: str = ""  # what the ``after`` probe returned
    server_details: list[str] = field(default_factory=list)  # distinct non-OK details (first few)
    # The same payload with a deadline far beyond any request, ``capacity_clients`` closed-loop clients, on
    # the same server just before the overload: OK answers per second (the unloaded capacity).
    capacity_clients: int = 0
    capacity_ok_per_s: float | None = None
    goodput_of_capacity: float | None = None  # ok_per_s / capacity_ok_per_s
    # Cores used on average (CPU seconds / wall seconds) in each phase: the server's, and this load generator's,
    # which on a small machine takes CPU the server would otherwise have (2 cores here: the server got about
    # two thirds of what it had unloaded while 48 clients sent ~250 requests of 1.2 MiB a second).
    capacity_server_cores: float | None = None
    server_cores: float | None = None
    client_cores: float | None = None
    # OK answers per server CPU-second under overload, as a share of the same unloaded: how much of the CPU the
    # server got went into answered work (what admission decides), whatever the clients took from the machine.
    goodput_per_cpu_of_capacity: float | None = None
    hoarders: int = 0  # streams buffering a turn they never finish during the overload
    hoarders_ended: dict[str, int] = field(default_factory=dict)  # how each ended: "held to the end" or a code


def _quantile(values: Sequence[float], q: float) -> float | None:
    return float(np.quantile(values, q)) if values else None


@dataclass
class _Calls:
    results: list[tuple[str, float]] = field(default_factory=list)  # (status code name, latency seconds)
    # RESOURCE_EXHAUSTED latencies of calls whose client's previous call was not refused (its first, or after an
    # answer): the server answers these at once; a client that resends straight after "busy" is held
    # (--refusal-hold-seconds), and those are the rest of the refusals.
    first_refusals: list[float] = field(default_factory=list)
    details: dict[str, None] = field(default_factory=dict)  # distinct non-OK details
    health: list[float] = field(default_factory=list)  # health-check latencies, seconds


_NONCES = itertools.count(1)


async def drive(target: str, clients: int, seconds: float, deadline_s: float, requests: RequestBytes) -> _Calls:
    """``clients`` closed-loop clients, each on its own connection, sending for ``seconds``; meanwhile one
    more connection asks for health every 100 ms."""
    limit = 256 * 1024 * 1024
    # A connection per client, as separate clients have (channels of one process share one by default).
    options = [("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit),
               ("grpc.use_local_subchannel_pool", 1)]  # fmt: skip
    calls = _Calls()
    stop_at = time.perf_counter() + seconds
    nonce = _NONCES  # shared by every drive of the process: a second run must not resend the first's audio

    async def client() -> None:
        async with grpc.aio.insecure_channel(target, options=options) as ch:
            check = ch.unary_unary(
                "/sleuthd.v1.Sleuth/CheckDialogue",
                request_serializer=None,
                response_deserializer=pb.DialogueVerdict.FromString,
            )
            code = ""
            while time.perf_counter() < stop_at:
                req = requests.make(next(nonce))
                after_busy = code == "RESOURCE_EXHAUSTED"
                t0 = time.perf_counter()
                try:
                    await check(req, timeout=deadline_s)
                    code = "OK"
                except grpc.aio.AioRpcError as err:
                    code = err.code().name
                    calls.details.setdefault(f"{code}: {err.details()}"[:160])
                calls.results.append((code, time.perf_counter() - t0))
                if code == "RESOURCE_EXHAUSTED" and not after_busy:
                    calls.first_refusals.append(calls.results[-1][1])
                if code == "UNAVAILABLE":
                    await asyncio.sleep(0.1)  # the server is gone (or going): do not spin

    async def health() -> None:
        async with grpc.aio.insecure_channel(target) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                try:
                    await stub.Check(health_pb2.HealthCheckRequest(), timeout=60)
                except grpc.aio.AioRpcError:
                    pass
                calls.health.append(time.perf_counter() - t0)
                await asyncio.sleep(0.1)

    await asyncio.gather(health(), *(client() for _ in range(clients)))
    return calls


async def hoarding_stream(target: str, mib: float, trickle_s: float, stop: asyncio.Event) -> str:
    """A stream (on a connection of its own) that sends ``mib`` of one turn in 1 MiB chunks and never finishes
    it, keeping itself alive with a 2-byte chunk every ``trickle_s`` until ``stop``; how it ended ("held to
    the end", or the status the server ended it with)."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    req = pb.StreamDialogueRequest
    async with grpc.aio.insecure_channel(target, options=options) as ch:
        call = pb_grpc.SleuthStub(ch).StreamDialogue(timeout=3600)
        try:
            await call.write(req(open=pb.StreamOpen(dialogue_id="hoard")))
            await call.write(req(turn_start=pb.TurnStart(turn_id="t", speaker="A")))
            left = mib
            while left > 0:
                await call.write(req(audio=pb.TurnAudio(turn_id="t", data=bytes(int(min(1.0, left) * 2**20)))))
                left -= 1.0
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), trickle_s)
                except TimeoutError:
                    await call.write(req(audio=pb.TurnAudio(turn_id="t", data=b"\x00\x00")))
            ended = "held to the end"
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
            ended = (await call.code()).name
        call.cancel()
        return ended


async def _with_hoarders(
    target: str, hoarders: int, hoard_mib: float, work: Callable[[], Awaitable[_Calls]]
) -> tuple[_Calls, list[str]]:
    """``work()`` while ``hoarders`` streams hoard ``hoard_mib`` each (in place for a second first)."""
    stop = asyncio.Event()
    streams = [asyncio.ensure_future(hoarding_stream(target, hoard_mib, 5.0, stop)) for _ in range(hoarders)]
    if streams:
        await asyncio.sleep(1.0)
    try:
        calls = await work()
    finally:
        stop.set()
    return calls, list(await asyncio.gather(*streams))


async def _warm_up(target: str, turns: Sequence[tuple[str, bytes]]) -> None:
    async with grpc.aio.insecure_channel(target) as ch:
        await pb_grpc.SleuthStub(ch).CheckDialogue(make_request(turns[:2], 0), timeout=120)


def run(
    *,
    clients: int,
    seconds: float,
    deadline_s: float,
    turns: int,
    turn_seconds: float,
    target: str | None = None,
    serve_args: Sequence[str] = (),
    log: Path = Path("runs/overload/server.log"),
    kill_rss_mb: float | None = 6000.0,
    settle_s: float = 5.0,
    after: Callable[[str], str] | None = None,
    capacity_clients: int = 0,
    capacity_seconds: float = 0.0,
    hoarders: int = 0,
    hoard_mib: float = 0.0,
    env: dict[str, str] | None = None,
) -> OverloadResult:
    """One overload run; starts (and stops) a server unless ``target`` is given (then RSS is not measured).
    ``after(target)``, if given, runs once the clients have stopped; what it returns is ``after_status``.
    With ``capacity_clients``, the unloaded capacity is measured first on the same server (same payload,
    no deadline pressure, ``capacity_seconds``); with ``hoarders``, that many streams each hold
    ``hoard_mib`` of a turn they never finish throughout the overload. ``env``: more of the server's environment."""
    audio = long_turns(turns, turn_seconds)
    requests = RequestBytes(audio)
    result = OverloadResult(clients, seconds, deadline_s, len(requests.template) / 2**20)
    result.capacity_clients, result.hoarders = capacity_clients, hoarders
    server = ServerProcess(serve_args, log, env) if target is None else None
    sampler = RssSampler(server.proc.pid, kill_mb=kill_rss_mb) if server else None
    try:
        addr = server.target if server else target
        assert addr is not None
        asyncio.run(_warm_up(addr, audio))
        cpu = (lambda: cpu_seconds(server.proc.pid)) if server else None
        if capacity_clients:
            cpu0, wall0 = cpu() if cpu else 0.0, time.perf_counter()
            unloaded = asyncio.run(drive(addr, capacity_clients, capacity_seconds, 600.0, requests))
            result.capacity_ok_per_s = sum(code == "OK" for code, _ in unloaded.results) / capacity_seconds
            if cpu:
                result.capacity_server_cores = (cpu() - cpu0) / (time.perf_counter() - wall0)
        if sampler:
            result.rss_before_mb = sampler.rss_mb()
            sampler.reset_peak()
            sampler.start()
        started = time.perf_counter()
        cpu0, mine0 = cpu() if cpu else 0.0, time.process_time()
        calls, result_hoarders = asyncio.run(
            _with_hoarders(addr, hoarders, hoard_mib, lambda: drive(addr, clients, seconds, deadline_s, requests))
        )
        result.hoarders_ended = dict(Counter(result_hoarders))
        wall = time.perf_counter() - started
        result.client_cores = (time.process_time() - mine0) / wall
        if cpu:
            result.server_cores = (cpu() - cpu0) / wall
        result.server_details = list(calls.details)[:8]
        result.requests = len(calls.results)
        result.codes = dict(Counter(code for code, _ in calls.results).most_common())
        ok = [s for code, s in calls.results if code == "OK"]
        exhausted = [s for code, s in calls.results if code == "RESOURCE_EXHAUSTED"]
        result.health_p50_s = _quantile(calls.health, 0.5)
        result.health_max_s = max(calls.health) if calls.health else None
        result.ok_per_s = len(ok) / wall
        if result.capacity_ok_per_s:
            result.goodput_of_capacity = result.ok_per_s / result.capacity_ok_per_s
            if result.server_cores and result.capacity_server_cores:
                result.goodput_per_cpu_of_capacity = (result.ok_per_s / result.server_cores) / (
                    result.capacity_ok_per_s / result.capacity_server_cores
                )
        result.audio_s_per_s = len(ok) * turns * turn_seconds / wall
        result.ok_latency_p50_s = _quantile(ok, 0.5)
        result.exhausted_latency_p50_s = _quantile(exhausted, 0.5)
        result.exhausted_latency_p95_s = _quantile(exhausted, 0.95)
        result.exhausted_latency_max_s = max(exhausted) if exhausted else None
        result.exhausted_first_latency_p50_s = _quantile(calls.first_refusals, 0.5)
        result.exhausted_first = len(calls.first_refusals)
        if sampler and server:
            time.sleep(settle_s)
            result.killed_by_watchdog = sampler.killed
            if sampler.killed_at is not None:
                result.killed_after_s = sampler.killed_at - started
            if server.proc.poll() is None:
                result.rss_after_mb = sampler.rss_mb()
                result.rss_hwm_mb = sampler.hwm_mb()
            result.rss_peak_mb = sampler.peak_mb
        if after is not None:
            result.after_status = after(addr)
    finally:
        if sampler:
            sampler.stop()
        if server:
            server.stop()
    return result


def table(r: OverloadResult) -> str:
    def f(x: float | None, spec: str = ".2f") -> str:
        return "-" if x is None else format(x, spec)

    return "\n".join(
        [
            f"clients {r.clients}, {r.seconds:g} s, deadline {r.deadline_s:g} s, request {r.request_mb:.2f} MiB",
            f"requests {r.requests}: " + ", ".join(f"{k} {v}" for k, v in r.codes.items()),
            f"goodput {r.ok_per_s:.2f} OK/s ({r.audio_s_per_s:.1f} audio s/s), OK p50 {f(r.ok_latency_p50_s)} s"
            + (
                f"; unloaded capacity {f(r.capacity_ok_per_s)} OK/s ({r.capacity_clients} clients), goodput "
                f"{f(r.goodput_of_capacity)} of it"
                if r.capacity_clients
                else ""
            )
            + (f"; {r.hoarders} hoarding streams: {r.hoarders_ended}" if r.hoarders else ""),
            f"time to RESOURCE_EXHAUSTED p50 {f(r.exhausted_latency_p50_s, '.3f')} s, "
            f"p95 {f(r.exhausted_latency_p95_s, '.3f')} s, max {f(r.exhausted_latency_max_s, '.3f')} s; "
            f"of the {r.exhausted_first} not straight after a refusal, "
            f"p50 {f(r.exhausted_first_latency_p50_s, '.3f')} s",
            f"health check p50 {f(r.health_p50_s, '.3f')} s, max {f(r.health_max_s, '.3f')} s",
            f"cores: server {f(r.server_cores)} (unloaded {f(r.capacity_server_cores)}), these clients "
            f"{f(r.client_cores)}; goodput per server CPU-second {f(r.goodput_per_cpu_of_capacity)} of unloaded",
            f"server RSS before {f(r.rss_before_mb, '.0f')} MB, peak {f(r.rss_peak_mb, '.0f')} MB "
            f"(VmHWM {f(r.rss_hwm_mb, '.0f')}), after {f(r.rss_after_mb, '.0f')} MB"
            + (f" [killed by the watchdog {r.killed_after_s:.1f} s in]" if r.killed_after_s is not None else ""),
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64, help="concurrent clients, one connection each (64)")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the clients send (30)")
    parser.add_argument("--deadline", type=float, default=5.0, help="deadline of each call, seconds (5)")
    parser.add_argument("--turns", type=int, default=4, help="turns per dialogue (4)")
    parser.add_argument("--turn-seconds", type=float, default=30.0, help="seconds of audio per turn (30)")
    parser.add_argument("--target", help="HOST:PORT of a running server (then server RSS is not measured)")
    parser.add_argument(
        "--serve-args", default=os.environ.get("SLEUTHD_SERVE_ARGS", ""), help="extra `sleuthd serve` flags"
    )
    parser.add_argument("--kill-rss-mb", type=float, default=6000.0, help="watchdog: kill the server above this")
    parser.add_argument("--settle", type=float, default=5.0, help="idle seconds before the RSS after the run")
    parser.add_argument("--log", type=Path, default=Path("runs/overload/server.log"), help="the server's output")
    parser.add_argument("--capacity-clients", type=int, default=2, help="clients measuring capacity first (0: no)")
    parser.add_argument("--capacity-seconds", type=float, default=30.0, help="how long capacity is measured (30)")
    parser.add_argument("--hoarders", type=int, default=0, help="streams hoarding a turn during the run (0)")
    parser.add_argument("--hoard-mib", type=float, default=16.0, help="what each hoarding stream buffers, MiB")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    result = run(
        clients=args.clients,
        seconds=args.seconds,
        deadline_s=args.deadline,
        turns=args.turns,
        turn_seconds=args.turn_seconds,
        target=args.target,
        serve_args=shlex.split(args.serve_args),
        log=args.log,
        kill_rss_mb=args.kill_rss_mb,
        settle_s=args.settle,
        capacity_clients=args.capacity_clients,
        capacity_seconds=args.capacity_seconds,
        hoarders=args.hoarders,
        hoard_mib=args.hoard_mib,
    )
    print(table(result))
    for line in result.server_details:
        print("  " + line)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(asdict(result), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
