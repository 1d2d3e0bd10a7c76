"""Model manifests: what an exported model is, where it came from, and the defaults that go with it.

Model cards are committed, hand-maintained and ship inside the package as data: ``sleuthd/cards/<name>.json``
(source, licence, input spec, default thresholds with how they were chosen), found with importlib.resources
so an installed wheel has them. ``sleuthd models export <name>`` writes the ONNX file and
``<models dir>/<name>/manifest.json`` = the card plus what only the export knows (file hash, parity figures).
The server loads manifests only, and refuses a model whose file does not match the recorded hash.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from sleuthd.audio.windows import WindowSpec

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
SCHEMA_VERSION = 1

# The SpeakerSleuth paper's fixed thresholds (Appendix B.2), tuned for ECAPA-TDNN and WavLM.
PAPER_THRESHOLDS: dict[str, float] = {"pairwise": 0.4, "centroid": 0.3, "reference": 0.4}


class ManifestError(RuntimeError):
    """A model folder is missing, incomplete or does not match its manifest."""


@dataclass(frozen=True)
class EncoderManifest:
    name: str
    path: Path  # the ONNX file
    sha256: str
    embedding_size: int
    input_name: str
    output_name: str
    window: WindowSpec
    loudness_target_dbfs: float
    min_speech_seconds: float
    default_method: str
    default_thresholds: dict[str, float]
    raw: dict[str, Any] = field(repr=False, compare=False)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _require(d: dict[str, Any], key: str, where: Path) -> Any:
    if key not in d:
        raise ManifestError(f"{where}: missing field {key!r}")
    return d[key]


def card_names() -> list[str]:
    """The models this package has cards for."""
    return sorted(p.name.removesuffix(".json") for p in resources.files("sleuthd").joinpath("cards").iterdir()
                  if p.name.endswith(".json"))  # fmt: skip


def read_card(name: str) -> dict[str, Any]:
    """The model card shipped in the package for model ``name`` (e.g. "ge2e")."""
    path = resources.files("sleuthd").joinpath("cards", f"{name}.json")
    if not path.is_file():
        raise ManifestError(f"this sleuthd has no model card for {name!r} (cards: {', '.join(card_names())})")
    card: dict[str, Any] = json.loads(path.read_text())
    return card


def load_encoder_manifest(model_dir: Path, verify_hash: bool = True) -> EncoderManifest:
    """Load and check ``model_dir/manifest.json``; the ONNX file must exist and match its sha256."""
    path = model_dir / MANIFEST
    if not path.exists():
        raise ManifestError(
            f"no manifest at {path}: build the model with `sleuthd models export {model_dir.name}` (or `make models`)"
        )
    m = json.loads(path.read_text())
    if m.get("schema_version") != SCHEMA_VERSION:
        raise ManifestError(f"{path}: schema_version {m.get('schema_version')} is not {SCHEMA_VERSION}")
    onnx_path = model_dir / _require(m, "file", path)
    if not onnx_path.exists():
        raise ManifestError(f"{path} names {onnx_path.name}, which does not exist: re-run the export")
    sha = _require(m, "sha256", path)
    if verify_hash and sha256_of(onnx_path) != sha:
        raise ManifestError(f"{onnx_path} does not match the sha256 in {path}: re-run the export")
    inp, out = _require(m, "input", path), _require(m, "output", path)
    w = _require(inp, "window", path)
    thresholds = {k: float(v["value"]) for k, v in _require(m, "thresholds", path).items()}
    return EncoderManifest(
        name=_require(m, "name", path),
        path=onnx_path,
        sha256=sha,
        embedding_size=int(_require(out, "embedding_size", path)),
        input_name=_require(inp, "name", path),
        output_name=_require(out, "name", path),
        window=WindowSpec(
            window_frames=int(w["window_frames"]),
            hop_samples=int(w["hop_samples"]),
            context_samples=int(w["context_samples"]),
            rate_per_second=float(w["rate_per_second"]),
            min_coverage=float(w["min_coverage"]),
        ),
        loudness_target_dbfs=float(_require(inp, "loudness_target_dbfs", path)),
        min_speech_seconds=float(_require(m, "min_speech_seconds", path)),
        default_method=_require(m, "default_method", path),
        default_thresholds=thresholds,
        raw=m,
    )


def vad_model_path(models_dir: Path) -> Path:
    """The Silero VAD ONNX file, checked against its manifest."""
    model_dir = models_dir / "silero_vad"
    path = model_dir / MANIFEST
    if not path.exists():
        raise ManifestError(f"no VAD manifest at {path}: run `sleuthd models export vad` (or `make models`)")
    m = json.loads(path.read_text())
    onnx_path = model_dir / m["file"]
    if not onnx_path.exists() or sha256_of(onnx_path) != m["sha256"]:
        raise ManifestError(f"{onnx_path} is missing or does not match {path}: run `sleuthd models export vad`")
    return onnx_path


def find_encoders(models_dir: Path) -> list[Path]:
    """Model folders under ``models_dir`` that hold an encoder manifest (the VAD is not an encoder)."""
    if not models_dir.is_dir():
        raise ManifestError(
            f"models folder {models_dir} does not exist: build the models into it with `sleuthd models export all "
            f"--models-dir {models_dir}` (`make models` in a checkout), or point --models-dir / $SLEUTHD_MODELS_DIR "
            "at the folder that has them"
        )
    return sorted(p for p in models_dir.iterdir() if p.is_dir() and p.name != "silero_vad" and (p / MANIFEST).exists())
