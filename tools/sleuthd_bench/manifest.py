"""The benchmark manifest (JSONL, one dialogue per line): reading, validating and writing it.

The format is fixed by ``docs/benchmark-format.md`` (shared with other teams' tools), so reading is
strict about the required fields and lenient about everything else: optional fields (``context``,
``texts``, ``meta``) are kept as given and unknown fields are ignored, so that manifests written by
other tools replay without edits. Audio paths are relative to the manifest's folder.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REQUIRED = (
    "dialogue_id",
    "source",
    "target_speaker",
    "reference",
    "target_turns",
    "altered_turn",
    "s2_audio",
    "s3_audio",
)
# How many problems to name in one error message before summarising the rest.
_SHOWN_PROBLEMS = 5


class ManifestError(ValueError):
    """A manifest line is malformed or names audio that does not exist; the message says which."""


@dataclass(frozen=True)
class ManifestLine:
    """One dialogue of a manifest. Paths are as written: relative to the manifest's folder."""

    dialogue_id: str
    source: str
    target_speaker: str
    reference: str
    target_turns: tuple[str, ...]
    altered_turn: int
    s2_audio: str
    s3_audio: str
    context: tuple[Mapping[str, Any], ...] | None = None
    texts: tuple[str, ...] | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.target_turns) < 2:
            raise ManifestError(
                f"{self.dialogue_id}: target_turns needs at least 2 turns, got {len(self.target_turns)}"
            )
        if not 0 <= self.altered_turn < len(self.target_turns):
            raise ManifestError(
                f"{self.dialogue_id}: altered_turn {self.altered_turn} is outside 0..{len(self.target_turns) - 1}"
            )
        if self.texts is not None and len(self.texts) != len(self.target_turns):
            raise ManifestError(
                f"{self.dialogue_id}: texts has {len(self.texts)} entries for {len(self.target_turns)} target_turns"
            )

    def audio_paths(self) -> list[tuple[str, str]]:
        """Every audio path of the line with the field it comes from, e.g. ``("target_turns[2]", path)``."""
        out = [("reference", self.reference)]
        out += [(f"target_turns[{i}]", p) for i, p in enumerate(self.target_turns)]
        out += [("s2_audio", self.s2_audio), ("s3_audio", self.s3_audio)]
        return out

    def to_json(self) -> dict[str, Any]:
        """The line as a JSON object, fields in the order of benchmark-format.md; unset optionals left out."""
        obj: dict[str, Any] = {
            "dialogue_id": self.dialogue_id,
            "source": self.source,
            "target_speaker": self.target_speaker,
            "reference": self.reference,
            "target_turns": list(self.target_turns),
            "altered_turn": self.altered_turn,
            "s2_audio": self.s2_audio,
            "s3_audio": self.s3_audio,
        }
        if self.context is not None:
            obj["context"] = [dict(c) for c in self.context]
        if self.texts is not None:
            obj["texts"] = list(self.texts)
        if self.meta:
            obj["meta"] = dict(self.meta)
        return obj


def _string(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = obj[key]
    if not isinstance(value, str) or not value:
        raise ManifestError(f"{where}: {key} must be a non-empty string, got {value!r}")
    return value


def parse_line(obj: Any, where: str) -> ManifestLine:
    """Validate one decoded JSON object; ``where`` (e.g. ``"dev.jsonl line 3"``) prefixes every error."""
    if not isinstance(obj, dict):
        raise ManifestError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in REQUIRED if k not in obj]
    if missing:
        raise ManifestError(f"{where}: missing required field(s) {', '.join(missing)}")
    turns = obj["target_turns"]
    if not isinstance(turns, list) or not all(isinstance(t, str) and t for t in turns):
        raise ManifestError(f"{where}: target_turns must be a list of paths (strings)")
    altered = obj["altered_turn"]
    if isinstance(altered, bool) or not isinstance(altered, int):
        raise ManifestError(f"{where}: altered_turn must be an integer, got {altered!r}")
    texts = obj.get("texts")
    if texts is not None and (not isinstance(texts, list) or not all(isinstance(t, str) for t in texts)):
        raise ManifestError(f"{where}: texts must be a list of strings")
    context = obj.get("context")
    if context is not None and (not isinstance(context, list) or not all(isinstance(c, dict) for c in context)):
        raise ManifestError(f"{where}: context must be a list of objects")
    meta = obj.get("meta") or {}
    if not isinstance(meta, dict):
        raise ManifestError(f"{where}: meta must be an object")
    source = _string(obj, "source", where)
    if source == "avg":
        raise ManifestError(f"{where}: source 'avg' is reserved for the pooled discrimination accuracy")
    try:
        return ManifestLine(
            dialogue_id=_string(obj, "dialogue_id", where),
            source=source,
            target_speaker=_string(obj, "target_speaker", where),
            reference=_string(obj, "reference", where),
            target_turns=tuple(turns),
            altered_turn=altered,
            s2_audio=_string(obj, "s2_audio", where),
            s3_audio=_string(obj, "s3_audio", where),
            context=tuple(context) if context is not None else None,
            texts=tuple(texts) if texts is not None else None,
            meta=meta,
        )
    except ManifestError as exc:
        raise ManifestError(f"{where}: {exc}") from None


def read_manifest(path: Path, check_audio: bool = True) -> list[ManifestLine]:
    """Read and validate a manifest; with ``check_audio`` every audio path must name an existing file.

    Blank lines are skipped. Raises :class:`ManifestError` naming the file and line of the first
    problem (or, for missing audio, the first few missing files and how many there are).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ManifestError(f"cannot read manifest {path}: {exc.strerror or exc}") from None
    lines: list[ManifestLine] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        where = f"{path.name} line {number}"
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ManifestError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        line = parse_line(obj, where)
        if line.dialogue_id in seen:
            raise ManifestError(
                f"{where}: dialogue_id {line.dialogue_id!r} already used on line {seen[line.dialogue_id]}"
            )
        seen[line.dialogue_id] = number
        lines.append(line)
    if not lines:
        raise ManifestError(f"manifest {path} has no dialogues")
    if check_audio:
        check_audio_exists(path.parent, lines, path.name)
    return lines


def check_audio_exists(base: Path, lines: Iterable[ManifestLine], manifest_name: str) -> None:
    """Raise :class:`ManifestError` listing audio paths (relative to ``base``) that are not files."""
    missing: list[str] = []
    checked: dict[str, bool] = {}
    for line in lines:
        for what, rel in line.audio_paths():
            if rel not in checked:
                checked[rel] = (base / rel).is_file()
            if not checked[rel]:
                missing.append(f"{line.dialogue_id} {what}: {rel} (looked for {base / rel})")
    if missing:
        shown = "; ".join(missing[:_SHOWN_PROBLEMS])
        more = f" and {len(missing) - _SHOWN_PROBLEMS} more" if len(missing) > _SHOWN_PROBLEMS else ""
        raise ManifestError(
            f"manifest {manifest_name} names {len(missing)} audio file(s) that do not exist "
            f"(paths are relative to the manifest's folder): {shown}{more}"
        )


def relative_path(path: Path, manifest_dir: Path) -> str:
    """``path`` relative to ``manifest_dir`` with forward slashes, as a manifest stores it."""
    return Path(os.path.relpath(Path(path).resolve(), Path(manifest_dir).resolve())).as_posix()


def dumps(lines: Sequence[ManifestLine]) -> str:
    """The manifest text: one compact JSON object per line, in the given order."""
    return "".join(json.dumps(line.to_json(), ensure_ascii=False) + "\n" for line in lines)


def write_manifest(path: Path, lines: Sequence[ManifestLine]) -> Path:
    """Write ``lines`` to ``path`` atomically (temporary file, then rename); returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(dumps(lines), encoding="utf-8")
    os.replace(tmp, path)
    return path
