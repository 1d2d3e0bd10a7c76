"""Turning clip embeddings into per-turn and per-speaker verdicts, for every turn of a dialogue at once.

Shared by CheckDialogue and StreamDialogue (through sleuthd.judgment.dialogue), so a stream's verdicts are exactly
what CheckDialogue gives for the same turns. Each speaker's evidence lives in a :class:`SpeakerPool` that
keeps what judging needs (exact cosines, sorted pairs, features) and, when one turn arrives, updates it
with one matrix-vector product, a merge, and a fixed number of array passes over the speaker's cosines
(never a Python loop over turns); :func:`score_speakers` turns the pools into arrays of scores and verdict
codes, and :func:`turn_result` makes a verdict object only for the turns someone asks about.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from sleuthd.domain import EncoderScores, FlagReason, SpeakerResult, TurnResult, TurnStatus
from sleuthd.encoders.clips import ClipEmbedding
from sleuthd.judgment import scoring
from sleuthd.judgment.calibration import Calibration, OwnEvidence, features, own_evidence
from sleuthd.judgment.gram import SortedPairs, cosines, gram, products, quantize
from sleuthd.judgment.scoring import METHODS, Method, unit


@dataclass(frozen=True)
class Judgment:
    """How turns are judged: a method, its threshold on the method's scale, and the encoder's
    calibration (None when the encoder has none; required for Method.AUTO)."""

    method: Method
    threshold: float
    calibration: Calibration | None = None
    # A fused encoder's parts: (name, first, stop) column ranges of its embedding. Each turn verdict then
    # also reports every part's paper scores (TurnResult.encoder_scores).
    components: tuple[tuple[str, int, int], ...] = ()


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
        for name, part in self.components.items():
            part.add(k, _part(embedding, *self._slices[name]), speech_seconds)

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


# Verdict codes, one per turn, so that a whole dialogue's statuses compare as arrays.
CONSISTENT, OVER_THRESHOLD, CONFUSED, NO_CONTEXT, NO_AUDIO = range(5)
STATUS_OF_CODE = (
    TurnStatus.CONSISTENT,
    TurnStatus.INCONSISTENT,
    TurnStatus.INCONSISTENT,
    TurnStatus.INSUFFICIENT_CONTEXT,
    TurnStatus.INSUFFICIENT_AUDIO,
)
REASON_OF_CODE = (
    FlagReason.NONE,
    FlagReason.SCORE_THRESHOLD,
    FlagReason.SPEAKER_CONFUSION,
    FlagReason.NONE,
    FlagReason.NONE,
)
STATUS_NUMBER = np.array([0, 1, 1, 2, 3])  # code -> status, as numbers: revisions are status changes


@dataclass(frozen=True)
class SpeakerScores:
    """One speaker's verdicts as arrays over their usable turns (dialogue order)."""

    pairwise: np.ndarray | None  # (n,) cosine similarity; None with fewer than two usable turns
    centroid: np.ndarray | None  # (n,) cosine distance
    reference: np.ndarray | None  # (n,) cosine similarity; None without a reference
    probability: np.ndarray | None  # (n,) P(inconsistent); None without a calibration or evidence
    model: str  # auto's fitted model (variant) that gave ``probability``
    scores: np.ndarray | None  # (n,) the scores the method judges with (one of the above); None: unscored
    codes: np.ndarray  # (n,) int: CONSISTENT, OVER_THRESHOLD, CONFUSED or NO_CONTEXT
    rivals: list[str]  # the other speakers with usable turns
    closest: np.ndarray | None  # (n,) index into rivals of the closest other speaker; None: one voice only
    margin: np.ndarray | None  # (n,) cosine to own speaker minus to the closest rival; NaN: nothing own
    # A fused encoder's parts: name -> (pairwise, centroid, reference) as above, each part's own.
    components: Mapping[str, tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]] = field(
        default_factory=dict
    )


def score_speakers(pools: Mapping[str, SpeakerPool], judgment: Judgment) -> dict[str, SpeakerScores]:
    """Every speaker's verdict arrays. ``pools``: speaker -> pool, in order of first appearance. The
    other speakers' voices are each speaker's cohort; under auto, a turn closer to another speaker than
    to its own is flagged SPEAKER_CONFUSION."""
    voiced = [s for s, p in pools.items() if p.n]
    centroids = {s: pools[s].centroid() for s in voiced}
    out: dict[str, SpeakerScores] = {}
    for s in voiced:
        pool = pools[s]
        others = [u for u in voiced if u != s]
        cohort = np.stack([centroids[u] for u in others]) if others else None
        pw, cd, rc = pool.paper_scores()
        prob, model = None, ""
        calibration = judgment.calibration
        if calibration is not None and (pool.n >= 2 or pool.reference is not None):
            near = pool.nearest_other(cohort) if cohort is not None and pool.n >= 2 else None
            model, x = features(pool.own_evidence(), near)
            prob = calibration.models[model].probability(x)
        chosen = {Method.PAIRWISE: pw, Method.CENTROID: cd, Method.REFERENCE: rc, Method.AUTO: prob}[judgment.method]
        if chosen is None:
            codes = np.full(pool.n, NO_CONTEXT)
        else:
            codes = np.where(scoring.flagged(judgment.method, chosen, judgment.threshold), OVER_THRESHOLD, CONSISTENT)
        best = margin = None
        if cohort is not None:
            rivals = products(pool.emb, cohort)  # (n, c) float32: cosine to each other speaker's centroid
            best = np.argmax(rivals, axis=1)
            margin = pool.own_speaker_cosine() - rivals[np.arange(pool.n), best].astype(np.float64)
            if judgment.method is Method.AUTO:
                codes = np.where(margin < 0, CONFUSED, codes)  # NaN (unattributed) compares False
        parts = {name: part.paper_scores() for name, part in pool.components.items()}
        out[s] = SpeakerScores(pw, cd, rc, prob, model, chosen, codes, others, best, margin, parts)
    return out


def turn_result(
    turn_id: str,
    speaker: str,
    audio_seconds: float,
    speech_seconds: float,
    detail: str,
    scores: SpeakerScores | None,
    k: int,
    judgment: Judgment,
) -> TurnResult:
    """The verdict object of one turn: the k-th usable turn of its speaker, or (``scores`` None) a turn
    without usable audio, whose ``detail`` says why. (Plain Python on scalars: CheckDialogue makes one
    per turn, so this is most of what judging a long dialogue costs beyond the vector work.)"""
    if scores is None:
        return TurnResult(turn_id, speaker, TurnStatus.INSUFFICIENT_AUDIO, audio_seconds, speech_seconds, detail=detail)
    code = int(scores.codes[k])
    score = threshold = None
    scale = ""
    if scores.scores is None:
        detail = (
            f"speaker {speaker!r} has no other usable turn to compare with; "
            "send more turns, or a reference and use method reference or auto"
        )
    else:
        info = METHODS[judgment.method]
        score, threshold, scale = float(scores.scores[k]), judgment.threshold, info.scale
        # The same comparison as scoring.flagged, on one number.
        bad = score > threshold if info.flag_above else score < threshold
        relation = (">" if bad else "<=") if info.flag_above else ("<" if bad else ">=")
        # auto names the fitted model it used (which evidence it had, cohort or not).
        model = f" ({scores.model} model)" if judgment.method is Method.AUTO else ""
        detail = f"{judgment.method.value}{model}: {scale.replace('_', ' ')} {score:.3f} {relation} {threshold:.3f}"
    closest, margin = "", None
    if scores.margin is not None and scores.closest is not None:
        d = float(scores.margin[k])
        if d == d:  # not NaN: the turn had something of its own speaker to compare with
            closest, margin = (speaker if d >= 0 else scores.rivals[int(scores.closest[k])]), d
    if code == CONFUSED:
        detail = f"sounds closer to speaker {closest!r} than to {speaker!r} (cosine margin {margin:.3f}); {detail}"
    return TurnResult(
        turn_id=turn_id,
        speaker=speaker,
        status=STATUS_OF_CODE[code],
        audio_seconds=audio_seconds,
        speech_seconds=speech_seconds,
        score=score,
        score_scale=scale,
        threshold=threshold,
        pairwise_mean_cosine=None if scores.pairwise is None else float(scores.pairwise[k]),
        centroid_cosine_distance=None if scores.centroid is None else float(scores.centroid[k]),
        reference_cosine=None if scores.reference is None else float(scores.reference[k]),
        detail=detail,
        inconsistency_probability=None if scores.probability is None else float(scores.probability[k]),
        reason=REASON_OF_CODE[code],
        closest_speaker=closest,
        closest_speaker_margin=margin,
        encoder_scores=tuple(
            EncoderScores(name, *(None if a is None else float(a[k]) for a in arrays))
            for name, arrays in scores.components.items()
        ),
    )


def speaker_verdict(speaker: str, turn_ids: Sequence[str], codes: np.ndarray) -> SpeakerResult:
    """A speaker's verdict from the codes of all their turns (dialogue order; NO_AUDIO for unusable ones)."""
    status = STATUS_NUMBER[codes]
    scored = int(np.count_nonzero(status <= 1))
    bad = tuple(turn_ids[int(i)] for i in np.flatnonzero(status == 1))
    return SpeakerResult(
        speaker=speaker,
        judged=scored > 0,
        consistent=scored > 0 and not bad,
        inconsistent_turn_ids=bad,
        scored_turns=scored,
        unscored_turns=len(codes) - scored,
    )
