"""Which ONNX Runtime build is installed, checked before and after the models load.

``onnxruntime`` and ``onnxruntime-gpu`` install the same ``onnxruntime`` module: with both, whichever was
installed last wins and the CUDA provider can silently disappear. And onnxruntime-gpu lists the CUDA
provider even when CUDA's libraries are missing, then runs the session on CPU. Both are start-up errors
here (or warnings, where the CPU is what was asked for), with the command that fixes them.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterable
from importlib import metadata

from sleuthd.config import ConfigError

logger = logging.getLogger(__name__)

CPU_DIST, GPU_DIST = "onnxruntime", "onnxruntime-gpu"
CUDA = "CUDAExecutionProvider"
_REINSTALL = "pip uninstall -y onnxruntime onnxruntime-gpu && pip install 'sleuthd[gpu]' (or 'sleuthd[cpu]')"


def installed_runtimes() -> list[str]:
    """The ONNX Runtime distributions installed, of the two the extras choose between."""
    found = []
    for dist in (CPU_DIST, GPU_DIST):
        try:
            metadata.distribution(dist)
        except metadata.PackageNotFoundError:
            continue
        found.append(dist)
    return found


def check_before_load(device: str) -> None:
    """Refuse to start without an ONNX Runtime, or with both builds when CUDA is wanted."""
    if importlib.util.find_spec("onnxruntime") is None:
        raise ConfigError(
            "no ONNX Runtime is installed: pip install 'sleuthd[cpu]' (or 'sleuthd[gpu]' on a CUDA machine)"
        )
    if set(installed_runtimes()) == {CPU_DIST, GPU_DIST}:
        message = f"both onnxruntime and onnxruntime-gpu are installed; they share one module: {_REINSTALL}"
        if device == "cuda":
            raise ConfigError(message)
        logger.warning("%s", message)


def check_after_load(device: str, providers: Iterable[tuple[str, str]]) -> None:
    """``providers``: (encoder name, provider its session runs on). Refuse a CUDA request served by the CPU."""
    on_cpu = [name for name, provider in providers if provider != CUDA]
    if device == "cpu" or not on_cpu:
        return
    import onnxruntime as ort

    if CUDA not in ort.get_available_providers():
        return  # auto on a CPU-only build: the CPU is the expected outcome
    message = (
        f"ONNX Runtime lists the CUDA provider but encoder(s) {', '.join(on_cpu)} run on the CPU: the CUDA or "
        "cuDNN libraries this onnxruntime-gpu needs are missing (ONNX Runtime's log names them) or no GPU is visible"
    )
    if device == "cuda":
        raise ConfigError(message + "; or start with --device cpu")
    logger.warning("%s", message)
