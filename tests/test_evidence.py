"""The evidence model (sleuthd.judgment.evidence) with its shipped calibration: features equal the
leave-one-out statistics computed by hand, every feature's effect is monotone and bounded, the calibration
refuses other weights, a speaker outside the fitted support is never a confident CONSISTENT, and a dialogue
of real (synthesized) speech whose every turn sits at low similarity still has its intruder flagged."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from sleuthd.api import SpeakerEncoder
from sleuthd.encoders.manifest import read_card
from sleuthd.judgment.evidence import (
    SIGNS,
    EvidenceCalibration,
    EvidenceError,
    _median_rows,
    encoder_evidence,
    variant_of,
)

from tests.support import MODELS_DIR, REPO

CARD = REPO / "service" / "sleuthd" / "cards" / "evidence.json"


@pytest.fixture(scope="module")
def block() -> dict:
    return json.loads(CARD.read_text())


@pytest.fixture(scope="module")
def calibration(block: dict) -> EvidenceCalibration:
    return EvidenceCalibration.from_json(block)


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("has_reference", [True, False])
def test_features_are_the_leave_one_out_statistics_computed_by_hand(has_reference: bool) -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(7, 24)) + 2.0  # a shared component: cosines well above 0, like one speaker's
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ev = encoder_evidence(x @ x.T, has_reference)
    r0 = 1 if has_reference else 0
    for k, i in enumerate(range(r0, 7)):
        rest = [j for j in range(7) if j != i]
        own = _cos(x[i], x[rest].sum(axis=0))
        loo = [_cos(x[j], x[[q for q in rest if q != j]].sum(axis=0)) for j in rest]
        assert ev["own"][k] == pytest.approx(own, abs=1e-9)
        assert ev["level"][k] == pytest.approx(np.median(loo), abs=1e-9)
        assert ev["gap"][k] == pytest.approx(np.median(loo) - own, abs=1e-9)
        spread = max(float(np.std(loo)), 0.02)
        assert ev["z"][k] == pytest.approx((np.median(loo) - own) / spread, abs=1e-9)
        if has_reference:
            others = [x[j] @ x[0] for j in range(1, 7) if j != i]
            assert ev["ref_gap"][k] == pytest.approx(np.median(others) - x[i] @ x[0], abs=1e-9)


def test_every_feature_acts_monotonically_and_is_bounded(calibration: EvidenceCalibration) -> None:
    model = calibration.models["context_reference"]
    lo, hi = calibration.support["context_reference"][:, 0], calibration.support["context_reference"][:, 1]
    base = (lo + hi) / 2
    for k, name in enumerate(model.inputs):
        sign = SIGNS.get(name.split(".")[-1], 0)
        x = np.tile(base, (201, 1))
        x[:, k] = np.linspace(lo[k] - 10 * (hi[k] - lo[k]) - 5, hi[k] + 10 * (hi[k] - lo[k]) + 5, 201)
        logit = model.logit(x)
        if k >= len(model.features):
            continue  # a context (the speaker's level) selects the curves; it is evidence of neither side
        if sign:
            assert np.all(sign * np.diff(logit) >= -1e-12), name  # never against the evidence
        # Far outside the knots the effect is flat: nothing explodes out of the fitted range.
        assert logit[0] == pytest.approx(logit[1]) and logit[-1] == pytest.approx(logit[-2]), name
    # The whole logit is bounded by the sum of the largest effects, whatever the input.
    bound = abs(model.bias) + np.abs(model.weights).sum() + np.abs(model.pair_weights).sum()
    assert np.all(np.abs(model.logit(np.random.default_rng(0).normal(0, 100, (500, len(model.inputs))))) <= bound)


def test_a_calibration_for_other_weights_or_of_another_kind_is_refused(block: dict) -> None:
    weights = dict(block["encoder_weights_sha256"])
    EvidenceCalibration.from_json(block, weights)  # the weights it was fitted for: accepted
    other = {**weights, "campplus": "0" * 64}
    with pytest.raises(EvidenceError, match="refit it with `sleuthd-bench calibrate fit-evidence`"):
        EvidenceCalibration.from_json(block, other)
    for broken in ({**block, "version": 99}, {**block, "kind": "auto"}):
        with pytest.raises(EvidenceError, match="evidence calibration of version"):
            EvidenceCalibration.from_json(broken)
    wrong = copy.deepcopy(block)
    wrong["models"]["context"]["features"][0] = "ge2e.pitch"  # a feature this code does not compute
    with pytest.raises(EvidenceError, match="other features"):
        EvidenceCalibration.from_json(wrong)


def test_the_blend_is_refused_on_another_auto_calibration(block: dict) -> None:
    """The stack reads today's `auto` logit: fitted on one calibration, it means nothing on another."""
    today = read_card("fused")["calibration"]
    EvidenceCalibration.from_json(block, None, today)  # the calibration it was fitted on
    other = copy.deepcopy(today)
    other["models"]["context"]["bias"] += 0.5
    with pytest.raises(EvidenceError, match=r"blend was fitted on today.s `auto` calibration .* refit it with"):
        EvidenceCalibration.from_json(block, None, other)
    negative = copy.deepcopy(block)
    negative["blend"]["evidence_weights"][0] = -0.1  # a stack that could fall as the evidence rises
    with pytest.raises(EvidenceError, match="wrong shape or sign"):
        EvidenceCalibration.from_json(negative)


def test_inside_the_gate_the_blend_is_todays_probability_and_outside_it_is_monotone(
    calibration: EvidenceCalibration,
) -> None:
    blend = calibration.blend
    assert blend is not None
    rng = np.random.default_rng(4)
    grams = {}
    for e, dim in (("ge2e", 256), ("campplus", 192)):
        x = rng.normal(size=(6, dim)) * 0.08 + 1.0  # one tight voice: levels far above the gate
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        grams[e] = x @ x.T
    today = np.array([-3.0, -0.04, 0.1, 2.5, 45.0])  # P 0.047, 0.490, 0.525, 0.924, 1.0
    v = calibration.judge(grams, True, np.full(5, 3.0), auto_logit=today)
    assert v is not None and v.inside and all(v.levels[e] >= g for e, g in blend.gate.items())
    np.testing.assert_array_equal(v.probability, 1.0 / (1.0 + np.exp(-np.clip(today, -40, 40))))
    # Decided at today's threshold (0.5), not at the evidence model's own (0.48): 0.490 is not flagged.
    assert blend.decision_threshold == 0.5 > 0.49 > calibration.decision_threshold
    assert v.flagged.tolist() == [False, False, True, True, True] and not v.uncertain.any()
    # The stack never falls as either logit rises, and stays bounded whatever today's logit does.
    level = np.linspace(0.5, 1.0, 11)
    for z in (-5.0, 0.0, 5.0):
        a = blend.logit(np.full(11, -100.0), np.full(11, z), level)
        b = blend.logit(np.full(11, 100.0), np.full(11, z), level)
        assert np.all(b >= a) and np.all(np.abs(b - a) <= 2 * blend.auto_logit_clip * blend.auto_weights.max() + 1e-9)
        assert np.all(
            blend.logit(np.zeros(11), np.full(11, z + 1), level) >= blend.logit(np.zeros(11), np.full(11, z), level)
        )


def test_variants_follow_the_evidence_available() -> None:
    assert variant_of(5, True, False) == "context_reference"
    assert variant_of(5, False, True) == "context_cohort"
    assert variant_of(1, True, False) == "pair" and variant_of(2, False, False) == "pair"
    assert variant_of(1, False, False) is None and variant_of(0, True, False) is None


def test_a_speaker_whose_own_turns_are_mutually_dissimilar_is_never_a_confident_consistent(
    calibration: EvidenceCalibration,
) -> None:
    """Unrelated directions for every turn (cosines about 0): below every level seen on consistent speakers
    in fitting. Each turn must come out flagged or uncertain, with the reason said."""
    rng = np.random.default_rng(1)
    grams = {}
    for e, dim in (("ge2e", 256), ("campplus", 192)):
        x = rng.normal(size=(6, dim))
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        grams[e] = x @ x.T
    v = calibration.judge(grams, True, np.full(5, 3.0))
    assert v is not None
    assert np.all(v.flagged | v.uncertain)
    assert all(r for r, f in zip(v.reasons, v.flagged, strict=True) if not f)


FIXTURE = REPO / "tests" / "data" / "evidence_low_similarity_dialogue.json"


def test_low_similarity_dialogue_with_an_opposite_gender_intruder_is_flagged_at_that_turn(
    calibration: EvidenceCalibration, tmp_path: Path
) -> None:
    """German espeak-ng, every turn in another emotion-like prosody and cut to 2.2 s (a dialogue of the
    robustness matrix's eval split: voices never fitted on), a man's turn among a woman's. Today's fused
    `auto` leaves this one unflagged (every probability below 0.5, docs/research/robustness.md)."""
    from sleuthd_bench.robustness import render

    fixture = json.loads(FIXTURE.read_text())
    renderer = render.Renderer(tmp_path, tmp_path)
    audio = [renderer.render(spec).read_bytes() for spec in [*fixture["turns"], fixture["reference"]]]
    grams: dict[str, np.ndarray] = {}
    seconds = np.zeros(5)
    for name in calibration.encoders:
        encoder = SpeakerEncoder.load(MODELS_DIR, encoder=name)
        try:
            got = encoder.embed_sync(audio)
        finally:
            encoder.close()
        vectors = [g.embedding for g in got]
        assert all(v is not None for v in vectors)
        emb = np.stack([np.asarray(vectors[5])] + [np.asarray(v) for v in vectors[:5]]).astype(np.float64)
        grams[name] = emb @ emb.T
        seconds = np.array([g.speech_seconds for g in got[:5]])
    # Every turn is at low similarity: the speaker's own turns sit far below clean speech's (CAM++ > 0.85).
    own = [k for k in range(5) if k != fixture["altered_turn"]]
    assert np.median(grams["campplus"][1:, 1:][np.ix_(own, own)][np.triu_indices(4, 1)]) < 0.8
    v = calibration.judge(grams, True, seconds)
    assert v is not None
    assert np.flatnonzero(v.flagged).tolist() == [fixture["altered_turn"]], v.probability


def test_row_medians_equal_numpys_nanmedian_bit_for_bit() -> None:
    """The leave-one-out row medians (partitioned, not np.nanmedian: issue 30's streamed-turn latency) are
    exactly np.nanmedian's, for the one-out masks the evidence uses and for uneven masks."""
    rng = np.random.default_rng(3)
    for n, m in [(1, 2), (2, 3), (5, 6), (6, 6), (50, 51), (200, 201)]:
        x = rng.normal(size=(n, m))
        for cut in (np.arange(n), np.arange(m - n, m)):
            mask = np.ones((n, m), bool)
            mask[np.arange(n), cut] = False
            assert np.array_equal(_median_rows(x, mask), np.nanmedian(np.where(mask, x, np.nan), axis=1))
        uneven = rng.random((n, m)) > 0.4
        uneven[:, 0] = True
        assert np.array_equal(_median_rows(x, uneven), np.nanmedian(np.where(uneven, x, np.nan), axis=1))


def test_a_pool_keeps_its_evidence_until_its_next_turn_and_it_equals_a_fresh_computation() -> None:
    """A stream judges every speaker after each turn; a speaker who did not speak reuses the features its pool
    kept (SpeakerPool.evidence), which must be what computing them anew gives, bit for bit, and a new turn
    must drop them."""
    from sleuthd.judgment.evidence import pool_evidence, with_rivals
    from sleuthd.judgment.pool import SpeakerPool

    rng = np.random.default_rng(3)

    def fused(x: np.ndarray) -> np.ndarray:  # two unit parts, each scaled by 1/sqrt(2), as the fusion joins them
        a, b = x[:6] / np.linalg.norm(x[:6]), x[6:] / np.linalg.norm(x[6:])
        return (np.concatenate([a, b]) / np.sqrt(2)).astype(np.float32)

    centre = fused(rng.standard_normal(12))
    parts = (("a", 0, 6), ("b", 6, 12))
    for reference in (None, centre):
        pool = SpeakerPool(reference, parts)
        for k in range(7):
            pool.add(k, fused(centre + 0.3 * rng.standard_normal(12)), 2.0 + k)
            for name, part in pool.components.items():
                kept = part.evidence()
                assert part.evidence() is kept  # kept, not recomputed
                fresh = pool_evidence(part.gram(), reference is not None)
                assert kept.keys() == fresh.keys()
                for f in fresh:
                    np.testing.assert_array_equal(kept[f], fresh[f], err_msg=f"{name} {f} after turn {k}")
                rivals = rng.standard_normal((k + 1, 2))
                whole = encoder_evidence(part.gram(), reference is not None, rivals)
                joined = with_rivals(kept, rivals)
                assert joined.keys() == whole.keys() and "rival_margin" in joined
                for f in whole:
                    np.testing.assert_array_equal(joined[f], whole[f])
        before = pool.components["a"].evidence()
        pool.add(pool.n, centre, 3.0)
        assert pool.components["a"].evidence() is not before
        assert len(pool.components["a"].evidence()["own"]) == pool.n


def test_pool_evidence_in_place_equals_the_plain_expressions_bit_for_bit() -> None:
    """pool_evidence computes its (n, m) leave-one-out matrix in place (issue 30: judging a streamed turn at 1,000
    turns); every feature must be what the plain expressions give (np.nanmedian, masked mean and variance), to
    the bit, with and without a reference, for pools with identical turns too."""
    from sleuthd.judgment.evidence import MIN_SPREAD, pool_evidence

    rng = np.random.default_rng(11)
    for trial in range(60):
        m = int(rng.integers(3, 30))
        x = rng.normal(size=(m, 16)) + rng.uniform(0, 3)
        if trial % 4 == 0:
            x[1] = x[0]
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        g = x @ x.T
        for has_reference in (False, True):
            t = np.arange(1 if has_reference else 0, m)
            n = len(t)
            row, diag = g.sum(axis=1), np.diagonal(g).copy()
            total = row.sum()
            own = (row[t] - diag[t]) / np.sqrt(np.maximum(total - 2 * row[t] + diag[t], 1e-12))
            num = (row - diag)[None, :] - g[t]
            norm2 = (total - 2 * row[t] + diag[t])[:, None] - 2 * row[None, :] + diag[None, :] + 2 * g[t]
            rest = num / np.sqrt(np.maximum(norm2, 1e-12))
            mask = np.ones((n, m), bool)
            mask[np.arange(n), t] = False
            level = np.nanmedian(np.where(mask, rest, np.nan), axis=1)
            mean = np.where(mask, rest, 0.0).sum(axis=1) / (m - 1)
            var = np.where(mask, (rest - mean[:, None]) ** 2, 0.0).sum(axis=1) / (m - 1)
            got = pool_evidence(g, has_reference)
            np.testing.assert_array_equal(got["own"], own)
            np.testing.assert_array_equal(got["level"], level)
            np.testing.assert_array_equal(got["z"], (level - own) / np.maximum(np.sqrt(var), MIN_SPREAD))


def test_uncertain_reasons_are_written_for_the_uncertain_turns_only(calibration: EvidenceCalibration) -> None:
    """The reasons are made for uncertain turns only (issue 30); each turn's reason and kind must be what the rule
    says turn by turn: flagged -> none; the speaker's own turns dissimilar -> that; a feature outside the fitted
    range -> which ones; else none."""
    import dataclasses

    from sleuthd.judgment.evidence import OUT_OF_SUPPORT, OWN_TURNS_DISSIMILAR, feature_matrix

    rng = np.random.default_rng(4)
    grams = {}
    for e, dim in (("ge2e", 256), ("campplus", 192)):
        x = rng.normal(size=(12, dim)) + 0.25 * rng.normal(size=dim)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        grams[e] = x @ x.T
    seconds = rng.uniform(0.6, 8.0, 12)
    # A narrowed support and no level floor: some turns fall outside, some inside, some are flagged.
    variant = "context"
    support = dict(calibration.support)
    lo, hi = support[variant][:, 0], support[variant][:, 1]
    support[variant] = np.stack([lo + 0.45 * (hi - lo), hi - 0.45 * (hi - lo)], axis=1)
    for floors in ({}, {"ge2e": 2.0}):
        narrowed = dataclasses.replace(calibration, support=support, level_floor=floors)
        v = narrowed.judge(grams, False, seconds)
        assert v is not None and v.variant == variant
        names = narrowed.models[variant].inputs
        evidence = {e: encoder_evidence(grams[e], False) for e in narrowed.encoders}
        x = feature_matrix(names, evidence, seconds)
        s_lo, s_hi = support[variant][:, 0], support[variant][:, 1]
        slack = narrowed.support_margin * (s_hi - s_lo)
        kinds = []
        for k in range(12):
            outside = [f for f, o in zip(names, (x[k] < s_lo - slack) | (x[k] > s_hi + slack), strict=True) if o]
            if v.flagged[k]:
                kinds.append(("", ""))
            elif floors:
                kinds.append((OWN_TURNS_DISSIMILAR, "the speaker's own turns are less alike than any consistent "
                              "speaker's in fitting"))  # fmt: skip
            elif outside:
                kinds.append((OUT_OF_SUPPORT, "outside the fitted range: " + ", ".join(outside)))
            else:
                kinds.append(("", ""))
        assert list(zip(v.kinds, v.reasons, strict=True)) == kinds
        np.testing.assert_array_equal(v.uncertain, [bool(r) for _, r in kinds])
        if not floors:
            assert {k for k, _ in kinds} == {"", OUT_OF_SUPPORT}, "the case needs turns inside and outside"
