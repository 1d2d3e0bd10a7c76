"""Screen: does a pitch (median F0) outlier rule, OR-ed with the served blend, lift the matrix?"""
import json, sys
from pathlib import Path
import numpy as np
from sleuthd.api import SpeakerEncoder
from sleuthd.judgment.calibration import Calibration
from sleuthd.judgment.evidence import EvidenceCalibration
from sleuthd_bench.instances import scenario_turns
from sleuthd_bench.manifest import read_manifest
from sleuthd_bench.metrics import SCENARIOS
from sleuthd_bench.robustness import embed, judges
from sleuthd_bench.robustness.build import CONDITIONS
from sleuthd_bench.robustness.instances import load_instances
from sleuthd_bench.robustness.report import ORACLE_ENCODERS

root = Path("data/robustness")
z = np.load("runs/f0/f0.npz")
F0 = dict(zip(z["paths"], z["f0"][:, 0]))
embs = {e: embed.load(root, e) for e in embed.ENCODERS}
enc = SpeakerEncoder.load(Path("models"), encoder="fused"); raw = enc.manifest.raw; enc.close()
fcal = Calibration.from_manifest(raw, "fused")
ev = EvidenceCalibration.from_json(json.loads(Path("service/sleuthd/cards/evidence.json").read_text()),
                                   {e: embs[e].weights_sha256 for e in embed.ENCODERS})

def f0dev(turn_f0, ref_f0):
    """per turn: |f0_i - median of the other pieces| in octaves (NaN where unknown)."""
    x = np.asarray(turn_f0, float)
    pieces = list(x) + ([ref_f0] if ref_f0 is not None else [])
    out = np.full(len(x), np.nan)
    for i in range(len(x)):
        others = [p for j, p in enumerate(pieces) if j != i and np.isfinite(p)]
        if np.isfinite(x[i]) and len(others) >= 2:
            out[i] = abs(x[i] - np.median(others))
    return out

def rows(split, conds):
    insts = load_instances(root, split, conds, embs)
    # the same order as load_instances: per condition, per line, per scenario
    devs = []
    for cond in conds:
        for line in read_manifest(root / f"{split}-{cond}.jsonl"):
            for sc in SCENARIOS:
                turns = scenario_turns(line, sc)
                devs.append(f0dev([F0.get(p, np.nan) for p in turns], F0.get(line.reference, np.nan)))
    assert len(devs) == len(insts)
    out = []
    for inst, d in zip(insts, devs):
        flagged, unsure, _ = judges.evidence_flags(inst, ev, fcal)
        out.append((inst, flagged, d))
    return out

def score(recs, tau):
    res = []
    for inst, flagged, d in recs:
        extra = frozenset(k for k in range(len(d)) if np.isfinite(d[k]) and d[k] > tau)
        res.append(judges.record(inst, flagged | extra))
    return judges.metrics(res)

train_conds = [c.name for c in CONDITIONS if (root / f"train-{c.name}.jsonl").is_file()]
eval_conds = [c.name for c in CONDITIONS]
tr = rows("train", train_conds)
ev_rows = rows("eval", eval_conds)
taus = [0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 1.0, 9.0]
print("train mean Bal per tau")
for tau in taus:
    bals = [score([r for r in tr if r[0].condition == c], tau)["bal"] for c in train_conds]
    print(tau, round(float(np.mean(bals)), 2), "min", round(min(bals), 1))
print()
hdr = "cond oracle | blend bal S1/S2/S3 | " + " | ".join(f"tau{t}" for t in (0.4, 0.5, 0.6, 0.7))
print(hdr)
for c in eval_conds:
    mine = [r for r in ev_rows if r[0].condition == c]
    insts = [r[0] for r in mine]
    best = max((judges.oracle(insts, e, m) for e in ORACLE_ENCODERS for m in judges.PAPER), key=lambda o: o.bal if o else -1)
    cells = []
    for tau in (9.0, 0.4, 0.5, 0.6, 0.7):
        m = score(mine, tau)
        cells.append(f"{m['bal']:.1f} ({m['S1']:.0f}/{m['S2']:.0f}/{m['S3']:.0f})")
    print(f"{c:22s} {best.bal:5.1f} S2o {best.S2:5.1f} | " + " | ".join(cells))
