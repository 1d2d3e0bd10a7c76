"""The SpeakerSleuth paper's three embedding methods (Appendix B.2), as pure functions over arrays.

Embeddings are rows of unit length, shape (n, D). Every function states its scale:
cosine similarity in [-1, 1] (higher = more alike) or cosine distance = 1 - similarity in [0, 2].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sleuthd.domain import Method

__all__ = ["METHODS", "PAPER_METHODS", "Method", "MethodInfo"]


@dataclass(frozen=True)
class MethodInfo:
    scale: str  # per-turn score: "cosine_similarity", "cosine_distance" or "probability" (of not belonging)
    flag_above: bool  # True: flagged when score > threshold; False: when score < threshold
    threshold_range: tuple[float, float]
    candidate_scale: str  # candidate score in RankCandidates
    higher_is_better: bool  # for candidate scores


METHODS: dict[Method, MethodInfo] = {
    Method.PAIRWISE: MethodInfo("cosine_similarity", False, (-1.0, 1.0), "cosine_similarity", True),
    Method.CENTROID: MethodInfo("cosine_distance", True, (0.0, 2.0), "cosine_distance", False),
    Method.REFERENCE: MethodInfo("cosine_similarity", False, (-1.0, 1.0), "cosine_similarity", True),
    # auto: a turn scores P(it does NOT belong); candidates are ordered by cosine similarity to the
    # context centroid (the best discriminator on our dev set) and also carry P(it belongs).
    Method.AUTO: MethodInfo("probability", True, (0.0, 1.0), "cosine_similarity", True),
    # lalm: the judge's P(not the speaker) per turn; candidates by its P(the speaker's voice)
    # (sleuthd.engine.judging).
    Method.LALM: MethodInfo("probability", True, (0.0, 1.0), "probability", True),
}
PAPER_METHODS = (Method.PAIRWISE, Method.CENTROID, Method.REFERENCE)


def unit(x: np.ndarray) -> np.ndarray:
    """Rows (or a single vector) scaled to unit length; zero rows stay finite."""
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return np.asarray(x / np.maximum(norms, 1e-12))


def pairwise_mean_cosine(emb: np.ndarray) -> np.ndarray:
    """s_i = mean over j != i of cos(e_i, e_j); (n,) cosine similarity. Needs n >= 2."""
    n = len(emb)
    if n < 2:
        raise ValueError("pairwise similarity needs at least two embeddings")
    e = unit(emb)
    sims = e @ e.T
    return np.asarray((sims.sum(axis=1) - np.diag(sims)) / (n - 1))


def centroid_cosine_distance(emb: np.ndarray) -> np.ndarray:
    """s_i = 1 - cos(e_i, c) with c the mean of all rows (e_i included); (n,) cosine distance."""
    if len(emb) < 1:
        raise ValueError("centroid distance needs at least one embedding")
    e = unit(emb)
    c = unit(e.mean(axis=0))
    return np.asarray(1.0 - e @ c)


def reference_cosine(emb: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """s_i = cos(e_i, r); (n,) cosine similarity."""
    return np.asarray(unit(emb) @ unit(reference))


def flagged(method: Method, scores: np.ndarray, threshold: float) -> np.ndarray:
    """(n,) bool: which scores cross the threshold in the method's direction."""
    if METHODS[method].flag_above:
        return np.asarray(scores > threshold)
    return np.asarray(scores < threshold)


def candidate_scores(
    method: Method, candidates: np.ndarray, context: np.ndarray, reference: np.ndarray | None
) -> np.ndarray:
    """Discrimination scores q_j of candidate rows against a speaker's context turns.

    pairwise: mean cosine similarity to the context turns; centroid: cosine distance to the context
    centroid (lower is better); reference: cosine similarity to the reference; auto: cosine similarity
    to the context centroid, or to the reference when there is no context.
    """
    c = unit(candidates)
    if method is Method.AUTO:
        if len(context):
            return np.asarray(c @ unit(unit(context).mean(axis=0)))
        if reference is None:
            raise ValueError("auto ranking needs context turns or a reference")
        return np.asarray(c @ unit(reference))
    if method is Method.PAIRWISE:
        return np.asarray((c @ unit(context).T).mean(axis=1))
    if method is Method.CENTROID:
        return np.asarray(1.0 - c @ unit(unit(context).mean(axis=0)))
    if reference is None:
        raise ValueError("reference comparison needs a reference embedding")
    return np.asarray(c @ unit(reference))


def rank_order(scores: np.ndarray, higher_is_better: bool) -> np.ndarray:
    """Indices best first; equal scores keep their input order (stable sort)."""
    key = -scores if higher_is_better else scores
    return np.argsort(key, kind="stable")
