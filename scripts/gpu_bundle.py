"""Pack what `scripts/gpu_check.sh` needs on a bare GPU machine into `.gpu/` (run here, where PyPI is reachable).

The GPU machines lent to this project have Python 3.12 with torch (and CUDA 13's libraries as torch's nvidia-*
packages), numpy, grpcio, protobuf and prometheus-client, a CPU-only onnxruntime, and no network. A run there
brings at most 64 MiB of files along (the working tree included), and the onnxruntime-gpu wheel is 255 MB. What
travels:

- ``ort-cuda-provider.tar.xz`` (about 52 MB): onnxruntime-gpu's CUDA execution provider library
  (``libonnxruntime_providers_cuda.so``, 284 MB), with the GPU code for every architecture but the one kept
  (``--keep-arch``, default 90: sm_90, the H100 and H200) overwritten by zeros: the CUDA driver loads only the
  cubin built for the device's architecture, and zeros compress to nothing. (Its fatbin holds cubins for sm_75,
  80, 86, 89, 90 and 120 and no PTX; sm_90's are 73 MB of the 208.)
- ``ort.tar.xz``: the rest of onnxruntime-gpu's Python package (without its TensorRT provider, its tools and its
  .dist-info, so the module shadows the machine's CPU onnxruntime on PYTHONPATH without sleuthd's start-up check
  seeing two runtimes installed); ``wheels/``: the wheels the serving path lacks there (soundfile, soxr,
  grpcio-health-checking, grpcio-reflection, and the grpcio and protobuf our generated code was made for, for
  ``--python-version``); ``models.tar.xz``: the models; ``speech.tar.xz``: real speech for the benchmarks (the
  throughput dialogues and the latency voices, synthesized here, since the machine has no espeak-ng).

They are packed into as few parts ``.gpu/part1`` .. ``partN`` as fit a run each beside the working tree (three
with a 7.7 MiB tree), each with a ``PART`` file ("k N stamp"). The parts go in N runs on one warm machine (a machine
is given back 30 s after a call ends):

    runs 1 .. N-1: carry [".gpu/partK"]    scripts/gpu_check.sh --unpack-only
    run N:         carry [".gpu/partN"]    scripts/gpu_check.sh --device cuda

Each unpacks its part into ``.gpu/site`` (git-ignored, so it stays on the machine between calls); the last one
checks that every part is there and runs the check.

    python scripts/gpu_bundle.py [--python-version 3.12] [--keep-arch 90] [--dialogues 12]
"""

from __future__ import annotations

import argparse
import io
import json
import lzma
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / ".gpu"
LIMIT_MIB = 64  # what one run brings along, the working tree included
MARGIN = 2**20  # for what the tree gains between packing and the runs (a note, a log)
ORT_GPU = "onnxruntime-gpu==1.31.1"  # CUDA 13 and cuDNN 9, as the GPU image's torch
WHEELS = (
    "soundfile==0.14.0",
    "soxr==1.1.0",
    "grpcio-health-checking==1.85.1",
    "grpcio-reflection==1.85.1",
    "tqdm==4.70.1",
    "cffi==2.1.1",
    "pycparser==3.12",
)  # tqdm: the bench tools' progress bars; cffi: soundfile's
# The runtimes our generated code was made for (sleuthd/v1/*_pb2*.py refuse an older one; the GPU machine has
# grpcio 1.84.0): they travel with the rest and shadow the machine's on PYTHONPATH.
RUNTIME_WHEELS = ("grpcio==1.85.3", "protobuf==7.36.2")
PROVIDER = "onnxruntime/capi/libonnxruntime_providers_cuda.so"
# Not needed to serve: the TensorRT provider, the model tools, the optimizers for transformers, quantization.
SKIP = ("libonnxruntime_providers_tensorrt.so", "onnxruntime/tools/", "onnxruntime/transformers/",
        "onnxruntime/quantization/", "onnxruntime/datasets/")  # fmt: skip
FATBIN_MAGIC = 0xBA55ED50


def download(spec: str, python_version: str, dest: Path) -> Path:
    """One wheel for the GPU machine's Python (manylinux, x86-64), from the package index."""
    before = set(dest.glob("*.whl"))
    platforms = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--implementation",
           "cp", "--python-version", python_version, "-d", str(dest)]  # fmt: skip
    for p in platforms:
        cmd += ["--platform", p]
    cmd.append(spec)
    subprocess.run(cmd, check=True)
    name = spec.split("==")[0].replace("-", "_").lower()
    found = [w for w in dest.glob("*.whl") if w.name.lower().startswith(name + "-")]
    if not found:
        found = sorted(set(dest.glob("*.whl")) - before)
    if not found:
        raise SystemExit(f"pip downloaded no wheel for {spec}")
    return found[0]


def keep_one_arch(library: bytes, arch: int) -> tuple[bytes, int]:
    """``library`` with the payload of every fatbin entry not built for sm_``arch`` overwritten by zeros
    (headers kept, so every offset and size stays valid); returns it and the bytes zeroed."""
    data = bytearray(library)
    start, size = fatbin_section(data)
    pos, end, zeroed, kept = start, start + size, 0, 0
    while pos + 16 <= end:
        magic, _version, header, body = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # fatbins in the section are 8-byte aligned
            continue
        entry, stop = pos + header, pos + header + body
        while entry < stop:
            _kind, _ever, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            (entry_arch,) = struct.unpack_from("<I", data, entry + 28)
            if entry_arch != arch:
                data[entry + entry_header : entry + entry_header + payload] = bytes(payload)
                zeroed += payload
            else:
                kept += payload
            entry += entry_header + payload
        pos = stop
    if kept == 0:
        raise SystemExit(f"the CUDA provider has no cubin for sm_{arch}: choose --keep-arch from its fatbin")
    return bytes(data), zeroed


def fatbin_section(data: bytearray) -> tuple[int, int]:
    """(file offset, size) of the ELF section .nv_fatbin (64-bit little-endian ELF)."""
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    names_off = struct.unpack_from("<Q", data, shoff + shstrndx * shentsize + 0x18)[0]
    for i in range(shnum):
        base = shoff + i * shentsize
        (name,) = struct.unpack_from("<I", data, base)
        end = data.index(b"\0", names_off + name)
        if data[names_off + name : end] == b".nv_fatbin":
            offset, size = struct.unpack_from("<QQ", data, base + 0x18)
            return offset, size
    raise SystemExit("no .nv_fatbin section in the CUDA provider library")


def xz_tar(members: dict[str, bytes]) -> bytes:
    """``members`` (archive name -> bytes) as a .tar.xz."""
    folders = sorted({str(parent) for name in members for parent in Path(name).parents if str(parent) != "."})
    buffer = io.BytesIO()
    with lzma.open(buffer, "wb", preset=6) as raw, tarfile.open(fileobj=raw, mode="w") as tar:
        for folder in folders:  # explicit entries: tar would otherwise make them without the search bit
            info = tarfile.TarInfo(folder)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
            tar.addfile(info)
        for name, blob in sorted(members.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(blob), 0o755 if name.endswith(".so") or ".so." in name else 0o644
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(blob))
    return buffer.getvalue()


def pack(sizes: dict[str, int], room: int) -> list[list[str]]:
    """The files in as few parts as first-fit decreasing finds, each part at most ``room`` bytes; the CUDA
    provider (the largest) comes first, in part 1."""
    parts: list[tuple[int, list[str]]] = []
    for name in sorted(sizes, key=lambda n: -sizes[n]):
        if sizes[name] > room:
            raise SystemExit(f"{name} ({sizes[name] / 2**20:.1f} MiB) does not fit a run beside the working tree "
                             f"({room / 2**20:.1f} MiB left of {LIMIT_MIB})")  # fmt: skip
        for i, (used, names) in enumerate(parts):
            if used + sizes[name] <= room:
                parts[i] = (used + sizes[name], [*names, name])
                break
        else:
            parts.append((sizes[name], [name]))
    return [names for _, names in parts]


def speech(dialogues: int) -> dict[str, bytes]:
    """The throughput dialogues and the latency voices, synthesized here (cached under data/)."""
    sys.path[:0] = [str(REPO / "service"), str(REPO / "tools")]
    from sleuthd_bench import latency, throughput

    throughput.build_dialogues(REPO / "data" / "throughput", dialogues, seed=7)
    latency.voice_clips(REPO / "data" / "latency")
    out = {}
    for folder, pattern in (("throughput", "[0-9][0-9][0-9]-[0-9].wav"), ("latency", "*/*.wav")):
        for f in sorted((REPO / "data" / folder).glob(pattern)):
            if folder == "throughput" and int(f.name[:3]) >= dialogues:
                continue
            out[f"speech/{folder}/{f.relative_to(REPO / 'data' / folder)}"] = f.read_bytes()
    return out


def tree_bytes() -> int:
    """What the working tree itself brings along (tracked and untracked files git does not ignore)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.split(b"\0")  # fmt: skip
    return sum((REPO / f.decode()).stat().st_size for f in files if f and (REPO / f.decode()).is_file())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default: 3.12)")
    ap.add_argument("--keep-arch", type=int, default=90, help="the GPU's compute capability x 10 (default: 90)")
    ap.add_argument("--dialogues", type=int, default=12, help="throughput dialogues carried (default: 12)")
    ap.add_argument("--models-dir", type=Path, default=REPO / "models")
    args = ap.parse_args()
    for old in OUT.glob("part*"):
        shutil.rmtree(old)
    files: dict[str, bytes] = {}  # what travels, by its name in a part: archives at the top, wheels under wheels/
    with tempfile.TemporaryDirectory() as tmp:
        wheel = download(ORT_GPU, args.python_version, Path(tmp))
        with zipfile.ZipFile(wheel) as z:
            provider, zeroed = keep_one_arch(z.read(PROVIDER), args.keep_arch)
            rest = {f"py/{n}": z.read(n) for n in z.namelist()
                    if n.startswith("onnxruntime/") and n != PROVIDER and not any(s in n for s in SKIP)}  # fmt: skip
        for spec in WHEELS + RUNTIME_WHEELS:
            w = download(spec, args.python_version, Path(tmp))
            files[f"wheels/{w.name}"] = w.read_bytes()
    files["ort-cuda-provider.tar.xz"] = xz_tar({f"py/{PROVIDER}": provider})
    files["ort.tar.xz"] = xz_tar(rest)
    models = {}
    for name in ("ge2e", "campplus", "silero_vad"):
        folder = args.models_dir / name
        manifest = json.loads((folder / "manifest.json").read_text())
        for f in ("manifest.json", manifest["file"]):
            models[f"models/{name}/{f}"] = (folder / f).read_bytes()
    files["models.tar.xz"] = xz_tar(models)
    files["speech.tar.xz"] = xz_tar(speech(args.dialogues))
    tree = tree_bytes()
    room = LIMIT_MIB * 2**20 - tree - MARGIN
    parts = pack({name: len(blob) for name, blob in files.items()}, room)
    stamp = time.strftime("%Y%m%dT%H%M%S")  # which bundle a part belongs to
    for k, names in enumerate(parts, 1):
        for name in names:
            path = OUT / f"part{k}" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(files[name])
        (OUT / f"part{k}" / "PART").write_text(f"{k} {len(parts)} {stamp}\n")  # gpu_check.sh: which of how many
    report = {"keep_arch": args.keep_arch, "zeroed_mib": round(zeroed / 2**20, 1), "tree_mib": round(tree / 2**20, 1),
              "parts": {f"part{k}": {n: round(len(files[n]) / 2**20, 1) for n in names}
                        for k, names in enumerate(parts, 1)},
              "run_mib": {f"part{k}": round((tree + sum(len(files[n]) for n in names)) / 2**20, 1)
                          for k, names in enumerate(parts, 1)}}  # fmt: skip
    (OUT / "BUNDLE.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    for k in range(1, len(parts)):
        print(f"run {k}: carry .gpu/part{k}, command: scripts/gpu_check.sh --unpack-only")
    print(f"run {len(parts)} (each at once, while the machine is warm): carry .gpu/part{len(parts)}, "
          "command: scripts/gpu_check.sh --device cuda")
    return 0


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
