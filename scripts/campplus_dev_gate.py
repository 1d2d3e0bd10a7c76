"""The dev-benchmark gate for a cheaper CAM++ (issue 30): every CAM++ embedding of the dev benchmark's caches made
again with a variant, then fused `auto` judged offline on both, paired, split by split (numbers for
docs/research/fused-speed/, not a test). ``--base data/robustness`` does the same for the robustness matrix's
eval conditions.

Variants:
- ``float``: today's model and windows through this script's own path (a check of the path: every cosine to the
  cached embeddings should be 1);
- ``bf16``: OpenVINO's CPU plugin with bfloat16 inference for everything after the front end (the DFT, mel and log
  stay float32: in bfloat16 they alone take the parity under 0.7; scripts/campplus_variants.py); needs
  ``pip install openvino``;
- ``bf16-tdnn``: the same with the 2-D head in float32 too (bfloat16 for the TDNN only);
- ``whole-turn``: today's float model, one call per clip on all its speech instead of 3 s windows every 1.5 s
  (a clip with less than one window of speech keeps today's refilled window).

What is re-embedded: ``<base>/emb``, ``<base>/narrow/emb`` and ``<base>/clipped/emb``'s CAM++ caches (the clips, their
narrowband copies and their clipped or noisy copies, made by the server's own ``channel_copy``), through the
server's decode, loudness normalisation and energy VAD. GE2E's caches and the channel measures are copied. The
judgment is the server's default fused `auto` (the blend with band, clip and noise matching), exactly as
``sleuthd-bench robustness report`` judges; the comparison is ``sleuthd_bench.paired`` (2,000 resamples).

    python scripts/campplus_dev_gate.py VARIANT [--base data/devlarge] [--out DIR] [--models models]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
from campplus_variants import OPENVINO_VARIANTS, openvino_model  # scripts/, beside this file
from sleuthd.audio.vad import EnergyVad
from sleuthd.domain import AudioInput
from sleuthd.encoders.clips import cut_placements, decode, pool, trim
from sleuthd.encoders.manifest import EncoderManifest, load_encoder_manifest
from sleuthd_bench.robustness import embed

Model = Callable[[np.ndarray], np.ndarray]  # (batch, samples) -> (batch, 192)


def onnx_model(manifest: EncoderManifest) -> Model:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 0
    session = ort.InferenceSession(str(manifest.path), so, providers=["CPUExecutionProvider"])
    return lambda x: session.run([manifest.output_name], {manifest.input_name: x})[0]


def clip_embedder(variant: str, manifest: EncoderManifest) -> Callable[[AudioInput], tuple[np.ndarray, float, float]]:
    vad = EnergyVad()
    if variant == "bf16":
        model = openvino_model(manifest.path, OPENVINO_VARIANTS["bf16 after the front end"])
    elif variant == "bf16-tdnn":
        model = openvino_model(manifest.path, OPENVINO_VARIANTS["bf16 TDNN only"])
    else:
        model = onnx_model(manifest)
    nan = np.full(manifest.embedding_size, np.nan, np.float32)

    def embed_clip(audio: AudioInput) -> tuple[np.ndarray, float, float]:
        speech = trim(decode(audio, embed.MAX_SECONDS).samples, manifest.loudness_target_dbfs, vad)
        (clip,) = cut_placements(speech, manifest, [None])
        if clip.windows is None:
            return nan, clip.speech_seconds, clip.audio_seconds
        if variant == "whole-turn" and len(clip.windows) > 1:
            kept = speech.samples[speech.keep].astype(np.float32)
            vectors = model(kept[None, :])
        else:
            vectors = np.concatenate([model(clip.windows[i : i + 8]) for i in range(0, len(clip.windows), 8)])
        vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        return pool(vectors), clip.speech_seconds, clip.audio_seconds

    return embed_clip


def as_audio(source: Path | AudioInput) -> AudioInput:
    return AudioInput(source.read_bytes()) if isinstance(source, Path) else source


def build(variant: str, base: Path, out: Path, models: Path) -> None:
    manifest = load_encoder_manifest(models / "campplus")
    embed_clip = clip_embedder(variant, manifest)
    out.mkdir(parents=True, exist_ok=True)
    for entry in base.iterdir():  # the manifests, the audio and whatever else the caches point into
        if entry.name not in ("emb", embed.NARROW, embed.CLIPPED) and not (out / entry.name).exists():
            (out / entry.name).symlink_to(entry.resolve())
    for kind, at in (("plain", base), ("narrow", embed.narrow_root(base)), ("clipped", embed.clipped_root(base))):
        target = out / at.relative_to(base)
        if not embed.cache_path(at, "campplus").is_file():
            continue
        (target / "emb").mkdir(parents=True, exist_ok=True)
        shutil.copy(embed.cache_path(at, "ge2e"), embed.cache_path(target, "ge2e"))
        if kind == "narrow" and embed.bandwidth_path(base).is_file():
            shutil.copy(embed.bandwidth_path(base), embed.bandwidth_path(out))
        cached = embed.load(at, "campplus")
        done = embed.cache_path(target, "campplus")
        if done.is_file() and embed.load(target, "campplus").paths == cached.paths:
            print(f"{kind}: {len(cached.paths)} embeddings already made", flush=True)
            continue
        rows, speech, audio, cosines = [], [], [], []
        t0 = time.monotonic()
        for k, key in enumerate(cached.paths):
            vector, s, a = embed_clip(as_audio(embed.clip_source(base, key, kind == "narrow", kind == "clipped")))
            rows.append(vector)
            speech.append(s)
            audio.append(a)
            if not np.isnan(cached.vectors[k, 0]) and not np.isnan(vector[0]):
                cosines.append(float(vector @ cached.vectors[k]))
            if (k + 1) % 200 == 0:
                print(f"{kind}: {k + 1}/{len(cached.paths)} ({time.monotonic() - t0:.0f} s)", flush=True)
        made = embed.Embeddings(
            "campplus", cached.weights_sha256, cached.paths, np.stack(rows).astype(np.float32),
            np.array(speech), np.array(audio),
        )  # fmt: skip
        embed._save(target, made)
        c = np.array(cosines)
        print(f"{kind}: {len(rows)} clips, cosine to today's embedding min {c.min():.5f}, p1 "
              f"{np.quantile(c, 0.01):.5f}, median {np.median(c):.5f}", flush=True)  # fmt: skip


def judge(root: Path, models: Path, conditions: list[str], split: str = "eval") -> dict[str, list]:
    """Per condition (an eval manifest's name), the detection records of the server's default fused `auto`."""
    from sleuthd.api import SpeakerEncoder
    from sleuthd.config import EngineConfig
    from sleuthd.judgment.calibration import Calibration
    from sleuthd.judgment.evidence import EvidenceCalibration
    from sleuthd_bench.robustness import judges
    from sleuthd_bench.robustness.cli import _load_all

    encoder = SpeakerEncoder.load(models, encoder="fused")
    raw = encoder.manifest.raw
    encoder.close()
    auto, evidence = Calibration.from_manifest(raw, "fused"), EvidenceCalibration.from_manifest(raw)
    _, instances = _load_all(root, split, list(conditions))
    config = EngineConfig()  # the server's defaults
    records: dict[str, list] = {c: [] for c in conditions}
    for inst in instances:
        flagged, _, _ = judges.evidence_flags(
            inst, evidence, auto, config.band_match_octaves, config.clip_match_spread, config.noise_match_db
        )
        records[inst.condition].append(judges.record(inst, flagged))
    return records


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variant", choices=("float", "bf16", "bf16-tdnn", "whole-turn"))
    ap.add_argument("--base", type=Path, default=Path("data/devlarge"))
    ap.add_argument("--out", type=Path, help="default: <base>-campplus-<variant>")
    ap.add_argument("--models", type=Path, default=Path("models"))
    args = ap.parse_args()
    out = args.out or args.base.with_name(f"{args.base.name}-campplus-{args.variant}")
    build(args.variant, args.base, out, args.models)
    from sleuthd_bench import paired
    from sleuthd_bench.robustness import judges

    splits = sorted(f.name.removeprefix("eval-").removesuffix(".jsonl") for f in args.base.glob("eval-*.jsonl"))
    base, variant = judge(args.base, args.models, splits), judge(out, args.models, splits)
    print(f"\n| split | today: Bal (S1/S2/S3) | {args.variant} | Δ Bal [95 % CI] | gate |")
    print("| :--- | :--- | :--- | :--- | :--- |")
    for split in splits:
        a, b = judges.metrics(base[split]), judges.metrics(variant[split])
        d = paired.compare(args.variant, variant[split], "today", base[split], resamples=2000).bal
        gate = "pass" if d.low <= 0.0 <= d.high or d.low > 0 else "FAIL"
        row = (f"| {split} | {a['bal']:.1f} ({a['S1']:.0f}/{a['S2']:.0f}/{a['S3']:.0f}) | {b['bal']:.1f} "
               f"({b['S1']:.0f}/{b['S2']:.0f}/{b['S3']:.0f}) ")  # fmt: skip
        print(f"{row}| {d.difference:+.2f} [{d.low:+.2f}, {d.high:+.2f}] | {gate} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
