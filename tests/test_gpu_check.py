"""scripts/gpu_check.sh, the whole server on a GPU in one short run, dry-run on the CPU so it does not rot
(no GPU is lent to CI), and scripts/gpu_bundle.py's packing of the CUDA provider for the bare GPU machine."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from tests.support import REPO


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_check_runs_the_real_server_on_the_cpu(tmp_path: Path, models_dir: Path) -> None:
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable, SLEUTHD_MODELS_DIR=str(models_dir))
    cmd = [str(REPO / "scripts" / "gpu_check.sh"), "--device", "cpu", "--encoders", "fused", "--modes", "batched",
           "--concurrency", "2", "--seconds", "0.5", "--replicas", "1,2", "--dialogues", "2",
           "--stream-turns", "2", "--check-turns", "2",
           "--speech", str(tmp_path / "speech"), "--out", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "check.json").read_text())
    assert report["environment"]["device"] == "cpu" and not report["unfinished"]
    for name in ("ge2e", "campplus"):  # host preparation against the model, per audio second
        where = report["where_time_goes"][name]
        assert where["provider"] == "CPUExecutionProvider" and where["windows"] > 0
        assert where["host_ms_per_audio_s"] > 0 and where["model_ms_per_audio_s"] > 0 and 0 < where["host_share"] < 1
    run = report["throughput"]["1"]["fused"]  # the real server, the raw models' rate measured in the same run
    level = run["modes"]["batched"]["2"]
    assert level["errors"] == 0 and level["audio_seconds_per_second"] > 0 and level["p99_ms"] >= level["p50_ms"]
    assert set(run["raw_model"]["components"]) == {"ge2e", "campplus"}
    assert run["raw_model"]["audio_seconds_per_second"] > 0 and run["ratios"]["2"]["batched_over_raw_model"] > 0
    # Two server processes behind round robin: each served its share of the calls.
    pair = report["throughput"]["2"]["fused"]
    assert pair["replicas"] == 2 and pair["modes"]["batched"]["2"]["errors"] == 0
    assert all(cores > 0.05 for cores in pair["modes"]["batched"]["2"]["replica_cores"]), pair["modes"]["batched"]
    assert set(report["latency"]["stream"]["median_ms_of_last_10"]) == {"2"}
    assert report["latency"]["check"]["2"]["rpc_p50_ms"] > 0
    summary = (out / "summary.md").read_text()
    for heading in (
        "Where the time goes",
        "Throughput",
        "Streamed 3 s turns",
        "| fused | 1 | 2 |",
        "| fused | 2 | 2 |",
    ):
        assert heading in summary, summary


def _elf_with_fatbin(entries: list[tuple[int, bytes]]) -> bytes:
    """A minimal 64-bit ELF whose .nv_fatbin section holds one fatbin of ELF entries (arch, payload)."""
    body = b""
    for arch, payload in entries:
        header = bytearray(64)
        struct.pack_into("<HHIQ", header, 0, 2, 0x101, 64, len(payload))  # kind ELF, header size, payload size
        struct.pack_into("<I", header, 28, arch)
        body += bytes(header) + payload
    fatbin = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body
    names = b"\0.shstrtab\0.nv_fatbin\0"
    data_off = 64
    names_off = data_off + len(fatbin)
    shoff = names_off + len(names)
    elf = bytearray(64)
    elf[:4] = b"\x7fELF"
    struct.pack_into("<Q", elf, 0x28, shoff)
    struct.pack_into("<HHH", elf, 0x3A, 64, 3, 1)
    sections = bytearray(64 * 3)
    struct.pack_into("<I", sections, 64, 1)  # .shstrtab
    struct.pack_into("<QQ", sections, 64 + 0x18, names_off, len(names))
    struct.pack_into("<I", sections, 128, 11)  # .nv_fatbin
    struct.pack_into("<QQ", sections, 128 + 0x18, data_off, len(fatbin))
    return bytes(elf) + fatbin + names + bytes(sections)


def test_the_bundle_keeps_only_the_gpus_cubins() -> None:
    bundle = _script("gpu_bundle")
    sm80, sm90, sm120 = b"\x11" * 40, b"\x22" * 24, b"\x33" * 8
    library = _elf_with_fatbin([(80, sm80), (90, sm90), (120, sm120)])
    kept, zeroed = bundle.keep_one_arch(library, 90)
    assert len(kept) == len(library) and zeroed == len(sm80) + len(sm120)
    # Only the other architectures' payloads are zeroed: the ELF, the fatbin and entry headers stay as they were.
    assert kept == library.replace(sm80, bytes(len(sm80))).replace(sm120, bytes(len(sm120)))
    try:
        bundle.keep_one_arch(library, 89)
    except SystemExit as exc:
        assert "no cubin for sm_89" in str(exc)
    else:
        raise AssertionError("a library without the GPU's architecture must be refused")


def test_cuda_sessions_run_without_tf32_unless_asked(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # With ONNX Runtime's default (TF32 on), CAM++'s embeddings on an H200 were 0.988 cosine to the CPU's
    # (docs/research/gpu/README.md): the server's CUDA sessions must ask for full float32.
    import onnxruntime as ort
    from sleuthd.encoders.runner import session_providers

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert session_providers("cuda") == [("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"]
    assert session_providers("auto", tf32=True)[0] == ("CUDAExecutionProvider", {"use_tf32": "1"})
    assert session_providers("cpu") == ["CPUExecutionProvider"]


def test_the_bundle_is_packed_into_as_few_runs_as_fit() -> None:
    # Each run brings at most 64 MiB with the working tree: the files go first-fit, largest first, and one that
    # cannot fit any run is refused rather than split.
    bundle = _script("gpu_bundle")
    mib = 2**20
    sizes = {"provider": 50 * mib, "models": 31 * mib, "ort": 16 * mib, "speech": 8 * mib, "grpcio": 7 * mib,
             "soundfile": mib}  # fmt: skip
    parts = bundle.pack(sizes, 56 * mib)
    assert parts == [["provider", "soundfile"], ["models", "ort", "speech"], ["grpcio"]]
    assert all(sum(sizes[n] for n in part) <= 56 * mib for part in parts)
    try:
        bundle.pack({"provider": 57 * mib}, 56 * mib)
    except SystemExit as exc:
        assert "does not fit a run" in str(exc)
    else:
        raise AssertionError("a file larger than a run must be refused")
