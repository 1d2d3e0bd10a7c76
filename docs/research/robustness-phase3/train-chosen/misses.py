"""The served default's misses and false alarms on a split beside the split's best rule's scores.

PYTHONPATH=service:tools:. python docs/research/robustness-phase3/train-chosen/misses.py train ctrl-espeak,d-mp3 v \
    [DIALOGUE_IDS: both encoders' centroid and pairwise scores of these dialogues]"""
import sys

import numpy as np

sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common
from sleuthd_bench.robustness import judges, report

split = sys.argv[1]
conds = sys.argv[2].split(",")
insts, judge = common.load_served(split, conds)
for c in conds:
    mine = [i for i in insts if i.condition == c]
    out = [judge(i) for i in mine]
    recs = [judges.record(i, o[0]) for i, o in zip(mine, out)]
    m = judges.metrics(recs)
    rule = report.best_rule(report.oracles(mine))
    print(f"{c} {split}: served {m['bal']:.1f} ({m['S1']:.1f}/{m['S2']:.1f}/{m['S3']:.1f}); best rule {rule.encoder}:{rule.method}@{rule.threshold:.3f} {rule.bal:.1f} ({rule.S1:.1f}/{rule.S2:.1f}/{rule.S3:.1f})")
    if len(sys.argv) > 3:
        for i, o in zip(mine, out):
            if i.scenario == "S3" and not o[0]:
                s = judges.paper_scores(i.views[rule.encoder], rule.method)
                p = o[2]
                print(f"  miss {i.dialogue_id} gold {sorted(i.gold)} p={np.round(p,3)} {rule.method}={np.round(s,3)} idx={i.views[rule.encoder].index}")
            if i.scenario == "S1" and o[0]:
                s = judges.paper_scores(i.views[rule.encoder], rule.method)
                print(f"  FA {i.dialogue_id} p={np.round(o[2],3)} {rule.method}={np.round(s,3)}")
if len(sys.argv) > 4:
    for i in insts:
        if i.dialogue_id in sys.argv[4].split(","):
            for e in ("ge2e", "campplus"):
                print(i.dialogue_id, i.scenario, e, "centroid", np.round(judges.paper_scores(i.views[e], "centroid"), 3), "pairwise", np.round(judges.paper_scores(i.views[e], "pairwise"), 3))
