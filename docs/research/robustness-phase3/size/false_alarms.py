"""Which genuine turns do groups of 5 flag on eval's long conditions (S1)?"""
import sys
from dataclasses import replace
import numpy as np
sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common
from sleuthd_bench.robustness import judges
from sleuthd_bench.robustness.instances import Turns
conds = ["c-long-short", "c-long-allshort"]
_, insts = common.load("eval", conds)
metas = common.metas("eval", conds)
fcal, ev = common.load_models()
def sub(inst, keep):
    return replace(inst, views={e: Turns(v.index[np.isin(v.index, keep)], v.emb[np.isin(v.index, keep)], v.seconds[np.isin(v.index, keep)], v.reference) for e, v in inst.views.items()})
K, R = 5, 2
for i in insts:
    if i.scenario != "S1" or i.refused: continue
    idx = i.views["fused"].index; n = len(idx); sec = i.views["fused"].seconds
    tot = np.zeros(n); cnt = np.zeros(n)
    rng = np.random.default_rng(n)
    for r in range(R):
        perm = rng.permutation(n)
        for s in range(n):
            w = perm[(s + np.arange(K)) % n]
            t = sub(i, idx[w]); _, _, p = judges.evidence_flags(t, ev, fcal)
            pos = np.searchsorted(idx, t.views["fused"].index)
            p = np.clip(p, 1e-12, 1 - 1e-12); tot[pos] += np.log(p / (1 - p)); cnt[pos] += 1
    z = tot / cnt
    for j in np.flatnonzero(z > 0):
        m = metas[i.dialogue_id]
        print(f"{i.dialogue_id} target={m['target_speaker']} turn {idx[j]} speech {sec[j]:.2f} s (median {np.median(sec):.2f}) logit {z[j]:+.2f} clip={i.paths[idx[j]].split('/')[-1][:40]}")
