"""Discrimination: ranking regenerated candidates for one speaker's slot. Pure functions.

The engine embeds the candidates, the speaker's context turns and the reference, judges each candidate in the slot
as CheckDialogue would (its fit), then calls :func:`rank_candidates`; requests are checked first with
:func:`validate_rank` and :func:`check_evidence`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sleuthd.domain import RankedCandidateResult, RankRequest, TurnResult, TurnStatus
from sleuthd.encoders.clips import ClipEmbedding
from sleuthd.errors import InvalidRequest, LimitExceeded
from sleuthd.judgment import scoring
from sleuthd.judgment.dialogue import check_id
from sleuthd.judgment.pool import stack_embeddings
from sleuthd.judgment.scoring import METHODS, Method


def validate_rank(request: RankRequest, max_candidates: int, max_context: int) -> None:
    n = len(request.candidates)
    if n < 2:
        raise InvalidRequest(f"ranking needs at least 2 candidates, got {n}")
    if n > max_candidates:
        raise LimitExceeded(f"{n} candidates; the limit is {max_candidates}")
    if len(request.context) > max_context:
        raise LimitExceeded(f"{len(request.context)} context clips; the limit is {max_context}")
    seen: set[str] = set()
    for k, c in enumerate(request.candidates):
        check_id(c.candidate_id, f"candidate #{k} candidate_id")
        if c.candidate_id in seen:
            raise InvalidRequest(f"candidate_id {c.candidate_id!r} appears twice; candidate ids must be unique")
        seen.add(c.candidate_id)


def check_evidence(method: Method, n_context: int, has_reference: bool) -> None:
    """Refuse a request whose method has nothing to compare the candidates with."""
    if method is Method.REFERENCE and not has_reference:
        raise InvalidRequest("method reference needs the speaker's reference clip")
    if method in (Method.PAIRWISE, Method.CENTROID) and not n_context:
        raise InvalidRequest(f"method {method.value} needs at least one context clip of the speaker")
    if method in (Method.AUTO, Method.LALM) and not n_context and not has_reference:
        raise InvalidRequest(f"method {method.value} needs context clips of the speaker, a reference, or both")


def usable_context(
    method: Method,
    candidates: Sequence[tuple[str, ClipEmbedding]],
    context: Sequence[ClipEmbedding],
    reference: ClipEmbedding | None,
    has_reference: bool,
    min_speech_seconds: float,
) -> list[ClipEmbedding]:
    """The context clips with enough speech, after refusing a request that cannot be ranked once its audio
    is heard: a candidate or the reference (``reference``: the clip sent; None for a registered voice or
    none) without enough speech, or no usable context where the method needs it."""
    for candidate_id, clip in candidates:
        if not clip.usable:
            raise InvalidRequest(f"candidate {candidate_id!r} cannot be scored: {clip.detail}")
    if reference is not None and not reference.usable:
        raise InvalidRequest(f"reference is unusable: {reference.detail}")
    usable = [c for c in context if c.usable]
    if method in (Method.PAIRWISE, Method.CENTROID) and not usable:
        raise InvalidRequest(
            f"none of the {len(context)} context clips has enough speech "
            f"(at least {min_speech_seconds:.2f} s each) for method {method.value}"
        )
    if method in (Method.AUTO, Method.LALM) and not usable and not has_reference:
        raise InvalidRequest(
            f"none of the {len(context)} context clips has enough speech and there is no reference: method "
            f"{method.value} has nothing to compare the candidates with"
        )
    return usable


def rank_candidates(
    method: Method,
    candidate_ids: Sequence[str],
    candidates: Sequence[ClipEmbedding],
    context: Sequence[ClipEmbedding],
    reference: np.ndarray | None,
    fits: Sequence[TurnResult] | None = None,
) -> tuple[RankedCandidateResult, ...]:
    """Candidates best first under ``method``. Every candidate must be usable; ``context`` holds only
    usable clips. ``fits``: each candidate's verdict in the slot under auto (in candidate order), whose
    P(it belongs to the speaker), status and detail each candidate then carries."""
    cand = stack_embeddings(candidates)
    context_emb = stack_embeddings(context) if context else np.zeros((0, cand.shape[1]), np.float32)
    scores = scoring.candidate_scores(method, cand, context_emb, reference)
    info = METHODS[method]
    order = scoring.rank_order(scores, info.higher_is_better)
    if method is Method.AUTO and fits is not None:
        # The candidates the gate would pass come first, then those it would leave unsure, then those it would flag,
        # each group in score order (a stable sort). A channel moves the centroid cosine: beside Opus or mixed-channel
        # context another voice's candidate could outscore the speaker's own, which the gate, comparing on like
        # copies, passes. Screened on the dev fit split and three train conditions, reported on others
        # (docs/research/ranking-fit/): top-1 accuracy +2.5 points under channel drift, +1.9 under Opus, clean
        # speech unchanged; ordering by the fit probability itself lost on clean speech.
        order = np.array(sorted(order, key=lambda j: _TIER.get(fits[j].status, 3)))
    return tuple(
        RankedCandidateResult(
            candidate_id=candidate_ids[j],
            rank=r + 1,
            score=float(scores[j]),
            score_scale=info.candidate_scale,
            higher_is_better=info.higher_is_better,
            speech_seconds=candidates[j].speech_seconds,
            fit_probability=None if fits is None else _belongs(fits[j]),
            fit_status=None if fits is None else fits[j].status,
            fit_detail="" if fits is None else fits[j].detail,
        )
        for r, j in enumerate(order)
    )


# The order of a candidate's fit status in auto's ranking (any other status cannot come back for a usable candidate
# with context or a reference; it would rank last).
_TIER = {TurnStatus.CONSISTENT: 0, TurnStatus.UNCERTAIN: 1, TurnStatus.INCONSISTENT: 2}


def _belongs(verdict: TurnResult) -> float | None:
    """P(the candidate belongs to the speaker) from its verdict in the slot."""
    p = verdict.inconsistency_probability
    return None if p is None else 1.0 - p
