"""Screen: today's auto's log_turns clamped to its fitted range (1-10 turns)."""
import sys
import numpy as np
sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common
import sleuthd.judgment.calibration as C
from sleuthd_bench import paired
from sleuthd_bench.robustness import judges
split = sys.argv[1]; conds = sys.argv[2].split(","); cap = float(sys.argv[3])
insts, judge = common.load_served(split, conds)
def run():
    return {c: [judges.record(i, judge(i)[0]) for i in insts if i.condition == c] for c in conds}
base = run()
orig = C.own_evidence
def clamped(*a, **k):
    o = orig(*a, **k)
    if "log_turns" in o.columns:
        o.columns["log_turns"] = np.minimum(o.columns["log_turns"], np.log(cap))
    return o
C.own_evidence = clamped
new = run()
for c in conds:
    a, b = judges.metrics(base[c]), judges.metrics(new[c])
    d = paired.compare("clamp", new[c], "served", base[c]).bal
    print(f"{c}: {a['bal']:.1f} ({a['S1']:.1f}/{a['S2']:.1f}/{a['S3']:.1f}) -> {b['bal']:.1f} ({b['S1']:.1f}/{b['S2']:.1f}/{b['S3']:.1f}) {d.difference:+.2f} [{d.low:+.2f}, {d.high:+.2f}]")
