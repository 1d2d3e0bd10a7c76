"""The whole server on a GPU (or, to try it anywhere, the CPU): started by scripts/gpu_check.sh, which sets up
the bare machine's paths first. Numbers for the record (docs/research/gpu/), not a test.

1. The machine: Python, ONNX Runtime and its providers, the GPU, cores, load.
2. Where the time goes, per encoder, on the same real speech: the host's work per audio second (decode,
   resample, loudness, VAD, windows: ``sleuthd.encoders.clips.prepare_placements`` on one thread) against the
   model's (``OnnxEncoder`` as the server builds it: on CUDA every call padded to --max-batch-windows), and, on
   CUDA, parity of the device's embeddings with the CPU's.
3. ``sleuthd-bench throughput`` for each encoder (servers started with ``--device``; the raw model rate in
   the same run): audio-s/s, p50/p99 per dialogue, batched / unbatched, batched / raw model, server cores.
4. ``sleuthd-bench latency``: the streamed 3 s turn's verdict latency (fused default) and CheckDialogue of
   cached turns.
Each step gets what is left of ``--budget-seconds`` (a lent GPU run lasts at most ~8 minutes); a step that
runs out is reported as such and the summary is still written. Output: the steps' own tables, then a
summary, all also under ``--out`` (summary.md, check.json, throughput.json, latency.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def environment(device: str) -> dict[str, Any]:
    import onnxruntime as ort

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "onnxruntime": f"{ort.__version__} ({Path(ort.__file__).parent})",
        "providers": ort.get_available_providers(),
        "device": device,
    }
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
        env["gpu"] = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip()
    return env


def _timed(model: Any, windows: np.ndarray, step: int) -> tuple[float, np.ndarray]:
    """Seconds ``model`` (an OnnxEncoder) takes to embed ``windows`` in calls of ``step``, after a warm-up, and
    the last call's embeddings."""
    model.warm_up()
    t0 = time.perf_counter()
    for i in range(0, len(windows), step):
        emb = model.embed(windows[i : i + step])
    return time.perf_counter() - t0, emb


def where_time_goes(models_dir: Path, speech: Path, device: str, batch: int, dialogues: int) -> dict[str, Any]:
    """Host preparation against the model, per audio second, for each component encoder."""
    from sleuthd.audio.vad import EnergyVad
    from sleuthd.domain import AudioInput
    from sleuthd.encoders.clips import prepare_placements
    from sleuthd.encoders.manifest import load_encoder_manifest
    from sleuthd.encoders.runner import OnnxEncoder

    files = sorted((speech / "throughput").glob("[0-9][0-9][0-9]-[0-9].wav"))
    audios = [AudioInput(data=f.read_bytes()) for f in files if int(f.name[:3]) < dialogues]
    vad = EnergyVad()
    out: dict[str, Any] = {}
    for name in ("ge2e", "campplus"):
        manifest = load_encoder_manifest(models_dir / name)
        prepare_placements(audios[0], manifest, vad, 600.0, (None,))  # imports and first-call costs, untimed
        t0, c0 = time.perf_counter(), time.process_time()
        prepared = [prepare_placements(a, manifest, vad, 600.0, (None,))[0] for a in audios]
        host_wall, host_cpu = time.perf_counter() - t0, time.process_time() - c0
        seconds = sum(p.audio_seconds for p in prepared)
        windows = np.concatenate([p.windows for p in prepared if p.windows is not None])
        runner = OnnxEncoder(manifest, device=device, gpu_batch=batch)  # as the server builds it
        step = (
            batch
            if runner.fixed_batch
            else min(batch, manifest.raw.get("batching", {}).get("cpu_max_batch_windows", batch))
        )
        model_wall, emb = _timed(runner, windows, step)
        row = {
            "provider": runner.provider,
            "audio_seconds": round(seconds, 1),
            "windows": len(windows),
            "host_ms_per_audio_s": 1e3 * host_wall / seconds,
            "host_cpu_ms_per_audio_s": 1e3 * host_cpu / seconds,
            "model_ms_per_audio_s": 1e3 * model_wall / seconds,
            "model_batch": step,
        }
        row["host_share"] = row["host_ms_per_audio_s"] / (row["host_ms_per_audio_s"] + row["model_ms_per_audio_s"])
        if runner.provider != "CPUExecutionProvider":
            cpu = OnnxEncoder(manifest, device="cpu").embed(windows[-len(emb) :])
            row["parity_min_cosine_vs_cpu"] = float(np.min(np.sum(emb * cpu, axis=1)))
            # ONNX Runtime's default, which the server turns off (OnnxEncoder's tf32): what it would cost and give.
            fast = OnnxEncoder(manifest, device=device, gpu_batch=batch, tf32=True)
            fast_wall, fast_emb = _timed(fast, windows, step)
            row["tf32_model_ms_per_audio_s"] = 1e3 * fast_wall / seconds
            row["tf32_parity_min_cosine_vs_cpu"] = float(np.min(np.sum(fast_emb * cpu, axis=1)))
        out[name] = row
    return out


def bench(argv: list[str], timeout: float, log: Path) -> tuple[bool, str]:
    """One sleuthd-bench command, its output echoed and kept; (finished, output)."""
    cmd = [sys.executable, "-m", "sleuthd_bench.cli", "--log-level", "warning", *argv]
    print("$ sleuthd-bench " + " ".join(argv), flush=True)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired as exc:
        text = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        log.write_text(text)
        print(text + f"\n(stopped after {timeout:.0f} s: out of the run's budget)", flush=True)
        return False, text
    log.write_text(done.stdout + done.stderr)
    print(done.stdout, flush=True)
    if done.returncode != 0:
        print(done.stderr[-3000:], flush=True)
    return done.returncode == 0, done.stdout


def summary(report: dict[str, Any]) -> str:
    lines = ["# sleuthd on " + str(report["environment"].get("gpu") or report["environment"]["device"]), ""]
    env = report["environment"]
    lines.append(f"ONNX Runtime {env['onnxruntime']}, providers {', '.join(env['providers'])}; "
                 f"{env['cpus']} CPUs, load average {env['load_average'][0]:.1f}; device {env['device']}")  # fmt: skip
    where = report.get("where_time_goes") or {}
    if where:
        lines += ["", "## Where the time goes (per audio second, one stream of work)", "",
                  "| encoder | provider | host decode+VAD+windows ms | model ms (batch) | host share | parity vs CPU "
                  "| with TF32: model ms | with TF32: parity |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
        for name, r in where.items():
            parity = f"{r['parity_min_cosine_vs_cpu']:.6f}" if "parity_min_cosine_vs_cpu" in r else "-"
            host, model = r["host_ms_per_audio_s"], r["model_ms_per_audio_s"]
            tf32 = (f"{r['tf32_model_ms_per_audio_s']:.2f} | {r['tf32_parity_min_cosine_vs_cpu']:.6f}"
                    if "tf32_model_ms_per_audio_s" in r else "- | -")  # fmt: skip
            lines.append(f"| {name} | {r['provider']} | {host:.2f} | {model:.2f} ({r['model_batch']}) "
                         f"| {100 * r['host_share']:.0f} % | {parity} | {tf32} |")  # fmt: skip
    tp = report.get("throughput") or {}
    if tp:
        lines += ["", "## Throughput (closed-loop CheckDialogue of 5 turns x 2-6 s)", "",
                  "| encoder | server processes | clients | batched audio-s/s | p50 ms | p99 ms | unbatched audio-s/s "
                  "| batched / unbatched | batched / raw model | server cores |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
        for replicas, encoder, r in [(n, e, r) for n, by in tp.items() for e, r in by.items()]:
            for c, b in r["modes"]["batched"].items():
                u = r["modes"].get("unbatched", {}).get(c)
                ratio, cores = r["ratios"][c], b.get("server_cores")
                cells = [encoder, replicas, c, f"{b['audio_seconds_per_second']:.1f}", f"{b['p50_ms']:.0f}",
                         f"{b['p99_ms']:.0f}",
                         f"{u['audio_seconds_per_second']:.1f}" if u else "-",
                         f"{ratio['batched_over_unbatched']:.2f}x" if u else "-",
                         f"{ratio['batched_over_raw_model']:.2f}",
                         "-" if cores is None else f"{cores:.2f}"]  # fmt: skip
                lines.append("| " + " | ".join(cells) + " |")
            raw = r["raw_model"]
            lines.append(f"| {encoder} raw model | | | {raw['audio_seconds_per_second']:.1f} | | | | | | |")
    lat = report.get("latency") or {}
    if lat.get("stream"):
        med = lat["stream"]["median_ms_of_last_10"]
        lines += ["", "## Streamed 3 s turns, default encoder (verdict latency, median of the last 10)", "",
                  "| turn | " + " | ".join(med) + " |", "| --- |" + " ---: |" * len(med),
                  "| ms | " + " | ".join(f"{v:.1f}" for v in med.values()) + " |"]  # fmt: skip
    if lat.get("check"):
        lines += ["", "| CheckDialogue, cached turns | RPC p50 ms |", "| ---: | ---: |"]
        lines += [f"| {n} | {r['rpc_p50_ms']:.1f} |" for n, r in lat["check"].items()]
    if report.get("unfinished"):
        lines += ["", "Not finished within the budget: " + ", ".join(report["unfinished"])]
    lines += ["", f"{report['elapsed_seconds']:.0f} s in all"]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--models-dir", type=Path, default=Path("models"))
    ap.add_argument("--speech", type=Path, default=Path("data"), help="holds throughput/ and latency/ speech")
    ap.add_argument("--encoders", default="ge2e,campplus,fused")
    ap.add_argument("--modes", default="unbatched,batched", help="sleuthd-bench throughput --modes")
    ap.add_argument("--concurrency", default="1,8,32,128")
    ap.add_argument("--seconds", type=float, default=5.0, help="per throughput level")
    ap.add_argument("--dialogues", type=int, default=12)
    ap.add_argument("--stream-turns", default="10,100")
    ap.add_argument("--check-turns", default="10,100")
    ap.add_argument("--batch", type=int, default=64, help="the server's --max-batch-windows")
    ap.add_argument(
        "--replicas",
        default="1",
        help="server processes, one throughput run per count, e.g. 1,4 "
        "(default: 1; counts above 1: the batched mode only, calls round robin over the processes)",
    )
    ap.add_argument("--server-arg", action="append", help="one more `sleuthd serve` argument (repeat)")
    ap.add_argument("--repeats", type=int, default=3, help="sleuthd-bench latency --repeats (default: 3)")
    ap.add_argument("--budget-seconds", type=float, default=450.0, help="the whole run (default: 450)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "runs/gpu_check"))
    args = ap.parse_args()
    start = time.perf_counter()
    left = lambda: args.budget_seconds - (time.perf_counter() - start)  # noqa: E731
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"environment": environment(args.device), "unfinished": []}
    print(json.dumps(report["environment"], indent=2), flush=True)
    if args.device == "cuda" and "CUDAExecutionProvider" not in report["environment"]["providers"]:
        print("this onnxruntime has no CUDA provider: see scripts/gpu_bundle.py", file=sys.stderr)
        return 2
    server = ["--server-arg=--max-batch-windows", f"--server-arg={args.batch}",
              *(f"--server-arg={a}" for a in args.server_arg or [])]  # fmt: skip
    report["throughput"] = {}
    for replicas in [int(r) for r in args.replicas.split(",") if r.strip()]:
        name = "throughput" if replicas == 1 else f"throughput_r{replicas}"
        ok, _ = bench(
            ["throughput", "--encoders", args.encoders, "--modes", args.modes if replicas == 1 else "batched",
             "--concurrency", args.concurrency, "--seconds", str(args.seconds), "--dialogues", str(args.dialogues),
             "--cache", str(args.speech / "throughput"), "--device", args.device, "--replicas", str(replicas),
             "--json", str(args.out / f"{name}.json"), "--quiet", *server],
            left() - 60, args.out / f"{name}.txt",
        )  # fmt: skip
        if ok:
            data = json.loads((args.out / f"{name}.json").read_text())
            report["throughput"][str(replicas)] = data if "modes" not in data else {args.encoders: data}
        else:
            report["unfinished"].append(name)
    ok, _ = bench(
        ["latency", "--stream-turns", args.stream_turns, "--check-turns", args.check_turns,
         "--repeats", str(args.repeats), "--cache", str(args.speech / "latency"),
         "--server-arg=--device", f"--server-arg={args.device}", *server,
         "--json", str(args.out / "latency.json"), "--quiet"],
        left() - 5, args.out / "latency.txt",
    )  # fmt: skip
    if ok:
        report["latency"] = json.loads((args.out / "latency.json").read_text())
    else:
        report["unfinished"].append("latency")
    # After the benchmarks: the throughput command synthesizes its dialogues where they are not carried.
    report["where_time_goes"] = where_time_goes(args.models_dir, args.speech, args.device, args.batch, args.dialogues)
    print(json.dumps(report["where_time_goes"], indent=2), flush=True)
    report["elapsed_seconds"] = time.perf_counter() - start
    (args.out / "check.json").write_text(json.dumps(report, indent=2) + "\n")
    text = summary(report)
    (args.out / "summary.md").write_text(text)
    print(text, flush=True)
    return 0 if not report["unfinished"] else 1


if __name__ == "__main__":
    sys.exit(main())
