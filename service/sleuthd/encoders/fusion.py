"""The `fused` encoder: several loaded speaker encoders heard as one.

A clip's fused embedding is the concatenation of its component embeddings, each scaled by
``1/sqrt(k)`` for k components. Each part is a unit vector, so the result is one too, and the cosine of
two fused embeddings is exactly the **mean of the components' cosines**. Every judgment then runs
unchanged on that one similarity: the paper's three methods, `auto`'s relative evidence (with its own
calibration fitted on fused embeddings), incremental judging, ranking and drift-free reference lookups.
Fusing at the similarity level keeps one code path for every method; the cost is that `auto` sees the
encoders' evidence already averaged rather than each encoder's apart (what a per-encoder feature model
would add was not measured).

The fusion is described by a committed card (``sleuthd/cards/fused.json``: components, thresholds,
calibration). Its identity is a hash over the components' weights, in order, so a calibration fitted
for one set of encoder weights is refused for any other set (sleuthd.judgment.calibration), never used silently.
It is loaded whenever every component is (sleuthd.engine.loading); a clip is usable only when every component
can embed it (the longest minimum speech applies). Drift inside a turn (``detect_drift``) is looked for in
the first component's dense windows, with its settings.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sleuthd.encoders.clips import Channel, ClipEmbedding
from sleuthd.encoders.manifest import EncoderManifest, ManifestError, card_names, read_card
from sleuthd.encoders.runner import WindowEncoder
from sleuthd.errors import EngineFailure

FUSED = "fused"


def fused_weights_sha256(components: Sequence[EncoderManifest]) -> str:
    """The identity of a fusion: its components' names and weights hashes, in order."""
    h = hashlib.sha256()
    for m in components:
        h.update(f"{m.name}:{m.raw.get('source', {}).get('file_sha256', m.sha256)}\n".encode())
    return h.hexdigest()


@dataclass
class FusedEncoder:
    """Not a model of its own: the embedder (sleuthd.encoders.embedder) embeds a clip with every component and
    :meth:`combine` joins the results."""

    manifest: EncoderManifest
    components: tuple[WindowEncoder, ...]
    provider: str = field(init=False)  # the components' execution providers

    def __post_init__(self) -> None:
        self.provider = ",".join(sorted({c.provider for c in self.components}))

    @property
    def component_names(self) -> tuple[str, ...]:
        return tuple(c.manifest.name for c in self.components)

    @property
    def layout(self) -> tuple[tuple[str, int, int], ...]:
        """Each component's (name, first column, stop column) in the fused embedding."""
        out, first = [], 0
        for c in self.components:
            out.append((c.manifest.name, first, first + c.manifest.embedding_size))
            first += c.manifest.embedding_size
        return tuple(out)

    async def encode(self, windows: np.ndarray, deadline: float | None = None) -> np.ndarray:
        # Windows belong to one component's placement; a fused clip is embedded per component instead.
        raise EngineFailure("the fused encoder has no windows of its own: embed clips through ClipEmbedder")

    def combine(self, clips: Sequence[ClipEmbedding]) -> ClipEmbedding:
        """One clip's component embeddings (in component order) -> its fused embedding. The clip is
        unusable when any component found it unusable (that component's reason is kept)."""
        for clip in clips:
            if not clip.usable:
                return clip
        vector = self.join([c.embedding for c in clips if c.embedding is not None])
        first = clips[0]
        # One "window" spanning the clip (drift uses the first component's own windows instead).
        times = np.array([[0.0, first.audio_seconds]])
        # Measured by whichever component decoded the clip (each field None when every part came from the cache).
        measured = zip(*(c.channel for c in clips), strict=True)  # per field, across the parts
        channel = Channel(*(next((v for v in values if v is not None), None) for values in measured))
        return ClipEmbedding(
            first.audio_seconds,
            first.speech_seconds,
            vector,
            vector[None, :],
            times,
            channel=channel,
        )

    def join(self, vectors: Sequence[np.ndarray]) -> np.ndarray:
        """Unit component vectors -> the fused unit vector (each part scaled by 1/sqrt(k))."""
        if len(vectors) != len(self.components):
            raise ValueError(f"expected {len(self.components)} component vectors, got {len(vectors)}")
        scale = 1.0 / np.sqrt(len(vectors))
        return np.concatenate([np.asarray(v, np.float32) * scale for v in vectors]).astype(np.float32)


def load_fusion(
    encoders: Mapping[str, WindowEncoder], card: dict[str, Any] | None = None, evidence: dict[str, Any] | None = None
) -> FusedEncoder | None:
    """The fusion its card describes, when every component is loaded (None otherwise). ``evidence``: the blend's
    calibration (default: the package's ``cards/evidence.json``)."""
    card = card if card is not None else read_card(FUSED)
    names = list(card["components"])
    if not all(n in encoders for n in names):
        return None
    parts = [encoders[n] for n in names]
    manifests = [p.manifest for p in parts]
    raw = copy.deepcopy(card)
    raw["source"] = {
        "file_sha256": fused_weights_sha256(manifests),
        "components": {m.name: m.raw.get("source", {}).get("file_sha256", m.sha256) for m in manifests},
    }
    if "drift" in manifests[0].raw:  # drift is found in the first component's windows, with its settings
        raw["drift"] = copy.deepcopy(manifests[0].raw["drift"])
    if evidence is None and "evidence" in card_names():
        evidence = read_card("evidence")
    if evidence is not None:  # the fused `auto`'s blend (sleuthd.judgment.evidence), checked where it is loaded
        raw["evidence"] = evidence
    raw["sha256"] = hashlib.sha256("|".join(m.sha256 for m in manifests).encode()).hexdigest()  # the graphs'
    try:
        thresholds = {k: float(v["value"]) for k, v in card["thresholds"].items()}
        manifest = EncoderManifest(
            name=FUSED,
            path=Path(),
            sha256=raw["sha256"],
            embedding_size=sum(m.embedding_size for m in manifests),
            input_name="",
            output_name="",
            window=manifests[0].window,
            loudness_target_dbfs=manifests[0].loudness_target_dbfs,
            min_speech_seconds=max(m.min_speech_seconds for m in manifests),
            default_method=card["default_method"],
            default_thresholds=thresholds,
            raw=raw,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestError(f"the fused card is malformed: {exc}") from exc
    return FusedEncoder(manifest, tuple(parts))
