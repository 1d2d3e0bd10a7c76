"""The Kokoro dev set (``sleuthd-bench synth-kokoro``): neural-TTS voices in a fit and a transfer split.

Voices and splits are in :mod:`sleuthd_bench.kokoro_voices`, synthesis in :mod:`sleuthd_bench.kokoro`.
Per split this writes two manifests that share every dialogue (turns, reference, altered turn, S2)
and differ only in S3:

* ``<split>.jsonl`` (source ``kokoro-<split>``): S3 is the most similar same-gender voice by centroid
  cosine, the rule of ``sleuthd-bench make``;
* ``<split>-near.jsonl`` (source ``kokoro-<split>-near``): S3 is the same-gender voice nearest to the
  target in blend weights (:func:`kokoro_voices.near_intruder`; a 90/10 blend is 0.1 from its main pack),
  the intruder a TTS system produces when it picks a neighbouring voice.

S2 is an opposite-gender voice of the same split. Every line's ``meta`` records the split and the
blend weights of target, S2 and S3 and their weight distance to the target, and the speed of each
turn, so every turn's true speaker is known. The split names are a contract like those of the
espeak-ng dev set: calibration may be fitted on ``fit`` (``corpus/fit.csv``), never on ``transfer``.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from sleuthd.api import SpeakerEncoder

from sleuthd_bench import kokoro, kokoro_voices
from sleuthd_bench.corpus import embed_clips, read_corpus
from sleuthd_bench.make import MakeOptions, SpeakerPool, plan_dialogues, speaker_pools
from sleuthd_bench.manifest import ManifestLine, relative_path, write_manifest
from sleuthd_bench.progress import Progress

logger = logging.getLogger(__name__)

S3_NEAR_BLEND = "near_blend"
_COSINE_DIGITS = 4


@dataclass(frozen=True)
class KokoroDevSetSpec:
    """One size of the Kokoro dev set: the voice design (:data:`kokoro_voices.DESIGNS`), takes per voice and
    dialogues per target voice in each split."""

    size: str
    clips_per_voice: int
    fit_dialogues: int
    transfer_dialogues: int


# large: 26 fit voices (19 F, 7 M) x 6 = 156 dialogues, 16 transfer voices (12 F, 4 M) x 9 = 144;
# 672 clips, 60 min of audio: about 15 min to synthesize on 2 free cores (70 min on 2 busy shared ones).
PRESETS: dict[str, KokoroDevSetSpec] = {
    "small": KokoroDevSetSpec("small", clips_per_voice=8, fit_dialogues=1, transfer_dialogues=1),
    "large": KokoroDevSetSpec("large", clips_per_voice=16, fit_dialogues=6, transfer_dialogues=9),
}


def source_name(split: str, near: bool = False) -> str:
    """The manifest ``source`` of a split: ``kokoro-fit``, ``kokoro-transfer-near``, ..."""
    return f"kokoro-{split}" + ("-near" if near else "")


def _cosine(a: SpeakerPool, b: SpeakerPool) -> float:
    return round(float(a.centroid @ b.centroid), _COSINE_DIGITS)


def annotate(
    lines: Sequence[ManifestLine], voices: Mapping[str, kokoro_voices.KokoroVoice], speeds: Mapping[str, float]
) -> list[ManifestLine]:
    """Add to each line's meta the split, the weights of target, S2 and S3, their weight distances to
    the target and the speed of every turn (``speeds``: manifest-relative path -> speed)."""
    out = []
    for line in lines:
        target = voices[line.target_speaker]
        s2, s3 = voices[line.meta["s2_speaker"]], voices[line.meta["s3_speaker"]]
        meta = dict(line.meta)
        meta.update(
            split=target.split,
            target_weights=target.fractions,
            s2_weights=s2.fractions,
            s2_weight_distance=round(kokoro_voices.weight_distance(target, s2), 2),
            s3_weights=s3.fractions,
            s3_weight_distance=round(kokoro_voices.weight_distance(target, s3), 2),
            turn_speeds=[speeds[p] for p in line.target_turns],
        )
        out.append(replace(line, meta=meta))
    return out


def near_lines(
    lines: Sequence[ManifestLine],
    pools: Mapping[str, SpeakerPool],
    voices: Mapping[str, kokoro_voices.KokoroVoice],
    manifest_dir: Path,
    seed: int,
    max_distance: float = kokoro_voices.NEAR_MAX_DISTANCE,
) -> list[ManifestLine]:
    """The same dialogues with S3 replaced by the near-blend intruder (:func:`kokoro_voices.near_intruder`
    among the voices of ``pools``), a clip of it drawn with ``Random(f"{seed}:{dialogue_id}:near")``.

    Source and dialogue id get the suffix ``-near``; meta records ``s3_policy = "near_blend"``.
    """
    candidates = [voices[s] for s in pools]
    out = []
    for line in lines:
        target = voices[line.target_speaker]
        intruder = kokoro_voices.near_intruder(target, candidates, max_distance)
        clip = random.Random(f"{seed}:{line.dialogue_id}:near").choice(pools[intruder.name].clips)
        source = f"{line.source}-near"
        meta = dict(line.meta)
        meta.update(
            s3_speaker=intruder.name,
            s3_gender=intruder.gender,
            s3_policy=S3_NEAR_BLEND,
            s3_centroid_cosine=_cosine(pools[target.name], pools[intruder.name]),
            s3_weights=intruder.fractions,
            s3_weight_distance=round(kokoro_voices.weight_distance(target, intruder), 2),
        )
        if clip.text:
            meta["s3_text"] = clip.text
        else:
            meta.pop("s3_text", None)
        out.append(
            replace(
                line,
                dialogue_id=source + line.dialogue_id.removeprefix(line.source),
                source=source,
                s3_audio=relative_path(clip.path, manifest_dir),
                meta=meta,
            )
        )
    return out


def _speeds(split_csv: Path, manifest_dir: Path) -> dict[str, float]:
    with split_csv.open(newline="", encoding="utf-8") as fh:
        return {
            relative_path(split_csv.parent / row["path"], manifest_dir): float(row["speed"])
            for row in csv.DictReader(fh)
        }


@dataclass(frozen=True)
class KokoroDevSetResult:
    """Where the manifests are (``fit``, ``fit-near``, ``transfer``, ``transfer-near``) and how many
    dialogues each has."""

    out_dir: Path
    manifests: dict[str, Path]
    dialogues: dict[str, int]


def _s3_summary(lines: Sequence[ManifestLine]) -> dict[str, Any]:
    distances = sorted(float(line.meta["s3_weight_distance"]) for line in lines)
    cosines = sorted(float(line.meta["s3_centroid_cosine"]) for line in lines)
    return {
        "weight_distance_min_median_max": [distances[0], distances[len(distances) // 2], distances[-1]],
        "centroid_cosine_min_median_max": [cosines[0], cosines[len(cosines) // 2], cosines[-1]],
    }


async def build_kokoro_devset(
    out_dir: Path,
    spec: KokoroDevSetSpec,
    encoder: SpeakerEncoder,
    *,
    seed: int = 0,
    turns: int = 5,
    workers: int = 2,
    threads: int = 1,
    show_progress: bool = True,
) -> KokoroDevSetResult:
    """Synthesize (or reuse) the corpus under ``out_dir/corpus`` and write both manifests per split.

    Also writes ``kokoro.json`` (what was built: voices per split and gender, dialogues, S3 weight
    distances and cosines per rule, how often the two rules pick the same intruder).
    """
    out_dir = Path(out_dir)
    voices = kokoro_voices.design_voices(kokoro_voices.DESIGNS[spec.size], seed)
    by_name = {v.name: v for v in voices}
    clips_per_voice = max(spec.clips_per_voice, turns + 3)  # turns + reference + spare clips
    with Progress(0, "synthesizing (Kokoro)", enabled=show_progress) as bar:
        corpus = kokoro.build_corpus(
            out_dir / "corpus", voices, clips_per_voice, seed, workers=workers, threads=threads, progress=bar.update_to
        )
    dialogues = {"fit": spec.fit_dialogues, "transfer": spec.transfer_dialogues}
    manifests: dict[str, Path] = {}
    counts: dict[str, int] = {}
    splits: dict[str, Any] = {}
    for split, split_csv in corpus.split_csvs.items():
        clips = read_corpus(split_csv)
        with Progress(len(clips), f"embedding {split_csv.name}", enabled=show_progress) as bar:
            embeddings = await embed_clips(encoder, clips, progress=bar.advance)
        pools = speaker_pools(clips, embeddings)
        options = MakeOptions(turns=turns, dialogues_per_speaker=dialogues[split], source=source_name(split), seed=seed)
        planned, _ = plan_dialogues(pools, options, out_dir, f"corpus/{split_csv.name}", encoder.name)
        lines = annotate(planned, by_name, _speeds(split_csv, out_dir))
        near = near_lines(lines, pools, by_name, out_dir, seed)
        for key, rows in ((split, lines), (f"{split}-near", near)):
            manifests[key] = write_manifest(out_dir / f"{key}.jsonl", rows)
            counts[key] = len(rows)
        split_voices = [by_name[s] for s in pools]
        splits[split] = {
            "voices": {g: sum(v.gender == g for v in split_voices) for g in ("F", "M")},
            "clips": len(clips),
            "clips_skipped_too_little_speech": sum(e is None for e in embeddings),
            "dialogues": len(lines),
            "s3_most_similar": _s3_summary(lines),
            "s3_near": _s3_summary(near),
            "same_s3_speaker_share": round(
                sum(a.meta["s3_speaker"] == b.meta["s3_speaker"] for a, b in zip(lines, near, strict=True))
                / len(lines),
                3,
            ),
        }
    description = {
        "spec": asdict(spec),
        "seed": seed,
        "turns": turns,
        "clips_per_voice": clips_per_voice,
        "clips_synthesized_this_run": corpus.synthesized,
        "splits": splits,
        "manifests": {k: p.name for k, p in manifests.items()},
    }
    tmp = out_dir / ".kokoro.json.tmp"
    tmp.write_text(json.dumps(description, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, out_dir / "kokoro.json")
    return KokoroDevSetResult(out_dir, manifests, counts)
