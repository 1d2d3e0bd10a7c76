"""The turn x turn similarity matrix of a dialogue (CheckOptions.similarity_matrix). Pure NumPy.

Cosines come from the exact quantized products of sleuthd.judgment.gram, the same numbers every verdict of the
dialogue is judged with, so a heat map drawn from them agrees with the verdicts to the last bit of a float32.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from sleuthd.domain import SimilarityMatrix
from sleuthd.judgment.gram import gram, quantize


def similarity_matrix(turns: Iterable[tuple[int, str, np.ndarray]]) -> SimilarityMatrix:
    """``turns``: (position in the dialogue, turn id, unit embedding of shape (D,)) of each usable turn, in
    any order -> their cosine similarities in dialogue order, row-major, rounded to float32 (the wire type)."""
    ordered = sorted(turns, key=lambda t: t[0])
    if not ordered:
        return SimilarityMatrix((), ())
    g = gram(quantize(np.stack([e for _, _, e in ordered])))
    np.fill_diagonal(g, 1.0)  # a unit vector's own cosine, without its quantization error
    cosines = np.clip(g, -1.0, 1.0).astype(np.float32).ravel()
    return SimilarityMatrix(tuple(turn_id for _, turn_id, _ in ordered), tuple(cosines.tolist()))
