"""`sleuthd models triton-repo OUT`: a Triton model repository serving the exported encoders.

One Triton model per encoder, named as its manifest (``ge2e``, ``campplus``), with the manifest's input and
output names and shapes, so ``sleuthd serve --encoder-backend triton`` talks to it exactly as to the
in-process runner. Each client-facing model records the SHA-256 of the ONNX file it serves (the client
refuses other weights). Two layouts:

GPU (default)::

    OUT/<name>/config.pbtxt        Python backend, KIND_CPU: Triton's dynamic batcher (preferred batch size,
    OUT/<name>/1/model.py          max queue delay, bounded queue, per-request timeouts) in front of a padder
                                   that makes every call exactly --pad-batch rows (batch_padder.py says why)
    OUT/<name>_onnx/config.pbtxt   backend "onnxruntime", fixed shape [pad-batch, window], KIND_GPU instances
    OUT/<name>_onnx/1/model.onnx   the manifest's ONNX file, byte for byte

``--python-backend`` (CPU; the tests, and any Triton without the onnxruntime backend)::

    OUT/<name>/config.pbtxt        Python backend, KIND_CPU, dynamic batching; model.py runs model.onnx with
    OUT/<name>/1/model.py, model.onnx   ONNX Runtime on the CPU, as sleuthd.encoder.OnnxEncoder does

``--pad-batch N`` with ``--python-backend`` builds the GPU layout with the Python runner as the inner model
(how the padder is tested without a GPU). Batch sizes: ``max_batch_size`` = ``--max-batch-windows``, except
on the CPU, where a card's ``batching.cpu_max_batch_windows`` caps it (CAM++: 8), as the micro-batcher does.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from sleuthd.encoders.manifest import EncoderManifest, find_encoders, load_encoder_manifest
from sleuthd.encoders.triton import SHA256_PARAMETER

PYTHON_ENV_NOTE = "numpy<2 in the Python backend's environment (the wheel's stub was built against numpy 1.x)"


@dataclass(frozen=True)
class RepoOptions:
    """How the repository batches; every field is a flag of `sleuthd models triton-repo`."""

    python_backend: bool = False  # run the ONNX file in model.py (CPU) instead of Triton's onnxruntime backend
    max_batch_windows: int = 64  # rows per model call (Triton's max_batch_size), as --max-batch-windows
    pad_batch: int | None = None  # pad every call to this many rows; None = max_batch_windows on the GPU, 0 on CPU
    max_queue_delay_us: int = 5000  # the dynamic batcher's longest wait for a fuller batch, microseconds
    max_queue_requests: int = 4096  # requests Triton queues per model before refusing (RESOURCE_EXHAUSTED)
    instances: int = 1  # model instances (GPU: per GPU; CPU: processes), each runs one batch at a time
    intra_op_threads: int = 0  # Python runner's ONNX Runtime threads; 0 = the CPU count

    def __post_init__(self) -> None:
        for name in ("max_batch_windows", "max_queue_requests", "instances"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_queue_delay_us < 0 or self.intra_op_threads < 0 or (self.pad_batch or 0) < 0:
            raise ValueError("max_queue_delay_us, intra_op_threads and pad_batch must be 0 or more")

    @property
    def padding(self) -> int:
        """Rows every model call is padded to (0: no padding)."""
        if self.pad_batch is not None:
            return self.pad_batch
        return 0 if self.python_backend else self.max_batch_windows


# ---------------------------------------------------------------------------------------------- pbtxt


def pbtxt(fields: Mapping[str, Any], indent: int = 0) -> str:
    """A protobuf text-format message from nested dicts: lists repeat a field, str values are quoted unless
    they are enum names (upper case), bools are true/false."""
    pad = "  " * indent
    lines = []
    for key, value in fields.items():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, Mapping):
                lines.append(f"{pad}{key} {{\n{pbtxt(item, indent + 1)}{pad}}}")
            elif isinstance(item, bool):
                lines.append(f"{pad}{key}: {'true' if item else 'false'}")
            elif isinstance(item, str) and not (item.isupper() and item.replace("_", "").isalnum()):
                escaped = item.replace("\\", "\\\\").replace('"', '\\"')
                lines.append(f'{pad}{key}: "{escaped}"')
            else:
                lines.append(f"{pad}{key}: {item}")
    return "".join(line + "\n" for line in lines)


def _tensor(name: str, dims: list[int]) -> dict[str, Any]:
    return {"name": name, "data_type": "TYPE_FP32", "dims": dims}


def _params(values: Mapping[str, object]) -> list[dict[str, Any]]:
    return [{"key": k, "value": {"string_value": str(v)}} for k, v in values.items()]


def batch_cap(manifest: EncoderManifest, options: RepoOptions) -> int:
    """max_batch_size of the client-facing model: on the CPU a card may cap it where bigger calls are slower
    per window (CAM++), as sleuthd.loading.encoder_batcher_config does for the micro-batcher."""
    cap = manifest.raw.get("batching", {}).get("cpu_max_batch_windows")
    on_cpu = options.python_backend and not options.padding
    return min(options.max_batch_windows, int(cap)) if on_cpu and cap else options.max_batch_windows


def front_config(manifest: EncoderManifest, options: RepoOptions, name: str) -> str:
    """The model sleuthd calls: Triton's dynamic batcher in front of the runner (or of the padder)."""
    rows = batch_cap(manifest, options) if not options.padding else options.padding
    params: dict[str, object] = {SHA256_PARAMETER: manifest.sha256}
    if options.padding:
        params.update(inner_model=f"{name}_onnx", rows=options.padding)
    else:
        params.update(onnx_file="model.onnx", intra_op_threads=options.intra_op_threads)
    return pbtxt({
        "name": name,
        "backend": "python",
        "max_batch_size": rows,
        "input": [_tensor(manifest.input_name, [manifest.window.window_samples])],
        "output": [_tensor(manifest.output_name, [manifest.embedding_size])],
        "dynamic_batching": {
            "preferred_batch_size": [rows],
            "max_queue_delay_microseconds": options.max_queue_delay_us,
            # REJECT + override: sleuthd sends each RPC's remaining deadline as the request timeout, and
            # Triton drops a request from its queue once nobody waits for it. A full queue is refused at
            # once (RESOURCE_EXHAUSTED: busy, retry later), never left to grow.
            "default_queue_policy": {
                "timeout_action": "REJECT",
                "allow_timeout_override": True,
                "max_queue_size": options.max_queue_requests,
            },
        },
        "instance_group": [{"count": options.instances, "kind": "KIND_CPU"}],
        "parameters": _params(params),
    })  # fmt: skip


def inner_config(manifest: EncoderManifest, options: RepoOptions, name: str) -> str:
    """The fixed-shape ONNX model behind the padder: [rows, window] in, [rows, embedding] out, no batching
    by Triton (max_batch_size 0), so ONNX Runtime's CUDA provider sees one input shape for ever."""
    rows = options.padding
    fields: dict[str, Any] = {
        "name": f"{name}_onnx",
        "max_batch_size": 0,
        "input": [_tensor(manifest.input_name, [rows, manifest.window.window_samples])],
        "output": [_tensor(manifest.output_name, [rows, manifest.embedding_size])],
    }
    if options.python_backend:
        fields["backend"] = "python"
        fields["instance_group"] = [{"count": options.instances, "kind": "KIND_CPU"}]
        fields["parameters"] = _params({"onnx_file": "model.onnx", "intra_op_threads": options.intra_op_threads})
    else:
        fields["backend"] = "onnxruntime"
        fields["default_model_filename"] = "model.onnx"
        fields["instance_group"] = [{"count": options.instances, "kind": "KIND_GPU"}]
        # Warm-up at load runs the one shape, so its cuDNN algorithm search happens before the first request
        # (a ~2 s search for CAM++ on an H200). Noise costs what speech costs.
        fields["model_warmup"] = [{
            "name": "fixed_shape",
            "batch_size": 1,
            "inputs": {"key": manifest.input_name, "value": {
                "data_type": "TYPE_FP32", "dims": [rows, manifest.window.window_samples], "random_data": True}},
        }]  # fmt: skip
    return pbtxt(fields)


# ---------------------------------------------------------------------------------------------- writing


def _model_source(module: str) -> str:
    return resources.files("sleuthd.export.triton_models").joinpath(f"{module}.py").read_text()


def write_model(out: Path, manifest: EncoderManifest, options: RepoOptions) -> list[Path]:
    """The model(s) of one encoder under ``out``; returns the folders written."""
    name = manifest.name
    front = out / name
    (front / "1").mkdir(parents=True, exist_ok=True)
    (front / "config.pbtxt").write_text(front_config(manifest, options, name))
    if not options.padding:
        (front / "1" / "model.py").write_text(_model_source("onnx_runner"))
        shutil.copyfile(manifest.path, front / "1" / "model.onnx")
        return [front]
    (front / "1" / "model.py").write_text(_model_source("batch_padder"))
    (front / "1" / "onnx_runner.py").write_text(_model_source("onnx_runner"))  # the padder's helpers
    inner = out / f"{name}_onnx"
    (inner / "1").mkdir(parents=True, exist_ok=True)
    (inner / "config.pbtxt").write_text(inner_config(manifest, options, name))
    shutil.copyfile(manifest.path, inner / "1" / "model.onnx")
    if options.python_backend:
        (inner / "1" / "model.py").write_text(_model_source("onnx_runner"))
    return [front, inner]


def write_repository(models_dir: Path, out: Path, options: RepoOptions) -> list[Path]:
    """Every encoder under ``models_dir`` (manifests checked against their files) as Triton models in ``out``.
    The fusion needs no model of its own: sleuthd fuses its components' embeddings."""
    written = []
    for model_dir in find_encoders(models_dir):
        written += write_model(out, load_encoder_manifest(model_dir), options)
    if not written:
        raise ValueError(f"no encoder manifests under {models_dir}: run `sleuthd models export all` first")
    return written


# ---------------------------------------------------------------------------------------------- command


def add_parser(models: Any, default_models_dir: Path) -> None:
    """`sleuthd models triton-repo` on the ``models`` subparsers of the sleuthd command line."""
    p = models.add_parser("triton-repo", help="write a Triton model repository serving the exported encoders")
    p.add_argument("out", type=Path, help="the repository folder (tritonserver --model-repository OUT)")
    p.add_argument("--models-dir", type=Path, default=default_models_dir, help="folder of model manifests")
    p.add_argument("--python-backend", action="store_true",
                   help="run the ONNX files in Triton's Python backend with ONNX Runtime on the CPU (tests, or a "
                   "Triton without the onnxruntime backend) instead of the onnxruntime backend on GPUs")  # fmt: skip
    p.add_argument("--max-batch-windows", type=int, default=64, help="windows per model call (default: 64)")
    p.add_argument("--pad-batch", type=int, default=None,
                   help="pad every model call to this many windows (default: --max-batch-windows on GPUs, where "
                   "ONNX Runtime's CUDA convolutions need one shape; 0 = off, the CPU default)")  # fmt: skip
    p.add_argument(
        "--max-queue-delay-us",
        type=int,
        default=5000,
        help="the dynamic batcher's longest wait for a fuller batch, microseconds (default: 5000)",
    )
    p.add_argument(
        "--max-queue-requests",
        type=int,
        default=4096,
        help="requests queued per model before Triton refuses more (default: 4096)",
    )
    p.add_argument("--instances", type=int, default=1, help="model instances (per GPU on GPUs; default: 1)")
    p.add_argument(
        "--intra-op-threads",
        type=int,
        default=0,
        help="--python-backend: ONNX Runtime threads per instance (default: 0 = the CPU count)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sleuthd.encoders.manifest import ManifestError

    try:
        options = RepoOptions(args.python_backend, args.max_batch_windows, args.pad_batch, args.max_queue_delay_us,
                              args.max_queue_requests, args.instances, args.intra_op_threads)  # fmt: skip
        for folder in write_repository(args.models_dir, args.out, options):
            print(f"wrote {folder}")
    except (ManifestError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
