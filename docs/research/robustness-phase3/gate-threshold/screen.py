"""Inside the blend's gate (a speaker as self-similar as the dev fit split's), today's calibration judges at its Bayes
threshold 0.5; the similar-voice intruders it misses there (ctrl-espeak S3 90.9 against a GE2E pairwise oracle's
100) ask whether a lower threshold inside the gate, chosen on the matrix's train split, finds more without flagging
consistent speakers.

    python screen.py SPLIT [--root R] [--conditions ...] [--grid] [--variant T ...]
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common  # noqa: E402
from sleuthd_bench.metrics import DetectionRecord  # noqa: E402
from sleuthd_bench.robustness import judges  # noqa: E402

args, names = common.threshold_screen_args(("--stack", dict(action="store_true", help="the blend's stack inside the gate too (at threshold T)")))
fcal, ev = common.load_models()
_, insts = common.load(args.split, names, args.root)
rows = []  # (inst, served flags, inside logits {position: logit} or None)
for inst in insts:
    served = judges.evidence_flags(inst, ev, fcal, *common.MATCH)[0]
    d = common.decompose(inst, ev, fcal)
    if d is None or not d["inside"]:
        rows.append((inst, served, None))
        continue
    logits = {int(i): float(z) for i, z in zip(d["index"], d["final"])}
    assert frozenset(i for i, z in logits.items() if z > 0) == served, inst.dialogue_id  # the served flags
    if args.stack:  # the stack judges inside the gate too (its logit as outside)
        z = d["sbias"] + d["aclip"] * d["aw"] + d["zev"] * d["ew"]
        logits = {int(i): float(v) for i, v in zip(d["index"], z)}
    rows.append((inst, served, logits))
print(f"{args.split}: {len(insts)} instances, {sum(r[2] is not None for r in rows)} inside the gate", flush=True)


def flags(row, t):
    inst, served, logits = row
    if logits is None or t is None:
        return served
    cut = np.log(t / (1 - t))
    return frozenset(i for i, z in logits.items() if z > cut)


def records(cond, t):
    return [DetectionRecord(r[0].dialogue_id, cond, r[0].scenario, r[0].gold, f, bool(f))
            for r in rows if r[0].condition == cond for f in [flags(r, t)]]


served = {c: records(c, None) for c in names}
mserved = {c: judges.metrics(served[c]) for c in names}
keep = {c: {r[0].dialogue_id for r in rows if r[0].condition == c} for c in names}
if args.grid:
    for t in ((0.5, 0.6, 0.4, 0.3) if args.stack else (0.6, 0.4, 0.3, 0.2, 0.1, 0.05)):
        ms = {c: judges.metrics(records(c, t)) for c in names}
        d = {c: ms[c]["bal"] - mserved[c]["bal"] for c in names}
        worst = min(d, key=d.get)
        best = max(d, key=d.get)
        print(f"  T {t:<5g} mean Bal {np.mean([m['bal'] for m in ms.values()]):6.2f} ({np.mean(list(d.values())):+.2f}); "
              f"worst {worst} {d[worst]:+.2f}; best {best} {d[best]:+.2f}; S1/S2/S3 "
              f"{np.mean([m['S1'] for m in ms.values()]):.1f}/{np.mean([m['S2'] for m in ms.values()]):.1f}/"
              f"{np.mean([m['S3'] for m in ms.values()]):.1f}", flush=True)
for t in args.variant:
    print(f"\n{args.split}: inside the gate, flagged above {t:g} (served 0.5)")
    common.paired_table(f"T{t:g}", names, keep, served, mserved, lambda c, t=t: records(c, t))
