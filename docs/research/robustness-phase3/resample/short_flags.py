"""The consistent speakers (S1) the served default flags under the short-turn conditions (eval, whole references):
which turn, and every usable turn's speech seconds. Output: short_flags.txt."""
import sys, json
sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common
import numpy as np
from sleuthd_bench.robustness import judges
from sleuthd_bench.robustness.cli import pitch_matching
from sleuthd.config import EngineConfig
fcal, ev = common.load_models()
pitch = pitch_matching(common.ROOT, EngineConfig().pitch_match_octaves)
for cond in ("c-mixed", "c-short", "g-kokoro-short"):
    _, insts = common.load("eval", [cond])
    fl = {}
    for i in insts:
        f = judges.evidence_flags(i, ev, fcal, *common.MATCH, pitch)[0]
        if i.scenario == "S1" and f:
            v = i.views["fused"]
            secs = dict(zip(v.index.tolist(), v.seconds.tolist()))
            print(cond, i.dialogue_id, "flag", sorted(f), "speech s", {k: round(x, 1) for k, x in secs.items()})
