"""Every clip of the robustness matrix embedded once per encoder, through the product's public API
(``sleuthd.api.SpeakerEncoder``: decode, resampling, loudness, the energy VAD, the encoder's windows and
micro-batcher, exactly the server's path), cached on disk.

Cache: ``<root>/emb/<encoder>.npz`` with the clips' relative paths, their unit embeddings (NaN rows for
clips the encoder found unusable), speech and audio seconds, and the encoder's weights hash; a cache
for other weights is refused, never mixed. The fused embedding is not cached: it is the components'
embeddings joined as sleuthd.fusion joins them (each part scaled by 1/sqrt(2)).

Channel matching (sleuthd.judgment.channel_matching) needs more, cached under ``<root>/narrow/``: every clip's
effective bandwidth and plateau fraction (``bandwidth.npz``, measured on the decoded clip as the server's fused
decode measures them) and the embeddings of the clips' narrowband copies (``emb/<encoder>.npz``, the same format,
made by the server's own ``channel_copy``) for the clips of instances that are band-matched; and, under
``<root>/clipped/``, the embeddings of the clipped copies of the clips of instances that are clip-matched, keyed
``<path>#<copy>`` (:func:`copy_key`: one per target, since an instance's target is its most-clipped piece's).

Pitch matching (sleuthd.judgment.pitch_matching) reads every clip's median pitch (``<root>/pitch/pitch.npz``,
measured as the server measures it) and the embeddings of the copies moved in pitch that it would judge on, in the
same cache as the clipped copies, keyed :func:`pitch_key`.

Length matching (sleuthd.judgment.length_matching) reads the trimmed length in samples of the clips of instances with
a short turn (``<root>/length/kept.npz``, measured as the server measures it) and the embeddings of the other pieces'
copies cut to each short turn's length, in the same cache again, keyed :func:`cut_key`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

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
CLIPPED = "clipped"
MAX_SECONDS = 600.0  # longer than any clip of the matrix


def cache_path(root: Path, encoder: str) -> Path:
    return root / "emb" / f"{encoder}.npz"


def narrow_root(root: Path) -> Path:
    """Where the narrowband copies' embeddings of the clips under ``root`` are cached (same relative paths)."""
    return root / NARROW


def clipped_root(root: Path) -> Path:
    """Where the clipped copies' embeddings of the clips under ``root`` are cached (keys: :func:`copy_key`)."""
    return root / CLIPPED


def noise_key(path: str, snr_db: float, noisiest: str) -> str:
    """The cache key of a clip's copy with ``noisiest``'s noise added to ``snr_db`` (rounded as the server rounds
    it)."""
    return f"{path}#noise{snr_db:.1f}@{noisiest}"


def copy_key(path: str, narrow: bool, plateau: float) -> str:
    """The cache key of a clip's copy clipped to ``plateau`` (rounded as the server rounds a target), low-passed
    too when ``narrow``."""
    return f"{path}#{'narrow' if narrow else 'full'}-clip{plateau:.4f}"


def composed_key(path: str, narrow: bool, plateau: float | None, snr_db: float, noisiest: str) -> str:
    """The cache key of a clip's copy clipped to ``plateau`` (None: not clipped), with ``noisiest``'s noise added to
    ``snr_db`` and low-passed too when ``narrow``: a speaker matched by band or clipping and noise-matched too."""
    clip = "none" if plateau is None else f"{plateau:.4f}"
    return f"{path}#{'narrow' if narrow else 'full'}-clip{clip}-noise{snr_db:.1f}@{noisiest}"


def telephone_key(path: str, plateau: float | None, snr_db: float | None, noisiest: str) -> str:
    """The cache key of a clip's copy band-passed at the telephone band (narrowband, and below 300 Hz removed), clipped
    to ``plateau`` and with ``noisiest``'s noise added to ``snr_db`` where those are not None."""
    clip = "none" if plateau is None else f"{plateau:.4f}"
    noise = "none" if snr_db is None else f"{snr_db:.1f}"
    return f"{path}#tel-clip{clip}-noise{noise}@{noisiest}"


def pitch_key(path: str, steps: int, narrow: bool) -> str:
    """The cache key of a clip's copy moved ``steps`` quarter tones in pitch (spectral envelope with it), low-passed
    too when ``narrow`` (a speaker judged on narrowband copies)."""
    return f"{path}#{'narrow' if narrow else 'full'}-pitch{steps:+d}"


def cut_key(path: str, samples: int) -> str:
    """The cache key of a clip's copy cut to the middle ``samples`` of its trimmed speech (length matching)."""
    return f"{path}#cut-{samples}"


def parse_copy_key(key: str) -> tuple[str, Any]:
    """(the clip's path, the sleuthd.api.ChannelCopy its key names; a noisy copy's carries its noise's audio, as
    (snr_db, noisiest) for a noise-only copy, or (ChannelCopy without the noise, snr_db, noisiest) for a composed
    one)."""
    from sleuthd.api import ChannelCopy

    path, _, fragment = key.partition("#")
    if fragment.startswith("cut-"):
        return path, ChannelCopy(cut_samples=int(fragment.removeprefix("cut-")))
    if fragment.startswith(("narrow-pitch", "full-pitch")):
        band, _, steps = fragment.partition("-pitch")
        return path, ChannelCopy(narrow=band == "narrow", pitch_steps=int(steps))
    if fragment.startswith("tel-clip"):
        kind, _, noisiest = fragment.partition("@")
        clip, _, snr = kind.removeprefix("tel-clip").partition("-noise")
        base = ChannelCopy(narrow=True, plateau=None if clip == "none" else float(clip), telephone=True)
        return path, base if snr == "none" else (base, float(snr), noisiest)
    if fragment.startswith(("narrow-clip", "full-clip")) and "-noise" in fragment.partition("@")[0]:
        kind, _, noisiest = fragment.partition("@")
        band, _, rest = kind.partition("-clip")
        clip, _, snr = rest.partition("-noise")
        plateau = None if clip == "none" else float(clip)
        return path, (ChannelCopy(narrow=band == "narrow", plateau=plateau), float(snr), noisiest)
    if "#noise" in key:
        path, _, copy = key.partition("#noise")
        snr, _, noisiest = copy.partition("@")
        return path, (float(snr), noisiest)
    path, _, copy = key.rpartition("#")
    band, _, clip = copy.partition("-clip")
    return path, ChannelCopy(narrow=band == "narrow", plateau=float(clip))


def bandwidth_path(root: Path) -> Path:
    return narrow_root(root) / "bandwidth.npz"


class Channels(NamedTuple):
    """Clip path -> effective bandwidth (Hz), plateau fraction, SNR (dB), low band level (dB); NaN: too short or
    silent to tell."""

    bandwidths: dict[str, float]
    plateaus: dict[str, float]
    snrs: dict[str, float]
    low_bands: dict[str, float]


def load_channels(root: Path) -> Channels:
    """The clips' channels as measured so far (a cache from before plateaus or SNRs were measured lacks them);
    empty when never measured."""
    path = bandwidth_path(root)
    if not path.is_file():
        return Channels({}, {}, {}, {})
    with np.load(path, allow_pickle=False) as z:
        paths = list(z["paths"])
        hz = dict(zip(paths, z["hz"].tolist(), strict=True))

        def measured(field: str) -> dict[str, float]:
            # A clip measured before this field was is saved with NaN there: not measured (a silent clip has NaN
            # for its bandwidth too).
            got = dict(zip(paths, z[field].tolist(), strict=True)) if field in z.files else {}
            return {p: v for p, v in got.items() if v == v or hz[p] != hz[p]}

        return Channels(hz, measured("plateau"), measured("snr"), measured("low_band"))


def load_bandwidths(root: Path) -> dict[str, float]:
    """Clip path -> effective bandwidth in Hz (NaN: too short or silent to tell); {} when never measured."""
    return load_channels(root).bandwidths


def measure_channels(
    root: Path, paths: Sequence[str], progress: Callable[[str, int, int], None] | None = None
) -> Channels:
    """The channels the cache lacks, measured and saved (about 10 ms a clip: a decode and a spectrum)."""
    from sleuthd.api import clip_channel
    from sleuthd.domain import AudioInput

    hz, plateau, snr, low = load_channels(root)
    todo = [p for p in paths if p not in hz or p not in plateau or p not in snr or p not in low]
    for n, p in enumerate(todo, 1):
        channel = clip_channel(AudioInput((root / p).read_bytes()), MAX_SECONDS)
        hz[p] = np.nan if channel.bandwidth_hz is None else channel.bandwidth_hz
        plateau[p] = np.nan if channel.plateau is None else channel.plateau
        snr[p] = np.nan if channel.snr_db is None else channel.snr_db
        low[p] = np.nan if channel.low_band_db is None else channel.low_band_db
        if progress and (n % 200 == 0 or n == len(todo)):
            progress("channel", n, len(todo))
    if todo:
        keys = list(hz)
        _write_npz(
            bandwidth_path(root),
            paths=np.array(keys),
            hz=np.array([hz[p] for p in keys], np.float64),
            plateau=np.array([plateau.get(p, np.nan) for p in keys], np.float64),
            snr=np.array([snr.get(p, np.nan) for p in keys], np.float64),
            low_band=np.array([low.get(p, np.nan) for p in keys], np.float64),
        )
    return Channels(hz, plateau, snr, low)


def pitch_path(root: Path) -> Path:
    return root / "pitch" / "pitch.npz"


def load_pitches(root: Path) -> dict[str, float]:
    """Clip path -> median pitch, log2(Hz) (NaN: too little voiced to tell); {} when never measured."""
    path = pitch_path(root)
    if not path.is_file():
        return {}
    with np.load(path, allow_pickle=False) as z:
        return dict(zip(list(z["paths"]), z["octaves"].tolist(), strict=True))


def measure_pitches(
    root: Path, paths: Sequence[str], progress: Callable[[str, int, int], None] | None = None
) -> dict[str, float]:
    """The median pitches the cache lacks, measured as the server measures them (sleuthd.api.clip_pitch, about
    15 ms a clip) and saved."""
    from sleuthd.api import clip_pitch
    from sleuthd.domain import AudioInput

    pitches = load_pitches(root)
    todo = [p for p in paths if p not in pitches]
    for n, p in enumerate(todo, 1):
        found = clip_pitch(AudioInput((root / p).read_bytes()), MAX_SECONDS)
        pitches[p] = np.nan if found is None else found
        if progress and (n % 200 == 0 or n == len(todo)):
            progress("pitch", n, len(todo))
    if todo:
        _write_npz(
            pitch_path(root), paths=np.array(list(pitches)), octaves=np.array(list(pitches.values()), np.float64)
        )
    return pitches


def kept_path(root: Path) -> Path:
    return root / "length" / "kept.npz"


def load_kept(root: Path) -> dict[str, int]:
    """Clip path -> its trimmed speech in samples (sleuthd.api.SpeakerEncoder.kept_samples); {} when never measured."""
    path = kept_path(root)
    if not path.is_file():
        return {}
    with np.load(path, allow_pickle=False) as z:
        return dict(zip(list(z["paths"]), z["samples"].tolist(), strict=True))


def measure_kept(
    root: Path,
    paths: Sequence[str],
    models_dir: Path | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, int]:
    """The trimmed lengths the cache lacks, measured as the server measures them (a decode and the VAD, a few ms a
    clip; GE2E's loudness target, which CAM++ shares) and saved."""
    from sleuthd.api import SpeakerEncoder
    from sleuthd.domain import AudioInput

    kept = load_kept(root)
    todo = [p for p in paths if p not in kept]
    if not todo:
        return kept
    encoder = SpeakerEncoder.load(models_dir, encoder=ENCODERS[0])
    try:
        for n, p in enumerate(todo, 1):
            kept[p] = encoder.kept_samples(AudioInput((root / p).read_bytes()))
            if progress and (n % 200 == 0 or n == len(todo)):
                progress("kept", n, len(todo))
    finally:
        encoder.close()
    _write_npz(kept_path(root), paths=np.array(list(kept)), samples=np.array(list(kept.values()), np.int64))
    return kept


def load(root: Path, encoder: str) -> Embeddings:
    path = cache_path(root, encoder)
    if not path.is_file():
        raise FileNotFoundError(f"no embeddings for {encoder} under {root}: run `sleuthd-bench robustness embed`")
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        return Embeddings(encoder, meta["weights_sha256"], list(z["paths"]), z["vectors"], z["speech"], z["audio"])


def _write_npz(path: Path, **arrays: Any) -> None:
    """Save a cache whole or not at all: written beside, then renamed over the old one (an interrupted run leaves
    the old cache)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)


def _save(root: Path, e: Embeddings) -> None:
    meta = json.dumps({"encoder": e.encoder, "weights_sha256": e.weights_sha256})
    _write_npz(
        cache_path(root, e.encoder),
        meta=np.array(meta),
        paths=np.array(e.paths),
        vectors=e.vectors,
        speech=e.speech_seconds,
        audio=e.audio_seconds,
    )


def manifest_paths(manifests: Iterable[Path]) -> list[str]:
    """Every audio path (relative to the data folder) the manifests use, in first-seen order."""
    seen: dict[str, None] = {}
    for m in manifests:
        for raw in m.read_text().splitlines():
            line = json.loads(raw)
            for p in (*line["target_turns"], line["reference"], line["s2_audio"], line["s3_audio"]):
                seen.setdefault(p, None)
    return list(seen)


def clip_source(root: Path, key: str, narrowband: bool = False, clipped: bool = False, encoder: Any = None) -> Any:
    """What a cache entry is embedded from: the clip's file; with ``narrowband`` its narrowband copy; with
    ``clipped`` the copy its :func:`copy_key`, :func:`noise_key`, :func:`pitch_key` or :func:`cut_key` names (a noisy
    copy's noise is the noisiest clip's), made by the server's own ``channel_copy`` (a cut by ``encoder``'s
    ``speech_cut``, which needs its VAD)."""
    from sleuthd.api import NARROWBAND, ChannelCopy, channel_copy
    from sleuthd.domain import AudioInput

    if clipped:
        path, copy = parse_copy_key(key)
        if isinstance(copy, tuple):
            base, snr, noisiest = copy if len(copy) == 3 else (ChannelCopy(), *copy)
            copy = replace(base, snr_db=snr, noise=AudioInput((root / noisiest).read_bytes()))
        if copy.cut_samples:
            return encoder.speech_cut(AudioInput((root / path).read_bytes()), copy.cut_samples)
        return channel_copy(AudioInput((root / path).read_bytes()), MAX_SECONDS, copy)
    return channel_copy(AudioInput((root / key).read_bytes()), MAX_SECONDS, NARROWBAND) if narrowband else root / key


def embed_all(
    root: Path,
    paths: Sequence[str],
    encoders: Sequence[str] = ENCODERS,
    models_dir: Path | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    chunk: int = 32,
    save_every_s: float = 120.0,
    narrowband: bool = False,
    clipped: bool = False,
) -> dict[str, Embeddings]:
    """Embed the paths each encoder's cache lacks (saved every few minutes, so an interrupted run resumes).
    ``narrowband``: embed the clips' narrowband copies into the cache under :func:`narrow_root` instead;
    ``clipped``: ``paths`` are :func:`copy_key` or :func:`noise_key` keys, whose copies go into the cache under
    :func:`clipped_root`."""
    from sleuthd.api import SpeakerEncoder

    def source(p: str, encoder: Any) -> Any:
        return clip_source(root, p, narrowband, clipped, encoder)

    cache_root = clipped_root(root) if clipped else narrow_root(root) if narrowband else root
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
                results = encoder.embed_sync([source(p, encoder) for p in part])
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
