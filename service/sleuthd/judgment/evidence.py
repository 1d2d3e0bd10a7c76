"""The evidence model: `auto` judged from every encoder's evidence side by side, relative to the dialogue.

Why. The shipped `auto` (sleuthd.calibration) reads one similarity (GE2E, or the fused mean of GE2E's and
CAM++'s cosines) through features divided by "the room left below 1", fitted where a speaker's own turns
sit above 0.85. Expressive speech in another language puts a speaker's own turns at 0.45-0.55 and an
intruder at 0.3: the evidence is there, but the features shrink and the model answers "consistent".
Here every quantity is measured against the speaker's own other evidence *in absolute cosine units*
(nothing divided by a room that grows when the level falls), each encoder's evidence is its own
feature, and each feature acts through a bounded, monotone curve, so no input outside the fitted range
can push a probability further than the largest effect seen in fitting.

Features of turn i of one speaker, per encoder, from that encoder's pool cosine matrix (the reference
first when there is one, then the speaker's usable turns; sleuthd.gram), all O(m^2) for m pieces:

- ``own``: cosine of turn i to the centroid of the rest of the pool (leave-one-out);
- ``gap``: ``level - own``, with ``level`` the median over the other pieces j of j's cosine to the centroid
  of the pool without i and j (the same leave-one-out measurement of the rest, so an intruder among them
  barely moves it);
- ``z``: ``gap`` / max(standard deviation of those, MIN_SPREAD);
- ``ref`` / ``ref_gap`` (with a reference): cosine of turn i to the reference, and the median of the
  other turns' cosines to it minus that;
- ``rival_margin`` (other speakers in the dialogue): ``own`` minus the highest cosine of turn i to another
  speaker's centroid;

and, shared, ``log_speech_seconds``. A model is P = sigmoid(bias + sum_f sum_k w_fk ramp_fk(x_f)) with
ramps clip((x - k_j) / (k_j+1 - k_j), 0, 1) between fitted quantile knots: every feature's effect is
piecewise linear inside the knots, constant outside them, and monotone in the direction the evidence
points (SIGNS; e.g. a larger gap can never lower the probability).

Uncertain. A turn that is not flagged is UNCERTAIN instead of CONSISTENT when the dialogue lies outside
what the model was fitted on: a feature outside the range of the fitting turns (by more than a margin),
or the speaker's own other evidence is mutually dissimilar (some encoder's ``level`` below the floor seen
on consistent speakers in fitting). Counted as not flagged by the benchmark.

The blend (what the fused encoder's `auto` serves, version 2). Where a speaker's own turns are as alike as
in the corpus today's fused `auto` (sleuthd.judgment.calibration) was fitted on, today's `auto` judges, bit
for bit: the *gate* is each encoder's speaker level (the median over the speaker's turns of ``level``) at or
above the 0.5 % quantile of that statistic over the dialogues of today's calibration's fitting corpus.
Below it (another language, expressive speech, short turns, a noisy or drifting channel, real speech under
prosody...) a *stack* judges: P = sigmoid(sum_l hat_l(GE2E level of the turn) * (a_l * clip(today's logit)
+ b_l * evidence logit + c_l)), a_l, b_l >= 0 (monotone in both), fitted on the robustness matrix's train
split with out-of-fold evidence logits (so the stack does not learn to trust an evidence model on the
speakers it was fitted on). Only stacked turns can be UNCERTAIN (the rule above).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

EVIDENCE_VERSION = 2
MIN_SPREAD = 0.02  # cosine: floor of the rest's spread, so z stays finite for near-identical turns
MIN_SECONDS = 0.5  # speech seconds are clipped to this before the log
ENCODER_FEATURES = ("own", "gap", "z", "excess", "ref", "ref_gap", "rival_margin")
SHARED_FEATURES = ("log_speech_seconds",)
# +1: a larger value means more likely foreign; -1: less likely; 0: either way (still bounded).
SIGNS = {"own": -1, "gap": 1, "z": 1, "excess": 1, "ref": -1, "ref_gap": 1, "rival_margin": -1, "log_speech_seconds": 0}
# Which encoder features each variant uses: pool of 3+ pieces (context), exactly 2 (pair); with a
# reference or not; with other speakers of the dialogue (cohort) or not.
VARIANT_FEATURES: dict[str, tuple[str, ...]] = {
    "context_reference": ("own", "gap", "z", "excess", "ref", "ref_gap"),
    "context": ("own", "gap", "z", "excess"),
    "pair": ("own",),
}
VARIANT_FEATURES.update({v + "_cohort": (*f, "rival_margin") for v, f in list(VARIANT_FEATURES.items())})


REFIT = "refit it with `sleuthd-bench calibrate fit-evidence`"
# Why a turn the model does not flag is UNCERTAIN (the values of sleuthd.domain.UncertainReason).
OWN_TURNS_DISSIMILAR = "own_turns_dissimilar"
OUT_OF_SUPPORT = "out_of_support"


class EvidenceError(RuntimeError):
    """The evidence calibration cannot be used (malformed, or fitted for other encoder weights)."""


def calibration_identity(calibration_block: Mapping[str, Any]) -> str:
    """The identity of today's `auto` calibration the blend stacks on: a hash of its fitted models."""
    models = calibration_block.get("models", {})
    return hashlib.sha256(json.dumps(models, sort_keys=True).encode()).hexdigest()


def speaker_levels(evidence: Mapping[str, Mapping[str, np.ndarray]]) -> dict[str, float]:
    """Encoder -> the speaker's level (median over the turns of ``level``): the gate's statistic; NaN when
    the pool has fewer than three pieces."""
    out = {}
    for e, ev in evidence.items():
        level = np.asarray(ev["level"], np.float64)
        out[e] = float(np.median(level)) if len(level) and not np.isnan(level).any() else float("nan")
    return out


# ------------------------------------------------------------------------------------------ features


def _median_rows(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Row medians of x over the True entries of mask (each row has at least one): what np.nanmedian of
    the masked-out entries set to NaN gives, bit for bit. Not np.nanmedian itself: on rows it goes through
    masked arrays, about half the judging time of a streamed turn at 1,000 turns (55-65 ms a turn)."""
    y = np.where(mask, x, np.nan)
    counts = mask.sum(axis=1)
    lo, hi = (counts - 1) // 2, counts // 2
    if counts.min() == counts.max():  # one count for all rows (leave-one-out): partition around two ranks
        y = np.partition(y, sorted({int(lo[0]), int(hi[0])}), axis=1)  # NaN ranks after every number
    else:
        y = np.sort(y, axis=1)
    rows = np.arange(len(y))
    return (y[rows, lo] + y[rows, hi]) / 2


def encoder_evidence(g: np.ndarray, has_reference: bool, rivals: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Features of every turn from one encoder's pool cosine matrix ``g`` ((m, m), reference first when
    ``has_reference``). ``rivals``: (n, c) cosines of each turn to the other speakers' centroids, or None.
    Returns feature name -> (n,) float64, plus ``level`` (the yardstick, for the uncertain rule). Needs
    m >= 2; with m == 2 only ``own`` (the one cosine there is) and ``level`` (NaN) are meaningful."""
    return with_rivals(pool_evidence(g, has_reference), rivals)


def with_rivals(evidence: Mapping[str, np.ndarray], rivals: np.ndarray | None) -> dict[str, np.ndarray]:
    """``evidence`` (of :func:`pool_evidence`) with ``rival_margin`` added when there are other speakers: the
    one feature that changes when another speaker's turns do."""
    out = dict(evidence)
    if rivals is not None and rivals.size:
        out["rival_margin"] = out["own"] - np.asarray(rivals, np.float64).max(axis=1)
    return out


def pool_evidence(g: np.ndarray, has_reference: bool) -> dict[str, np.ndarray]:
    """:func:`encoder_evidence` without ``rival_margin``: everything that depends on the speaker's own pool
    alone, so a pool can keep it until its next turn (sleuthd.judgment.pool.SpeakerPool.evidence)."""
    g = np.asarray(g, np.float64)
    m = len(g)
    r0 = 1 if has_reference else 0
    t = np.arange(r0, m)
    n = len(t)
    row = g.sum(axis=1)
    diag = np.diagonal(g).copy()
    total = row.sum()
    own = (row[t] - diag[t]) / np.sqrt(np.maximum(total - 2 * row[t] + diag[t], 1e-12))
    out: dict[str, np.ndarray] = {"own": own}
    if m >= 3:
        # j's cosine to the centroid of the pool without turn i and j, for every (i, j): (n, m). Computed in place,
        # in the same order of operations as the plain expression
        #   ((row - diag) - g[t]) / sqrt(max(((total - 2 row[t] + diag[t]) - 2 row + diag) + 2 g[t], 1e-12)),
        # so the bits are those of that expression; at 500 turns a speaker each temporary is a 2 MB pass, and this
        # runs for the speaker who spoke on every streamed turn, once per encoder.
        gt = g[t]
        rest = (row - diag)[None, :] - gt
        norm2 = (total - 2 * row[t] + diag[t])[:, None] - 2 * row[None, :]
        norm2 += diag[None, :]
        gt *= 2
        norm2 += gt
        np.maximum(norm2, 1e-12, out=norm2)
        rest /= np.sqrt(norm2, out=norm2)
        cells = (np.arange(n), t)  # (i, i): turn i itself is not part of its rest
        rest[cells] = 0.0
        mean = rest.sum(axis=1) / (m - 1)
        dev = np.subtract(rest, mean[:, None], out=norm2)
        dev *= dev
        dev[cells] = 0.0
        var = dev.sum(axis=1) / (m - 1)
        # The median of the m - 1 others: NaN on (i, i) ranks after every number, as np.nanmedian ignores it.
        rest[cells] = np.nan
        lo, hi = (m - 2) // 2, (m - 1) // 2
        rest.partition(sorted({lo, hi}), axis=1)
        level = (rest[:, lo] + rest[:, hi]) / 2
        gap = level - own
        out.update(level=level, gap=gap, z=gap / np.maximum(np.sqrt(var), MIN_SPREAD))
        # How far turn i stands out beyond the runner-up: one intruder stands out alone, while a speaker
        # whose turns all vary (expressive speech, a channel per turn) has several turns about as far out.
        if n >= 2:
            top2 = np.sort(gap)[-2:]
            out["excess"] = gap - np.where(gap >= top2[-1], top2[0], top2[-1])
        else:
            out["excess"] = np.zeros(n)
    else:
        out.update(level=np.full(n, np.nan), gap=np.zeros(n), z=np.zeros(n), excess=np.zeros(n))
    if has_reference:
        to_ref = g[t, 0]
        out["ref"] = to_ref.copy()
        if n >= 2:
            others = np.broadcast_to(to_ref, (n, n))
            out["ref_gap"] = _median_rows(others, ~np.eye(n, dtype=bool)) - to_ref
        else:
            out["ref_gap"] = np.zeros(n)
    return out


def variant_of(turns: int, has_reference: bool, cohort: bool) -> str | None:
    """The model that judges a speaker with ``turns`` usable turns; None when there is nothing to compare."""
    pieces = turns + (1 if has_reference else 0)
    if turns < 1 or pieces < 2:
        return None
    base = "pair" if pieces == 2 else ("context_reference" if has_reference else "context")
    return base + ("_cohort" if cohort else "")


def feature_names(variant: str, encoders: Sequence[str]) -> tuple[str, ...]:
    """Column names of a variant's feature matrix: ``<encoder>.<feature>`` per encoder, then the shared."""
    return (*(f"{e}.{f}" for e in encoders for f in VARIANT_FEATURES[variant]), *SHARED_FEATURES)


def feature_matrix(
    names: Sequence[str], evidence: Mapping[str, Mapping[str, np.ndarray]], speech_seconds: np.ndarray
) -> np.ndarray:
    """(n, k) features named ``<encoder>.<feature>`` or a shared name (:func:`feature_names`);
    ``evidence``: encoder -> encoder_evidence(...)."""
    seconds = np.log(np.maximum(np.asarray(speech_seconds, np.float64), MIN_SECONDS))
    cols = []
    for name in names:
        encoder, _, feature = name.rpartition(".")
        cols.append(seconds if name == "log_speech_seconds" else np.asarray(evidence[encoder][feature], np.float64))
    return np.stack(cols, axis=1)


# ------------------------------------------------------------------------------------------ model


@dataclass(frozen=True)
class RampModel:
    """P(inconsistent) = sigmoid(bias + sum_f sum_k weights[f, k] ramp_k(x_f)
    + sum over pairs (f, c) of sum_k sum_l pair_weights[p, k, l] ramp_k(x_f) hat_l(x_c)).

    The pairs let a context (the speaker's own ``level`` of similarity, measured without the turn) choose
    which curve a piece of evidence follows: hat functions on the context's knots sum to 1, so between two
    knots the curve is a blend of theirs, and beyond the outer knots it is the outer one. Every curve is
    monotone in its evidence (the weights' signs are bounded in fitting) and bounded (ramps saturate)."""

    features: tuple[str, ...]
    knots: np.ndarray  # (k, K + 1) increasing knots per feature
    weights: np.ndarray  # (k, K)
    bias: float
    context: tuple[str, ...] = ()
    context_knots: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))  # (c, L + 1)
    pairs: tuple[tuple[int, int], ...] = ()  # (feature index, context index)
    pair_weights: np.ndarray = field(default_factory=lambda: np.zeros((0, 1, 2)))  # (q, K, L + 1)

    @property
    def inputs(self) -> tuple[str, ...]:
        """The columns the model reads: its features, then its contexts."""
        return (*self.features, *self.context)

    @staticmethod
    def ramps(x: np.ndarray, knots: np.ndarray) -> np.ndarray:
        """(n, k) features -> (n, k, K) ramp values in [0, 1]."""
        lo, hi = knots[None, :, :-1], knots[None, :, 1:]
        return np.asarray(np.clip((x[:, :, None] - lo) / np.maximum(hi - lo, 1e-9), 0.0, 1.0))

    @staticmethod
    def hats(x: np.ndarray, knots: np.ndarray) -> np.ndarray:
        """(n, c) contexts -> (n, c, L + 1) hat functions on the knots (each row sums to 1)."""
        r = RampModel.ramps(x, knots)  # (n, c, L): how far past each knot interval
        ones = np.ones((*r.shape[:2], 1))
        return np.asarray(np.concatenate([ones, r], axis=2) - np.concatenate([r, 0 * ones], axis=2))

    def design(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """((n, k, K) ramps, (n, q, K, L + 1) pair products) of (n, inputs) rows."""
        k = len(self.features)
        r = self.ramps(x[:, :k], self.knots)
        if not self.pairs:
            return r, np.zeros((len(x), 0, r.shape[2], 1))
        h = self.hats(x[:, k:], self.context_knots)
        f, c = np.array(self.pairs).T
        return r, r[:, f, :, None] * h[:, c, None, :]

    def logit(self, x: np.ndarray) -> np.ndarray:
        r, pr = self.design(np.asarray(x, np.float64))
        out = np.einsum("nkj,kj->n", r, self.weights) + self.bias
        if self.pairs:
            out += np.einsum("nqjl,qjl->n", pr, self.pair_weights)
        return np.asarray(out)

    def probability(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(1.0 / (1.0 + np.exp(-np.clip(self.logit(x), -40, 40))))

    def to_json(self) -> dict[str, Any]:
        return {
            "features": list(self.features),
            "knots": np.round(self.knots, 6).tolist(),
            "weights": np.round(self.weights, 6).tolist(),
            "bias": round(float(self.bias), 6),
            "context": list(self.context),
            "context_knots": np.round(self.context_knots, 6).tolist(),
            "pairs": [list(p) for p in self.pairs],
            "pair_weights": np.round(self.pair_weights, 6).tolist(),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RampModel:
        knots = np.asarray(d["knots"], np.float64)
        weights = np.asarray(d["weights"], np.float64)
        k = len(d["features"])
        if knots.ndim != 2 or knots.shape[0] != k or weights.shape != (k, knots.shape[1] - 1):
            raise EvidenceError(f"evidence model with {k} features has knots/weights of the wrong shape")
        context = tuple(d.get("context", ()))
        pairs = tuple((int(a), int(b)) for a, b in d.get("pairs", ()))
        cknots = np.asarray(d.get("context_knots") or np.zeros((0, 2)), np.float64)
        if cknots.ndim != 2 or len(cknots) != len(context):
            raise EvidenceError("evidence model context knots have the wrong shape")
        pw = np.asarray(d.get("pair_weights") or np.zeros((0, 1, 2)), np.float64)
        if pairs and (
            pw.shape != (len(pairs), knots.shape[1] - 1, cknots.shape[1])
            or any(not (0 <= a < k and 0 <= b < len(context)) for a, b in pairs)
        ):
            raise EvidenceError("evidence model pairs have the wrong shape")
        if np.any(np.diff(knots, axis=1) < 0) or np.any(np.diff(cknots, axis=1) < 0):
            raise EvidenceError("evidence model knots must increase")
        return cls(tuple(d["features"]), knots, weights, float(d["bias"]), context, cknots, pairs, pw)


@dataclass(frozen=True)
class Blend:
    """Today's `auto` where the speaker lies inside its calibration's support (the gate), else the stack of
    today's logit and the evidence logit (module docstring)."""

    gate: dict[str, float]  # encoder -> the lowest speaker level that is inside today's support
    level_encoder: str  # the encoder whose turn level chooses the stack's weights
    knots: np.ndarray  # (L + 1,) increasing knots of that level (hat functions)
    auto_weights: np.ndarray  # (L + 1,) >= 0: weight of clip(today's logit) at each knot
    evidence_weights: np.ndarray  # (L + 1,) >= 0: weight of the evidence logit at each knot
    bias: np.ndarray  # (L + 1,)
    auto_logit_clip: float  # today's logit is clipped to +- this (it is unbounded outside its support)
    auto_calibration_sha256: str  # calibration_identity() of today's calibration it was fitted on
    decision_threshold: float  # on P, inside the gate and out: today's calibration's (0.5)

    def inside(self, levels: Mapping[str, float]) -> bool:
        """Whether today's `auto` judges this speaker: every encoder's level at or above its gate. A pool of
        fewer than three pieces has no level (NaN) and stays with today's `auto` too."""
        if any(np.isnan(levels[e]) for e in self.gate):
            return True
        return all(levels[e] >= g for e, g in self.gate.items())

    def logit(self, auto_logit: np.ndarray, evidence_logit: np.ndarray, level: np.ndarray) -> np.ndarray:
        """(n,) stacked log-odds from today's (n,) logits, the evidence model's and the level encoder's turn levels."""
        h = RampModel.hats(np.asarray(level, np.float64)[:, None], self.knots[None, :])[:, 0, :]
        a = np.clip(np.asarray(auto_logit, np.float64), -self.auto_logit_clip, self.auto_logit_clip)
        return np.asarray(
            h @ self.bias + a * (h @ self.auto_weights) + np.asarray(evidence_logit) * (h @ self.evidence_weights)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "gate": {e: round(float(v), 6) for e, v in self.gate.items()},
            "level_encoder": self.level_encoder,
            "knots": np.round(self.knots, 6).tolist(),
            "auto_weights": np.round(self.auto_weights, 6).tolist(),
            "evidence_weights": np.round(self.evidence_weights, 6).tolist(),
            "bias": np.round(self.bias, 6).tolist(),
            "auto_logit_clip": float(self.auto_logit_clip),
            "auto_calibration_sha256": self.auto_calibration_sha256,
            "decision_threshold": float(self.decision_threshold),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], encoders: Sequence[str]) -> Blend:
        knots = np.asarray(d["knots"], np.float64)
        arrays = [np.asarray(d[k], np.float64) for k in ("auto_weights", "evidence_weights", "bias")]
        if knots.ndim != 1 or len(knots) < 2 or np.any(np.diff(knots) <= 0):
            raise EvidenceError("the blend's knots must be two or more increasing values: " + REFIT)
        if any(a.shape != knots.shape for a in arrays) or np.any(arrays[0] < 0) or np.any(arrays[1] < 0):
            raise EvidenceError("the blend's weights have the wrong shape or sign: " + REFIT)
        gate = {str(e): float(v) for e, v in d["gate"].items()}
        if set(gate) != set(encoders) or d["level_encoder"] not in encoders:
            raise EvidenceError("the blend's gate names other encoders than the calibration's: " + REFIT)
        auto_weights, evidence_weights, bias = arrays
        return cls(
            gate,
            str(d["level_encoder"]),
            knots,
            auto_weights,
            evidence_weights,
            bias,
            float(d["auto_logit_clip"]),
            str(d["auto_calibration_sha256"]),
            float(d["decision_threshold"]),
        )


@dataclass(frozen=True)
class Verdicts:
    """One speaker's turns (dialogue order): probability, flagged, uncertain (not flagged, outside support)."""

    variant: str
    probability: np.ndarray
    flagged: np.ndarray
    uncertain: np.ndarray
    reasons: tuple[str, ...]  # per turn: why uncertain, in words ("" when not)
    # With the blend: True when today's `auto` judged the speaker (inside its support; ``probability`` is then
    # today's), False when the stack did. Evidence alone (no blend): False.
    inside: bool = False
    kinds: tuple[str, ...] = ()  # per turn: OWN_TURNS_DISSIMILAR, OUT_OF_SUPPORT or ""
    levels: dict[str, float] = field(default_factory=dict)  # encoder -> the speaker's level (the gate's statistic)


@dataclass(frozen=True)
class EvidenceCalibration:
    """The fitted models of one set of encoders (in order), with the support the uncertain rule checks."""

    encoders: tuple[str, ...]
    weights_sha256: dict[str, str]
    models: dict[str, RampModel]
    decision_threshold: float
    support: dict[str, np.ndarray]  # variant -> (k, 2) [low, high] per feature, fitting turns
    support_margin: float  # how far (in units of the support's width) a feature may lie outside
    level_floor: dict[str, float]  # encoder -> lowest ``level`` of consistent speakers seen in fitting
    raw: dict[str, Any]
    blend: Blend | None = None

    @classmethod
    def from_json(
        cls,
        block: Mapping[str, Any],
        weights_sha256: Mapping[str, str] | None = None,
        auto_calibration: Mapping[str, Any] | None = None,
    ) -> EvidenceCalibration:
        """Load a calibration; with ``weights_sha256`` (encoder -> its weights' hash, as in the manifests)
        refuse one fitted for other weights, and with ``auto_calibration`` (today's calibration block) refuse a
        blend fitted on another one."""
        if block.get("kind") != "evidence" or int(block.get("version", 0)) != EVIDENCE_VERSION:
            raise EvidenceError(f"not an evidence calibration of version {EVIDENCE_VERSION}: {REFIT}")
        try:
            encoders = tuple(block["encoders"])
            fitted = {str(k): str(v) for k, v in block["encoder_weights_sha256"].items()}
            models = {name: RampModel.from_json(m) for name, m in block["models"].items()}
            support = {name: np.asarray(s, np.float64) for name, s in block["support"].items()}
            floors = {str(k): float(v) for k, v in block["level_floor"].items()}
            threshold, margin = float(block["decision_threshold"]), float(block["support_margin"])
            blend = Blend.from_json(block["blend"], encoders) if block.get("blend") is not None else None
        except (KeyError, TypeError, ValueError) as exc:
            raise EvidenceError(f"the evidence calibration is malformed: {exc}; {REFIT}") from exc
        for e in encoders:
            if weights_sha256 is not None and weights_sha256.get(e) != fitted.get(e):
                raise EvidenceError(
                    f"the evidence calibration was fitted for {e} weights {fitted.get(e, '?')[:12]}… but the "
                    f"loaded ones are {str(weights_sha256.get(e))[:12]}…: {REFIT}"
                )
        if blend is not None and auto_calibration is not None:
            loaded = calibration_identity(auto_calibration)
            if loaded != blend.auto_calibration_sha256:
                raise EvidenceError(
                    f"the evidence calibration's blend was fitted on today's `auto` calibration "
                    f"{blend.auto_calibration_sha256[:12]}… but the loaded one is {loaded[:12]}…: {REFIT}"
                )
        for name, model in models.items():
            base = name.removesuffix("_cohort")
            allowed = set(feature_names(name, encoders)) | {f"{e}.level" for e in encoders}
            if base not in ("context_reference", "context", "pair") or not set(model.inputs) <= allowed:
                raise EvidenceError(f"evidence model {name!r} was fitted on other features: {REFIT}")
            if support[name].shape != (len(model.inputs), 2):
                raise EvidenceError(f"evidence support of {name!r} has the wrong shape: {REFIT}")
        return cls(encoders, fitted, models, threshold, support, margin, floors, dict(block), blend)

    @classmethod
    def from_manifest(cls, raw: Mapping[str, Any]) -> EvidenceCalibration | None:
        """The blend a fused encoder's manifest carries (None: it carries none), checked against the manifest's
        component weights and its `auto` calibration, as the server loads it."""
        if raw.get("evidence") is None:
            return None
        return cls.from_json(raw["evidence"], raw.get("source", {}).get("components", {}), raw["calibration"])

    def judge(
        self,
        grams: Mapping[str, np.ndarray],
        has_reference: bool,
        speech_seconds: np.ndarray,
        rivals: Mapping[str, np.ndarray] | None = None,
        auto_logit: np.ndarray | None = None,
        threshold: float | None = None,
        kept_evidence: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    ) -> Verdicts | None:
        """One speaker's verdicts. ``grams``: encoder -> pool cosine matrix (reference first when
        ``has_reference``, then the usable turns); ``speech_seconds``: (n,); ``rivals``: encoder -> (n, c)
        cosines of each turn to the other speakers' centroids, or None. None: nothing to compare with.

        ``auto_logit``: (n,) today's `auto` log-odds of the same turns; with it and a blend, the blend judges
        (today's `auto` inside the gate, the stack outside), else the evidence model alone. ``threshold``: the
        decision threshold on P (default: the blend's when it judges, else the evidence model's).
        ``kept_evidence``: encoder -> :func:`pool_evidence` of ``grams[encoder]`` when the caller keeps it (else
        computed here)."""
        n = len(speech_seconds)
        cohort = rivals is not None and all(np.asarray(rivals[e]).size for e in self.encoders)
        variant = variant_of(n, has_reference, cohort)
        if variant is None:
            return None
        if variant not in self.models:
            variant = variant.removesuffix("_cohort")
        blended = self.blend is not None and auto_logit is not None
        if threshold is not None:
            tau = threshold
        elif blended:
            assert self.blend is not None
            tau = self.blend.decision_threshold  # today's: the blend answers on today's scale, inside and out
        else:
            tau = self.decision_threshold
        evidence = {
            e: with_rivals(
                kept_evidence[e] if kept_evidence is not None else pool_evidence(grams[e], has_reference),
                None if rivals is None else rivals[e],
            )
            for e in self.encoders
        }
        levels = speaker_levels(evidence)
        if blended:
            assert self.blend is not None and auto_logit is not None
            if self.blend.inside(levels):
                p = _probability(np.asarray(auto_logit, np.float64))
                flagged = p > tau
                return Verdicts(variant, p, flagged, np.zeros(n, bool), ("",) * n, True, ("",) * n, levels)
        x = feature_matrix(self.models[variant].inputs, evidence, speech_seconds)
        z = self.models[variant].logit(x)
        if blended:
            assert self.blend is not None and auto_logit is not None
            z = self.blend.logit(np.asarray(auto_logit), z, evidence[self.blend.level_encoder]["level"])
        p = _probability(z)
        flagged = p > tau
        lo, hi = self.support[variant][:, 0], self.support[variant][:, 1]
        slack = self.support_margin * (hi - lo)
        outside = (x < lo - slack) | (x > hi + slack)
        low_level = np.zeros(n, bool)
        for e in self.encoders:
            level = evidence[e]["level"]
            low_level |= np.nan_to_num(level, nan=np.inf) < self.level_floor.get(e, -np.inf)
        # Reasons are written for the uncertain turns only (a Python loop over every turn was a few ms a streamed
        # turn at 1,000 turns, where most turns are neither flagged nor uncertain).
        names = self.models[variant].inputs
        outside_any = outside.any(axis=1)
        uncertain = ~flagged & (low_level | outside_any)
        reasons, kinds = [""] * n, [""] * n
        for k in np.flatnonzero(uncertain).tolist():
            if low_level[k]:
                reasons[k] = "the speaker's own turns are less alike than any consistent speaker's in fitting"
                kinds[k] = OWN_TURNS_DISSIMILAR
            else:
                out_of_range = [f for f, o in zip(names, outside[k], strict=True) if o]
                reasons[k] = "outside the fitted range: " + ", ".join(out_of_range)
                kinds[k] = OUT_OF_SUPPORT
        return Verdicts(variant, p, flagged, uncertain, tuple(reasons), False, tuple(kinds), levels)


def _probability(z: np.ndarray) -> np.ndarray:
    # The same expression as sleuthd.judgment.calibration.LogisticModel.probability, so that inside the gate
    # the blend's probability is today's, bit for bit.
    return np.asarray(1.0 / (1.0 + np.exp(-np.clip(z, -40, 40))))
