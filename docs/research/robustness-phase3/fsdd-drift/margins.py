import sys
import numpy as np
sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common
from sleuthd.api import guard_margin
from sleuthd_bench.robustness import judges
cond = sys.argv[1] if len(sys.argv) > 1 else "f-fsdd-drift"
_, insts = common.load("eval", [cond])
metas = common.metas("eval", [cond])
def margins(inst, enc):
    grams, has_ref, _, idx = judges.evidence_inputs(inst)
    g = grams[enc]
    return {int(p): guard_margin(g, [int(has_ref) + j]) for j, p in enumerate(idx)}
res = {}
for i in insts:
    if i.refused: continue
    mi = judges.channel_matched(i, *common.MATCH)
    alt = metas[i.dialogue_id]["altered_turn"]
    for view, x in (("sent", i), ("matched", mi)):
        for enc in ("campplus", "ge2e"):
            m = margins(x, enc)
            if i.scenario == "S1":
                res.setdefault((view, enc, "S1 worst"), []).append(min(m.values()))
            elif alt in m:
                res.setdefault((view, enc, i.scenario), []).append(m[alt])
from sklearn.metrics import roc_auc_score
for view in ("sent", "matched"):
    for enc in ("campplus", "ge2e"):
        s1 = np.array(res[(view, enc, "S1 worst")])
        for sc in ("S2", "S3"):
            x = np.array(res[(view, enc, sc)])
            auc = roc_auc_score(np.r_[np.zeros(len(s1)), np.ones(len(x))], np.r_[-s1, -x])
            print(f"{view:8s} {enc:9s} {sc}: intruder margin median {np.median(x):+.3f} (10th pct {np.percentile(x,90):+.3f}); S1 worst median {np.median(s1):+.3f} (5th pct {np.percentile(s1,5):+.3f}); AUC {auc:.3f}")
