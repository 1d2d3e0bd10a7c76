"""Which genuine turns do groups of 5 flag on eval's long conditions (S1)?"""
import sys
import numpy as np
sys.path.insert(0, "docs/research/robustness-phase3/expressive")
sys.path.insert(0, "docs/research/robustness-phase3/size")
import common
from groups import group_logits
from sleuthd_bench.robustness import judges
conds = ["c-long-short", "c-long-allshort"]
_, insts = common.load("eval", conds)
metas = common.metas("eval", conds)
fcal, ev = common.load_models()
K, R = 5, 2
for i in insts:
    if i.scenario != "S1" or i.refused: continue
    idx = i.views["fused"].index; n = len(idx); sec = i.views["fused"].seconds
    z = group_logits(i, ev, fcal, K, R)
    for j in np.flatnonzero(z > 0):
        m = metas[i.dialogue_id]
        print(f"{i.dialogue_id} target={m['target_speaker']} turn {idx[j]} speech {sec[j]:.2f} s (median {np.median(sec):.2f}) logit {z[j]:+.2f} clip={i.paths[idx[j]].split('/')[-1][:40]}")
