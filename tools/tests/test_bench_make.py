"""`sleuthd-bench make`: manifests built from a real (synthesized) speaker corpus with the real encoder."""

from __future__ import annotations

import csv
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio
from sleuthd.api import SpeakerEncoder
from sleuthd_bench import synth
from sleuthd_bench.corpus import CorpusError, read_corpus
from sleuthd_bench.make import MakeError, MakeOptions, make_manifest
from sleuthd_bench.manifest import read_manifest

from tests.support import REPO

pytestmark = pytest.mark.skipif(
    any(shutil.which(t) is None for t in synth.TOOLS), reason="needs espeak-ng, flite and sox (make setup)"
)

# Four male and four female voices: each gender has several candidates for the most similar speaker.
VOICES = (
    "espeak-m1",
    "espeak-m3",
    "espeak-m7",
    "espeak-klatt",
    "espeak-f1",
    "espeak-f2",
    "espeak-f4",
    "flite-slt",
)
CLIPS_PER_VOICE = 7
CORPUS_DIR = REPO / "data" / "bench-test" / "corpus"


@pytest.fixture(scope="module")
def corpus_csv() -> Path:
    """A small synthetic corpus, cached under data/ (synthesized once, then reused)."""
    voices = [synth.get_voice(v) for v in VOICES]
    return synth.build_corpus(CORPUS_DIR, voices, CLIPS_PER_VOICE, seed=3)


@pytest.fixture(scope="module")
def rows(corpus_csv: Path) -> dict[Path, dict[str, str]]:
    """Corpus rows keyed by the clip's absolute path."""
    with corpus_csv.open(newline="") as fh:
        return {(corpus_csv.parent / r["path"]).resolve(): r for r in csv.DictReader(fh)}


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def centroids(speaker_encoder: SpeakerEncoder, rows: dict[Path, dict[str, str]]) -> dict[str, np.ndarray]:
    """Speaker centroids computed here, independently of the code under test."""
    paths = sorted(rows)
    clips = await speaker_encoder.embed(paths)
    by_speaker: dict[str, list[np.ndarray]] = {}
    for p, c in zip(paths, clips, strict=True):
        assert c.embedding is not None, f"{p}: synthetic sentences always have enough speech"
        by_speaker.setdefault(rows[p]["speaker"], []).append(c.embedding)
    out = {}
    for speaker, embs in by_speaker.items():
        mean = np.mean(embs, axis=0)
        out[speaker] = mean / np.linalg.norm(mean)
    return out


def _speaker_of(manifest: Path, rel: str, rows: dict[Path, dict[str, str]]) -> str:
    assert not os.path.isabs(rel), f"{rel}: manifest paths must be relative"
    path = (manifest.parent / rel).resolve()
    assert path.is_file(), f"{rel} does not exist relative to {manifest.parent}"
    return rows[path]["speaker"]


def _subset(corpus_csv: Path, genders: set[str], name: str) -> Path:
    """A CSV next to the corpus with only the rows of the given genders."""
    with corpus_csv.open(newline="") as fh:
        kept = [r for r in csv.DictReader(fh) if r["gender"] in genders]
    out = corpus_csv.parent / name
    with out.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(synth.CSV_HEADER))
        writer.writeheader()
        writer.writerows(kept)
    return out


async def test_same_seed_same_bytes_other_seed_other_manifest(
    speaker_encoder: SpeakerEncoder, corpus_csv: Path, tmp_path: Path
) -> None:
    paths = []
    for folder, seed in (("a", 7), ("b", 7), ("c", 8)):
        out = tmp_path / folder / "manifest.jsonl"
        await make_manifest(
            corpus_csv, out, MakeOptions(dialogues_per_speaker=2, seed=seed), speaker_encoder, show_progress=False
        )
        paths.append(out)
    a, b, c = (p.read_bytes() for p in paths)
    assert a == b
    assert a != c


async def test_lines_follow_the_construction_rules(
    speaker_encoder: SpeakerEncoder,
    corpus_csv: Path,
    rows: dict[Path, dict[str, str]],
    centroids: dict[str, np.ndarray],
    tmp_path: Path,
) -> None:
    # The manifest lives far from the corpus: paths must still resolve relative to its folder.
    out = tmp_path / "deep" / "bench" / "dev.jsonl"
    result = await make_manifest(
        corpus_csv,
        out,
        MakeOptions(turns=5, dialogues_per_speaker=3, source="unit", seed=1),
        speaker_encoder,
        show_progress=False,
    )
    lines = read_manifest(out)  # also checks that every path exists
    assert len(lines) == len(VOICES) * 3 == len(result.lines)
    assert result.n_skipped == 0 and not result.s2_fallback_targets
    gender = {r["speaker"]: r["gender"] for r in rows.values()}
    text = {p: r["text"] for p, r in rows.items()}
    altered_seen = set()
    for line in lines:
        target = line.target_speaker
        assert line.source == "unit"
        assert len(line.target_turns) == 5 and len(set(line.target_turns)) == 5
        assert all(_speaker_of(out, t, rows) == target for t in line.target_turns)
        assert _speaker_of(out, line.reference, rows) == target
        assert line.reference not in line.target_turns
        assert 0 <= line.altered_turn < 5
        altered_seen.add(line.altered_turn)

        s2 = _speaker_of(out, line.s2_audio, rows)
        assert gender[s2] != gender[target]
        assert line.meta["s2_speaker"] == s2 and line.meta["s2_policy"] == "opposite_gender"

        s3 = _speaker_of(out, line.s3_audio, rows)
        same = [s for s in centroids if s != target and gender[s] == gender[target]]
        expected = max(same, key=lambda s: float(centroids[target] @ centroids[s]))
        assert s3 == expected == line.meta["s3_speaker"]
        assert line.meta["s3_centroid_cosine"] == pytest.approx(float(centroids[target] @ centroids[s3]), abs=1e-3)
        assert line.meta["seed"] == 1

        assert line.texts == tuple(text[(out.parent / t).resolve()] for t in line.target_turns)
    assert len(altered_seen) > 1, "altered_turn should vary between dialogues"


async def test_turns_option(speaker_encoder: SpeakerEncoder, corpus_csv: Path, tmp_path: Path) -> None:
    out = tmp_path / "three.jsonl"
    await make_manifest(
        corpus_csv, out, MakeOptions(turns=3, dialogues_per_speaker=1), speaker_encoder, show_progress=False
    )
    lines = read_manifest(out)
    assert {len(line.target_turns) for line in lines} == {3}
    assert all(0 <= line.altered_turn < 3 for line in lines)
    # Ten turns plus a reference need 11 clips per speaker; the corpus has 7.
    with pytest.raises(MakeError, match="11 usable clips"):
        await make_manifest(
            corpus_csv, tmp_path / "ten.jsonl", MakeOptions(turns=10), speaker_encoder, show_progress=False
        )


async def test_least_similar_fallback_without_opposite_gender(
    speaker_encoder: SpeakerEncoder,
    corpus_csv: Path,
    rows: dict[Path, dict[str, str]],
    centroids: dict[str, np.ndarray],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gender = {r["speaker"]: r["gender"] for r in rows.values()}
    males = _subset(corpus_csv, {"M"}, "males.csv")
    out = tmp_path / "males.jsonl"
    with caplog.at_level(logging.WARNING, logger="sleuthd_bench.make"):
        result = await make_manifest(
            males, out, MakeOptions(dialogues_per_speaker=2), speaker_encoder, show_progress=False
        )
    assert any("least similar" in r.getMessage() for r in caplog.records)
    assert len(result.s2_fallback_targets) == 4
    for line in read_manifest(out):
        target = line.target_speaker
        s2 = _speaker_of(out, line.s2_audio, rows)
        s3 = _speaker_of(out, line.s3_audio, rows)
        others = [s for s in centroids if s != target and gender[s] == "M"]
        assert s3 == max(others, key=lambda s: float(centroids[target] @ centroids[s]))
        assert s2 == min([s for s in others if s != s3], key=lambda s: float(centroids[target] @ centroids[s]))
        assert line.meta["s2_policy"] == "least_similar"


def test_corpus_csv_errors(tmp_path: Path) -> None:
    bad_header = tmp_path / "bad.csv"
    bad_header.write_text("file,who\na.wav,x\n")
    with pytest.raises(CorpusError, match="lacks path, speaker, gender"):
        read_corpus(bad_header)
    missing = tmp_path / "missing.csv"
    missing.write_text("path,speaker,gender\nnope/0.wav,x,M\n")
    with pytest.raises(CorpusError, match=r"1 audio file\(s\) do not exist.*nope/0.wav"):
        read_corpus(missing)


def test_cli_writes_manifest_and_reports_errors_plainly(corpus_csv: Path, tmp_path: Path) -> None:
    out = tmp_path / "cli.jsonl"
    cmd = [sys.executable, "-m", "sleuthd_bench.cli", "--log-level", "warning", "make", str(corpus_csv)]
    ok = subprocess.run(
        [*cmd, "--out", str(out), "--turns", "4", "--dialogues-per-speaker", "1", "--source", "cli", "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == len(VOICES)
    assert {len(x["target_turns"]) for x in lines} == {4} and {x["source"] for x in lines} == {"cli"}

    bad = subprocess.run(
        [sys.executable, "-m", "sleuthd_bench.cli", "make", str(tmp_path / "none.csv"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert bad.returncode == 2
    assert "error: cannot read corpus" in bad.stderr and "Traceback" not in bad.stderr
