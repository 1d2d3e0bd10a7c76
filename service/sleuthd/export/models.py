"""`sleuthd models export`: build model files and write their manifests (card + export facts).

Needs the ``export`` extra for GE2E (torch, resemblyzer, onnx). The VAD export only copies the ONNX
file that ships in the ``silero-vad`` wheel (part of the ``export`` extra, or installed alone with
``--no-deps``; its torch code is never imported), checked against the sha256 in the card.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from sleuthd.clips import pool
from sleuthd.features import WindowSpec, make_windows
from sleuthd.manifest import MANIFEST, read_card, sha256_of

logger = logging.getLogger(__name__)


def _write_manifest(model_dir: Path, manifest: dict[str, Any]) -> Path:
    path = model_dir / MANIFEST
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)
    return path


def parity_cosines(embed_windows: Callable[[np.ndarray], np.ndarray], wavs: Sequence[np.ndarray]) -> list[float]:
    """Cosine between resemblyzer's ``VoiceEncoder.embed_utterance`` and our windows + ``embed_windows``.

    ``wavs`` are 16 kHz waveforms already through resemblyzer's ``preprocess_wav``, so both sides see
    the same samples and any difference is the exported network and front end.
    """
    from resemblyzer import VoiceEncoder

    reference = VoiceEncoder("cpu", verbose=False)
    spec = WindowSpec()
    out = []
    for wav in wavs:
        theirs = reference.embed_utterance(wav.astype(np.float32))
        windows, _ = make_windows(wav.astype(np.float32), spec)
        ours = pool(embed_windows(windows))
        out.append(float(np.dot(theirs, ours)))
    return out


def fsdd_parity_turns(folder: Path, per_turn: int = 5) -> list[np.ndarray]:
    """Real-speech test turns: each speaker's digit takes in ``folder`` joined ``per_turn`` at a time,
    through resemblyzer's ``preprocess_wav`` (8 kHz -> 16 kHz, loudness, webrtcvad trimming)."""
    from resemblyzer import preprocess_wav

    by_speaker: dict[str, list[Path]] = {}
    for p in sorted(folder.glob("*.wav")):
        by_speaker.setdefault(p.stem.split("_")[1], []).append(p)
    turns = []
    for files in by_speaker.values():
        for i in range(0, len(files) - per_turn + 1, per_turn):
            turns.append(np.concatenate([preprocess_wav(f) for f in files[i : i + per_turn]]))
    return turns


def export_ge2e_model(models_dir: Path, parity_dir: Path | None) -> Path:
    """Write ``models_dir/ge2e/ge2e.onnx`` and its manifest, with parity figures if clips are given."""
    import onnxruntime as ort

    from sleuthd.export import ge2e as export_ge2e

    model_dir = models_dir / "ge2e"
    model_dir.mkdir(parents=True, exist_ok=True)
    card = read_card("ge2e")
    w = card["input"]["window"]
    spec = WindowSpec(
        window_frames=w["window_frames"],
        hop_samples=w["hop_samples"],
        context_samples=w["context_samples"],
        rate_per_second=w["rate_per_second"],
        min_coverage=w["min_coverage"],
    )
    onnx_path = model_dir / card["file"]
    facts = export_ge2e.export(onnx_path, spec)
    if facts["package_version"] != card["source"]["package_version"]:
        raise RuntimeError(
            f"installed resemblyzer {facts['package_version']} differs from the card's "
            f"{card['source']['package_version']}: update the card sleuthd/cards/ge2e.json deliberately"
        )
    parity: dict[str, Any] = {"measured": False, "why": "no parity clips given"}
    if parity_dir is not None and parity_dir.is_dir():
        session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])

        def run(windows: np.ndarray) -> np.ndarray:
            (emb,) = session.run(None, {export_ge2e.INPUT_NAME: windows})
            return np.asarray(emb)

        cos = parity_cosines(run, fsdd_parity_turns(parity_dir))
        parity = {
            "measured": True,
            "against": "resemblyzer VoiceEncoder.embed_utterance (torch, CPU) on the same preprocessed audio",
            "clips": f"{len(cos)} real-speech turns joined from {parity_dir.name} (FSDD, 8 kHz -> 16 kHz)",
            "min_cosine": round(min(cos), 7),
            "mean_cosine": round(float(np.mean(cos)), 7),
        }
        logger.info("parity vs resemblyzer: min cosine %.7f over %d clips", min(cos), len(cos))
        if min(cos) < 0.999:
            raise RuntimeError(f"exported GE2E disagrees with resemblyzer: min cosine {min(cos):.5f} < 0.999")
    manifest = {
        **card,
        "source": {**card["source"], **facts},
        "sha256": sha256_of(onnx_path),
        "parity": parity,
        "exported_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    return _write_manifest(model_dir, manifest)


def export_vad_model(models_dir: Path) -> Path:
    """Copy Silero VAD's sequence ONNX file out of the installed ``silero-vad`` wheel."""
    model_dir = models_dir / "silero_vad"
    model_dir.mkdir(parents=True, exist_ok=True)
    card = read_card("silero_vad")
    spec = importlib.util.find_spec("silero_vad")  # locates the package without importing it (it imports torch)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "silero-vad is not installed: pip install 'sleuthd[export]' (or, without torch, "
            "`pip install --no-deps silero-vad==6.2.3`: only the ONNX file in its wheel is used)"
        )
    from importlib.metadata import version

    installed = version("silero-vad")
    if installed != card["source"]["package_version"]:
        raise RuntimeError(
            f"installed silero-vad {installed} differs from the card's {card['source']['package_version']}"
        )
    src = Path(next(iter(spec.submodule_search_locations))) / "data" / Path(card["source"]["file"]).name
    dst = model_dir / card["file"]
    expected = card["source"].get("file_sha256")
    if expected and sha256_of(src) != expected:
        raise RuntimeError(f"{src} does not match the sha256 in the card: reinstall silero-vad=={installed}")
    shutil.copyfile(src, dst)
    manifest = {
        **card,
        "sha256": sha256_of(dst),
        "exported_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    return _write_manifest(model_dir, manifest)
