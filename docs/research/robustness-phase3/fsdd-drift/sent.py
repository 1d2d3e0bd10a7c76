import sys
import numpy as np
sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common
from sleuthd.config import EngineConfig
from sleuthd_bench.robustness import judges
cond = sys.argv[1] if len(sys.argv) > 1 else "f-fsdd-drift"
_, insts = common.load("eval", [cond])
metas = common.metas("eval", [cond])
fcal, ev = common.load_models()
rows = {}
for i in insts:
    if i.refused: continue
    alt = metas[i.dialogue_id]["altered_turn"]
    sent = judges.evidence_flags(i, ev, fcal)  # as sent: no matching
    served = judges.evidence_flags(i, ev, fcal, *common.MATCH)
    idx = list(i.views["fused"].index)
    ps, pm = sent[2], served[2]
    if i.scenario == "S1":
        rows.setdefault("S1", []).append((max(ps), max(pm), bool(sent[0]), bool(served[0])))
    else:
        j = idx.index(alt)
        rows.setdefault(i.scenario, []).append((ps[j], pm[j], alt in sent[0], alt in served[0]))
for sc, r in rows.items():
    r = np.array(r, float)
    print(f"{sc}: as sent flagged {r[:,2].mean()*100:.1f} %, channel matched {r[:,3].mean()*100:.1f} %; ", end="")
    if sc == "S1":
        print(f"max p as sent > 0.9: {np.mean(r[:,0] > 0.9)*100:.1f} %")
    else:
        miss = r[:,3] == 0
        print(f"missed when matched: {miss.sum():.0f}, their p as sent: {np.round(r[miss,0],2).tolist()}")
