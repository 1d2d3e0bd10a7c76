"""Screen on the TRAIN split only: a GE2E relative-outlier flag added to the served judgment. A speaker's turn with
the largest GE2E leave-one-out cosine distance d (to the mean of the other turns) is flagged too when d > a and
d > r x the next largest. Prints the mean and worst change of Bal over the train conditions at each (a, r).

PYTHONPATH=service:tools:. python docs/research/robustness-phase3/train-chosen/ge2e_flag.py train"""
import os
import pickle
import sys

import numpy as np

sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common
from sleuthd_bench.robustness import judges
from sleuthd_bench.robustness.build import CONDITIONS

split = sys.argv[1]
conds = [c.name for c in CONDITIONS if os.path.exists(f"data/robustness/{split}-{c.name}.jsonl")]
os.makedirs("runs/train-chosen", exist_ok=True)
cache = f"runs/train-chosen/served_{split}.pkl"  # the served verdicts, judged once (runs/ is git-ignored)
insts, judge = common.load_served(split, conds)
if os.path.exists(cache):
    served = pickle.load(open(cache, "rb"))
else:
    served = {(i.dialogue_id, i.scenario): judge(i)[0] for i in insts}
    pickle.dump(served, open(cache, "wb"))

def loo(v):
    e = v.emb.astype(np.float64); n = len(e)
    if n < 3: return None
    s = e.sum(0)
    d = np.empty(n)
    for i in range(n):
        m = s - e[i]; m /= np.linalg.norm(m)
        d[i] = 1 - e[i] @ m
    return d

feats = {}
for i in insts:
    d = loo(i.views["ge2e"])
    if d is None: continue
    j = int(np.argmax(d)); rest = np.delete(d, j)
    feats[(i.dialogue_id, i.scenario)] = (d[j], d[j] / max(rest.max(), 1e-9), int(i.views["ge2e"].index[j]))

def bal(recs):
    return judges.metrics(recs)["bal"]
base = {c: [judges.record(i, served[(i.dialogue_id, i.scenario)]) for i in insts if i.condition == c] for c in conds}
bb = {c: bal(base[c]) for c in conds}
print("base mean", np.mean(list(bb.values())))
for a in (0.04, 0.06, 0.08, 0.10, 0.12):
    for r in (1.5, 2.0, 2.5, 3.0, 4.0):
        tot = []; worst = (0, "")
        for c in conds:
            recs = []
            for i in insts:
                if i.condition != c: continue
                f = served[(i.dialogue_id, i.scenario)]
                x = feats.get((i.dialogue_id, i.scenario))
                if x and x[0] > a and x[1] > r:
                    f = f | {x[2]}
                recs.append(judges.record(i, frozenset(f)))
            d = bal(recs) - bb[c]; tot.append(d)
            if d < worst[0]: worst = (d, c)
        print(f"a={a} r={r}: mean {np.mean(tot):+.2f} worst {worst[0]:+.2f} {worst[1]} best {max(tot):+.2f} {conds[int(np.argmax(tot))]}")
