"""`sleuthd-bench side-by-side`: server configurations (or checkouts) measured in one run, in alternating rounds.

On a shared machine whose load moves by 2-3x within minutes, two benchmark runs minutes apart cannot be
compared. Here every variant is measured once per round, the rounds alternate, and the median over rounds
is reported with each variant's ratio to the first: the load's drift falls on all variants alike.

A variant is ``NAME=SERVE ARGS`` (``sleuthd serve`` flags, shell-quoted, e.g. ``"threads1=--intra-op-threads
1 --max-concurrent-batches 2"``), optionally with its own code: ``--checkout NAME=DIR`` runs that variant's
server from another checkout's ``service/`` (e.g. main's, for before/after figures). Per round, per variant and
encoder: one server (embedding cache off), closed-loop CheckDialogue clients at each concurrency (the
``throughput`` command's dialogues and driver: audio-s/s, p50, p99), then, if asked, one stream of
``--stream-turns`` 3 s turns (the ``latency`` command's: median verdict latency of its last 10 turns).
With ``--beside-check N``, the stream is run once more on a server of its own (embedding cache on) while another
client sends CheckDialogue of N cached turns (the ``latency`` command's) back to back: what a long dialogue's
judging does to the streamed turns beside it (median, 90th percentile and worst turn; checks answered a second).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

from sleuthd_bench import latency, throughput


@dataclass(frozen=True)
class Variant:
    name: str
    serve_args: tuple[str, ...]
    checkout: Path | None = None  # another checkout's product code (its service/ folder), else this one's

    def env(self) -> dict[str, str] | None:
        if self.checkout is None:
            return None
        theirs = str(self.checkout / "service")
        mine = str(Path(throughput.__file__).resolve().parents[2] / "service")  # never ahead of theirs
        rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in (mine, theirs)]
        return dict(os.environ, PYTHONPATH=os.pathsep.join([theirs, *rest]))


def parse_variants(specs: Sequence[str], checkouts: Sequence[str]) -> list[Variant]:
    """``NAME=ARGS`` specs and ``NAME=DIR`` checkouts -> variants; ValueError says what is wrong."""
    dirs: dict[str, Path] = {}
    for spec in checkouts:
        name, sep, folder = spec.partition("=")
        if not sep or not (Path(folder) / "service" / "sleuthd").is_dir():
            raise ValueError(f"--checkout takes NAME=DIR, DIR a sleuthd checkout (with service/sleuthd); got {spec!r}")
        dirs[name] = Path(folder).resolve()
    out = []
    for spec in specs:
        name, sep, args = spec.partition("=")
        if not sep or not name:
            raise ValueError(f"--variant takes NAME=SERVE ARGS (the args may be empty); got {spec!r}")
        out.append(Variant(name, tuple(shlex.split(args)), dirs.pop(name, None)))
    if dirs:
        raise ValueError(f"--checkout names no variant: {', '.join(dirs)}")
    if len({v.name for v in out}) != len(out) or len(out) < 2:
        raise ValueError("give at least two variants, each with its own name")
    return out


def run(
    variants: Sequence[Variant],
    encoders: Sequence[str],
    concurrency: Sequence[int],
    seconds: float,
    rounds: int,
    stream_turns: int,
    cache_dir: Path,
    dialogues: int,
    progress: Callable[[str], None],
    beside_check: int = 0,
) -> dict[str, Any]:
    convos = throughput.build_dialogues(cache_dir / "throughput", dialogues, seed=7)
    clips = latency.voice_clips(cache_dir / "latency") if stream_turns else {}
    turns = latency.stream_turns(clips, stream_turns, seed=1) if stream_turns else []
    warm = latency.stream_turns(clips, 3, seed=3) if stream_turns else []
    check = latency.check_request(clips, beside_check, seed=2) if beside_check and stream_turns else None
    # samples[variant][encoder][metric] -> one value per round
    samples: dict[str, dict[str, dict[str, list[float]]]] = {v.name: {e: {} for e in encoders} for v in variants}
    loads = [os.getloadavg()[0]]
    for r in range(rounds):
        for encoder in encoders:
            for v in variants:
                server = throughput.ServerProcess([*v.serve_args, "--encoder", encoder], env=v.env())
                try:
                    got = samples[v.name][encoder]
                    for c in concurrency:
                        level, _ = asyncio.run(throughput.drive_server(server.target, convos, c, seconds))
                        if level.errors:
                            raise RuntimeError(f"{v.name} {encoder} c={c}: {level.errors} requests failed")
                        got.setdefault(f"c{c}_audio_s_per_s", []).append(level.audio_seconds_per_second)
                        got.setdefault(f"c{c}_p50_ms", []).append(level.p50_ms)
                        got.setdefault(f"c{c}_p99_ms", []).append(level.p99_ms)
                    if turns:
                        asyncio.run(latency.run_stream(server.target, warm, lambda _: None, "warm-up"))
                        lat = asyncio.run(latency.run_stream(server.target, turns, lambda _: None))["latencies"]
                        got.setdefault("stream_ms", []).append(1e3 * statistics.median(lat[-latency.WINDOW :]))
                finally:
                    server.stop()
                if check is not None:
                    # The check's cost is estimated from its audio (20 minutes of it for 1000 turns), not from the
                    # cache that answers it: let it queue beside the stream rather than be refused.
                    cached = ["--embedding-cache-entries", "4096", "--max-message-mb", "256",
                              "--max-queued-work-seconds", "600"]  # fmt: skip
                    server = throughput.ServerProcess([*v.serve_args, "--encoder", encoder, *cached], env=v.env())
                    try:
                        lat, checks_per_s = asyncio.run(_stream_beside_checks(server.target, warm, turns, check))
                    finally:
                        server.stop()
                    got.setdefault("beside_check_stream_p50_ms", []).append(1e3 * float(np.percentile(lat, 50)))
                    got.setdefault("beside_check_stream_p90_ms", []).append(1e3 * float(np.percentile(lat, 90)))
                    got.setdefault("beside_check_stream_max_ms", []).append(1e3 * max(lat))
                    got.setdefault("beside_checks_per_s", []).append(checks_per_s)
                progress(f"round {r + 1}/{rounds} {encoder} {v.name}: " + ", ".join(
                    f"{k} {vals[-1]:.1f}" for k, vals in got.items()))  # fmt: skip
        loads.append(os.getloadavg()[0])
    medians = {
        v: {e: {k: statistics.median(vals) for k, vals in m.items()} for e, m in by_encoder.items()}
        for v, by_encoder in samples.items()
    }
    return {"variants": {v.name: {"serve_args": list(v.serve_args), "checkout": str(v.checkout or "")}
                         for v in variants},
            "rounds": rounds, "seconds_per_level": seconds, "load_average_per_round": loads,
            "samples": samples, "medians": medians}  # fmt: skip


async def _stream_beside_checks(
    target: str,
    warm: Sequence[tuple[str, bytes]],
    turns: Sequence[tuple[str, bytes]],
    check: pb.CheckDialogueRequest,
) -> tuple[list[float], float]:
    """The stream's turn latencies (seconds) while another client sends ``check`` back to back (its embeddings
    cached first, so what it costs the server is its judging and its message), and the checks answered a second."""
    await latency.run_check(target, check, 0)  # fills the embedding cache
    await latency.run_stream(target, warm, lambda _: None, "warm-up")
    stop = asyncio.Event()

    async def checks() -> int:
        answered = 0
        # A connection of its own (channels of one process share one otherwise): another client, with its own
        # share of the server's audio budget.
        own = [*latency._options(), ("grpc.use_local_subchannel_pool", 1)]
        async with grpc.aio.insecure_channel(target, options=own) as channel:
            stub = pb_grpc.SleuthStub(channel)
            while not stop.is_set():
                await stub.CheckDialogue(check, timeout=600)
                answered += 1
        return answered

    beside = asyncio.ensure_future(checks())
    started = time.perf_counter()
    try:
        lat = (await latency.run_stream(target, turns, lambda _: None))["latencies"]
    finally:
        stop.set()
    answered = await beside
    return lat, answered / (time.perf_counter() - started)


def table(report: Mapping[str, Any]) -> str:
    names = list(report["variants"])
    first = names[0]
    lines = []
    for encoder, metrics in report["medians"][first].items():
        lines += ["", f"**{encoder}** (median of {report['rounds']} rounds; ratio to {first})", "",
                  "| metric | " + " | ".join(names) + " | " + " | ".join(f"{n} / {first}" for n in names[1:]) + " |",
                  "| --- |" + " ---: |" * (2 * len(names) - 1)]  # fmt: skip
        for metric in metrics:
            values = [report["medians"][n][encoder][metric] for n in names]
            ratios = [f"{v / values[0]:.2f}" if values[0] else "-" for v in values[1:]]
            lines.append(f"| {metric} | " + " | ".join(f"{v:.1f}" for v in values) + " | " + " | ".join(ratios) + " |")
    cross = [e for e in report["medians"][first] if e != "ge2e"]
    if "ge2e" in report["medians"][first] and cross:
        lines += [
            "",
            "cost per audio second relative to ge2e's, same variant and level (audio-s/s of ge2e / of it):",
            "",
        ]
        for n in names:
            for e in cross:
                for metric, value in report["medians"][n][e].items():
                    if metric.endswith("audio_s_per_s") and value:
                        ratio = report["medians"][n]["ge2e"][metric] / value
                        lines.append(f"- {n}: {e} {metric.split('_')[0]}: {ratio:.2f}x")
    loads = ", ".join(f"{x:.1f}" for x in report["load_average_per_round"])
    lines += ["", f"load average (1 min) at the start and after each round: {loads}; {os.cpu_count()} CPUs"]
    return "\n".join(lines).lstrip("\n")


def main_args(args: Any, progress: Callable[[str], None]) -> dict[str, Any]:
    variants = parse_variants(args.variant or [], args.checkout or [])
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if not levels or min(levels) < 1:
        raise ValueError("--concurrency takes positive integers, e.g. 1,32")
    encoders = [e.strip() for e in args.encoders.split(",") if e.strip()]
    if args.beside_check and not args.stream_turns:
        raise ValueError("--beside-check measures the stream beside the checks: give --stream-turns too")
    return run(variants, encoders, levels, args.seconds, args.rounds, args.stream_turns, args.cache,
               args.dialogues, progress, args.beside_check)  # fmt: skip


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run it as `sleuthd-bench side-by-side`")
