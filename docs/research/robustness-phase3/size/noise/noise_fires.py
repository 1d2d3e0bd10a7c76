import sys
import numpy as np
sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common
from sleuthd_bench.robustness import judges
split = sys.argv[1]; conds = sys.argv[2].split(",")
_, insts = common.load(split, conds)
for c in conds:
    mine = [i for i in insts if i.condition == c and not i.refused]
    kinds = {}
    for i in mine:
        m = judges.channel_matched(i, *common.MATCH)
        if m is i: k = "sent"
        elif m.views is i.narrow_views: k = "narrow"
        elif i.noise is not None and m.views is i.noise_views: k = "noise"
        else: k = "other copies"
        kinds[k] = kinds.get(k, 0) + 1
    snr = [i.noise[1] - i.noise[0] for i in mine if i.noise is not None]
    print(c, len(mine), kinds, f"SNR spread median {np.median(snr):.1f} dB, 90th {np.percentile(snr, 90):.1f}")
