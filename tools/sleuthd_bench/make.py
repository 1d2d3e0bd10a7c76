"""Building a SpeakerSleuth-style manifest from a speaker-labelled corpus (``sleuthd-bench make``).

Construction follows the paper (Section 4.2) with our corpora's limits:

* every speaker with at least ``turns + 1`` usable clips is a target; each of its dialogues draws
  ``turns`` distinct clips as the target turns and one more as the reference, so the reference
  always comes from outside the dialogue;
* ``altered_turn`` is drawn uniformly;
* S2 replaces it with a clip of a speaker of the opposite gender drawn from the pool; a corpus with
  no such speaker (FSDD is all male) falls back to the *least* similar other speaker;
* S3 replaces it with a clip of the most similar same-gender speaker, by cosine similarity of the
  encoder's speaker centroids (normalised mean of a speaker's clip embeddings).

Unlike the paper we cannot voice-convert the original turn, so S2/S3 clips carry other words; the
embedding methods never look at the words. Everything is deterministic in the seed: each target
speaker has its own random stream, so adding a speaker to a corpus leaves the others' dialogues as
they were.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sleuthd.api import SpeakerEncoder

from sleuthd_bench.corpus import CorpusClip, embed_clips, read_corpus
from sleuthd_bench.manifest import ManifestLine, relative_path, write_manifest
from sleuthd_bench.progress import Progress

logger = logging.getLogger(__name__)

S2_OPPOSITE_GENDER = "opposite_gender"
S2_LEAST_SIMILAR = "least_similar"
S3_SAME_GENDER = "most_similar_same_gender"
S3_ANY_GENDER = "most_similar_any_gender"
# Cosines in meta are rounded so that float noise in the last bits never changes the manifest bytes.
_COSINE_DIGITS = 4


class MakeError(ValueError):
    """The corpus cannot yield a benchmark with the requested options; the message says why."""


@dataclass(frozen=True)
class MakeOptions:
    """Options of ``bench make``.

    ``turns``: target turns per dialogue (the paper uses 5, and 10 in its appendix).
    ``dialogues_per_speaker``: dialogues built for each eligible target speaker.
    ``source``: the manifest's ``source`` field (discrimination accuracy is reported per source).
    ``seed``: everything random (clips, altered turn, S2 speaker) derives from it.
    """

    turns: int = 5
    dialogues_per_speaker: int = 3
    source: str = "corpus"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.turns < 2:
            raise MakeError(f"--turns must be at least 2, got {self.turns}")
        if self.dialogues_per_speaker < 1:
            raise MakeError(f"--dialogues-per-speaker must be at least 1, got {self.dialogues_per_speaker}")
        if not self.source or self.source == "avg":
            raise MakeError("--source must be a non-empty name other than 'avg'")


@dataclass(frozen=True)
class SpeakerPool:
    """A speaker's usable clips (enough speech) and centroid (unit vector)."""

    speaker: str
    gender: str
    clips: tuple[CorpusClip, ...]
    centroid: np.ndarray


@dataclass(frozen=True)
class MakeResult:
    lines: list[ManifestLine]
    path: Path | None
    n_clips: int
    n_skipped: int  # clips with too little speech
    n_targets: int
    s2_fallback_targets: tuple[str, ...]


def speaker_pools(clips: Sequence[CorpusClip], embeddings: Sequence[np.ndarray | None]) -> dict[str, SpeakerPool]:
    """Group usable clips by speaker (CSV order kept) and compute each speaker's centroid.

    A speaker's gender is that of its first row; speakers whose rows disagree raise :class:`MakeError`.
    """
    if len(clips) != len(embeddings):
        raise ValueError(f"{len(clips)} clips but {len(embeddings)} embeddings")
    genders: dict[str, str] = {}
    members: dict[str, list[tuple[CorpusClip, np.ndarray]]] = {}
    for clip, emb in zip(clips, embeddings, strict=True):
        known = genders.setdefault(clip.speaker, clip.gender)
        if known != clip.gender:
            raise MakeError(f"speaker {clip.speaker!r} is listed with two genders ({known!r} and {clip.gender!r})")
        if emb is not None:
            members.setdefault(clip.speaker, []).append((clip, emb))
    pools: dict[str, SpeakerPool] = {}
    for speaker in sorted(members):
        rows = members[speaker]
        mean = np.mean(np.stack([e for _, e in rows]), axis=0)
        centroid = mean / max(float(np.linalg.norm(mean)), 1e-12)
        pools[speaker] = SpeakerPool(speaker, genders[speaker], tuple(c for c, _ in rows), centroid)
    return pools


def _cosine(a: SpeakerPool, b: SpeakerPool) -> float:
    return float(np.dot(a.centroid, b.centroid))


def _most_similar(target: SpeakerPool, candidates: Sequence[SpeakerPool]) -> SpeakerPool:
    # max() keeps the first of equal keys; sorting by name first makes ties independent of input order.
    return max(sorted(candidates, key=lambda p: p.speaker), key=lambda p: _cosine(target, p))


def _least_similar(target: SpeakerPool, candidates: Sequence[SpeakerPool]) -> SpeakerPool:
    return min(sorted(candidates, key=lambda p: p.speaker), key=lambda p: _cosine(target, p))


def plan_dialogues(
    pools: dict[str, SpeakerPool], options: MakeOptions, manifest_dir: Path, corpus_name: str = "", encoder: str = ""
) -> tuple[list[ManifestLine], list[str]]:
    """The manifest lines for ``pools`` (sorted by target speaker, then dialogue index).

    Returns the lines and the targets whose S2 fell back to the least similar speaker. Raises
    :class:`MakeError` when no speaker has ``turns + 1`` usable clips or fewer than three speakers
    have usable clips (a target needs two other speakers, one for S2 and one for S3).
    """
    need = options.turns + 1
    targets = [p for p in pools.values() if len(p.clips) >= need]
    if not targets:
        most = max((len(p.clips) for p in pools.values()), default=0)
        raise MakeError(
            f"no speaker has the {need} usable clips a {options.turns}-turn dialogue needs "
            f"(turns + reference); the most any speaker has is {most}: lower --turns or add clips"
        )
    if len(pools) < 3:
        raise MakeError(f"need at least 3 speakers with usable clips (target, S2, S3); the corpus has {len(pools)}")
    lines: list[ManifestLine] = []
    fallbacks: list[str] = []
    for target in targets:
        others = [p for p in pools.values() if p.speaker != target.speaker]
        same = [p for p in others if target.gender and p.gender == target.gender]
        s3 = _most_similar(target, same or others)
        s3_policy = S3_SAME_GENDER if same else S3_ANY_GENDER
        if not same:
            logger.warning(
                "speaker %s has no other speaker of its gender: S3 is the most similar of any", target.speaker
            )
        opposite = [p for p in others if target.gender and p.gender and p.gender != target.gender]
        s2_fixed = None if opposite else _least_similar(target, [p for p in others if p.speaker != s3.speaker])
        if s2_fixed is not None:
            fallbacks.append(target.speaker)
        rng = random.Random(f"{options.seed}:{target.speaker}")
        for k in range(options.dialogues_per_speaker):
            picked = rng.sample(target.clips, need)
            turns, reference = picked[: options.turns], picked[options.turns]
            altered = rng.randrange(options.turns)
            s2 = s2_fixed if s2_fixed is not None else rng.choice(opposite)
            s2_clip, s3_clip = rng.choice(s2.clips), rng.choice(s3.clips)
            meta: dict[str, object] = {
                "target_gender": target.gender,
                "s2_speaker": s2.speaker,
                "s2_gender": s2.gender,
                "s2_policy": S2_OPPOSITE_GENDER if s2_fixed is None else S2_LEAST_SIMILAR,
                "s2_centroid_cosine": round(_cosine(target, s2), _COSINE_DIGITS),
                "s3_speaker": s3.speaker,
                "s3_gender": s3.gender,
                "s3_policy": s3_policy,
                "s3_centroid_cosine": round(_cosine(target, s3), _COSINE_DIGITS),
                "seed": options.seed,
                "corpus": corpus_name,
                "encoder": encoder,
            }
            if reference.text:
                meta["reference_text"] = reference.text
            if s2_clip.text and s3_clip.text:
                meta["s2_text"], meta["s3_text"] = s2_clip.text, s3_clip.text
            texts = tuple(c.text for c in turns)
            lines.append(
                ManifestLine(
                    dialogue_id=f"{options.source}-{target.speaker}-{k:03d}",
                    source=options.source,
                    target_speaker=target.speaker,
                    reference=relative_path(reference.path, manifest_dir),
                    target_turns=tuple(relative_path(c.path, manifest_dir) for c in turns),
                    altered_turn=altered,
                    s2_audio=relative_path(s2_clip.path, manifest_dir),
                    s3_audio=relative_path(s3_clip.path, manifest_dir),
                    texts=texts if all(texts) else None,
                    meta=meta,
                )
            )
    return lines, fallbacks


async def make_manifest(
    csv_path: Path,
    out: Path,
    options: MakeOptions,
    encoder: SpeakerEncoder,
    show_progress: bool = True,
) -> MakeResult:
    """Read the corpus, embed it with ``encoder``, plan the dialogues and write the manifest to ``out``."""
    clips = read_corpus(csv_path)
    name = encoder.name
    with Progress(len(clips), f"embedding {Path(csv_path).name}", enabled=show_progress) as bar:
        embeddings = await embed_clips(encoder, clips, progress=bar.advance)
    skipped = [c for c, e in zip(clips, embeddings, strict=True) if e is None]
    if skipped:
        logger.info(
            "%d of %d clips have too little speech for %s and are skipped (e.g. %s)",
            len(skipped),
            len(clips),
            name,
            skipped[0].path,
        )
    pools = speaker_pools(clips, embeddings)
    lines, fallbacks = plan_dialogues(pools, options, Path(out).parent, Path(csv_path).name, name)
    if fallbacks:
        logger.warning(
            "%s: no opposite-gender speaker for %d target speaker(s) (%s); S2 uses the least similar other "
            "speaker instead (meta.s2_policy = %s)",
            Path(csv_path).name,
            len(fallbacks),
            ", ".join(fallbacks),
            S2_LEAST_SIMILAR,
        )
    path = write_manifest(out, lines)
    n_targets = len({line.target_speaker for line in lines})
    logger.info("wrote %s: %d dialogues from %d target speakers", path, len(lines), n_targets)
    return MakeResult(lines, path, len(clips), len(skipped), n_targets, tuple(fallbacks))
