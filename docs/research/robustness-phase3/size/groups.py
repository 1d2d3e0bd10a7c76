"""The offline size-matching judgment the screens share: a speaker's usable turns judged as groups of K (runs of K in R
seeded permutations read as rings), each group by the served blend (no channel matching: these are clean clips), each
turn's log-odds averaged over its groups. The same groups as the server patch (/work/notes/size_matching_s28.patch)."""
from dataclasses import replace

import numpy as np
from sleuthd_bench.robustness import judges
from sleuthd_bench.robustness.instances import Turns

LONG = ["c-long-short", "c-long-allshort"]
K, R = 5, 2  # the screen's groups: 5 turns, 2 permutations


def load_long_eval():
    """(instances, manifest lines by dialogue id, today's fused calibration, the evidence calibration) of eval's long
    conditions, what cluster.py and false_alarms.py read (common.py must be importable)."""
    import common

    _, insts = common.load("eval", LONG)
    return insts, common.metas("eval", LONG), *common.load_models()


def only(inst, positions):
    """The instance with only the usable turns at these dialogue positions (the reference kept)."""
    views = {}
    for e, v in inst.views.items():
        keep = np.isin(v.index, positions)
        views[e] = Turns(v.index[keep], v.emb[keep], v.seconds[keep], v.reference)
    return replace(inst, views=views)


def group_logits(inst, ev, fcal, k, rounds):
    """(n,) mean log-odds over the groups of each usable turn (dialogue order of the fused view)."""
    idx = inst.views["fused"].index
    n = len(idx)
    total, count = np.zeros(n), np.zeros(n)
    rng = np.random.default_rng(n)
    for _ in range(rounds):
        order = rng.permutation(n)
        for start in range(n):
            part = only(inst, idx[order[(start + np.arange(k)) % n]])
            _, _, p = judges.evidence_flags(part, ev, fcal)
            at = np.searchsorted(idx, part.views["fused"].index)
            p = np.clip(p, 1e-12, 1 - 1e-12)
            total[at] += np.log(p / (1 - p))
            count[at] += 1
    return total / count
