"""The development benchmark (``sleuthd-bench synth``): synthetic and real-speech splits.

Splits (the names are part of the contract: calibration is fitted on ``fit`` and must be reported
on the others):

* ``fit``: espeak-ng voices only; targets and their S2/S3 pools are all espeak voices.
* ``transfer``: flite voices and the sox pitch/tempo variants ("similar speakers"); targets and
  pools restricted to those, so nothing in it was seen when fitting on ``fit``.
* ``fsdd``: real recordings (FSDD spoken digits joined into turns). All speakers are male, so S2
  falls back to the least similar speaker (``meta.s2_policy = "least_similar"``).

Each split's manifest uses the split name as ``source``. ``all.jsonl`` concatenates fit and
transfer. Audio is cached: synthesized clips and FSDD turns that already exist are not rebuilt.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from sleuthd.api import SpeakerEncoder

from sleuthd_bench import synth
from sleuthd_bench.make import MakeOptions, MakeResult, make_manifest
from sleuthd_bench.manifest import dumps
from sleuthd_bench.progress import Progress

logger = logging.getLogger(__name__)

SPLITS = ("fit", "transfer", "fsdd")
SIZES = ("small", "large")
FIT_FAMILIES = frozenset({"espeak"})
TRANSFER_FAMILIES = frozenset({"flite", "sox"})
REPO = Path(__file__).resolve().parents[2]
# Where FSDD is looked for when --fsdd-dir is not given, first match wins.
FSDD_CANDIDATES = (Path("/work/shared/data/fsdd"), REPO.parent / "shared" / "data" / "fsdd")


@dataclass(frozen=True)
class DevSetSpec:
    """What one size of the dev set contains.

    ``*_voices`` are catalogue voice names (empty = every catalogue voice of the split's families);
    ``clips_per_voice`` sentences are synthesized per voice; FSDD gets ``fsdd_turns_per_speaker``
    joined turns per speaker. ``*_dialogues`` are dialogues per target speaker.
    """

    size: str
    fit_voices: tuple[str, ...]
    transfer_voices: tuple[str, ...]
    clips_per_voice: int
    fit_dialogues: int
    transfer_dialogues: int
    fsdd_turns_per_speaker: int
    fsdd_dialogues: int


# small: 6 + 6 synthetic targets and 6 FSDD speakers, one dialogue each; builds and replays in CI.
# large: 34 espeak x 6 = 204 fit, 19 flite/sox x 9 = 171 transfer, 6 FSDD x 30 = 180 dialogues.
PRESETS: dict[str, DevSetSpec] = {
    "small": DevSetSpec(
        size="small",
        fit_voices=("espeak-m1", "espeak-m3", "espeak-m7", "espeak-f1", "espeak-f2", "espeak-f4"),
        transfer_voices=(
            "flite-slt",
            "flite-rms",
            "flite-awb",
            "flite-slt-p+200",
            "flite-rms-p-200",
            "espeak-f2-p-200",
        ),
        clips_per_voice=8,
        fit_dialogues=1,
        transfer_dialogues=1,
        fsdd_turns_per_speaker=12,
        fsdd_dialogues=1,
    ),
    "large": DevSetSpec(
        size="large",
        fit_voices=(),
        transfer_voices=(),
        clips_per_voice=24,
        fit_dialogues=6,
        transfer_dialogues=9,
        fsdd_turns_per_speaker=60,
        fsdd_dialogues=30,
    ),
}


class DevSetError(ValueError):
    """The dev set cannot be built as asked (unknown voice, missing FSDD data, ...)."""


@dataclass(frozen=True)
class DevSetResult:
    out_dir: Path
    manifests: dict[str, Path]  # split name (and "all") -> manifest path
    dialogues: dict[str, int]


def split_voices(split: str, names: Sequence[str]) -> list[synth.Voice]:
    """The catalogue voices of a synthetic split; ``names`` empty means all of the split's families."""
    families = FIT_FAMILIES if split == "fit" else TRANSFER_FAMILIES
    catalogue = synth.catalogue()
    if not names:
        return [v for v in catalogue if v.family in families]
    by_name = {v.name: v for v in catalogue}
    out = []
    for name in names:
        if name not in by_name:
            raise DevSetError(f"unknown voice {name!r} for split {split}")
        voice = by_name[name]
        if voice.family not in families:
            raise DevSetError(f"voice {name} is of family {voice.family}; split {split} takes {sorted(families)}")
        out.append(voice)
    return out


def find_fsdd(explicit: Path | None) -> Path | None:
    """The FSDD folder: ``explicit`` if given (it must hold fsdd.csv), else the first default that exists."""
    if explicit is not None:
        if not (Path(explicit) / "fsdd.csv").is_file():
            raise DevSetError(f"--fsdd-dir {explicit} has no fsdd.csv (see the FSDD README)")
        return Path(explicit)
    for candidate in FSDD_CANDIDATES:
        if (candidate / "fsdd.csv").is_file():
            return candidate
    return None


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _subset_csv(corpus_csv: Path, speakers: set[str], out: Path) -> Path:
    """Write the rows of ``corpus_csv`` whose speaker is in ``speakers`` to ``out`` (same folder)."""
    with corpus_csv.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(synth.CSV_HEADER)
    for row in rows:
        if row["speaker"] in speakers:
            writer.writerow([row[c] for c in synth.CSV_HEADER])
    _write_text(out, buf.getvalue())
    return out


async def build_devsets(
    out_dir: Path,
    spec: DevSetSpec,
    encoder: SpeakerEncoder,
    *,
    seed: int = 0,
    turns: int = 5,
    fsdd_dir: Path | None = None,
    splits: Sequence[str] = SPLITS,
    workers: int = 2,
    show_progress: bool = True,
) -> DevSetResult:
    """Synthesize (or reuse) the corpora and write ``<split>.jsonl`` per split plus ``all.jsonl``.

    Layout under ``out_dir``: ``corpus/synth/`` (all synthetic voices, ``corpus.csv`` and one
    ``<split>.csv`` per synthetic split), ``corpus/fsdd/`` (FSDD turns), the manifests, and
    ``devset.json`` describing what was built. The fsdd split is skipped with a warning when no
    FSDD folder is found and none was given.
    """
    unknown = [s for s in splits if s not in SPLITS]
    if unknown:
        raise DevSetError(f"unknown split(s) {', '.join(unknown)}; choose from {', '.join(SPLITS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    clips_per_voice = max(spec.clips_per_voice, turns + 3)  # turns + reference + spare clips
    manifests: dict[str, Path] = {}
    results: dict[str, MakeResult] = {}

    synthetic = [s for s in splits if s in ("fit", "transfer")]
    if synthetic:
        voices_by_split = {
            s: split_voices(s, spec.fit_voices if s == "fit" else spec.transfer_voices) for s in synthetic
        }
        all_voices = list({v.name: v for s in synthetic for v in voices_by_split[s]}.values())
        corpus_dir = out_dir / "corpus" / "synth"
        with Progress(0, "synthesizing", enabled=show_progress) as bar:
            corpus_csv = synth.build_corpus(
                corpus_dir, all_voices, clips_per_voice, seed, progress=bar.update_to, workers=workers
            )
        dialogues = {"fit": spec.fit_dialogues, "transfer": spec.transfer_dialogues}
        for split in synthetic:
            split_csv = _subset_csv(corpus_csv, {v.name for v in voices_by_split[split]}, corpus_dir / f"{split}.csv")
            options = MakeOptions(turns=turns, dialogues_per_speaker=dialogues[split], source=split, seed=seed)
            results[split] = await make_manifest(
                split_csv, out_dir / f"{split}.jsonl", options, encoder, show_progress=show_progress
            )
            manifests[split] = out_dir / f"{split}.jsonl"

    if "fsdd" in splits:
        fsdd = find_fsdd(fsdd_dir)
        if fsdd is None:
            logger.warning(
                "FSDD not found in %s; the fsdd split is skipped (pass --fsdd-dir)",
                " or ".join(str(c) for c in FSDD_CANDIDATES),
            )
        else:
            turns_per_speaker = max(spec.fsdd_turns_per_speaker, turns + 3)
            logger.info("joining FSDD digits from %s into %d turns per speaker", fsdd, turns_per_speaker)
            fsdd_csv = synth.build_fsdd_corpus(fsdd, out_dir / "corpus" / "fsdd", turns_per_speaker, seed)
            options = MakeOptions(turns=turns, dialogues_per_speaker=spec.fsdd_dialogues, source="fsdd", seed=seed)
            results["fsdd"] = await make_manifest(
                fsdd_csv, out_dir / "fsdd.jsonl", options, encoder, show_progress=show_progress
            )
            manifests["fsdd"] = out_dir / "fsdd.jsonl"

    combined = [line for s in ("fit", "transfer") if s in results for line in results[s].lines]
    if combined:
        manifests["all"] = out_dir / "all.jsonl"
        _write_text(manifests["all"], dumps(combined))
    counts = {s: len(r.lines) for s, r in results.items()}
    if combined:
        counts["all"] = len(combined)
    description = {
        "spec": asdict(spec),
        "seed": seed,
        "turns": turns,
        "clips_per_voice": clips_per_voice,
        "splits": {
            s: {
                "manifest": manifests[s].name,
                "dialogues": len(r.lines),
                "target_speakers": r.n_targets,
                "clips": r.n_clips,
                "clips_skipped_too_little_speech": r.n_skipped,
                "s2_least_similar_targets": list(r.s2_fallback_targets),
            }
            for s, r in results.items()
        },
    }
    _write_text(out_dir / "devset.json", json.dumps(description, indent=2) + "\n")
    return DevSetResult(out_dir, manifests, counts)
