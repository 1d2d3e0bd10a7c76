"""A turn that channel matching clears must be cleared clearly: where the clips as sent flag a turn and the copies do
not, keep it flagged unless its probability on the copies is at most T (served: T = 0.5, the decision threshold).

    python screen.py SPLIT [--root R] [--conditions ...] [--variant T ...] [--grid]

Why: the 11 opposite-speaker intruders the served judgment misses on eval f-fsdd-drift are all judged on clipped,
noisy or telephone-band copies, with probabilities 0.17-0.49 there. Everything offline from the cached embeddings
(judges.evidence_flags with and without the server's channel matching); paired bootstrap over dialogues, 95 %.
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common  # noqa: E402
from sleuthd_bench.metrics import DetectionRecord  # noqa: E402
from sleuthd_bench.robustness import judges  # noqa: E402

args, names = common.threshold_screen_args()
fcal, ev = common.load_models()
_, insts = common.load(args.split, names, args.root)
rows = []  # (inst, served flags, as-sent flags, {position: probability on the copies} or None)
for inst in insts:
    served, _, p = judges.evidence_flags(inst, ev, fcal, *common.MATCH)
    mi = judges.channel_matched(inst, *common.MATCH)
    if mi is inst:
        rows.append((inst, served, frozenset(), None))
        continue
    sent = judges.evidence_flags(inst, ev, fcal)[0]
    index = judges.evidence_inputs(mi)[3]
    rows.append((inst, served, sent, {int(i): float(q) for i, q in zip(index, p)}))
print(f"{args.split}: {len(names)} conditions, {len(insts)} instances, {sum(r[3] is not None for r in rows)} judged on "
      f"copies, of which the clips as sent flag a turn the copies clear: "
      f"{sum(1 for r in rows if r[3] is not None and (r[2] - r[1]))}", flush=True)


def flags(row, t):
    inst, served, sent, probs = row
    if probs is None or t >= 0.5:
        return served
    return served | frozenset(i for i in sent - served if probs.get(i, 1.0) > t)


def records(cond, t):
    return [DetectionRecord(r[0].dialogue_id, cond, r[0].scenario, r[0].gold, f, bool(f))
            for r in rows if r[0].condition == cond for f in [flags(r, t)]]


served = {c: records(c, 0.5) for c in names}
mserved = {c: judges.metrics(served[c]) for c in names}
keep = {c: {r[0].dialogue_id for r in rows if r[0].condition == c} for c in names}
if args.grid:
    for t in (0.4, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05, 0.02):
        ms = {c: judges.metrics(records(c, t)) for c in names}
        d = {c: ms[c]["bal"] - mserved[c]["bal"] for c in names}
        worst = min(d, key=d.get)
        s2 = {c: ms[c]["S2"] - mserved[c]["S2"] for c in names}
        print(f"  T {t:<5g} mean Bal {np.mean([m['bal'] for m in ms.values()]):6.2f} ({np.mean(list(d.values())):+.2f}); "
              f"worst {worst} {d[worst]:+.2f}; S2 gained {sum(max(v, 0) for v in s2.values()):.1f}; S1/S2/S3 "
              f"{np.mean([m['S1'] for m in ms.values()]):.1f}/{np.mean([m['S2'] for m in ms.values()]):.1f}/"
              f"{np.mean([m['S3'] for m in ms.values()]):.1f}", flush=True)
for t in args.variant:
    print(f"\n{args.split}: copies clear a turn only at probability <= {t:g} (served 0.5)")
    common.paired_table(f"T{t:g}", names, keep, served, mserved, lambda c, t=t: records(c, t))
