"""Exporting speaker encoders to ONNX (`sleuthd models export`), with parity checked against the originals.

Heavy dependencies (torch, onnx, resemblyzer, speechbrain, transformers) are imported only by the
exporters themselves; this package's top level stays light for the command line.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def parity_clips_dir() -> Path:
    """The real speech shipped for parity checks (an FSDD subset, CC BY-SA 4.0: see its README)."""
    return Path(str(resources.files("sleuthd.export").joinpath("parity_clips")))
