"""The evidence model and blend refitted with the long conditions in train, each 30-turn instance thinned to 5 rows
per judgment setting (choice.txt), against the same recipe on the served card's 19 conditions; both judged on eval
as the server judges (channel, pitch and length matching on), paired per condition.

    PYTHONPATH=service:tools:. python docs/research/robustness-phase3/size/refit/refit.py fit OUT.json [--long]
    PYTHONPATH=service:tools:. python docs/research/robustness-phase3/size/refit/refit.py eval BASE.json LONG.json
"""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common  # noqa: E402
from sleuthd.api import SpeakerEncoder  # noqa: E402
from sleuthd.config import EngineConfig  # noqa: E402
from sleuthd.judgment.calibration import Calibration  # noqa: E402
from sleuthd.judgment.evidence import EvidenceCalibration  # noqa: E402
from sleuthd_bench import paired  # noqa: E402
from sleuthd_bench.robustness import fit, judges  # noqa: E402
from sleuthd_bench.robustness.build import CONDITIONS  # noqa: E402
from sleuthd_bench.robustness.cli import _load_all, length_matching, pitch_matching  # noqa: E402
from sleuthd_bench.robustness.judges import auto_logits, evidence_inputs  # noqa: E402

LONG = {c.name for c in CONDITIONS if c.turns > 5}
KEEP = 5
DATA = Path("data/robustness")


def thin(y: np.ndarray, key: str) -> np.ndarray:
    """Rows kept of one long instance's judgment: the altered turn's, then random others, KEEP in all."""
    rng = np.random.default_rng(abs(hash(key)) % 2**32)
    pos = list(np.flatnonzero(y == 1))
    neg = list(rng.permutation(np.flatnonzero(y == 0))[: max(0, KEEP - len(pos))])
    return np.array(sorted(pos + neg))


_rows = fit.training_rows


def thinned_rows(instances, seed=0):
    rows = _rows(instances, seed)
    for variant, r in rows.items():
        xs, ys, conds, insts, at = [], [], [], [], 0
        for k, (x, y) in enumerate(zip(r.x, r.y)):
            n = len(y)
            c, ins = r.condition[at : at + n], r.instance[at : at + n]
            at += n
            keep = thin(y, f"{variant}:{k}:{c[0]}") if c and c[0] in LONG and n > KEEP else np.arange(n)
            xs.append(x[keep])
            ys.append(y[keep])
            conds += [c[i] for i in keep]
            insts += [ins[i] for i in keep]
        r.x, r.y, r.condition, r.instance = xs, ys, conds, insts
    return rows


def fit_blend(instances, auto, auto_block, support, seed=0):
    """fit.fit_blend, with the long instances' stack rows thinned as above."""
    gate = fit.support_gate(support)
    oof = fit.out_of_fold_logits(instances, seed=seed)
    ra, re_, rl, ry = [], [], [], []
    for number, inst in enumerate(instances):
        z = oof.get(number)
        if z is None or not len(z):
            continue
        grams, has_ref, _, index = evidence_inputs(inst)
        level = fit.encoder_evidence(grams[fit.BLEND_LEVEL_ENCODER], has_ref)["level"]
        if np.isnan(level).any():
            continue
        y = np.array([1.0 if int(i) in inst.gold else 0.0 for i in index])
        a = auto_logits(inst.views["fused"], auto)
        keep = thin(y, f"stack:{inst.dialogue_id}:{inst.scenario}") if inst.condition in LONG else np.arange(len(y))
        ra.append(a[keep]), re_.append(z[keep]), rl.append(level[keep]), ry.append(y[keep])
    knots, wa, we, bias = fit.fit_stack(np.concatenate(ra), np.concatenate(re_), np.concatenate(rl), np.concatenate(ry))
    blend = fit.Blend(gate, fit.BLEND_LEVEL_ENCODER, knots, wa, we, bias, fit.AUTO_LOGIT_CLIP,
                      fit.calibration_identity(auto_block), auto.decision_threshold)
    return blend, {"stack_turns": int(sum(len(y) for y in ry))}


def cmd_fit(out: Path, with_long: bool) -> None:
    names = [c.name for c in CONDITIONS if (c.fitted or (with_long and c.name in LONG))
             and (DATA / f"train-{c.name}.jsonl").is_file()]
    fit.training_rows = thinned_rows
    _, support = _load_all(Path("data/devlarge"), "eval", ["dev-fit"])
    embs, instances = _load_all(DATA, "train", names)
    models, extra = fit.fit(instances, seed=0)
    encoder = SpeakerEncoder.load(Path("models"), encoder="fused")
    raw = encoder.manifest.raw
    encoder.close()
    auto = Calibration.from_manifest(raw, "fused")
    blend, stats = fit_blend(instances, auto, raw["calibration"], support)
    extra["fit_stats"]["blend"] = stats
    label = f"{DATA} train split" + (", long conditions thinned to 5 rows an instance" if with_long else "")
    block = fit.calibration_block(models, extra, {e: embs[e].weights_sha256 for e in embs}, label, 0, blend, "")
    out.write_text(json.dumps(block, indent=1) + "\n")
    print(f"{len(names)} conditions, {len(instances)} instances -> {out}")


def cmd_eval(base: Path, variant: Path) -> None:
    names = [c.name for c in CONDITIONS if (DATA / f"eval-{c.name}.jsonl").is_file()]
    embs, insts = _load_all(DATA, "eval", names)
    insts = [i for i in insts if not i.refused]
    fcal, _ = common.load_models()
    weights = {e: embs[e].weights_sha256 for e in ("ge2e", "campplus")}
    cards = [EvidenceCalibration.from_json(json.loads(p.read_text()), weights) for p in (base, variant)]
    cfg = EngineConfig()
    pitch = pitch_matching(DATA, cfg.pitch_match_octaves)
    length = length_matching(DATA, cfg.length_match_ratio)
    means = [[], []]
    for c in names:
        mine = [i for i in insts if i.condition == c]
        recs = [[judges.record(i, judges.evidence_flags(i, card, fcal, *common.MATCH, pitch, length)[0]) for i in mine]
                for card in cards]
        m = [judges.metrics(r) for r in recs]
        d = paired.compare("long", recs[1], "base", recs[0]).bal
        means[0].append(m[0]["bal"]), means[1].append(m[1]["bal"])
        print(f"{c}: {m[0]['bal']:.1f} ({m[0]['S1']:.1f}/{m[0]['S2']:.1f}/{m[0]['S3']:.1f}) -> {m[1]['bal']:.1f} "
              f"({m[1]['S1']:.1f}/{m[1]['S2']:.1f}/{m[1]['S3']:.1f}) {d.difference:+.2f} [{d.low:+.2f}, {d.high:+.2f}]",
              flush=True)
    print(f"mean over {len(names)}: {np.mean(means[0]):.2f} -> {np.mean(means[1]):.2f}")


if sys.argv[1] == "fit":
    cmd_fit(Path(sys.argv[2]), "--long" in sys.argv)
else:
    cmd_eval(Path(sys.argv[2]), Path(sys.argv[3]))
