"""`sleuthd-bench throughput`: audio-seconds scored per second and latency, three ways, in one run.

Modes, on the same real (synthetic-voice) dialogues of 5 turns x 2-6 s:

- ``resemblyzer``: what a user would do instead: resemblyzer's ``VoiceEncoder`` in-process (torch,
  CPU) scoring one dialogue at a time (``preprocess_wav`` + ``embed_utterance`` per turn, then pairwise
  cosines); at concurrency c, c clients queue for that one encoder;
- ``unbatched``: our server with model calls of one window each (``--max-batch-windows 1
  --max-wait-ms 0``, as many model calls in flight as there are cores): no batching at all;
- ``per_clip``: our server with ``--batching off``: each clip's windows in one model call but nothing
  shared across clips or requests (how resemblyzer batches inside one utterance), for reference;
- ``batched``: our server with the micro-batcher on (default knobs);
- ``triton``: our server with ``--encoder-backend triton``: the windows go to a real Triton server (the
  nvidia-pytriton wheel's, started here on loopback with ``sleuthd models triton-repo --python-backend``:
  Triton's dynamic batcher in front of the same ONNX files in ONNX Runtime), on the same machine.

Both servers run as subprocesses with the embedding cache off (every request is scored from scratch)
and are driven through real gRPC channels by ``concurrency`` closed-loop workers for a fixed time per
level. Results: audio seconds scored per wall second, per-dialogue latency percentiles, errors, and
the ratios batched/unbatched and batched/resemblyzer measured side by side. Also checked: batched and
unbatched scores agree (max |difference| of per-turn pairwise cosines).
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import platform
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import soundfile as sf
from sleuthd.api import SpeakerEncoder
from sleuthd.config import default_models_dir
from sleuthd.encoders.manifest import read_card
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

from sleuthd_bench import synth
from sleuthd_bench.footprint import Footprint
from sleuthd_bench.model_rate import model_rate

logger = logging.getLogger(__name__)

MODES = ("resemblyzer", "unbatched", "per_clip", "batched", "triton")
# The server flags of each mode (the same server, configured three ways).
SERVER_MODES = {
    "unbatched": ["--max-batch-windows", "1", "--max-wait-ms", "0", "--max-concurrent-batches", str(os.cpu_count())],
    "per_clip": ["--batching", "off"],
    "batched": [],
    "triton": [],  # + --encoder-backend triton --triton-url of the Triton started for it (TritonForBench)
}
TURNS = 5


@dataclass(frozen=True)
class Dialogue:
    turns: tuple[bytes, ...]  # 16 kHz mono WAV files
    audio_seconds: float


@dataclass(frozen=True)
class LevelResult:
    audio_seconds_per_second: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    errors: int
    dialogues: int
    wall_seconds: float
    # What the serving processes used meanwhile (sleuthd_bench.footprint): cores on average, peak resident MiB.
    server_cores: float | None = None
    server_rss_peak_mib: float | None = None
    triton_cores: float | None = None  # the triton mode: Triton and its model processes
    triton_rss_peak_mib: float | None = None
    error_codes: dict[str, int] | None = None  # our server's errors by gRPC status (a count alone hid why)
    replica_cores: list[float] | None = None  # with --replicas: each server process's cores (is the load spread?)

    @property
    def turns_per_second(self) -> float:
        return self.dialogues * TURNS / self.wall_seconds if self.wall_seconds > 0 else 0.0


def build_dialogues(cache_dir: Path, n_dialogues: int, seed: int) -> list[Dialogue]:
    """``n_dialogues`` dialogues of 5 turns, each turn 2-6 s of one synthetic voice (cached on disk)."""
    rng = random.Random(seed)
    voices = [v for v in synth.catalogue() if v.family in ("espeak", "flite")]
    texts = synth.sentences(n_dialogues * TURNS, seed)
    dialogues = []
    for d in range(n_dialogues):
        voice = voices[d % len(voices)]
        turns = []
        for t in range(TURNS):
            path = cache_dir / f"{d:03d}-{t}.wav"
            length = rng.uniform(2.0, 6.0)
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                full = cache_dir / f"{d:03d}-{t}.full.wav"
                synth.synthesize(voice, texts[d * TURNS + t], full)
                samples, rate = sf.read(full, dtype="float32")
                sf.write(path, samples[: int(length * rate)], rate, subtype="PCM_16")
                full.unlink()
            turns.append(path.read_bytes())
        seconds = sum(sf.info(io.BytesIO(b)).duration for b in turns)
        dialogues.append(Dialogue(tuple(turns), seconds))
    return dialogues


def _percentiles(latencies_s: Sequence[float]) -> tuple[float, float, float]:
    if not latencies_s:
        return (float("nan"),) * 3
    p = np.percentile(np.asarray(latencies_s) * 1000.0, [50, 95, 99])
    return float(p[0]), float(p[1]), float(p[2])


def _level(audio: float, latencies: list[float], errors: int, wall: float) -> LevelResult:
    p50, p95, p99 = _percentiles(latencies)
    return LevelResult(audio / wall if wall > 0 else 0.0, p50, p95, p99, errors, len(latencies), wall)


# ------------------------------------------------------------------------------------------ baseline


def run_resemblyzer(dialogues: Sequence[Dialogue], concurrency: int, seconds: float) -> LevelResult:
    """``concurrency`` client threads share one in-process resemblyzer encoder that scores one dialogue
    at a time (a lock), for ``seconds``; latency includes the wait for the encoder."""
    from resemblyzer import VoiceEncoder, preprocess_wav

    encoder = VoiceEncoder("cpu", verbose=False)

    def score(d: Dialogue) -> np.ndarray:
        embs = []
        for wav in d.turns:
            samples, rate = sf.read(io.BytesIO(wav), dtype="float32")
            embs.append(encoder.embed_utterance(preprocess_wav(samples, source_sr=rate)))
        e = np.stack(embs)
        sims = e @ e.T
        return (sims.sum(1) - 1.0) / (len(e) - 1)

    score(dialogues[0])  # warm-up
    one_at_a_time = threading.Lock()
    stop_at = time.perf_counter() + seconds
    latencies: list[float] = []
    audio = 0.0
    errors = 0

    def worker(offset: int) -> None:
        nonlocal audio, errors
        k = offset
        while time.perf_counter() < stop_at:
            d = dialogues[k % len(dialogues)]
            t0 = time.perf_counter()
            try:
                with one_at_a_time:
                    score(d)
            except Exception:  # counted, not hidden: the run reports its errors
                logger.exception("resemblyzer failed")
                errors += 1
            else:
                latencies.append(time.perf_counter() - t0)
                audio += d.audio_seconds
            k += concurrency

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, range(concurrency)))
    return _level(audio, latencies, errors, time.perf_counter() - start)


# ------------------------------------------------------------------------------------------ our server


CALLS_PER_CONNECTION = 64  # closed-loop workers per client connection (below the server's 100 per connection)


def request_for(d: Dialogue, k: int) -> pb.CheckDialogueRequest:
    req = pb.CheckDialogueRequest(dialogue_id=f"bench-{k}", options=pb.CheckOptions(method=pb.METHOD_PAIRWISE))
    for t, wav in enumerate(d.turns):
        req.turns.add(turn_id=f"t{t}", speaker="S", audio=pb.Audio(encoded=wav))
    return req


async def drive_server(
    target: str, dialogues: Sequence[Dialogue], concurrency: int, seconds: float
) -> tuple[LevelResult, dict[int, list[float]]]:
    """Closed loop: ``concurrency`` workers each send one CheckDialogue at a time for ``seconds``.

    Returns the level result and, per dialogue index, the per-turn pairwise scores last seen."""
    requests = [request_for(d, k) for k, d in enumerate(dialogues)]
    scores: dict[int, list[float]] = {}
    latencies: list[float] = []
    audio = 0.0
    errors = 0
    codes: dict[str, int] = {}
    # One connection per CALLS_PER_CONNECTION workers: the server lets one connection have 100 calls open
    # (--max-streams-per-connection), and 128 workers on one channel met RST_STREAM (REFUSED_STREAM, reported
    # as UNAVAILABLE) on a GPU. Each channel its own connection (channels of one process share one by default).
    options: list[tuple[str, int | str]] = [
        ("grpc.max_send_message_length", 64 << 20),
        ("grpc.use_local_subchannel_pool", 1),
    ]
    if target.startswith("ipv4:"):  # several replicas: each channel sends its calls to the next one, round robin
        options.append(("grpc.service_config", json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})))
    channels = [
        grpc.aio.insecure_channel(target, options=options) for _ in range(-(-concurrency // CALLS_PER_CONNECTION))
    ]
    try:
        stubs = [pb_grpc.SleuthStub(ch) for ch in channels]
        for stub in stubs:
            await stub.CheckDialogue(requests[0], timeout=120)  # warm-up
        stop_at = time.perf_counter() + seconds

        async def worker(offset: int) -> None:
            nonlocal audio, errors
            k = offset
            stub = stubs[offset % len(stubs)]
            while time.perf_counter() < stop_at:
                i = k % len(requests)
                t0 = time.perf_counter()
                try:
                    v = await stub.CheckDialogue(requests[i], timeout=300)
                except grpc.aio.AioRpcError as exc:
                    errors += 1
                    codes[exc.code().name] = codes.get(exc.code().name, 0) + 1
                    logger.warning("request failed: %s %s", exc.code().name, exc.details())
                else:
                    latencies.append(time.perf_counter() - t0)
                    audio += dialogues[i].audio_seconds
                    scores[i] = [t.pairwise_mean_cosine for t in v.turns]
                k += concurrency

        start = time.perf_counter()
        await asyncio.gather(*(worker(o) for o in range(concurrency)))
        wall = time.perf_counter() - start
    finally:
        for ch in channels:
            await ch.close()
    return replace(_level(audio, latencies, errors, wall), error_codes=codes), scores


class ServerProcess:
    """`sleuthd serve` in a subprocess on a free loopback port."""

    def __init__(self, extra_args: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        """``env``: the server's environment (e.g. another checkout's PYTHONPATH); None inherits ours."""
        cmd = [sys.executable, "-m", "sleuthd.cli", "--log-level", "warning", "serve", "--port", "0",
               "--metrics-port", "-1", "--embedding-cache-entries", "0", *extra_args]  # fmt: skip
        # stderr goes to a file, never a pipe left unread (the server's log would fill it); stdout says the port.
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("sleuthd listening on "):
            self.log.seek(0)
            raise RuntimeError(f"server did not start: {line}{self.log.read()}")
        self.target = line.split()[-1]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def start_servers(extra_args: Sequence[str], replicas: int) -> list[ServerProcess]:
    """``replicas`` servers started side by side (a GPU server loads and warms up for seconds); all or none."""
    with ThreadPoolExecutor(replicas) as pool:
        futures = [pool.submit(ServerProcess, extra_args) for _ in range(replicas)]
    started = [f.result() for f in futures if f.exception() is None]
    failed = [f.exception() for f in futures if f.exception() is not None]
    if failed:
        for server in started:
            server.stop()
        raise failed[0]  # type: ignore[misc]
    return started


class TritonForBench:
    """A Triton server for the ``triton`` mode: the models folder's encoders as a --python-backend repository
    (written by `sleuthd models triton-repo`, the product's command), served on loopback."""

    def __init__(self, models_dir: Path) -> None:
        import tempfile

        from sleuthd_bench import tritonserver

        self.workdir = Path(tempfile.mkdtemp(prefix="sleuthd-bench-triton-"))
        repo = self.workdir / "repo"
        subprocess.run([sys.executable, "-m", "sleuthd.cli", "models", "triton-repo", str(repo), "--python-backend",
                        "--models-dir", str(models_dir)], check=True, capture_output=True, timeout=300)  # fmt: skip
        self.server = tritonserver.start(repo, startup_timeout_s=120, workdir=self.workdir)

    def flags(self) -> list[str]:
        return ["--encoder-backend", "triton", "--triton-url", self.server.url]

    def stop(self) -> None:
        import shutil

        self.server.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)


# ------------------------------------------------------------------------------------------ the run


RAW_BATCHES = (1, 4, 8, 16, 32, 64)


def raw_model(encoder: str, device: str, seconds: float, dialogues: Sequence[Dialogue]) -> dict[str, Any]:
    """The encoder's model alone (sleuthd_bench.model_rate) at each batch size, and its best rate in audio
    seconds of ``dialogues`` per second: windows/s over the windows these very dialogues make per second
    of their audio (counted by embedding them once through sleuthd.api, which trims silence exactly as the
    server does). The fusion runs every component on the same audio, so its ceiling is 1 / (sum of 1 /
    each component's)."""
    models = default_models_dir()
    names = list(read_card("fused")["components"]) if encoder == "fused" else [encoder]
    audio = [t for d in dialogues for t in d.turns]
    total_seconds = sum(d.audio_seconds for d in dialogues)
    parts: dict[str, dict[str, Any]] = {}
    for name in names:
        rates = model_rate(name, RAW_BATCHES, seconds, models, "cuda" if device == "cuda" else "cpu")
        api = SpeakerEncoder.load(models, encoder=name, device="cuda" if device == "cuda" else "cpu")
        try:
            clips = api.embed_sync(audio)
        finally:
            api.close()
        windows = sum(len(c.window_embeddings) for c in clips if c.window_embeddings is not None)
        per_second = windows / total_seconds
        best = max(rates, key=lambda b: rates[b])
        parts[name] = {
            "windows_per_second": {str(b): r for b, r in rates.items()},
            "best_batch": best,
            "windows_per_audio_second": per_second,
            "audio_seconds_per_second": rates[best] / per_second,
        }
    ceiling = 1.0 / sum(1.0 / p["audio_seconds_per_second"] for p in parts.values())
    return {"components": parts, "audio_seconds_per_second": ceiling}


def run(
    concurrency: Sequence[int],
    seconds: float,
    n_dialogues: int,
    cache_dir: Path,
    device: str,
    server_args: Sequence[str],
    progress: Callable[[str], None],
    modes: Sequence[str] = MODES,
    encoder: str = "ge2e",
    replicas: int = 1,
) -> dict[str, Any]:
    """One encoder's throughput in every mode, and its raw model rate measured in the same run.

    ``replicas``: server processes per mode, the clients' calls spread over them round robin (the way to use a
    machine whose one server process is bound by its own host threads, docs/deploy.md); their cores and peak
    memory are reported summed."""
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1; got {replicas}")
    unknown = [m for m in modes if m not in MODES]
    if unknown or "batched" not in modes:
        raise ValueError(f"modes must include batched and come from {', '.join(MODES)}; got {', '.join(modes)}")
    if encoder != "ge2e" and "resemblyzer" in modes:
        modes = [m for m in modes if m != "resemblyzer"]  # resemblyzer is GE2E: no baseline for other encoders
    dialogues = build_dialogues(cache_dir, n_dialogues, seed=7)
    total_audio = sum(d.audio_seconds for d in dialogues)
    progress(f"{len(dialogues)} dialogues of {TURNS} turns, {total_audio:.0f} s of audio in all")
    results: dict[str, dict[str, LevelResult]] = {m: {} for m in MODES if m in modes}
    agreement: dict[str, float] = {}
    load_start = os.getloadavg()
    progress(f"{encoder}: raw model rate at batch {', '.join(map(str, RAW_BATCHES))} ...")
    raw = raw_model(encoder, device, min(seconds, 3.0), dialogues)
    server_args = [*server_args, "--encoder", encoder]
    if "resemblyzer" in modes:
        for c in concurrency:
            progress(f"resemblyzer, concurrency {c} ...")
            results["resemblyzer"][str(c)] = run_resemblyzer(dialogues, c, seconds)
    mode_scores: dict[str, dict[int, list[float]]] = {}
    for mode, flags in SERVER_MODES.items():
        if mode not in modes:
            continue
        triton = TritonForBench(default_models_dir()) if mode == "triton" else None
        if triton is not None:
            flags = triton.flags()
        try:
            servers = start_servers([*flags, "--device", device, *server_args], replicas)
        except BaseException:
            if triton is not None:
                triton.stop()
            raise
        target = servers[0].target if replicas == 1 else "ipv4:" + ",".join(s.target for s in servers)
        try:
            merged: dict[int, list[float]] = {}
            for c in concurrency:
                progress(f"{mode} server{'s' if replicas > 1 else ''}, concurrency {c} ...")
                watched = {f"server{k}": s.proc.pid for k, s in enumerate(servers)}
                if triton is not None and triton.server.process is not None:
                    watched["triton"] = triton.server.process.pid
                with Footprint(watched) as footprint:
                    level, scores = asyncio.run(drive_server(target, dialogues, c, seconds))
                used = footprint.fields()
                results[mode][str(c)] = replace(
                    level,
                    server_cores=round(sum(used[f"server{k}_cores"] for k in range(replicas)), 3),
                    server_rss_peak_mib=round(sum(used[f"server{k}_rss_peak_mib"] for k in range(replicas)), 1),
                    replica_cores=[used[f"server{k}_cores"] for k in range(replicas)] if replicas > 1 else None,
                    triton_cores=used.get("triton_cores"),
                    triton_rss_peak_mib=used.get("triton_rss_peak_mib"),
                )
                merged.update(scores)
            mode_scores[mode] = merged
        finally:
            for server in servers:
                server.stop()
            if triton is not None:
                triton.stop()
    for other in ("unbatched", "triton"):
        common = sorted(set(mode_scores["batched"]) & set(mode_scores.get(other, {})))
        if common:
            diff = max(
                float(np.max(np.abs(np.subtract(mode_scores["batched"][i], mode_scores[other][i])))) for i in common
            )
            agreement[f"{other}_dialogues_compared"] = float(len(common))
            agreement[f"{other}_max_abs_pairwise_cosine_difference"] = diff
    ratios = {
        str(c): {
            f"batched_over_{other}": _ratio(results["batched"][str(c)], results[other][str(c)])
            for other in results
            if other != "batched"
        }
        | {
            "batched_over_raw_model": results["batched"][str(c)].audio_seconds_per_second
            / raw["audio_seconds_per_second"]
        }
        | {
            # Latency: how much longer the other mode's median request took than batched's.
            f"p50_{other}_over_batched": results[other][str(c)].p50_ms / results["batched"][str(c)].p50_ms
            for other in results
            if other != "batched"
        }
        for c in concurrency
    }
    return {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "device": device,
            "load_average_start": load_start,
            "load_average_end": os.getloadavg(),
        },
        "encoder": encoder,
        "replicas": replicas,
        "raw_model": raw,
        "dialogues": len(dialogues),
        "turns_per_dialogue": TURNS,
        "seconds_per_level": seconds,
        "modes": {
            m: {c: asdict(r) | {"turns_per_second": r.turns_per_second} for c, r in levels.items()}
            for m, levels in results.items()
        },
        "ratios": ratios,
        "agreement_batched_vs_unbatched": agreement,
    }


def _ratio(a: LevelResult, b: LevelResult) -> float:
    return a.audio_seconds_per_second / b.audio_seconds_per_second if b.audio_seconds_per_second else float("nan")


def table(report: dict[str, Any]) -> str:
    modes = report["modes"]
    lines = [
        "| mode | concurrency | audio s / s | turns / s | p50 ms | p95 ms | p99 ms | errors | dialogues "
        "| server cores | server RSS peak MiB | Triton cores | Triton RSS peak MiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def cell(value: float | None, digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    def errors(r: dict) -> str:
        codes = r.get("error_codes") or {}
        return f"{r['errors']}" + (f" ({', '.join(f'{k} {v}' for k, v in sorted(codes.items()))})" if codes else "")

    for mode in MODES:
        for c, r in modes.get(mode, {}).items():
            lines.append(
                f"| {mode} | {c} | {r['audio_seconds_per_second']:.1f} | {r.get('turns_per_second', 0):.1f} "
                f"| {r['p50_ms']:.0f} | {r['p95_ms']:.0f} | {r['p99_ms']:.0f} | {errors(r)} | {r['dialogues']} "
                f"| {cell(r.get('server_cores'), 2)} | {cell(r.get('server_rss_peak_mib'), 0)} "
                f"| {cell(r.get('triton_cores'), 2)} | {cell(r.get('triton_rss_peak_mib'), 0)} |"
            )
    others = [m for m in MODES if m in modes and m != "batched"]
    raw = report["raw_model"]
    lines[:0] = [
        f"encoder {report['encoder']}: raw model "
        + ", ".join(
            f"{name} {p['audio_seconds_per_second']:.1f} audio s/s at batch {p['best_batch']}"
            for name, p in raw["components"].items()
        )
        + (f" (together {raw['audio_seconds_per_second']:.1f})" if len(raw["components"]) > 1 else "")
        + "; the model alone, no decoding, VAD, queueing or gRPC"
        + (
            f"; {report['replicas']} server processes per mode, cores and RSS summed"
            if report.get("replicas", 1) > 1
            else ""
        ),
        "",
    ]
    lines += [
        "",
        "| concurrency | "
        + " | ".join(f"batched / {m} (audio s/s)" for m in others)
        + " | batched / raw model | "
        + " | ".join(f"p50 {m} / batched" for m in others)
        + " |",
        "| ---: |" + " ---: |" * (2 * len(others) + 1),
    ]
    for c, r in report["ratios"].items():
        cells = (
            [f"{r[f'batched_over_{m}']:.2f}x" for m in others]
            + [f"{r['batched_over_raw_model']:.2f}"]
            + [f"{r[f'p50_{m}_over_batched']:.2f}x" for m in others]
        )
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    agreement = report.get("agreement_batched_vs_unbatched") or {}
    for other in ("unbatched", "triton"):
        if f"{other}_dialogues_compared" in agreement:
            lines.append(
                f"\nbatched vs {other}: max |Δ pairwise cosine| = "
                f"{agreement[f'{other}_max_abs_pairwise_cosine_difference']:.2e} "
                f"over {int(agreement[f'{other}_dialogues_compared'])} dialogues"
            )
    machine = report["machine"]
    if "load_average_start" in machine:
        lines.append(
            f"load average at start {machine['load_average_start'][0]:.1f}, at end {machine['load_average_end'][0]:.1f}"
        )
    return "\n".join(lines)


def write_json(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
