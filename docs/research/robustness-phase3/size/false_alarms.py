"""Which genuine turns do groups of 5 flag on eval's long conditions (S1)?"""
import sys
import numpy as np
sys.path.insert(0, "docs/research/robustness-phase3/expressive")
sys.path.insert(0, "docs/research/robustness-phase3/size")
from groups import K, R, group_logits, load_long_eval
from sleuthd_bench.robustness import judges
insts, metas, fcal, ev = load_long_eval()
for i in insts:
    if i.scenario != "S1" or i.refused: continue
    idx = i.views["fused"].index; n = len(idx); sec = i.views["fused"].seconds
    z = group_logits(i, ev, fcal, K, R)
    for j in np.flatnonzero(z > 0):
        m = metas[i.dialogue_id]
        print(f"{i.dialogue_id} target={m['target_speaker']} turn {idx[j]} speech {sec[j]:.2f} s (median {np.median(sec):.2f}) logit {z[j]:+.2f} clip={i.paths[idx[j]].split('/')[-1][:40]}")
