"""Fitting and cross-validating the auto calibration (offline tooling).

These tests run the fitting code on embeddings drawn around per-speaker centres, not on speech: what is
tested is the bookkeeping (who is a target, what is jittered, what is held out, which setting the rule
picks), which needs speakers with known identities and no encoder. The shipped calibration itself is
exercised through the real server in test_auto.py and the replay tests.
"""

from __future__ import annotations

import numpy as np
import pytest
from sleuthd.judgment.calibration import BASE_VARIANTS, COHORT_SUFFIX, FEATURES, VARIANTS
from sleuthd_bench import calibrate
from sleuthd_bench.calibrate import (
    Clip,
    Instance,
    _draw_cohort,
    dialogue_scores,
    fit_models,
    make_instances,
    mix_lengths,
)
from sleuthd_bench.calibrate_cv import Setting, SettingResult, cross_validate, select, speaker_folds
from sleuthd_bench.cohort_eval import JUDGMENTS, cohort_cross_validate, compare
from sleuthd_bench.turn_lengths import MIXED_SHORT_SHARE

DIM = 32


def corpus(n_speakers: int = 12, clips_each: int = 12, spread: float = 0.15, seed: int = 0) -> list[Clip]:
    """Speaker k's clips lie around its own random centre and all last 1 + k seconds, so a turn's
    log_speech_seconds feature says which speaker it came from."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n_speakers):
        centre = rng.normal(size=DIM)
        centre /= np.linalg.norm(centre)
        for _ in range(clips_each):
            e = centre + rng.normal(0.0, spread / np.sqrt(DIM), DIM)
            out.append(Clip(f"s{k:02d}", "MF"[k % 2], e / np.linalg.norm(e), 1.0 + k, f"s{k:02d}/{len(out):03d}.wav"))
    return out


def turn_seconds(inst: Instance) -> np.ndarray:
    col = FEATURES[inst.variant].index("log_speech_seconds")
    return np.round(np.exp(inst.features[:, col]), 6)


def test_targets_restrict_who_is_judged_but_not_who_intrudes() -> None:
    clips = corpus()
    instances = make_instances(clips, 300, seed=3, benchmark_like=True, targets={"s03", "s07"})
    intruders: set[float] = set()
    for inst in instances:
        secs = turn_seconds(inst)
        own = set(secs[inst.labels == 0].tolist())
        assert own in ({4.0}, {8.0})  # every genuine turn is one of the two targets'
        assert inst.labels.sum() == (0 if inst.scenario == "S1" else 1)
        intruders |= set(secs[inst.labels == 1].tolist())
    assert len(intruders - {4.0, 8.0}) > 2  # intruders come from the whole corpus
    with pytest.raises(ValueError, match="no target speaker"):
        make_instances(clips, 10, seed=0, targets={"nobody"})


def test_jitter_is_reproducible_and_lowers_self_similarity() -> None:
    clips = corpus()
    a = make_instances(clips, 60, seed=5, benchmark_like=True, jitter_levels=(0.05,))
    b = make_instances(clips, 60, seed=5, benchmark_like=True, jitter_levels=(0.05,))
    plain = make_instances(clips, 60, seed=5, benchmark_like=True)
    assert all(np.array_equal(x.features, y.features) for x, y in zip(a, b, strict=True))
    # Same dialogues (same draws), different embeddings: the relative features move.
    assert [x.scenario for x in a] == [x.scenario for x in plain]
    assert any(not np.allclose(x.features, y.features) for x, y in zip(a, plain, strict=True))


def test_dialogue_scores_follow_the_benchmark_definitions() -> None:
    def inst(scenario: str, labels: list[int]) -> Instance:
        return Instance("context_reference", np.zeros((len(labels), 1)), np.array(labels, float), len(labels), scenario)

    instances = [inst("S1", [0, 0, 0]), inst("S1", [0, 0, 0]), inst("S2", [0, 1, 0]), inst("S3", [1, 0, 0])]
    probs = [np.array([0.1, 0.2, 0.3]), np.array([0.9, 0.1, 0.1]), np.array([0.1, 0.8, 0.7]), np.array([0.2, 0.1, 0.1])]
    m = dialogue_scores(instances, probs, 0.5)
    # S1: one of two unflagged; S2 detected (but two turns flagged); S3 missed.
    assert (m["S1"], m["S2"], m["S3"]) == (50.0, 100.0, 0.0)
    assert m["bal"] == pytest.approx(0.5 * (50 + (100 + 0) / 2))
    # Localization F1: S1 1 and 0 -> 50; S2 P=1/2, R=1 -> 2/3; S3 empty prediction -> 0.
    assert m["bal_f1"] == pytest.approx(0.5 * (50 + (100 * 2 / 3 + 0) / 2))


def test_fitted_models_separate_distinct_speakers() -> None:
    clips = corpus()
    models = fit_models(make_instances(clips, 900, seed=1) + make_instances(clips, 600, seed=4, cohort=True))
    assert set(models) == set(VARIANTS)
    test = make_instances(clips, 300, seed=2, benchmark_like=True)
    m = dialogue_scores(test, [models[i.variant].probability(i.features) for i in test], 0.5)
    assert m["S1"] >= 95 and m["S2"] >= 95 and m["bal"] >= 90


def test_speaker_folds_partition_the_speakers() -> None:
    speakers = [f"s{k}" for k in range(10)]
    folds = speaker_folds(speakers, 3, seed=0)
    assert sorted(s for f in folds for s in f) == speakers and all(f for f in folds)
    assert speaker_folds(speakers, 3, seed=0) == folds != speaker_folds(speakers, 3, seed=1)
    with pytest.raises(ValueError, match="--folds"):
        speaker_folds(speakers, 11, seed=0)


def test_selection_rule_puts_consistent_speakers_first() -> None:
    def result(l2: float, s1: tuple[float, float], bal: tuple[float, float]) -> SettingResult:
        return SettingResult(
            Setting((0.0,), l2),
            {
                j: {"S1": s, "S2": 100.0, "S3": 0.0, "bal": b, "bal_f1": b}
                for j, s, b in zip((0.0, 0.02), s1, bal, strict=True)
            },
        )

    sharp = result(1e-3, (97.0, 99.5), (95.0, 94.0))  # best mean Bal, but flags 3 % of consistent speakers
    steady = result(1e-2, (99.5, 100.0), (92.0, 90.0))
    timid = result(1e-1, (100.0, 100.0), (85.0, 80.0))
    assert select([sharp, steady, timid], min_s1=99.0) is steady
    assert select([sharp, steady, timid], min_s1=95.0) is sharp
    assert select([sharp], min_s1=99.0) is None


def test_cross_validation_scores_every_setting_on_held_out_targets() -> None:
    clips = corpus()
    messages: list[str] = []
    results = cross_validate(
        clips,
        [(0.0,), (0.0, 0.05)],
        [1e-2, 1e-1],
        folds=3,
        train_dialogues=450,
        test_dialogues=90,
        test_jitters=(0.0, 0.1),
        progress=messages.append,
    )
    assert len(messages) == 3 and {r.setting for r in results} == {
        Setting(j, l2) for j in ((0.0,), (0.0, 0.05)) for l2 in (1e-2, 1e-1)
    }
    for r in results:
        assert set(r.by_test_jitter) == {0.0, 0.1}
        clean, noisy = r.by_test_jitter[0.0], r.by_test_jitter[0.1]
        assert clean["S2"] >= 95 and clean["bal"] >= 85
        # Heavy test jitter makes the held-out speakers' turns less alike: detection gets harder.
        assert noisy["S3"] <= clean["S3"] + 1e-9 or noisy["S1"] <= clean["S1"] + 1e-9


def test_turn_length_conditions_count_in_the_selection_rule() -> None:
    clips = corpus()
    # The "short crops": the same clips (same sources, same centres) with twice the spread around
    # their speaker, as short turns have; the mixed condition pairs them with the whole clips by source.
    short = corpus(spread=0.3)
    results = cross_validate(
        clips, [(0.0,)], [1e-2], folds=3, train_dialogues=450, test_dialogues=90, test_jitters=(0.0,), short_clips=short
    )
    (r,) = results
    assert list(r.by_turn_length) == ["short", "mixed"]
    whole, cut = r.by_test_jitter[0.0], r.by_turn_length["short"]
    assert cut["bal"] < whole["bal"]  # noisier turns are harder to judge
    assert r.min_s1 == min(whole["S1"], cut["S1"], r.by_turn_length["mixed"]["S1"])
    assert r.mean_bal == pytest.approx(np.mean([whole["bal"], cut["bal"], r.by_turn_length["mixed"]["bal"]]))


def test_a_training_share_of_short_crops_is_a_setting_of_its_own() -> None:
    clips, short = corpus(), corpus(spread=0.3)
    kwargs = dict(folds=3, train_dialogues=450, test_dialogues=90, test_jitters=(0.0,), short_clips=short)
    results = cross_validate(clips, [(0.0,)], [1e-2], train_short_shares=(0.0, 0.5), **kwargs)  # type: ignore[arg-type]
    assert [r.setting.train_short_share for r in results] == [0.0, 0.5]
    assert "50% of training clips cut" in results[1].setting.label() and "cut" not in results[0].setting.label()
    # The share-0 setting is exactly the run without the option; training on noisier turns changes the models.
    (alone,) = cross_validate(clips, [(0.0,)], [1e-2], **kwargs)  # type: ignore[arg-type]
    assert alone.by_turn_length == results[0].by_turn_length and alone.by_test_jitter == results[0].by_test_jitter
    assert results[1].by_turn_length != results[0].by_turn_length
    with pytest.raises(ValueError, match="needs the short crops"):
        cross_validate(clips, [(0.0,)], [1e-2], folds=3, train_short_shares=(0.5,))


def test_mixed_lengths_swap_about_half_the_clips_for_their_crops() -> None:
    clips, short = corpus(), corpus(spread=0.3)
    mixed = mix_lengths(clips, short, seed=4, share=MIXED_SHORT_SHARE)
    assert [c.source for c in mixed] == [c.source for c in clips]
    swapped = sum(m is s for m, s in zip(mixed, short, strict=True))
    assert sum(m is c for m, c in zip(mixed, clips, strict=True)) + swapped == len(clips)
    assert 0.35 * len(clips) < swapped < 0.65 * len(clips)
    assert [c.source for c in mix_lengths(clips, short, seed=4, share=MIXED_SHORT_SHARE)] == [c.source for c in mixed]
    assert [m is s for m, s in zip(mix_lengths(clips, short, seed=4, share=MIXED_SHORT_SHARE), short, strict=True)] == [
        m is s for m, s in zip(mixed, short, strict=True)
    ]


# ------------------------------------------------------------------------------------------ cohort


def test_cohort_is_strangers_unless_the_intruder_is_asked_for() -> None:
    import random

    by_speaker: dict[str, list[Clip]] = {}
    for c in corpus():
        by_speaker.setdefault(c.speaker, []).append(c)
    intruder = by_speaker["s05"][3]
    rng = random.Random(0)
    for _ in range(200):
        groups = _draw_cohort(by_speaker, "s00", intruder, 0.0, rng)
        assert 1 <= len(groups) <= 3 and all(1 <= len(g) <= 5 for g in groups)
        speakers = [g[0].speaker for g in groups]
        assert all(len({c.speaker for c in g}) == 1 for g in groups) and len(set(speakers)) == len(speakers)
        assert not {"s00", "s05"} & set(speakers)
    for _ in range(50):
        groups = _draw_cohort(by_speaker, "s00", intruder, 1.0, rng)
        assert groups[0][0].speaker == "s05" and all(c is not intruder for c in groups[0])  # its other clips
        assert "s00" not in {g[0].speaker for g in groups}
    for _ in range(50):  # a look-alike is always there, once, and never crowds out the rule on strangers
        speakers = [g[0].speaker for g in _draw_cohort(by_speaker, "s00", intruder, 0.0, rng, look_alike="s02")]
        assert speakers.count("s02") == 1 and not {"s00", "s05"} & set(speakers) and 1 <= len(speakers) <= 3


def test_cohort_instances_carry_the_plain_judgment_of_the_same_turns() -> None:
    clips = corpus()
    instances = make_instances(clips, 120, seed=7, cohort=True)
    plain = {i.variant for i in make_instances(clips, 120, seed=7)}
    for inst in instances:
        assert inst.n_turns >= 2 and inst.variant == inst.plain_variant + COHORT_SUFFIX
        assert inst.plain_features is not None
        assert inst.features.shape == (inst.n_turns, len(FEATURES[inst.variant]))
        assert inst.plain_features.shape == (inst.n_turns, len(FEATURES[inst.plain_variant]))
        # The cohort variant's leading features are the plain ones, computed identically.
        assert np.array_equal(inst.features[:, : len(FEATURES[inst.plain_variant])], inst.plain_features)
    assert {i.plain_variant for i in instances} == plain - {"reference_only"}


def test_plain_models_do_not_depend_on_the_cohort_fit() -> None:
    clips = corpus()
    models, stats = calibrate.fit(clips, 600, seed=3, n_threshold_instances=90)
    alone = fit_models(make_instances(clips, 600, seed=3), variants=BASE_VARIANTS)
    assert stats["cohort_instances"] == 600 and stats["instances"] == 1200
    for v in BASE_VARIANTS:
        assert np.array_equal(models[v].weights, alone[v].weights) and models[v].bias == alone[v].bias


def test_one_gender_corpus_takes_the_least_similar_speaker_for_s2() -> None:
    clips = [Clip(c.speaker, "M", c.embedding, c.speech_seconds) for c in corpus()]
    centre = {}
    for secs in {c.speech_seconds for c in clips}:  # a speaker's clips all last the same, 1 + k seconds
        m = np.mean([c.embedding for c in clips if c.speech_seconds == secs], axis=0)
        centre[secs] = m / np.linalg.norm(m)
    instances = make_instances(clips, 90, seed=2, benchmark_like=True)
    assert {i.scenario for i in instances} == {"S1", "S2", "S3"}
    for inst in instances:
        if inst.scenario == "S1":
            continue
        secs = turn_seconds(inst)
        (target,), (intruder,) = set(secs[inst.labels == 0]), set(secs[inst.labels == 1])
        ranked = sorted((s for s in centre if s != target), key=lambda s: float(centre[target] @ centre[s]))
        assert intruder == (ranked[0] if inst.scenario == "S2" else ranked[-1])


def test_cohort_cross_validation_compares_both_judgments_on_the_same_dialogues() -> None:
    clips = corpus(spread=0.6)  # voices that overlap, so detection is not trivially perfect
    messages: list[str] = []
    results = cohort_cross_validate(
        clips, folds=3, repeats=1, train_dialogues=450, test_dialogues=90, test_jitters=(0.0,),
        progress=messages.append,
    )  # fmt: skip
    assert len(messages) == 3 and set(results) == {0.0} and set(results[0.0]) == set(JUDGMENTS)
    for m in results[0.0].values():
        assert (
            0 <= m["S1"] <= 100
            and 0 <= m["ece"] <= 1
            and m["bal"] == pytest.approx(0.5 * (m["S1"] + (m["S2"] + m["S3"]) / 2))
        )
    # compare() refuses dialogues that have no cohort rather than judging them twice the same way.
    with pytest.raises(ValueError, match="cohort"):
        compare({}, make_instances(clips, 3, seed=0, benchmark_like=True))


def test_a_fit_records_its_short_share_and_loads() -> None:
    from dataclasses import replace

    from sleuthd.judgment.calibration import Calibration

    clips = corpus()
    short = [replace(c, speech_seconds=1.5) for c in corpus(spread=0.3)]
    manifest = {"source": {"file_sha256": "ab" * 32}, "sha256": "cd" * 32}
    plain_models, plain_stats = calibrate.fit(clips, 600, seed=3, n_threshold_instances=90)
    models, stats = calibrate.fit(clips, 600, seed=3, n_threshold_instances=90, short_clips=short, short_share=0.5)
    assert plain_stats["short_clips_in_training"] == 0
    assert 0.3 * len(clips) < stats["short_clips_in_training"] < 0.7 * len(clips)
    block = calibrate.calibration_block(models, stats, manifest, "a corpus", 3)
    assert "replaced by a random 1.2-3 s cut" in block["how"] and "length_correction" not in block
    loaded = Calibration.from_manifest({**manifest, "calibration": block}, "enc")
    assert loaded.models.keys() == models.keys()
    plain = Calibration.from_manifest(
        {**manifest, "calibration": calibrate.calibration_block(plain_models, plain_stats, manifest, "c", 3)}, "enc"
    )
    assert "every clip whole" in plain.raw["how"]
    with pytest.raises(ValueError, match="needs the corpus's short crops"):
        calibrate.fit(clips, 60, seed=3, short_share=0.5)


def test_training_by_length_profile_draws_whole_mixed_and_cut_thirds() -> None:
    from dataclasses import replace

    # Crops last 0.5 s plus 0.01 s per speaker index, so a turn's length says what it is and whose.
    short = [replace(c, speech_seconds=0.5 + 0.01 * int(c.speaker[1:])) for c in corpus(spread=0.3)]
    clips = [c for c in corpus() if int(c.speaker[1:]) < 8]  # crops of speakers 8-11 must never be drawn
    instances = calibrate.training_instances(clips, short, 300, seed=2, length_profiles=True)
    assert len(instances) == 300
    thirds = [np.concatenate([turn_seconds(i) for i in instances[k * 100 : (k + 1) * 100]]) for k in range(3)]
    whole, mixed, cut = thirds
    assert whole.min() >= 1.0  # every turn whole
    assert cut.max() < 1.0  # every turn a crop ...
    assert cut.max() < 0.5 + 0.01 * 8  # ... of the given clips only
    assert 0.3 < float(np.mean(mixed < 1.0)) < 0.7  # whole and cut turns side by side
    # Without profiles and without a share, the draw is exactly make_instances on the whole clips.
    plain = calibrate.training_instances(clips, short, 60, seed=2)
    direct = make_instances(clips, 60, seed=2)
    assert all(np.array_equal(a.features, b.features) for a, b in zip(plain, direct, strict=True))
    with pytest.raises(ValueError, match="needs the corpus's short crops"):
        calibrate.training_instances(clips, [], 60, seed=2, length_profiles=True)
    with pytest.raises(ValueError, match="one or the other"):
        calibrate.training_instances(clips, short, 60, seed=2, length_profiles=True, short_share=0.5)


def test_a_fit_and_a_cross_validation_by_length_profile_say_so() -> None:
    from dataclasses import replace

    clips, short = corpus(), [replace(c, speech_seconds=0.5) for c in corpus(spread=0.3)]
    manifest = {"source": {"file_sha256": "ab" * 32}, "sha256": "cd" * 32}
    models, stats = calibrate.fit(clips, 600, seed=3, n_threshold_instances=90, short_clips=short, length_profiles=True)
    assert stats["length_profiles"] is True and stats["short_clips_in_training"] == 0
    assert "drawn by length profile" in calibrate.calibration_block(models, stats, manifest, "c", 3)["how"]
    kwargs = dict(folds=3, train_dialogues=450, test_dialogues=90, test_jitters=(0.0,), short_clips=short)
    (plain,) = cross_validate(clips, [(0.0,)], [1e-2], **kwargs)  # type: ignore[arg-type]
    (profiled,) = cross_validate(clips, [(0.0,)], [1e-2], length_profiles=True, **kwargs)  # type: ignore[arg-type]
    assert "trained by length profile" in profiled.setting.label() and "profile" not in plain.setting.label()
    assert profiled.by_turn_length != plain.by_turn_length  # the models saw other training turns
    with pytest.raises(ValueError, match="one or the other"):
        cross_validate(clips, [(0.0,)], [1e-2], length_profiles=True, train_short_shares=(0.5,), **kwargs)  # type: ignore[arg-type]
