"""Every clip of the robustness matrix embedded once per encoder, through the product's public API
(``sleuthd.api.SpeakerEncoder``: decode, resampling, loudness, the energy VAD, the encoder's windows and
micro-batcher, exactly the server's path), cached on disk.

Cache: ``<root>/emb/<encoder>.npz`` with the clips' relative paths, their unit embeddings (NaN rows for
clips the encoder found unusable), speech and audio seconds, and the encoder's weights hash; a cache
for other weights is refused, never mixed. The fused embedding is not cached: it is the components'
embeddings joined as sleuthd.fusion joins them (each part scaled by 1/sqrt(2)).

Band matching (sleuthd.judgment.dialogue.EncoderDialogue) needs two more things, cached under
``<root>/narrow/``: every clip's effective bandwidth (``bandwidth.npz``, measured on the decoded clip as the
server's fused decode measures it) and the embeddings of the clips' narrowband copies (``emb/<encoder>.npz``,
the same format, made by the server's own ``narrowband_copy``) for the clips of instances that are matched.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ENCODERS = ("ge2e", "campplus")


@dataclass
class Embeddings:
    """One encoder's embeddings of the matrix's clips."""

    encoder: str
    weights_sha256: str
    paths: list[str]
    vectors: np.ndarray  # (N, D) float32, NaN rows for unusable clips
    speech_seconds: np.ndarray  # (N,)
    audio_seconds: np.ndarray  # (N,)

    def __post_init__(self) -> None:
        self.index = {p: k for k, p in enumerate(self.paths)}

    def get(self, path: str) -> tuple[np.ndarray | None, float]:
        k = self.index[path]
        v = self.vectors[k]
        return (None if np.isnan(v[0]) else v), float(self.speech_seconds[k])


NARROW = "narrow"
MAX_SECONDS = 600.0  # longer than any clip of the matrix


def cache_path(root: Path, encoder: str) -> Path:
    return root / "emb" / f"{encoder}.npz"


def narrow_root(root: Path) -> Path:
    """Where the narrowband copies' embeddings of the clips under ``root`` are cached (same relative paths)."""
    return root / NARROW


def bandwidth_path(root: Path) -> Path:
    return narrow_root(root) / "bandwidth.npz"


def load_bandwidths(root: Path) -> dict[str, float]:
    """Clip path -> effective bandwidth in Hz (NaN: too short or silent to tell); {} when never measured."""
    path = bandwidth_path(root)
    if not path.is_file():
        return {}
    with np.load(path, allow_pickle=False) as z:
        return dict(zip(list(z["paths"]), z["hz"].tolist(), strict=True))


def measure_bandwidths(
    root: Path, paths: Sequence[str], progress: Callable[[str, int, int], None] | None = None
) -> dict[str, float]:
    """The bandwidths the cache lacks, measured and saved (about 10 ms a clip: a decode and a spectrum)."""
    from sleuthd.api import clip_channel
    from sleuthd.domain import AudioInput

    known = load_bandwidths(root)
    todo = [p for p in paths if p not in known]
    for n, p in enumerate(todo, 1):
        hz = clip_channel(AudioInput((root / p).read_bytes()), MAX_SECONDS)[0]
        known[p] = np.nan if hz is None else hz
        if progress and (n % 200 == 0 or n == len(todo)):
            progress("bandwidth", n, len(todo))
    if todo:
        path = bandwidth_path(root)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, paths=np.array(list(known)), hz=np.array(list(known.values()), np.float64))
        tmp.replace(path)
    return known


def load(root: Path, encoder: str) -> Embeddings:
    path = cache_path(root, encoder)
    if not path.is_file():
        raise FileNotFoundError(f"no embeddings for {encoder} under {root}: run `sleuthd-bench robustness embed`")
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        return Embeddings(encoder, meta["weights_sha256"], list(z["paths"]), z["vectors"], z["speech"], z["audio"])


def _save(root: Path, e: Embeddings) -> None:
    path = cache_path(root, e.encoder)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    meta = json.dumps({"encoder": e.encoder, "weights_sha256": e.weights_sha256})
    np.savez(
        tmp,
        meta=np.array(meta),
        paths=np.array(e.paths),
        vectors=e.vectors,
        speech=e.speech_seconds,
        audio=e.audio_seconds,
    )
    tmp.replace(path)


def manifest_paths(manifests: Iterable[Path]) -> list[str]:
    """Every audio path (relative to the data folder) the manifests use, in first-seen order."""
    seen: dict[str, None] = {}
    for m in manifests:
        for raw in m.read_text().splitlines():
            line = json.loads(raw)
            for p in (*line["target_turns"], line["reference"], line["s2_audio"], line["s3_audio"]):
                seen.setdefault(p, None)
    return list(seen)


def embed_all(
    root: Path,
    paths: Sequence[str],
    encoders: Sequence[str] = ENCODERS,
    models_dir: Path | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    chunk: int = 32,
    save_every_s: float = 120.0,
    narrowband: bool = False,
) -> dict[str, Embeddings]:
    """Embed the paths each encoder's cache lacks (saved every few minutes, so an interrupted run resumes).
    ``narrowband``: embed the clips' narrowband copies into the cache under :func:`narrow_root` instead."""
    from sleuthd.api import SpeakerEncoder, narrowband_copy
    from sleuthd.domain import AudioInput

    def source(p: str) -> Path | AudioInput:
        return narrowband_copy(AudioInput((root / p).read_bytes()), MAX_SECONDS) if narrowband else root / p

    cache_root = narrow_root(root) if narrowband else root
    out = {}
    for name in encoders:
        encoder = SpeakerEncoder.load(models_dir, encoder=name)
        sha = str(encoder.manifest.raw.get("source", {}).get("file_sha256", encoder.manifest.sha256))
        try:
            cached = load(cache_root, name)
            if cached.weights_sha256 != sha:
                raise ValueError(
                    f"{cache_path(cache_root, name)} was embedded with other {name} weights: delete it and embed again"
                )
        except FileNotFoundError:
            cached = Embeddings(
                name, sha, [], np.zeros((0, encoder.manifest.embedding_size), np.float32), np.zeros(0), np.zeros(0)
            )
        todo = [p for p in paths if p not in cached.index]
        rows: list[np.ndarray] = []
        speech: list[float] = []
        audio: list[float] = []
        done_paths: list[str] = []
        last = time.monotonic()

        def flush(name: str = name, sha: str = sha) -> None:
            nonlocal cached, rows, speech, audio, done_paths
            if not done_paths:
                return
            cached = Embeddings(
                name,
                sha,
                cached.paths + done_paths,
                np.vstack([cached.vectors, np.stack(rows)]).astype(np.float32),
                np.concatenate([cached.speech_seconds, speech]),
                np.concatenate([cached.audio_seconds, audio]),
            )
            _save(cache_root, cached)
            rows, speech, audio, done_paths = [], [], [], []

        try:
            for start in range(0, len(todo), chunk):
                part = todo[start : start + chunk]
                results = encoder.embed_sync([source(p) for p in part])
                for p, r in zip(part, results, strict=True):
                    vec = r.embedding if r.embedding is not None else np.full(encoder.manifest.embedding_size, np.nan)
                    rows.append(np.asarray(vec, np.float32))
                    speech.append(r.speech_seconds)
                    audio.append(r.audio_seconds)
                    done_paths.append(p)
                if progress:
                    progress(name, min(start + chunk, len(todo)), len(todo))
                if time.monotonic() - last > save_every_s:
                    flush()
                    last = time.monotonic()
            flush()
        finally:
            encoder.close()
        out[name] = cached
    return out


def fused(parts: Sequence[np.ndarray | None]) -> np.ndarray | None:
    """The fused embedding (sleuthd.fusion.FusedEncoder.join): None when any part is unusable."""
    if any(p is None for p in parts):
        return None
    scale = 1.0 / np.sqrt(len(parts))
    return np.concatenate([np.asarray(p, np.float32) * scale for p in parts]).astype(np.float32)  # type: ignore[arg-type]
