"""`sleuthd-bench latency`: what one more turn costs in a long dialogue, and what judging costs, through
the real server.

Two measurements against one `sleuthd serve` subprocess (or ``--target``, an already running server):

- ``stream``: one StreamDialogue of two synthetic voices taking turns, 3 s per turn, method auto. Each
  turn (turn_start and three audio chunks) is sent after the previous turn's own verdict arrived; its
  latency is from writing its final chunk to reading its verdict. Every turn's audio is distinct (a
  one-LSB dither on a pool of real clips), so every turn is really embedded. Reported: the median of
  the 10 turns that end at each checkpoint, revisions sent, and the server's resident memory per turn.
- ``check``: CheckDialogue of N turns (1.2 s of 8 kHz PCM each, so 1000 turns fit in one message)
  whose embeddings are already cached (the request is sent once before timing). Reported: the RPC's
  median latency and the server's own judging time, which the server logs at debug level.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import logging
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import soundfile as sf
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

from sleuthd_bench import synth

logger = logging.getLogger(__name__)

VOICES = ("espeak-m3", "espeak-f2")
CLIPS_PER_VOICE = 12
STREAM_SECONDS = 3.0
CHECK_SECONDS = 1.2
CHECK_RATE = 8000
WINDOW = 10  # turns per reported median
_JUDGED = re.compile(r"dialogue '(?P<id>[^']*)': judged (?P<turns>\d+) turns in (?P<ms>[0-9.]+) ms")


def voice_clips(cache_dir: Path) -> dict[str, list[np.ndarray]]:
    """CLIPS_PER_VOICE clips of real synthetic speech per voice, 16 kHz float32 (cached on disk)."""
    texts = synth.sentences(len(VOICES) * CLIPS_PER_VOICE, seed=22)
    out: dict[str, list[np.ndarray]] = {}
    for v, name in enumerate(VOICES):
        voice = synth.get_voice(name)
        clips = []
        for k in range(CLIPS_PER_VOICE):
            path = cache_dir / name / f"{k:02d}.wav"
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                synth.synthesize(voice, texts[v * CLIPS_PER_VOICE + k], path)
            samples, rate = sf.read(path, dtype="float32")
            if rate != 16000:
                raise RuntimeError(f"{path}: expected 16 kHz speech, got {rate} Hz")
            clips.append(samples)
        out[name] = clips
    return out


def _loop_to(samples: np.ndarray, n: int) -> np.ndarray:
    return np.resize(samples, n)  # repeats the clip when it is shorter than asked


def stream_turns(clips: dict[str, list[np.ndarray]], turns: int, seed: int) -> list[tuple[str, bytes]]:
    """(speaker, 3 s 16 kHz WAV) per turn, voices alternating; no two turns have the same bytes."""
    rng = np.random.default_rng(seed)
    out = []
    n = int(STREAM_SECONDS * 16000)
    for k in range(turns):
        voice = VOICES[k % len(VOICES)]
        base = _loop_to(clips[voice][int(rng.integers(CLIPS_PER_VOICE))], n)
        pcm = np.clip(np.round(base * 32767) + rng.integers(-1, 2, n), -32768, 32767).astype(np.int16)
        buf = io.BytesIO()
        sf.write(buf, pcm, 16000, format="WAV", subtype="PCM_16")
        out.append((f"S{k % len(VOICES)}", buf.getvalue()))
    return out


def check_request(clips: dict[str, list[np.ndarray]], turns: int, seed: int) -> pb.CheckDialogueRequest:
    """CheckDialogue of ``turns`` distinct 1.2 s turns as 8 kHz s16 PCM."""
    rng = np.random.default_rng(seed)
    req = pb.CheckDialogueRequest(dialogue_id=f"check-{turns}", options=pb.CheckOptions(method=pb.METHOD_AUTO))
    n = int(CHECK_SECONDS * 16000)
    for k in range(turns):
        voice = VOICES[k % len(VOICES)]
        base = _loop_to(clips[voice][int(rng.integers(CLIPS_PER_VOICE))], n)[::2]  # 8 kHz (speech is band-limited)
        pcm = np.clip(np.round(base * 32767) + rng.integers(-1, 2, len(base)), -32768, 32767).astype("<i2")
        fmt = pb.PcmAudio(data=pcm.tobytes(), encoding=pb.PCM_S16LE, sample_rate_hz=CHECK_RATE, channels=1)
        req.turns.add(turn_id=f"t{k:04d}", speaker=f"S{k % len(VOICES)}", audio=pb.Audio(pcm=fmt))
    return req


class Server:
    """`sleuthd serve` in a subprocess on a free loopback port, keeping its log lines."""

    def __init__(self, extra_args: Sequence[str]) -> None:
        cmd = [sys.executable, "-m", "sleuthd.cli", "--log-level", "debug", "serve", "--port", "0",
               "--metrics-port", "-1", "--max-message-mb", "256", *extra_args]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        line = self.proc.stdout.readline()
        if not line.startswith("sleuthd listening on "):
            raise RuntimeError(f"server did not start: {line}{self.proc.stderr.read()}")
        self.target = line.split()[-1]
        self.judged: list[tuple[str, int, float]] = []  # (dialogue id, turns, ms) from the server's log
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read_log, args=(self.proc.stderr,), daemon=True)
        self._reader.start()

    def _read_log(self, stream: io.TextIOBase) -> None:
        for line in stream:
            m = _JUDGED.search(line)
            if m:
                with self._lock:
                    self.judged.append((m["id"], int(m["turns"]), float(m["ms"])))

    def judge_ms(self, dialogue_id: str, turns: int | None = None) -> list[float]:
        """Judging times the server logged for ``dialogue_id`` (of ``turns`` turns), in order."""
        with self._lock:
            return [ms for d, n, ms in self.judged if d == dialogue_id and turns in (None, n)]

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _options() -> list[tuple[str, int]]:
    return [("grpc.max_send_message_length", 256 << 20), ("grpc.max_receive_message_length", 256 << 20)]


async def run_stream(
    target: str, turns: Sequence[tuple[str, bytes]], progress: Callable[[str], None], dialogue_id: str = "latency"
) -> dict[str, Any]:
    """Stream ``turns`` one after the other; per-turn latency (seconds) and the revisions received."""
    latencies: list[float] = []
    revisions = 0
    arrived: dict[str, asyncio.Future[float]] = {}
    async with grpc.aio.insecure_channel(target, options=_options()) as ch:
        call = pb_grpc.SleuthStub(ch).StreamDialogue(timeout=3600)
        opts = pb.CheckOptions(method=pb.METHOD_AUTO)
        await call.write(pb.StreamDialogueRequest(open=pb.StreamOpen(dialogue_id=dialogue_id, options=opts)))

        async def read() -> pb.DialogueVerdict:
            nonlocal revisions
            while True:
                msg = await call.read()
                if msg == grpc.aio.EOF:
                    raise RuntimeError("the stream ended before its final verdict")
                if msg.HasField("final"):
                    return msg.final
                if msg.turn.revision:
                    revisions += 1
                else:
                    arrived[msg.turn.verdict.turn_id].set_result(time.perf_counter())

        reader = asyncio.ensure_future(read())
        loop = asyncio.get_running_loop()
        for k, (speaker, wav) in enumerate(turns):
            turn_id = f"t{k:04d}"
            arrived[turn_id] = loop.create_future()
            await call.write(
                pb.StreamDialogueRequest(turn_start=pb.TurnStart(turn_id=turn_id, speaker=speaker, index=k))
            )
            cuts = np.linspace(0, len(wav), 4).astype(int)
            for a, b in itertools.pairwise(cuts[:-1]):
                await call.write(pb.StreamDialogueRequest(audio=pb.TurnAudio(turn_id=turn_id, data=wav[a:b])))
            sent = time.perf_counter()
            await call.write(
                pb.StreamDialogueRequest(audio=pb.TurnAudio(turn_id=turn_id, data=wav[cuts[-2] :], final=True))
            )
            waiting: list[asyncio.Future[Any]] = [arrived[turn_id], reader]
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if reader in done:
                reader.result()  # raises what ended the stream
            latencies.append(arrived[turn_id].result() - sent)
            if (k + 1) % 100 == 0:
                progress(
                    f"  turn {k + 1}: {1e3 * statistics.median(latencies[-WINDOW:]):.1f} ms (median of last {WINDOW})"
                )
        await call.done_writing()
        final = await reader
    if len(final.turns) != len(turns):
        raise RuntimeError(f"final verdict has {len(final.turns)} turns, expected {len(turns)}")
    return {"latencies": latencies, "revisions": revisions}


async def run_check(
    target: str, request: pb.CheckDialogueRequest, repeats: int
) -> tuple[list[float], pb.DialogueVerdict]:
    """Send ``request`` once to fill the embedding cache, then ``repeats`` times; latencies (seconds)."""
    async with grpc.aio.insecure_channel(target, options=_options()) as ch:
        stub = pb_grpc.SleuthStub(ch)
        verdict = await stub.CheckDialogue(request, timeout=3600)
        latencies = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            verdict = await stub.CheckDialogue(request, timeout=3600)
            latencies.append(time.perf_counter() - t0)
    return latencies, verdict


def run(
    checkpoints: Sequence[int],
    check_turns: Sequence[int],
    repeats: int,
    cache_dir: Path,
    target: str | None,
    server_args: Sequence[str],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    clips = voice_clips(cache_dir)
    report: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_average_start": os.getloadavg()},
        "target": target or "subprocess",
    }
    if checkpoints:
        # Its own server with the embedding cache off: every turn's audio is distinct anyway, and the
        # server's memory growth is then the stream's own.
        server = None if target else Server(["--embedding-cache-entries", "0", *server_args])
        try:
            turns = stream_turns(clips, max(checkpoints), seed=1)
            address = target or (server.target if server else "")
            # Warm-up (first model calls, first judging of each feature variant) on a separate stream.
            asyncio.run(run_stream(address, stream_turns(clips, WINDOW, seed=3), lambda _: None, "warm-up"))
            rss_before = server.rss_bytes() if server else 0
            progress(f"stream: {len(turns)} turns of {STREAM_SECONDS:.0f} s, two voices, method auto ...")
            streamed = asyncio.run(run_stream(address, turns, progress))
            lat = streamed["latencies"]
            judged = server.judge_ms("latency") if server else []
            report["stream"] = {
                "turn_seconds": STREAM_SECONDS,
                "median_ms_of_last_10": {
                    str(c): 1e3 * statistics.median(lat[max(c - WINDOW, 0) : c]) for c in checkpoints if c <= len(lat)
                },
                "judge_median_ms_of_last_10": {
                    str(c): statistics.median(judged[max(c - WINDOW, 0) : c]) for c in checkpoints if c <= len(judged)
                },
                "revisions": streamed["revisions"],
                "rss_bytes_per_turn": (server.rss_bytes() - rss_before) / len(turns) if server else None,
            }
        finally:
            if server is not None:
                server.stop()
    if check_turns:
        server = None if target else Server(server_args)
        try:
            report["check"] = {}
            for n in check_turns:
                progress(f"check: {n} cached turns ...")
                request = check_request(clips, n, seed=2)
                latencies, verdict = asyncio.run(
                    run_check(target or (server.target if server else ""), request, repeats)
                )
                if len(verdict.turns) != n:
                    raise RuntimeError(f"CheckDialogue answered {len(verdict.turns)} turns, expected {n}")
                judged = server.judge_ms(request.dialogue_id, n)[-repeats:] if server else []
                report["check"][str(n)] = {
                    "rpc_p50_ms": 1e3 * statistics.median(latencies),
                    "judge_p50_ms": statistics.median(judged) if judged else None,
                }
        finally:
            if server is not None:
                server.stop()
    report["machine"]["load_average_end"] = os.getloadavg()
    return report


def table(report: dict[str, Any]) -> str:
    load = report["machine"]
    lines = [f"load average at start {load['load_average_start'][0]:.1f}, at end {load['load_average_end'][0]:.1f}"]
    stream = report.get("stream")
    if stream:
        medians = stream["median_ms_of_last_10"]
        judged = stream["judge_median_ms_of_last_10"]
        lines += [
            "",
            "| streamed turn | verdict latency ms (median of last 10) | vs first checkpoint | judging ms (server) |",
            "| ---: | ---: | ---: | ---: |",
        ]
        first = next(iter(medians.values()))
        for turn, ms in medians.items():
            judge = f"{judged[turn]:.1f}" if turn in judged else "n/a"
            lines.append(f"| {turn} | {ms:.1f} | {ms / first:.2f}x | {judge} |")
        per_turn = stream["rss_bytes_per_turn"]
        memory = f"; server memory {per_turn / 1024:.1f} KiB per turn" if per_turn is not None else ""
        lines.append(f"\n{stream['revisions']} revisions sent{memory}")
    check = report.get("check")
    if check:
        lines += [
            "",
            "| CheckDialogue turns (cached) | RPC p50 ms | judging p50 ms (server) |",
            "| ---: | ---: | ---: |",
        ]
        for n, r in check.items():
            judge = f"{r['judge_p50_ms']:.1f}" if r["judge_p50_ms"] is not None else "n/a"
            lines.append(f"| {n} | {r['rpc_p50_ms']:.1f} | {judge} |")
    return "\n".join(lines)
