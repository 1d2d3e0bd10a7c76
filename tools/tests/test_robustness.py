"""The robustness matrix's tools: every channel renders audio the product decodes, a clip's spec names one
file, dialogues follow the benchmark format with intruders of the right kind, the oracle threshold is
the best single threshold in hindsight, and the train-chosen rule is the train split's best rule applied
unchanged to eval."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sleuthd.audio.decode import decode_encoded
from sleuthd_bench.instances import scenario_turns
from sleuthd_bench.manifest import read_manifest
from sleuthd_bench.robustness import build, render, report
from sleuthd_bench.robustness.instances import Instance, Turns
from sleuthd_bench.robustness.judges import metrics, oracle, paper_flags, record


def _espeak(text: str = "The young doctor found the red bicycle near the harbour.") -> dict:
    return {"src": {"kind": "espeak", "lang": "en-us", "variant": "m3", "text": text, "p": 50, "s": 160, "a": 100}}


@pytest.mark.parametrize("channel", build.DRIFT_CHANNELS)
def test_every_channel_renders_audio_the_product_decodes(channel: str, tmp_path: Path) -> None:
    clean = {**_espeak(), "fx": []}
    spec = build.slot_spec(clean, build.CONDITION_BY_NAME["c-short"], channel)
    path = render.Renderer(tmp_path, tmp_path).render(spec)
    assert path.name == render.relpath(spec).rsplit("/", 1)[1]
    audio = decode_encoded(path.read_bytes(), max_seconds=60.0)
    seconds = len(audio.samples) / audio.sample_rate_hz
    cut = next(step for step in spec["fx"] if step[0] == "cut")[2]
    assert cut - 0.05 <= seconds <= cut + 0.4  # the cut's length (reverb adds a tail, codecs pad a frame)
    assert float(np.sqrt(np.mean(audio.samples**2))) > 1e-4


def test_a_clip_and_its_channel_parameters_depend_only_on_the_clip_and_the_choice() -> None:
    clean = {**_espeak(), "fx": []}
    cond = build.CONDITION_BY_NAME["e-drift"]
    assert build.slot_spec(clean, cond, "noise") == build.slot_spec(clean, cond, "noise")
    other = {**_espeak("Please ask the bus driver to open the garden gate."), "fx": []}
    assert build.slot_spec(clean, cond, "noise")["fx"] != build.slot_spec(other, cond, "noise")["fx"]


def _speakers() -> list[build.Speaker]:
    out = []
    for k, (name, gender) in enumerate((("a", "M"), ("b", "M"), ("c", "F"), ("d", "F"))):
        clips = tuple({**_espeak(f"sentence {k} {j}"), "fx": []} for j in range(7))
        out.append(build.Speaker(name, gender, "espeak", "eval", clips, group="en"))
    return out


def test_dialogues_follow_the_benchmark_format_with_intruders_of_the_right_kind(tmp_path: Path) -> None:
    speakers = _speakers()
    similar = {"a": ["b"], "b": ["a"], "c": ["d"], "d": ["c"]}
    lines = build.draw_dialogues(build.CONDITION_BY_NAME["d-mp3"], speakers, similar, 4, "eval", seed=0)
    renderer = render.Renderer(tmp_path, tmp_path)
    for drawn in lines:
        for spec in drawn["meta"]["specs"]:
            renderer.render(spec)
    path = tmp_path / "eval-d-mp3.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    gender = {s.name: s.gender for s in speakers}
    for line, raw in zip(read_manifest(path), lines, strict=True):
        meta = raw["meta"]
        assert gender[meta["s2_speaker"]] != gender[line.target_speaker]
        assert meta["s3_speaker"] == similar[line.target_speaker][0]
        assert len(set(line.target_turns) | {line.reference}) == 6  # distinct clips of the target
        assert all(p.endswith(".mp3") for p in scenario_turns(line, "S3"))
        assert meta["channels"] == ["mp3"] * 8


def test_short_conditions_cut_every_turn_and_intruder_but_never_the_reference() -> None:
    # The server refuses a reference with less speech than the encoder needs (INVALID_ARGUMENT): a cut reference
    # would make a short-turn dialogue one it never answers, and the conditions are about short turns.
    speakers = _speakers()
    similar = {"a": ["b"], "b": ["a"], "c": ["d"], "d": ["c"]}
    for name in ("c-short", "c-mixed"):
        for raw in build.draw_dialogues(build.CONDITION_BY_NAME[name], speakers, similar, 6, "eval", seed=0):
            cuts = [any(step[0] == "cut" for step in spec["fx"]) for spec in raw["meta"]["specs"]]
            assert not cuts[build.TURNS], name  # the reference slot
            if name == "c-short":
                assert all(cuts[: build.TURNS]) and all(cuts[build.TURNS + 1 :])


def test_long_conditions_draw_30_turns_and_may_cut_the_reference_too() -> None:
    # c-long-*: 30 turns a speaker (session 27's gate failure lay in long dialogues of short turns); allshort also
    # cuts the reference, a short prompt, so the speaker's pool is short pieces only.
    speakers = [
        build.Speaker(
            s.name, s.gender, s.family, s.split, tuple({**_espeak(f"{s.name} {j}"), "fx": []} for j in range(32))
        )
        for s in _speakers()
    ]
    similar = {"a": ["b"], "b": ["a"], "c": ["d"], "d": ["c"]}
    for name, reference_cut in (("c-long-short", False), ("c-long-allshort", True)):
        cond = build.CONDITION_BY_NAME[name]
        assert cond.turns == 30
        for raw in build.draw_dialogues(cond, speakers, similar, 4, "eval", seed=0):
            assert len(raw["target_turns"]) == 30 and 0 <= raw["altered_turn"] < 30
            assert len(set(raw["target_turns"]) | {raw["reference"]}) == 31  # distinct clips of the target
            cuts = [any(step[0] == "cut" for step in spec["fx"]) for spec in raw["meta"]["specs"]]
            assert len(cuts) == 33 and all(cuts[:30]) and all(cuts[31:])
            assert cuts[30] is reference_cut, name


def test_the_default_fitting_set_is_the_one_the_served_card_was_fitted_on() -> None:
    # `calibrate fit-evidence` with no --conditions must keep reproducing service/sleuthd/cards/evidence.json.
    card = json.loads((Path(__file__).resolve().parents[2] / "service/sleuthd/cards/evidence.json").read_text())
    fitted = [c.name for c in build.CONDITIONS if c.fitted and c.pool != "fsdd" and c.pool != "kokoro-de"]
    assert f"conditions {', '.join(sorted(fitted))}), seed" in card["how"]


def test_building_some_conditions_keeps_the_others_in_the_index(tmp_path: Path) -> None:
    (tmp_path / "conditions.json").write_text(json.dumps({"ctrl-espeak": {"group": "ctrl"}}))
    build.build(tmp_path, [], eval_dialogues=1, train_dialogues=1, fsdd_dir=tmp_path)
    assert "ctrl-espeak" in json.loads((tmp_path / "conditions.json").read_text())


def _instance(scenario: str, scores: list[float], k: int) -> Instance:
    """A speaker whose turns lie at angles arccos(``scores``) on the unit circle (GE2E); CAM++ hears every turn
    alike, so no CAM++ threshold tells the scenarios apart."""
    angles = np.arccos(np.clip(scores, -1, 1))
    emb = np.stack([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)
    view = Turns(np.arange(len(scores)), emb, np.full(len(scores), 3.0), None)
    same = Turns(np.arange(len(scores)), np.tile(np.float32([1.0, 0.0]), (len(scores), 1)), view.seconds, None)
    gold = frozenset() if scenario == "S1" else frozenset({0})
    views = {"ge2e": view, "campplus": same}
    return Instance(f"d{k}", "c", scenario, gold, len(scores), views, target=f"v{k}@c")  # type: ignore[arg-type]


def test_the_oracle_is_the_best_single_threshold_in_hindsight() -> None:
    # Each instance: turns at angles whose pairwise means separate S1 from S2 at one threshold.
    insts = [_instance("S1", [0.9, 0.9, 0.9], k) for k in range(4)]
    insts += [_instance("S2", [0.2, 0.9, 0.9], k) for k in range(4)]
    insts += [_instance("S3", [0.8, 0.9, 0.9], k) for k in range(4)]
    o = oracle(insts, "ge2e", "pairwise")
    assert o is not None and o.bal == pytest.approx(100.0)
    # The threshold it found flags exactly the altered dialogues.
    for inst in insts:
        assert bool(paper_flags(inst.views["ge2e"], "pairwise", o.threshold)) == (inst.scenario != "S1")


def test_the_train_chosen_rule_is_chosen_on_train_and_applied_unchanged_to_eval() -> None:
    # Train: the similar intruder sits at 0.8, so the best train threshold lies just below the consistent speakers.
    train = [_instance(sc, [x, 0.9, 0.9], k) for k in range(4) for sc, x in (("S1", 0.9), ("S2", 0.2), ("S3", 0.8))]
    # Eval: a subtler similar intruder (0.88) that only a threshold chosen in hindsight on eval catches.
    evals = [_instance(sc, [x, 0.9, 0.9], k) for k in range(4) for sc, x in (("S1", 0.9), ("S2", 0.2), ("S3", 0.88))]
    records, choices = report.train_chosen(train, evals, ["c", "absent"])
    assert set(choices) == {"c"}  # a condition without train instances gets no rule
    assert choices["c"]["run"] == "ge2e:pairwise" and choices["c"]["train_bal"] == pytest.approx(100.0)
    tau = oracle(train, "ge2e", "pairwise").threshold  # type: ignore[union-attr]
    assert choices["c"]["threshold"] == pytest.approx(tau, abs=1e-4)
    chosen = metrics(records)
    assert (chosen["S1"], chosen["S2"], chosen["S3"], chosen["bal"]) == (100.0, 100.0, 0.0, 75.0)

    # A judge as good as eval's hindsight oracle: ahead of the train-chosen rule, and the report says so.
    best = oracle(evals, "ge2e", "pairwise")
    assert best is not None and best.bal == pytest.approx(100.0)
    perfect = [record(i, paper_flags(i.views["ge2e"], "pairwise", best.threshold)) for i in evals]
    runs = {"fused:auto": perfect, "evidence": perfect, report.TRAIN_CHOSEN: records}
    out = report.condition_report("c", evals, runs, {}, "evidence", chosen=choices["c"])
    assert out["oracle_best"] == {"run": "ge2e:pairwise", "bal": 100.0}
    assert out["train_chosen"]["bal"] == 75.0 and out["train_chosen"]["run"] == "ge2e:pairwise"
    vs = {c["vs"]: c for c in out["paired"]}
    assert vs[report.TRAIN_CHOSEN]["bal"] == pytest.approx(25.0) and vs[report.TRAIN_CHOSEN]["voices"] == 4
    md = report.markdown({"conditions": {"c": out}}, "evidence", ["fused:auto", report.TRAIN_CHOSEN, "evidence"])
    assert "| 75.0 (ge2e:pairwise) |" in md
    assert "on 1 of 1 conditions and the S2 bar on 1 of the 1 where it applies" in md
    assert "at least the train-chosen rule on 1 of 1." in md
