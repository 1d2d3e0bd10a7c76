"""The `auto` judgment: a calibrated probability that a turn does not belong to its speaker.

Fixed cosine thresholds do not transfer (SpeakerSleuth's central finding): how alike two turns of one
speaker are depends on the encoder, the voice, the recording and the turn length. `auto` therefore
never compares a cosine with a constant. It asks how a turn relates to the speaker's *other* turns
compared with how those relate to each other (and the same against the reference clip), scales
that gap by the speaker's own spread, and maps the result through a small logistic model fitted on
the synthetic dev corpus (espeak-ng voices only) and stored, with how it was fitted, in the encoder's
model manifest. The output is a probability in [0, 1]; turns above ``decision_threshold`` (0.5, the
Bayes decision for the fitted prior) are flagged.

Every feature is a difference or ratio of cosines measured inside the request, so a corpus whose
cosines all sit lower (real narrowband speech: same speaker 0.74-0.90) or higher (clean synthetic
voices: about 0.94) moves the features much less than it moves the raw cosines.

When the dialogue has usable audio of other speakers, they are the cohort: the nearest other voice
tells how far apart two *different* people sound in this very recording, a yardstick for how far a
turn has fallen from its own speaker. Those requests use the ``*_cohort`` twin of their variant, with
the cohort features added.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from sleuthd.judgment.gram import SortedPairs, gram, median_without, products, quantize, std_without

# Floors keep ratios finite for speakers whose turns are nearly identical.
MIN_SPREAD = 0.02  # cosine
MIN_DISTANCE = 0.02  # 1 - cosine

# Which model applies depends on what the request offers for the speaker: how many turns, whether
# there is a reference, and whether other speakers' audio is there to serve as a cohort (two or more
# own turns only: with one turn the yardstick has nothing of the speaker's own to measure).
BASE_VARIANTS = ("context_reference", "context", "pair_reference", "pair", "reference_only")
COHORT_SUFFIX = "_cohort"
VARIANTS = (*BASE_VARIANTS, *(v + COHORT_SUFFIX for v in BASE_VARIANTS if v != "reference_only"))


class CalibrationError(RuntimeError):
    """The encoder has no usable calibration for `auto` (missing, for other weights, or malformed)."""


@dataclass(frozen=True)
class LogisticModel:
    """P(inconsistent) = sigmoid(bias + weights . standardised(features))."""

    features: tuple[str, ...]
    mean: np.ndarray  # (k,)
    scale: np.ndarray  # (k,)
    weights: np.ndarray  # (k,)
    bias: float

    def logit(self, x: np.ndarray) -> np.ndarray:
        """x: (n, k) raw features in ``features`` order -> (n,) log-odds of inconsistency."""
        z = (x - self.mean) / self.scale
        return np.asarray(z @ self.weights + self.bias)

    def probability(self, x: np.ndarray) -> np.ndarray:
        """x: (n, k) raw features in ``features`` order -> (n,) probabilities."""
        return np.asarray(1.0 / (1.0 + np.exp(-np.clip(self.logit(x), -40, 40))))

    def to_json(self) -> dict[str, Any]:
        return {
            "features": list(self.features),
            "mean": [float(v) for v in self.mean],
            "scale": [float(v) for v in self.scale],
            "weights": [float(v) for v in self.weights],
            "bias": float(self.bias),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> LogisticModel:
        k = len(d["features"])
        arrays = [np.asarray(d[name], dtype=np.float64) for name in ("mean", "scale", "weights")]
        if any(a.shape != (k,) for a in arrays):
            raise CalibrationError(f"calibration model with {k} features has arrays of the wrong length")
        return cls(tuple(d["features"]), arrays[0], arrays[1], arrays[2], float(d["bias"]))


@dataclass(frozen=True)
class Calibration:
    """The fitted models of one encoder, keyed by variant, and the decision threshold on P."""

    models: dict[str, LogisticModel]
    decision_threshold: float
    raw: dict[str, Any]

    @classmethod
    def from_manifest(cls, manifest_raw: Mapping[str, Any], encoder_name: str) -> Calibration:
        """Load the ``calibration`` block of an encoder manifest; refuse one fitted for other weights."""
        block = manifest_raw.get("calibration")
        if not block:
            raise CalibrationError(
                f"encoder {encoder_name!r} has no calibration in its manifest, so method auto cannot judge with "
                "it: use a thresholded method (pairwise, centroid, reference) or fit one with "
                "`sleuthd-bench calibrate fit`"
            )
        weights_sha = manifest_raw.get("source", {}).get("file_sha256")
        if block.get("encoder_weights_sha256") != weights_sha:
            raise CalibrationError(
                f"the calibration of encoder {encoder_name!r} was fitted for weights "
                f"{str(block.get('encoder_weights_sha256'))[:12]}… but the manifest's weights are "
                f"{str(weights_sha)[:12]}…: refit it with `sleuthd-bench calibrate fit`"
            )
        try:
            models = {name: LogisticModel.from_json(m) for name, m in block["models"].items()}
            threshold = float(block["decision_threshold"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CalibrationError(f"calibration of encoder {encoder_name!r} is malformed: {exc}") from exc
        if block.get("length_correction") is not None:
            # Same feature names, different meaning: a model fitted on length-corrected cosines would give
            # wrong probabilities on the plain cosines this server computes. Refuse instead. (The
            # correction failed its gate and was removed; docs/research/ has its history.)
            raise CalibrationError(
                f"the calibration of encoder {encoder_name!r} was fitted with turn-length correction "
                f"{block['length_correction']!r}, which sleuthd no longer serves: refit it with "
                "`sleuthd-bench calibrate fit`"
            )
        missing = [v for v in VARIANTS if v not in models]
        if missing:
            raise CalibrationError(f"calibration of encoder {encoder_name!r} lacks models for: {', '.join(missing)}")
        stale = [v for v in VARIANTS if models[v].features != FEATURES[v]]
        if stale:
            raise CalibrationError(
                f"calibration of encoder {encoder_name!r} was fitted on other features ({', '.join(stale)}): "
                "refit it with `sleuthd-bench calibrate fit`"
            )
        return cls(models, threshold, dict(block))


# ------------------------------------------------------------------------------------------ features


@dataclass(frozen=True)
class OwnEvidence:
    """What `auto` measures of one speaker from their own turns and reference alone, for every turn at
    once; :func:`features` adds the dialogue's other voices (the cohort). Arrays are over the speaker's
    usable turns, in dialogue order."""

    turns: int
    has_reference: bool
    columns: dict[str, np.ndarray]  # feature name -> (n,) float64
    own_mean: np.ndarray | None  # (n,) mean cosine of turn i to the rest of the evidence; n >= 2
    level: np.ndarray | None  # (n,) median cosine between pieces of the rest of the evidence; context only


def own_evidence(
    g: np.ndarray, pairs: SortedPairs | None, speech_seconds: np.ndarray, has_reference: bool
) -> OwnEvidence:
    """Features of every turn of one speaker from the speaker's pool of evidence.

    g: (m, m) exact cosines of the pool (sleuthd.judgment.gram): the reference first when there is one, then the
    turns in dialogue order; pairs: its sorted pairs (built here when None and needed); speech_seconds: (n,).

    The yardstick for turn i is the speaker's other evidence (the other turns, and the reference when
    there is one) measured against itself in the same way; medians, not means, summarise it, so one
    replaced turn among the others barely moves it. Every statistic "without turn i" is computed for all
    turns together from whole-pool sums and sorted pairs, never by re-scanning the pool once per turn.
    """
    r0 = 1 if has_reference else 0
    m = len(g)
    n = m - r0
    t = np.arange(r0, m)
    diag = np.diagonal(g)
    own_norms = diag[t].copy()
    row = g.sum(axis=1)
    cols = {"log_speech_seconds": np.log(np.maximum(np.asarray(speech_seconds, np.float64), 0.1))}
    own = level = None
    if n >= 2:
        # Absolute: used only where nothing relative exists.
        turn_rows = row[t] - g[t, 0] if has_reference else row
        cols["pair_cosine"] = (turn_rows - diag[t]) / (n - 1)
        own = (row[t] - diag[t]) / (m - 1)
    if has_reference:
        to_reference = g[t, 0].copy()
        cols["reference_cosine"] = to_reference
        if n >= 2:
            ref_level = median_without(to_reference)
            gap = ref_level - to_reference
            cols["reference_gap"] = gap / np.maximum(1.0 - ref_level, MIN_DISTANCE)
            # The same gap in units of how much the other turns' similarity to the reference varies.
            cols["reference_z"] = gap / np.maximum(std_without(to_reference), MIN_SPREAD)
    if n >= 2 and m >= 3:
        assert own is not None
        pairs = pairs if pairs is not None else SortedPairs.of(g)
        level = pairs.median_without(m, t)
        room = np.maximum(1.0 - level, MIN_DISTANCE)
        below = level - own
        cols["context_gap"] = below / room
        cols["context_z"] = below / np.maximum(_pair_std_without(g, row, diag, t), MIN_SPREAD)
        # A robust spread (scaled median absolute deviation): a replaced turn among the others
        # widens the standard deviation, and with it the yardstick of every genuine turn.
        mad = pairs.median_deviation_without(m, t, level)
        cols["context_robust_z"] = below / np.maximum(1.4826 * mad, MIN_SPREAD)
        # Closest and farthest other evidence: the diagonal is masked in place (and restored), not copied.
        g[t, t] = -np.inf
        nearest = g[r0:].max(axis=1)
        g[t, t] = np.inf
        farthest = g[r0:].min(axis=1)
        g[t, t] = own_norms
        cols["nearest_gap"] = (level - nearest) / room  # even the most alike other evidence is far
        cols["farthest_gap"] = (level - farthest) / room
        loo, loo_level, loo_spread = _leave_one_out(g, row, diag, t)
        cols["loo_gap"] = (loo_level - loo) / np.maximum(1.0 - loo_level, MIN_DISTANCE)
        cols["loo_z"] = (loo_level - loo) / np.maximum(loo_spread, MIN_SPREAD)
        cols["log_turns"] = np.full(n, np.log(n))
        if n >= 3:
            # How much more of an outsider this turn is than the speaker's typical turn.
            cols["gap_excess"] = cols["loo_gap"] - median_without(cols["loo_gap"])
    return OwnEvidence(n, has_reference, cols, own, level)


def _pair_std_without(g: np.ndarray, row: np.ndarray, diag: np.ndarray, t: np.ndarray) -> np.ndarray:
    """(n,): population std of the pool's pair cosines without the pairs of pool index t[k], from row
    sums of (g - c)^2 with c the mean pair cosine (shifted: nothing large cancels)."""
    m = len(g)
    count = m * (m - 1) // 2 - (m - 1)
    c = (row.sum() - diag.sum()) / (m * (m - 1))
    dd = diag - c
    y = g - c
    row1 = row - m * c - dd  # per row: sum over j != i of (g_ij - c)
    row2 = np.einsum("ij,ij->i", y, y) - dd * dd
    mean = (row1.sum() / 2 - row1[t]) / count
    var = (row2.sum() / 2 - row2[t]) / count - mean * mean
    return np.sqrt(np.maximum(var, 0.0))


def _leave_one_out(
    g: np.ndarray, row: np.ndarray, diag: np.ndarray, t: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Leave-one-out: turn i against the centroid of the rest of the pool, versus each piece j of the
    rest against the centroid of the pool without i and j. Returns (loo_i, median_j, std_j), each (n,).

    Cosine to a centroid from the cosine matrix alone: p_j . sum(S) / |sum(S)|, with |sum(S)|^2 the sum
    of the block of S (inclusion-exclusion on whole-pool row sums). As in scoring.unit, a centroid
    shorter than 1e-12 is not scaled up further."""
    m, n = len(g), len(t)
    total = row.sum()
    loo = (row[t] - diag[t]) / np.maximum(np.sqrt(np.maximum(total - 2 * row[t] + diag[t], 0.0)), (m - 1) * 1e-12)
    gt = g[t[0] :]  # the turns' rows (t is a range)
    rest = (row - diag)[None, :] - gt  # p_j . sum of the pool without i and j
    norm2 = 2 * gt
    norm2 += (total - 2 * row[t] + diag[t])[:, None]
    norm2 -= (2 * row - diag)[None, :]
    np.maximum(norm2, ((m - 2) * 1e-12) ** 2, out=norm2)
    rest /= np.sqrt(norm2, out=norm2)
    rest[np.arange(n), t] = np.inf  # j == i is not part of the rest: sorts last
    rest.sort(axis=1)
    left = m - 1
    median = rest[:, left // 2] if left % 2 else (rest[:, left // 2 - 1] + rest[:, left // 2]) / 2
    y = rest[:, :left] - median[:, None]
    mean = y.sum(axis=1) / left
    return loo, median, np.sqrt(np.maximum(np.einsum("ij,ij->i", y, y) / left - mean * mean, 0.0))


def features(own: OwnEvidence, nearest_other: np.ndarray | None) -> tuple[str, np.ndarray]:
    """(variant, (n, k) features in that variant's order) for one speaker's turns.

    nearest_other: (m,) for each piece of the pool (reference first), its cosine to the closest other
    voice of the dialogue, or None without a cohort. Cohort normalisation needs two or more own turns:
    with one, the yardstick has nothing of the speaker's own to measure."""
    cols = own.columns
    cohort = nearest_other is not None and own.turns >= 2
    if cohort:
        assert nearest_other is not None and own.own_mean is not None
        r0 = 1 if own.has_reference else 0
        near = nearest_other[r0:]
        cols = dict(cols)
        # Where turn i's own similarity sits between "sounds like another person of this dialogue"
        # (0) and "identical" (1), measured from the nearest other voice upwards. Below -1 the turn
        # is that other voice (SPEAKER_CONFUSION's case); clipping keeps such turns from dominating
        # the standardisation.
        cols["cohort_position"] = np.maximum((own.own_mean - near) / np.maximum(1.0 - near, MIN_DISTANCE), -1.0)
        if own.level is not None:
            # How far turn i falls below the speaker's typical self-similarity, as a share of the
            # gap between that and how similar the speaker's other evidence is to the nearest other
            # voice: about 0 for a genuine turn, about 1 for one that sounds like a different person.
            separation = np.maximum(own.level - median_without(nearest_other)[r0:], MIN_DISTANCE)
            cols["cohort_gap"] = (own.level - own.own_mean) / separation
    variant = _variant(own.turns, own.has_reference) + (COHORT_SUFFIX if cohort else "")
    return variant, np.stack([cols[f] for f in FEATURES[variant]], axis=1).astype(np.float64)


def turn_features(
    emb: np.ndarray,
    reference: np.ndarray | None,
    speech_seconds: np.ndarray,
    cohort: np.ndarray | None = None,
) -> tuple[str, np.ndarray]:
    """Features of every turn of one speaker, and the variant (model) they belong to.

    emb: (n, D) unit embeddings of the speaker's usable turns; reference: (D,) or None;
    speech_seconds: (n,); cohort: (c, D) unit centroids of the dialogue's other speakers, or None.
    Returns (variant, (n, k) features in that variant's order). Features are float64 (the fitted
    models were), whatever the encoder's output dtype.
    """
    pool = emb if reference is None else np.vstack([reference[None, :], emb])
    own = own_evidence(gram(quantize(pool)), None, speech_seconds, reference is not None)
    nearest = None
    if cohort is not None and len(cohort):
        nearest = np.asarray(products(pool, cohort).max(axis=1), dtype=np.float64)
    return features(own, nearest)


def _variant(n: int, has_reference: bool) -> str:
    if n >= 3:
        return "context_reference" if has_reference else "context"
    if n == 2:
        return "pair_reference" if has_reference else "pair"
    return "reference_only"


_CONTEXT_FEATURES = (
    "context_gap",
    "context_z",
    "context_robust_z",
    "nearest_gap",
    "farthest_gap",
    "loo_gap",
    "loo_z",
    "gap_excess",
)
FEATURES: dict[str, tuple[str, ...]] = {
    "context_reference": (*_CONTEXT_FEATURES, "reference_gap", "reference_z", "log_speech_seconds", "log_turns"),
    "context": (*_CONTEXT_FEATURES, "log_speech_seconds", "log_turns"),
    "pair_reference": ("reference_gap", "reference_cosine", "pair_cosine", "log_speech_seconds"),
    "pair": ("pair_cosine", "log_speech_seconds"),
    "reference_only": ("reference_cosine", "log_speech_seconds"),
}
FEATURES.update(
    {
        "context_reference_cohort": (*FEATURES["context_reference"], "cohort_gap", "cohort_position"),
        "context_cohort": (*FEATURES["context"], "cohort_gap", "cohort_position"),
        "pair_reference_cohort": (*FEATURES["pair_reference"], "cohort_gap", "cohort_position"),
        "pair_cohort": (*FEATURES["pair"], "cohort_position"),
    }
)


def inconsistency_probability(
    calibration: Calibration,
    emb: np.ndarray,
    reference: np.ndarray | None,
    speech_seconds: np.ndarray,
    cohort: np.ndarray | None = None,
) -> tuple[str, np.ndarray]:
    """(variant, (n,) P(inconsistent)) for one speaker's usable turns; ``cohort``: (c, D) unit
    centroids of the dialogue's other speakers (None or empty: no cohort)."""
    variant, x = turn_features(emb, reference, speech_seconds, cohort)
    return variant, calibration.models[variant].probability(x)


def candidate_fit(
    calibration: Calibration,
    candidates: np.ndarray,
    candidate_seconds: np.ndarray,
    context: np.ndarray,
    context_seconds: np.ndarray,
    reference: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """For each candidate as one more turn next to the context turns (and reference): P(it belongs to
    the speaker), and the log-odds of belonging. Rank by the log-odds: two clearly foreign candidates
    both have P close to 0, but their log-odds still say which is the less foreign. ((m,), (m,))"""
    logits = np.empty(len(candidates))
    for j, (cand, secs) in enumerate(zip(candidates, candidate_seconds, strict=True)):
        emb = np.vstack([context, cand[None, :]])
        variant, x = turn_features(emb, reference, np.append(context_seconds, secs), None)
        logits[j] = -calibration.models[variant].logit(x[-1:])[0]
    return 1.0 / (1.0 + np.exp(-np.clip(logits, -40, 40))), logits
