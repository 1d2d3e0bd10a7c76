"""Speaker-labelled corpora for benchmark building: the CSV format and in-process embedding.

A corpus is a CSV with the header ``path,speaker,gender[,text]`` (extra columns are ignored);
paths are relative to the CSV's folder. Embedding runs sleuthd's own pipeline in-process (sleuthd.api): this is
offline tooling, so it does not go through gRPC.
"""

from __future__ import annotations

import csv
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sleuthd.api import SpeakerEncoder

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("path", "speaker", "gender")
# Clips per embedding call: large enough to batch the encoder well, small enough for steady progress.
_EMBED_CHUNK = 32
_GENDER_ALIASES = {"m": "M", "male": "M", "man": "M", "f": "F", "female": "F", "woman": "F"}


class CorpusError(ValueError):
    """The corpus CSV is malformed or names audio that does not exist."""


@dataclass(frozen=True)
class CorpusClip:
    """One row of a corpus: an absolute audio path, its speaker, gender (``""`` = unknown) and text."""

    path: Path
    speaker: str
    gender: str
    text: str = ""


def normalize_gender(value: str) -> str:
    """``"male"``/``"m"`` -> ``"M"``, ``"female"``/``"f"`` -> ``"F"``, empty stays empty, others upper-cased."""
    v = value.strip()
    return _GENDER_ALIASES.get(v.lower(), v.upper())


def read_corpus(csv_path: Path) -> list[CorpusClip]:
    """Read a corpus CSV; raises :class:`CorpusError` on a bad header, empty fields or missing files."""
    csv_path = Path(csv_path)
    try:
        fh = csv_path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise CorpusError(f"cannot read corpus {csv_path}: {exc.strerror or exc}") from None
    with fh:
        reader = csv.DictReader(fh)
        header = [h.strip() for h in reader.fieldnames or []]
        missing = [c for c in REQUIRED_COLUMNS if c not in header]
        if missing:
            raise CorpusError(
                f"{csv_path}: header {','.join(header) or '(empty)'} lacks {', '.join(missing)}; "
                "expected path,speaker,gender[,text]"
            )
        reader.fieldnames = header
        clips: list[CorpusClip] = []
        absent: list[str] = []
        for number, row in enumerate(reader, start=2):
            rel, speaker = (row.get("path") or "").strip(), (row.get("speaker") or "").strip()
            if not rel or not speaker:
                raise CorpusError(f"{csv_path} line {number}: path and speaker must not be empty")
            path = (csv_path.parent / rel).resolve()
            if not path.is_file():
                absent.append(rel)
                continue
            clips.append(
                CorpusClip(path, speaker, normalize_gender(row.get("gender") or ""), (row.get("text") or "").strip())
            )
    if absent:
        raise CorpusError(
            f"{csv_path}: {len(absent)} audio file(s) do not exist (paths are relative to the CSV's folder), "
            f"e.g. {', '.join(absent[:3])}"
        )
    if not clips:
        raise CorpusError(f"{csv_path} lists no clips")
    return clips


async def embed_clips(
    encoder: SpeakerEncoder,
    clips: Sequence[CorpusClip],
    progress: Callable[[int], None] | None = None,
) -> list[np.ndarray | None]:
    """Unit-length embeddings of ``clips`` in order; ``None`` for a clip with too little speech.

    ``progress(n)`` is called with the number of clips finished after every chunk. Undecodable audio
    raises sleuthd's ``AudioError`` naming the file.
    """
    out: list[np.ndarray | None] = []
    for start in range(0, len(clips), _EMBED_CHUNK):
        chunk = clips[start : start + _EMBED_CHUNK]
        results = await encoder.embed([c.path.read_bytes() for c in chunk], [str(c.path) for c in chunk])
        out.extend(r.embedding for r in results)
        if progress is not None:
            progress(len(chunk))
    return out
