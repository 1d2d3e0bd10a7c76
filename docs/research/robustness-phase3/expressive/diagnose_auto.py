"""Part 2 of the diagnosis: the false alarms sit inside the blend's gate, so today's fused `auto` (a logistic model on
fused-cosine features) judges them. Its logit split per feature (weight x standardised value), the gate margins, and
what the stack / the evidence model alone / one CAM++ threshold would say on the same turns.

    PYTHONPATH=service:tools:. python docs/research/robustness-phase3/expressive/diagnose_auto.py [SPLIT] [CONDITION]
"""
import sys

import numpy as np

sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common  # noqa: E402
from sleuthd.judgment.calibration import turn_features  # noqa: E402
from sleuthd_bench.robustness import judges  # noqa: E402

split = sys.argv[1] if len(sys.argv) > 1 else "eval"
cond = sys.argv[2] if len(sys.argv) > 2 else "b-espeak-expressive"
fcal, ev = common.load_models()
embs, insts = common.load(split, [cond])
oc = judges.oracle(insts, "campplus", "pairwise")
gate = ev.blend.gate
print(f"{split} {cond}; gate GE2E {gate['ge2e']:.3f} CAM++ {gate['campplus']:.3f}; campplus:pairwise oracle tau {oc.threshold:.3f}")

groups = {"S1 false alarm": [], "S1 clean, lowest turn": [], "S2 intruder": [], "S3 caught": [], "S3 missed": []}
for inst in insts:
    d = common.decompose(inst, ev, fcal)
    if d is None:
        continue
    mi = judges.channel_matched(inst, *common.MATCH)
    v = mi.views["fused"]
    variant, x = turn_features(v.emb, v.reference, v.seconds, None)
    model = fcal.models[variant]
    contrib = (x - model.mean) / model.scale * model.weights
    p = 1 / (1 + np.exp(-d["final"]))
    stack = d["sbias"] + d["aclip"] * d["aw"] + d["zev"] * d["ew"]
    pw = judges.paper_scores(inst.views["campplus"], "pairwise")
    pwi = pw[np.searchsorted(inst.views["campplus"].index, d["index"])]
    for k, pos in enumerate(d["index"]):
        row = dict(inside=d["inside"], final=d["final"][k], auto=d["auto"][k], stack=stack[k], zev=d["zev"][k],
                   cam=pwi[k], variant=variant, lv_g=d["levels"]["ge2e"], lv_c=d["levels"]["campplus"],
                   **{f"A.{f}": contrib[k, j] for j, f in enumerate(model.features)}, A_bias=model.bias,
                   **{f"X.{f}": x[k, j] for j, f in enumerate(model.features)})
        if inst.scenario == "S1":
            if p[k] > 0.5:
                groups["S1 false alarm"].append(row)
            elif not (p > 0.5).any() and d["final"][k] == d["final"].max():
                groups["S1 clean, lowest turn"].append(row)
        elif int(pos) in inst.gold:
            key = "S2 intruder" if inst.scenario == "S2" else ("S3 caught" if p[k] > 0.5 else "S3 missed")
            groups[key].append(row)

feats = [k for k in groups["S1 false alarm"][0] if k.startswith("A.")]
print("\nshares: inside the gate; flagged by: served, the stack (had the gate let it through), evidence model alone "
      "(p>0.48), CAM++ pairwise < oracle tau")
for name, g in groups.items():
    n = len(g)
    print(f"  {name:24s} n {n:3d} inside {sum(r['inside'] for r in g):3d} served {sum(r['final'] > 0 for r in g):3d} "
          f"stack {sum(r['stack'] > 0 for r in g):3d} evidence {sum(1 / (1 + np.exp(-r['zev'])) > ev.decision_threshold for r in g):3d} "
          f"CAM++<tau {sum(r['cam'] < oc.threshold for r in g):3d} | speaker level GE2E {np.median([r['lv_g'] for r in g]):.3f} "
          f"CAM++ {np.median([r['lv_c'] for r in g]):.3f}")
print("\ntoday's fused `auto` (context_reference): mean contribution to its logit (w * standardised x)")
print(f"  {'group':24s} {'logit':>7s} {'bias':>6s} " + " ".join(f"{f[2:]:>17s}" for f in feats))
for name, g in groups.items():
    g = [r for r in g if r["variant"] == "context_reference"]
    print(f"  {name:24s} {np.mean([r['auto'] for r in g]):7.2f} {g[0]['A_bias']:6.2f} " + " ".join(
        f"{np.mean([r[f] for r in g]):17.2f}" for f in feats))
print("\nraw feature medians")
for name, g in groups.items():
    g = [r for r in g if r["variant"] == "context_reference"]
    print(f"  {name:24s} " + " ".join(f"{np.median([r['X.' + f[2:]] for r in g]):17.3f}" for f in feats))
