"""One speaker's evidence: the pool of their usable turns (and reference) with its exact cosine matrix,
kept up to date turn by turn (sleuthd.judgment.gram), and the scores and features read off it.

Shared by CheckDialogue and StreamDialogue (through sleuthd.judgment.dialogue): one turn arriving costs one
matrix-vector product, a merge and a fixed number of array passes over the speaker's cosines (never a
Python loop over turns), and gives the same bits as building the pool at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from sleuthd.encoders.clips import ClipEmbedding
from sleuthd.judgment.calibration import OwnEvidence, own_evidence
from sleuthd.judgment.evidence import pool_evidence
from sleuthd.judgment.gram import SortedPairs, cosines, gram, products, quantize
from sleuthd.judgment.scoring import unit


def stack_embeddings(clips: Sequence[ClipEmbedding]) -> np.ndarray:
    """(n, D) rows of the usable clips' embeddings; (0, 1) when there are none."""
    rows = [c.embedding for c in clips if c.embedding is not None]
    return np.stack(rows) if rows else np.zeros((0, 1), np.float32)


class SpeakerPool:
    """One speaker's usable turns, in dialogue order, and reference: the speaker's *pool* of evidence
    (reference first, then the turns). Keeps the exact cosine matrix and its sorted pairs up to date: one
    turn added since the last use costs one matrix-vector product and O(m^2) copying, never a rebuild; many
    turns added at once (CheckDialogue) are built in one go. Both ways give the same bits (sleuthd.judgment.gram)."""

    def __init__(self, reference: np.ndarray | None, components: Sequence[tuple[str, int, int]] = ()) -> None:
        """``components``: a fused embedding's parts; each keeps a pool of its own (one more matrix-vector
        product per added turn each) for the per-encoder scores."""
        self.reference = reference
        self.components = {
            name: SpeakerPool(None if reference is None else _part(reference, a, b)) for name, a, b in components
        }
        self._slices = {name: (a, b) for name, a, b in components}
        self.r0 = 0 if reference is None else 1  # pool index of the first turn
        self._buf = np.zeros((0, 0), np.float32)  # rows [0, n): the turns' embeddings; grows by doubling
        self._seconds: list[float] = []  # speech seconds of each turn
        self._q = quantize(reference[None, :]) if reference is not None else None  # (m, D) pool, quantized
        self._g: np.ndarray | None = None  # (m, m) exact cosines of the pool
        self._pairs: SortedPairs | None = None
        self._pending = 0  # turns added since _g was last brought up to date
        self._last = 0  # the turn index of the last one added
        # Derived from the turns; emptied by add().
        self._own: OwnEvidence | None = None
        self._evidence: dict[str, np.ndarray] | None = None  # the blend's per-encoder features (evidence.py)
        self._centroid: np.ndarray | None = None
        self._paper: tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None] | None = None
        self._own_cosine: np.ndarray | None = None

    @property
    def n(self) -> int:
        return len(self._seconds)

    @property
    def emb(self) -> np.ndarray:
        """(n, D) float32 embeddings of the turns, in dialogue order."""
        return self._buf[: self.n]

    @property
    def seconds(self) -> np.ndarray:
        return np.asarray(self._seconds, np.float64)

    def add(self, k: int, embedding: np.ndarray, speech_seconds: float) -> None:
        """The usable turn that is now the k-th of this speaker's usable turns in dialogue order."""
        n = self.n
        if n == len(self._buf):
            grown = np.zeros((max(2 * n, 8), len(embedding)), np.float32)
            if n:
                grown[:n] = self._buf[:n]
            self._buf = grown
        self._buf[k + 1 : n + 1] = self._buf[k:n].copy()
        self._buf[k] = embedding
        self._seconds.insert(k, speech_seconds)
        self._pending += 1
        self._last = k
        self._own = self._centroid = self._paper = self._own_cosine = None
        self._evidence = None
        for name, part in self.components.items():
            part.add(k, _part(embedding, *self._slices[name]), speech_seconds)

    def with_rows(
        self, rows: Mapping[int, tuple[np.ndarray, float]], reference: np.ndarray | None = None
    ) -> SpeakerPool:
        """A new pool of the same turns with ``rows`` (turn row -> embedding, speech seconds) put in their place, and
        ``reference`` in the reference's when given: the speaker as pitch and length matching judge them again."""
        part = SpeakerPool(
            self.reference if reference is None else reference, [(n, *s) for n, s in self._slices.items()]
        )
        for k in range(self.n):
            emb, seconds = rows.get(k, (self._buf[k], self._seconds[k]))
            part.add(k, emb, seconds)
        return part

    def gram(self) -> np.ndarray:
        """The pool's exact cosine matrix, brought up to date."""
        if self._g is not None and self._pending == 1:
            z = self.r0 + self._last
            qz = quantize(self._buf[self._last][None, :])
            assert self._q is not None
            self._q = np.insert(self._q, z, qz, axis=0)
            self._g = _insert_row(self._g, z, cosines(self._q, qz)[:, 0])
            self._pairs = self._pairs.inserted(self._g, z) if self._pairs is not None else None
        elif self._g is None or self._pending:
            pool = self.emb if self.reference is None else np.vstack([self.reference[None, :], self.emb])
            self._q = quantize(pool)
            self._g = gram(self._q)
            self._pairs = None
        self._pending = 0
        return self._g

    def pairs(self) -> SortedPairs:
        g = self.gram()
        if self._pairs is None:
            self._pairs = SortedPairs.of(g)
        return self._pairs

    def own_evidence(self) -> OwnEvidence:
        """auto's cohort-free features of every turn (sleuthd.judgment.calibration), kept until the next add()."""
        if self._own is None:
            g = self.gram()
            pairs = self.pairs() if self.n >= 2 and len(g) >= 3 else None
            self._own = own_evidence(g, pairs, self.seconds, self.reference is not None)
        return self._own

    def evidence(self) -> dict[str, np.ndarray]:
        """The blend's features of every turn from this pool alone (sleuthd.judgment.evidence.pool_evidence), kept
        until the next add(): in a stream only the speaker who spoke is judged anew, the others' are reused."""
        if self._evidence is None:
            self._evidence = pool_evidence(self.gram(), self.reference is not None)
        return self._evidence

    def centroid(self) -> np.ndarray:
        """Unit centroid of the turns (float32: the voice other speakers are compared with)."""
        if self._centroid is None:
            self._centroid = unit(self.emb.mean(axis=0))
        return self._centroid

    def paper_scores(self) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        """(pairwise mean cosine, centroid cosine distance, reference cosine), each (n,) or None."""
        if self._paper is None:
            self._paper = self._paper_scores()
        return self._paper

    def _paper_scores(self) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        g = self.gram()
        turns = g[self.r0 :, self.r0 :]
        pw = cd = rc = None
        n = self.n
        if n >= 2:
            rows, diag = turns.sum(axis=1), np.diagonal(turns)
            pw = (rows - diag) / (n - 1)
            cd = 1.0 - (rows / n) / max(float(np.sqrt(max(rows.sum(), 0.0))) / n, 1e-12)
        if self.reference is not None and n:
            rc = g[self.r0 :, 0].copy()
        return pw, cd, rc

    def own_speaker_cosine(self) -> np.ndarray:
        """(n,) each turn's cosine to the centroid of the speaker's other turns, else to the reference,
        else NaN (nothing of its own to compare with)."""
        if self._own_cosine is None:
            self._own_cosine = self._own_speaker_cosine()
        return self._own_cosine

    def _own_speaker_cosine(self) -> np.ndarray:
        g = self.gram()
        n = self.n
        if n >= 2:
            turns = g[self.r0 :, self.r0 :]
            rows, diag = turns.sum(axis=1), np.diagonal(turns)
            norm = np.sqrt(np.maximum(rows.sum() - 2 * rows + diag, 0.0)) / (n - 1)
            return np.asarray((rows - diag) / (n - 1) / np.maximum(norm, 1e-12))
        if self.reference is not None and n:
            return g[1:, 0].copy()
        return np.full(n, np.nan)

    def nearest_other(self, cohort: np.ndarray) -> np.ndarray:
        """(m,) each piece of the pool's cosine to the closest of ``cohort`` ((c, D) other voices)."""
        pool = self.emb if self.reference is None else np.vstack([self.reference[None, :], self.emb])
        return np.asarray(products(pool, cohort).max(axis=1), dtype=np.float64)


def _part(embedding: np.ndarray, first: int, stop: int) -> np.ndarray:
    """One encoder's unit embedding from a fused one (its columns, scaled back to unit length)."""
    part = np.asarray(embedding[first:stop], np.float32)
    return np.asarray(part / max(float(np.linalg.norm(part)), 1e-12), np.float32)


def _insert_row(g: np.ndarray, z: int, col: np.ndarray) -> np.ndarray:
    """``g`` with a new row and column at index z (``col``: the new member's cosines, itself included)."""
    m = len(g)
    out = np.empty((m + 1, m + 1))
    out[:z, :z], out[:z, z + 1 :] = g[:z, :z], g[:z, z:]
    out[z + 1 :, :z], out[z + 1 :, z + 1 :] = g[z:, :z], g[z:, z:]
    out[z, :] = col
    out[:, z] = col
    return out
