"""Fitting the evidence model (sleuthd.judgment.evidence) on the robustness matrix's TRAIN split
(`sleuthd-bench calibrate fit-evidence`): synthetic espeak-ng and Kokoro voices under every condition that
has a train split; FSDD (real speech) has none and is never fitted on.

Training rows: every turn of every train instance (S1, S2, S3), judged with the reference, and again
without it (half of the dialogues, so the no-reference models are trained), and again with 1-2 other
speakers of the same condition as the dialogue's cohort (half of the dialogues; in a quarter of the
altered ones the intruder's own voice is among them). One model per variant, each feature through
monotone ramps between quantile knots of the training rows (both classes' ranges), fitted by L-BFGS-B
with the ramp weights' signs bounded (a monotone, bounded effect) and an L2 penalty per training row.

The blend (what the fused encoder's `auto` serves; sleuthd.judgment.evidence.Blend):

- the gate: per encoder, the GATE_QUANTILE quantile of the speaker level (median of the turns' ``level``)
  over the dialogues of today's calibration's fitting corpus (the dev benchmark's fit split, S1/S2/S3): where
  a speaker lies inside it, today's `auto` judges, unchanged;
- the stack, fitted on the train split's benchmark-like turns (5 turns and the reference): today's fused
  `auto` logit (clipped) and the evidence logit, weighted by hat functions of the turn's GE2E level. The
  evidence logits it is fitted on are out of fold (BLEND_FOLDS folds by target speaker, each judged by an
  evidence model fitted without it): fitted on in-sample logits, the stack learns to trust the evidence model
  more than it deserves on voices it has not seen.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
from sleuthd.judgment.calibration import Calibration
from sleuthd.judgment.evidence import (
    EVIDENCE_VERSION,
    SIGNS,
    VARIANT_FEATURES,
    Blend,
    RampModel,
    calibration_identity,
    encoder_evidence,
    feature_matrix,
    feature_names,
    speaker_levels,
    variant_of,
)

from sleuthd_bench.robustness.instances import ENCODERS, Instance
from sleuthd_bench.robustness.judges import auto_logits, evidence_inputs

L2_PENALTY = 1e-3  # per training row, on ramp weights (each ramp is 0-1)
NEGATIVE_QUANTILES = (0.005, 0.1, 0.5, 0.9, 0.995)
POSITIVE_QUANTILES = (0.1, 0.5, 0.9)
SUPPORT_QUANTILES = (0.001, 0.999)
SUPPORT_MARGIN = 0.1  # a feature may lie 10 % of the support's width outside it before a turn is uncertain
LEVEL_FLOOR_QUANTILE = 0.005
DECISION_THRESHOLD = 0.5
# The blend.
GATE_QUANTILE = 0.005  # of the speaker level over today's calibration's fitting dialogues
BLEND_FOLDS = 5
BLEND_LEVEL_ENCODER = "ge2e"
BLEND_KNOT_QUANTILES = (0.02, 0.25, 0.5, 0.75, 0.98)  # of the training turns' level
BLEND_L2 = 1e-3  # per training row, on the weights of the two logits
AUTO_LOGIT_CLIP = 8.0


@dataclass
class Rows:
    x: list[np.ndarray]
    y: list[np.ndarray]
    condition: list[str]
    # Benchmark-like judgments (with the reference, no cohort): per row the instance's number, else -1;
    # used to choose the decision threshold on whole dialogues.
    instance: list[int] = field(default_factory=list)


def _coin(*parts: object) -> float:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:4], "big") / 2**32


def _centroid(v: np.ndarray) -> np.ndarray:
    c = v.astype(np.float64).mean(axis=0)
    return np.asarray(c / max(float(np.linalg.norm(c)), 1e-12))


def _cohort(
    inst: Instance, by_target: Mapping[tuple[str, str], list[Instance]], rng: random.Random
) -> dict[str, np.ndarray] | None:
    """encoder -> (c, D) centroids of 1-2 other speakers of the same condition (the intruder's own voice
    among them in a quarter of the altered instances)."""
    others = [k for k in by_target if k[0] == inst.condition and k[1] not in (inst.target, inst.intruder)]
    if not others:
        return None
    chosen = rng.sample(others, min(rng.choice((1, 1, 2)), len(others)))
    if inst.intruder and rng.random() < 0.25 and (inst.condition, inst.intruder) in by_target:
        chosen = [(inst.condition, inst.intruder), *chosen[:1]]
    out = {}
    for e in ENCODERS:
        cents = []
        for key in chosen:
            donor = rng.choice(by_target[key])
            v = donor.views["fused"]
            rows = donor.views[e].emb[np.searchsorted(donor.views[e].index, v.index)]
            if len(rows):
                cents.append(_centroid(rows))
        if not cents:
            return None
        out[e] = np.stack(cents)
    return out


def training_rows(instances: Sequence[Instance], seed: int = 0) -> dict[str, Rows]:
    """Feature rows and labels per variant."""
    rng = random.Random(seed)
    by_target: dict[tuple[str, str], list[Instance]] = {}
    for inst in instances:
        if inst.scenario == "S1":
            by_target.setdefault((inst.condition, inst.target), []).append(inst)
    out: dict[str, Rows] = {}
    for number, inst in enumerate(instances):
        settings = [(True, False)]
        if _coin("noref", inst.dialogue_id) < 0.5:
            settings.append((False, False))
        if _coin("cohort", inst.dialogue_id) < 0.5:
            settings.append((_coin("cohort-ref", inst.dialogue_id) < 0.5, True))
        for use_ref, with_cohort in settings:
            grams, has_ref, seconds, index = evidence_inputs(inst, use_reference=use_ref)
            cohort = _cohort(inst, by_target, rng) if with_cohort else None
            variant = variant_of(len(seconds), has_ref, cohort is not None)
            if variant is None:
                continue
            rivals = None
            if cohort is not None:
                rivals = {e: _turn_rows(grams, inst, e, index, cohort[e]) for e in ENCODERS}
            evidence = {e: encoder_evidence(grams[e], has_ref, None if rivals is None else rivals[e]) for e in ENCODERS}
            x = feature_matrix(row_names(variant), evidence, seconds)
            y = np.array([1.0 if int(i) in inst.gold else 0.0 for i in index])
            rows = out.setdefault(variant, Rows([], [], []))
            rows.x.append(x)
            rows.y.append(y)
            rows.condition.extend([inst.condition] * len(y))
            rows.instance.extend([number if use_ref and not with_cohort else -1] * len(y))
        # The pair model: each turn against the reference alone (a speaker with one usable turn and a
        # reference, or two turns and none, has nothing more to compare).
        grams, has_ref, seconds, index = evidence_inputs(inst)
        if has_ref and _coin("pair", inst.dialogue_id) < 0.5:
            ev = {e: {"own": grams[e][1:, 0]} for e in ENCODERS}
            rows = out.setdefault("pair", Rows([], [], []))
            rows.x.append(feature_matrix(feature_names("pair", ENCODERS), ev, seconds))
            rows.y.append(np.array([1.0 if int(i) in inst.gold else 0.0 for i in index]))
            rows.condition.extend([inst.condition] * len(index))
            rows.instance.extend([-1] * len(index))
    return out


def _turn_rows(
    grams: Mapping[str, np.ndarray], inst: Instance, e: str, index: np.ndarray, cents: np.ndarray
) -> np.ndarray:
    v = inst.views[e]
    rows = v.emb[np.searchsorted(v.index, index)].astype(np.float64)
    return np.asarray(rows @ cents.T)


def row_names(variant: str) -> list[str]:
    """Columns of the training rows: the variant's features, then each encoder's level (a context)."""
    names = list(feature_names(variant, ENCODERS))
    return names if variant.startswith("pair") else [*names, *(f"{e}.level" for e in ENCODERS)]


CONTEXT_QUANTILES = (0.02, 0.25, 0.5, 0.75, 0.98)
# Evidence whose curve may depend on the speaker's own level of similarity (per encoder, its own level).
INTERACTING = ("own", "gap", "z", "ref")
# Each encoder's evidence follows curves chosen by its own level only (False) or by every encoder's level.
CROSS_CONTEXT = False


def _knots(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    out = []
    for k in range(x.shape[1]):
        col = x[:, k]
        neg, pos = col[y == 0], col[y == 1]
        qs = list(np.quantile(neg, NEGATIVE_QUANTILES)) if len(neg) else []
        qs += list(np.quantile(pos, POSITIVE_QUANTILES)) if len(pos) else []
        knots = np.unique(np.round(qs, 6))
        if len(knots) < 2:
            knots = np.array([knots[0] - 1e-3, knots[0] + 1e-3]) if len(knots) else np.array([0.0, 1e-3])
        out.append(knots)
    width = max(len(k) for k in out)
    # Pad every feature to the same number of knots by repeating its last one (a zero-width ramp is 0 or 1
    # beyond it and carries a weight like any other; the fit keeps it small).
    return np.stack(
        [np.concatenate([k, np.full(width - len(k), k[-1] + 1e-6 * np.arange(1, width - len(k) + 1))]) for k in out]
    )


def fit_ramp_model(
    x: np.ndarray,
    y: np.ndarray,
    features: Sequence[str],
    l2: float = L2_PENALTY,
    context: Sequence[str] = (),
    xc: np.ndarray | None = None,
) -> RampModel:
    """Fit main-effect ramps for ``features`` (columns of x) and, with ``context`` (columns of xc), one
    curve per context knot for each INTERACTING feature of the same encoder."""
    from scipy.optimize import minimize

    knots = _knots(x, y)
    n, k = x.shape
    pairs: list[tuple[int, int]] = []
    cknots = np.zeros((0, 2))
    if context and xc is not None:
        cknots = np.stack(
            [np.unique(np.round(np.quantile(xc[:, j], CONTEXT_QUANTILES), 6)) for j in range(len(context))]
        )
        for a, f in enumerate(features):
            enc, _, feat = f.rpartition(".")
            if feat not in INTERACTING:
                continue
            for c, name in enumerate(context):
                if name == f"{enc}.level" or CROSS_CONTEXT:
                    pairs.append((a, c))
    shell = RampModel(
        tuple(features),
        knots,
        np.zeros((k, knots.shape[1] - 1)),
        0.0,
        tuple(context),
        cknots,
        tuple(pairs),
        np.zeros((len(pairs), knots.shape[1] - 1, cknots.shape[1] if pairs else 1)),
    )
    r, pr = shell.design(np.hstack([x, xc]) if pairs and xc is not None else x)
    flat = np.hstack([r.reshape(n, -1), pr.reshape(n, -1)])
    kk = r.shape[2]
    signs = list(np.repeat([SIGNS[f.split(".")[-1]] for f in features], kk))
    for a, _ in pairs:
        signs += [SIGNS[features[a].split(".")[-1]]] * (kk * cknots.shape[1])
    bounds = [(0.0, None) if s > 0 else (None, 0.0) if s < 0 else (None, None) for s in signs] + [(None, None)]
    lam = l2 * n

    def loss(w: np.ndarray) -> tuple[float, np.ndarray]:
        z = flat @ w[:-1] + w[-1]
        p = 1.0 / (1.0 + np.exp(-np.clip(z, -40, 40)))
        ll = np.sum(np.logaddexp(0.0, z) - y * z) + 0.5 * lam * float(w[:-1] @ w[:-1])
        g = np.append(flat.T @ (p - y) + lam * w[:-1], np.sum(p - y))
        return float(ll), g

    w0 = np.zeros(flat.shape[1] + 1)
    w0[-1] = float(np.log(max(y.mean(), 1e-3) / max(1 - y.mean(), 1e-3)))
    res = minimize(loss, w0, jac=True, method="L-BFGS-B", bounds=bounds, options={"maxiter": 3000})
    main = res.x[: k * kk].reshape(k, kk)
    pw = res.x[k * kk : -1].reshape(len(pairs), kk, -1) if pairs else shell.pair_weights
    return RampModel(tuple(features), knots, main, float(res.x[-1]), shell.context, cknots, tuple(pairs), pw)


def choose_threshold(
    model: RampModel, rows: Rows, instances: Sequence[Instance], names: Sequence[str]
) -> tuple[float, dict[str, float]]:
    """The decision threshold on P with the best mean balanced detection accuracy over the training
    conditions' benchmark-like dialogues (a dialogue is flagged when any turn is above it)."""
    x, inst = np.vstack(rows.x), np.asarray(rows.instance)
    cols = [list(names).index(f) for f in model.inputs]
    keep = inst >= 0
    p = model.probability(x[keep][:, cols])
    top: dict[int, float] = {}
    for i, v in zip(inst[keep], p, strict=True):
        top[int(i)] = max(top.get(int(i), 0.0), float(v))
    grid = np.round(np.arange(0.3, 0.96, 0.01), 2)
    by_cond: dict[str, dict[str, list[float]]] = {}
    for i, v in top.items():
        c = by_cond.setdefault(instances[i].condition, {"S1": [], "S2": [], "S3": []})
        c[instances[i].scenario].append(v)
    score = []
    for tau in grid:
        bals = []
        for c in by_cond.values():
            s1 = np.mean(np.asarray(c["S1"]) <= tau)
            s2, s3 = np.mean(np.asarray(c["S2"]) > tau), np.mean(np.asarray(c["S3"]) > tau)
            bals.append(50 * (s1 + (s2 + s3) / 2))
        score.append(float(np.mean(bals)))
    best = int(np.argmax(score))
    at_half = int(np.argmin(np.abs(grid - 0.5)))
    return float(grid[best]), {"mean_bal_at_best": round(score[best], 2), "mean_bal_at_0.5": round(score[at_half], 2)}


def fit(
    instances: Sequence[Instance],
    seed: int = 0,
    l2: float = L2_PENALTY,
    rows: Mapping[str, Rows] | None = None,
    drop: Sequence[str] = (),
    tune_threshold: bool = True,
    interact: bool = True,
) -> tuple[dict[str, RampModel], dict[str, Any]]:
    """Models per variant, their feature support, the encoders' level floors and the decision threshold.
    ``drop``: encoder features left out of every model but the pair model (ablations); ``rows``:
    training_rows(...) made once."""
    rows = rows if rows is not None else training_rows(instances, seed)
    models: dict[str, RampModel] = {}
    support: dict[str, list[list[float]]] = {}
    stats: dict[str, Any] = {"variants": {}, "dropped_features": list(drop)}
    for variant in VARIANT_FEATURES:
        if variant not in rows:
            continue
        x, y = np.vstack(rows[variant].x), np.concatenate(rows[variant].y)
        names = row_names(variant)
        main = [k for k, f in enumerate(names) if not f.endswith(".level")]
        cols = [k for k in main if names[k].rpartition(".")[2] not in drop or variant.startswith("pair")]
        ctx = [k for k, f in enumerate(names) if f.endswith(".level")] if interact else []
        model = fit_ramp_model(x[:, cols], y, [names[k] for k in cols], l2, [names[k] for k in ctx], x[:, ctx])
        models[variant] = model
        lo, hi = np.quantile(x[:, cols + ctx], SUPPORT_QUANTILES, axis=0)
        support[variant] = [[round(float(a), 6), round(float(b), 6)] for a, b in zip(lo, hi, strict=True)]
        stats["variants"][variant] = {"turns": len(y), "inconsistent_share": round(float(y.mean()), 4)}
    threshold = DECISION_THRESHOLD
    if tune_threshold and "context_reference" in models:
        threshold, search = choose_threshold(
            models["context_reference"],
            rows["context_reference"],
            instances,
            row_names("context_reference"),
        )
        stats["decision_threshold_search"] = {"threshold": threshold, **search}
    floors = {}
    for e in ENCODERS:
        levels = []
        for inst in instances:
            if inst.scenario != "S1":
                continue
            grams, has_ref, _, _ = evidence_inputs(inst)
            if len(grams[e]) >= 3:
                levels.append(np.nanmin(encoder_evidence(grams[e], has_ref)["level"]))
        floors[e] = round(float(np.quantile(levels, LEVEL_FLOOR_QUANTILE)), 6) if levels else -1.0
    stats["conditions"] = sorted({i.condition for i in instances})
    stats["instances"] = len(instances)
    extra = {"support": support, "level_floor": floors, "fit_stats": stats, "decision_threshold": threshold}
    return models, extra


def calibration_block(
    models: Mapping[str, RampModel],
    extra: Mapping[str, Any],
    weights_sha256: Mapping[str, str],
    corpus: str,
    seed: int,
    blend: Blend | None = None,
    blend_how: str = "",
) -> dict[str, Any]:
    return {
        "kind": "evidence",
        "version": EVIDENCE_VERSION,
        "fitted_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "encoders": list(ENCODERS),
        "encoder_weights_sha256": dict(weights_sha256),
        "how": (
            "sleuthd.judgment.evidence ramp models (monotone, bounded feature effects; L-BFGS-B with sign bounds, "
            f"L2 {L2_PENALTY:g} per row) fitted on every turn of the train split of the robustness matrix ({corpus}; "
            f"conditions {', '.join(extra['fit_stats']['conditions'])}), seed {seed}; with and without the "
            "reference and "
            "with 1-2 other speakers of the condition as a cohort. Never fitted on FSDD (real speech). Decision "
            "threshold: the best mean balanced accuracy over the training conditions' dialogues (fit_stats). "
            f"Support: the {SUPPORT_QUANTILES} quantiles of the training "
            f"rows, margin {SUPPORT_MARGIN}; level floor: the {LEVEL_FLOOR_QUANTILE} quantile of consistent speakers."
        ),
        "decision_threshold": extra.get("decision_threshold", DECISION_THRESHOLD),
        "support_margin": SUPPORT_MARGIN,
        "score_scale": "probability that the turn does not belong to its speaker",
        "models": {name: m.to_json() for name, m in models.items()},
        "support": extra["support"],
        "level_floor": extra["level_floor"],
        "fit_stats": extra["fit_stats"],
        "blend": None if blend is None else blend.to_json(),
        "blend_how": blend_how,
    }


# ------------------------------------------------------------------------------------------ the blend


def speaker_of(inst: Instance) -> str:
    """The target's voice: a voice variant is one speaker in every language (``espeak-alex@de``)."""
    return inst.target.partition("@")[0]


def evidence_logits(instance: Instance, models: Mapping[str, RampModel]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The evidence model's (n,) logits of a benchmark-like judgment of the instance (reference, no cohort) and
    each encoder's (n,) turn levels; empty when there is nothing to compare."""
    grams, has_ref, seconds, _ = evidence_inputs(instance)
    variant = variant_of(len(seconds), has_ref, False)
    if variant is None:
        return np.zeros(0), {}
    evidence = {e: encoder_evidence(grams[e], has_ref) for e in ENCODERS}
    model = models[variant]
    z = model.logit(feature_matrix(model.inputs, evidence, seconds))
    return z, {e: np.asarray(evidence[e]["level"]) for e in ENCODERS}


def out_of_fold_logits(
    instances: Sequence[Instance], folds: int = BLEND_FOLDS, seed: int = 0, progress: Any = None
) -> dict[int, np.ndarray]:
    """Instance number -> its evidence logits from a model fitted without its target speaker's fold."""
    speakers = sorted({speaker_of(i) for i in instances})
    fold = {s: k % folds for k, s in enumerate(speakers)}
    out: dict[int, np.ndarray] = {}
    for k in range(folds):
        train = [i for i in instances if fold[speaker_of(i)] != k]
        models, _ = fit(train, seed=seed, tune_threshold=False)
        for number, inst in enumerate(instances):
            if fold[speaker_of(inst)] == k:
                out[number] = evidence_logits(inst, models)[0]
        if progress is not None:
            progress("fold", k + 1, folds)
    return out


def support_gate(instances: Sequence[Instance], quantile: float = GATE_QUANTILE) -> dict[str, float]:
    """Per encoder, the ``quantile`` quantile of the speaker level over ``instances`` (today's calibration's
    fitting corpus): the gate below which the blend no longer trusts today's `auto`."""
    levels: dict[str, list[float]] = {e: [] for e in ENCODERS}
    for inst in instances:
        grams, has_ref, _, _ = evidence_inputs(inst)
        if len(grams[ENCODERS[0]]) < 3:
            continue
        for e, v in speaker_levels({e: encoder_evidence(grams[e], has_ref) for e in ENCODERS}).items():
            levels[e].append(v)
    if not all(levels.values()):
        raise ValueError("the support corpus has no speaker with three or more pieces of evidence")
    return {e: round(float(np.quantile(v, quantile)), 6) for e, v in levels.items()}


def fit_stack(
    auto: np.ndarray, evidence: np.ndarray, level: np.ndarray, y: np.ndarray, l2: float = BLEND_L2
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(knots, auto weights, evidence weights, bias) of the stack: logistic loss with the two logits' weights
    bounded at 0 (the stacked probability never falls as either model's rises)."""
    from scipy.optimize import minimize

    knots = np.unique(np.round(np.quantile(level, BLEND_KNOT_QUANTILES), 6))
    h = RampModel.hats(level[:, None], knots[None, :])[:, 0, :]
    a = np.clip(auto, -AUTO_LOGIT_CLIP, AUTO_LOGIT_CLIP)
    design = np.hstack([a[:, None] * h, evidence[:, None] * h, h])
    n = len(design)
    q = len(knots)
    lam = l2 * n

    def loss(w: np.ndarray) -> tuple[float, np.ndarray]:
        z = design @ w
        p = 1.0 / (1.0 + np.exp(-np.clip(z, -40, 40)))
        ll = np.sum(np.logaddexp(0.0, z) - y * z) + 0.5 * lam * float(w[: 2 * q] @ w[: 2 * q])
        g = design.T @ (p - y)
        g[: 2 * q] += lam * w[: 2 * q]
        return float(ll), g

    w0 = np.concatenate([np.full(2 * q, 0.5), np.zeros(q)])
    bounds = [(0.0, None)] * (2 * q) + [(None, None)] * q
    res = minimize(loss, w0, jac=True, method="L-BFGS-B", bounds=bounds, options={"maxiter": 5000})
    return knots, res.x[:q], res.x[q : 2 * q], res.x[2 * q :]


def fit_blend(
    instances: Sequence[Instance],
    auto: Calibration,
    auto_block: Mapping[str, Any],
    support: Sequence[Instance],
    seed: int = 0,
    progress: Any = None,
) -> tuple[Blend, dict[str, Any]]:
    """The gate (from ``support``: today's calibration's fitting corpus) and the stack (from ``instances``,
    out-of-fold evidence logits and ``auto``'s logits)."""
    gate = support_gate(support)
    oof = out_of_fold_logits(instances, seed=seed, progress=progress)
    rows_a, rows_e, rows_l, rows_y = [], [], [], []
    for number, inst in enumerate(instances):
        z = oof.get(number)
        if z is None or not len(z):
            continue
        grams, has_ref, _, index = evidence_inputs(inst)
        level = encoder_evidence(grams[BLEND_LEVEL_ENCODER], has_ref)["level"]
        if np.isnan(level).any():
            continue
        rows_a.append(auto_logits(inst.views["fused"], auto))
        rows_e.append(z)
        rows_l.append(level)
        rows_y.append(np.array([1.0 if int(i) in inst.gold else 0.0 for i in index]))
    knots, wa, we, bias = fit_stack(
        np.concatenate(rows_a), np.concatenate(rows_e), np.concatenate(rows_l), np.concatenate(rows_y)
    )
    blend = Blend(
        gate,
        BLEND_LEVEL_ENCODER,
        knots,
        wa,
        we,
        bias,
        AUTO_LOGIT_CLIP,
        calibration_identity(auto_block),
        auto.decision_threshold,
    )
    stats = {
        "gate_quantile": GATE_QUANTILE,
        "support_dialogues": len({i.dialogue_id for i in support}),
        "stack_turns": int(sum(len(y) for y in rows_y)),
        "folds": BLEND_FOLDS,
    }
    return blend, stats
