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

from sleuthd.scoring import unit

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


def _pair_values(sims: np.ndarray, members: np.ndarray) -> np.ndarray:
    """Cosines between distinct members (indices) of a speaker's turns."""
    sub = sims[np.ix_(members, members)]
    return np.asarray(sub[np.triu_indices(len(members), k=1)])


def turn_features(
    emb: np.ndarray,
    reference: np.ndarray | None,
    speech_seconds: np.ndarray,
    cohort: np.ndarray | None = None,
) -> tuple[str, np.ndarray]:
    """Features of every turn of one speaker, and the variant (model) they belong to.

    emb: (n, D) unit embeddings of the speaker's usable turns; reference: (D,) or None;
    speech_seconds: (n,); cohort: (c, D) unit centroids of the dialogue's other speakers, or None.
    Returns (variant, (n, k) features in that variant's order).

    The yardstick for turn i is the speaker's other evidence (the other turns, and the reference when
    there is one) measured against itself in the same way; medians, not means, summarise it, so one
    replaced turn among the others barely moves it.
    """
    n = len(emb)
    pool = np.vstack([emb, reference[None, :]]) if reference is not None else emb  # evidence: turns (+ reference)
    m = len(pool)
    # Features are computed in float64 (the fitted models were), whatever the encoder's output dtype.
    sims = (pool @ pool.T).astype(np.float64)
    log_dur = np.log(np.maximum(speech_seconds, 0.1))
    rows: list[dict[str, float]] = [{"log_speech_seconds": float(log_dur[i])} for i in range(n)]
    # Cohort normalisation (two or more own turns): each piece of evidence's cosine to the closest
    # other voice of the dialogue is the yardstick of "a different person, in this recording".
    nearest_other = (
        (pool @ cohort.T).max(axis=1).astype(np.float64) if cohort is not None and len(cohort) and n >= 2 else None
    )
    for i in range(n):
        row = rows[i]
        turn_others = np.array([j for j in range(n) if j != i], dtype=int)
        others = np.array([j for j in range(m) if j != i], dtype=int)
        if n >= 2:
            row["pair_cosine"] = float(sims[i, turn_others].mean())  # absolute: only where nothing relative exists
        if nearest_other is not None:
            # Where turn i's own similarity sits between "sounds like another person of this dialogue"
            # (0) and "identical" (1), measured from the nearest other voice upwards. Below -1 the turn
            # is that other voice (SPEAKER_CONFUSION's case); clipping keeps such turns from dominating
            # the standardisation.
            near = float(nearest_other[i])
            own_i = float(sims[i, others].mean())
            row["cohort_position"] = max((own_i - near) / max(1.0 - near, MIN_DISTANCE), -1.0)
        if reference is not None:
            row["reference_cosine"] = float(sims[i, n])
            if n >= 2:
                to_reference = sims[turn_others, n]
                ref_level = float(np.median(to_reference))
                row["reference_gap"] = (ref_level - float(sims[i, n])) / max(1.0 - ref_level, MIN_DISTANCE)
                # The same gap in units of how much the other turns' similarity to the reference varies.
                row["reference_z"] = (ref_level - float(sims[i, n])) / max(float(to_reference.std()), MIN_SPREAD)
        if len(others) >= 2 and n >= 2:
            values = _pair_values(sims, others)
            level = float(np.median(values))
            spread = max(float(values.std()), MIN_SPREAD)
            room = max(1.0 - level, MIN_DISTANCE)
            mean_i, max_i = float(sims[i, others].mean()), float(sims[i, others].max())
            row["context_gap"] = (level - mean_i) / room
            row["context_z"] = (level - mean_i) / spread
            # A robust spread (scaled median absolute deviation): a replaced turn among the others
            # widens the standard deviation, and with it the yardstick of every genuine turn.
            robust_spread = max(1.4826 * float(np.median(np.abs(values - level))), MIN_SPREAD)
            row["context_robust_z"] = (level - mean_i) / robust_spread
            row["nearest_gap"] = (level - max_i) / room  # even the most alike other evidence is far
            row["farthest_gap"] = (level - float(sims[i, others].min())) / room
            # Leave-one-out: the turn against the centroid of the rest, versus each of the rest against
            # the centroid of the others without it.
            loo_i = float(pool[i] @ unit(pool[others].mean(axis=0)))
            loo_rest = np.array([float(pool[j] @ unit(pool[others[others != j]].mean(axis=0))) for j in others])
            loo_level = float(np.median(loo_rest))
            row["loo_gap"] = (loo_level - loo_i) / max(1.0 - loo_level, MIN_DISTANCE)
            row["loo_z"] = (loo_level - loo_i) / max(float(loo_rest.std()), MIN_SPREAD)
            row["log_turns"] = float(np.log(n))
            if nearest_other is not None:
                # How far turn i falls below the speaker's typical self-similarity, as a share of the
                # gap between that and how similar the speaker's other evidence is to the nearest other
                # voice: about 0 for a genuine turn, about 1 for one that sounds like a different person.
                separation = max(level - float(np.median(nearest_other[others])), MIN_DISTANCE)
                row["cohort_gap"] = (level - mean_i) / separation
    if all("context_gap" in r for r in rows) and n >= 3:
        # How much more of an outsider this turn is than the speaker's typical turn.
        gaps = np.array([r["loo_gap"] for r in rows])
        for i in range(n):
            rows[i]["gap_excess"] = float(gaps[i] - np.median(np.delete(gaps, i)))
    variant = _variant(n, reference is not None) + (COHORT_SUFFIX if nearest_other is not None else "")
    names = FEATURES[variant]
    return variant, np.array([[r[f] for f in names] for r in rows], dtype=np.float64)


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
