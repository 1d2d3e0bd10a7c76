"""The paper's three methods on hand-made embeddings, where every number can be checked by hand."""

from __future__ import annotations

import numpy as np
import pytest
from sleuthd.judgment.scoring import (
    Method,
    candidate_scores,
    centroid_cosine_distance,
    flagged,
    pairwise_mean_cosine,
    rank_order,
    reference_cosine,
)

# Three unit vectors: two identical, one orthogonal.
E = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])


def test_pairwise_mean_cosine_by_hand() -> None:
    # turn 0: mean(cos(e0,e1)=1, cos(e0,e2)=0) = 0.5; same for turn 1; turn 2: mean(0, 0) = 0.
    assert pairwise_mean_cosine(E).tolist() == pytest.approx([0.5, 0.5, 0.0])
    with pytest.raises(ValueError):
        pairwise_mean_cosine(E[:1])


def test_centroid_distance_by_hand() -> None:
    # centroid direction (2, 1)/sqrt(5): cos to e0 = 2/sqrt(5), to e2 = 1/sqrt(5).
    d = centroid_cosine_distance(E)
    assert d.tolist() == pytest.approx([1 - 2 / np.sqrt(5), 1 - 2 / np.sqrt(5), 1 - 1 / np.sqrt(5)])


def test_reference_and_unnormalised_inputs() -> None:
    assert reference_cosine(E * 3.0, np.array([0.0, 2.0])).tolist() == pytest.approx([0.0, 0.0, 1.0])


def test_flag_directions() -> None:
    assert flagged(Method.PAIRWISE, np.array([0.5, 0.3]), 0.4).tolist() == [False, True]
    assert flagged(Method.CENTROID, np.array([0.5, 0.3]), 0.4).tolist() == [True, False]
    # Exactly at the threshold is not flagged, either direction.
    assert not flagged(Method.REFERENCE, np.array([0.4]), 0.4)[0]
    assert not flagged(Method.CENTROID, np.array([0.4]), 0.4)[0]


def test_candidate_scores_and_ranking() -> None:
    context = np.array([[1.0, 0.0], [0.8, 0.6]])
    cands = np.array([[0.0, 1.0], [1.0, 0.0], [0.6, 0.8]])
    q = candidate_scores(Method.PAIRWISE, cands, context, None)
    # cand0: mean(0, 0.6) = 0.3; cand1: mean(1, 0.8) = 0.9; cand2: mean(0.6, 0.96) = 0.78
    assert q.tolist() == pytest.approx([0.3, 0.9, 0.78])
    assert rank_order(q, higher_is_better=True).tolist() == [1, 2, 0]
    d = candidate_scores(Method.CENTROID, cands, context, None)
    assert rank_order(d, higher_is_better=False).tolist() == [1, 2, 0]
    r = candidate_scores(Method.REFERENCE, cands, context, np.array([0.0, 1.0]))
    assert r.tolist() == pytest.approx([1.0, 0.0, 0.8])
    # Ties keep request order.
    assert rank_order(np.array([0.5, 0.7, 0.5]), higher_is_better=True).tolist() == [1, 0, 2]
