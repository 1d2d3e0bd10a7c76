import sys
import numpy as np
sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common
from sleuthd.config import EngineConfig
from sleuthd_bench.robustness import judges
from sleuthd_bench.robustness.cli import length_matching, pitch_matching
cond = sys.argv[1] if len(sys.argv) > 1 else "f-fsdd-drift"
_, insts = common.load("eval", [cond])
metas = common.metas("eval", [cond])
fcal, ev = common.load_models()
cfg = EngineConfig()
pitch = pitch_matching(common.ROOT, cfg.pitch_match_octaves)
length = length_matching(common.ROOT, cfg.length_match_ratio)
for i in insts:
    if i.scenario != "S2" or i.refused:
        continue
    f, u, p = judges.evidence_flags(i, ev, fcal, *common.MATCH, pitch, length)
    m = metas[i.dialogue_id]; alt = m["altered_turn"]
    if alt in f:
        continue
    mi = judges.channel_matched(i, *common.MATCH)
    how = "sent" if mi is i else ("narrow" if mi.views is i.narrow_views else "copies")
    idx = i.views["fused"].index
    pj = p[list(idx).index(alt)] if alt in idx else None
    ch = m["meta"]["channels"]
    turns = ch[:5]; intr = ch[6]
    d = common.decompose(mi, ev, fcal)
    j = list(d["index"]).index(alt)
    print(f"{i.dialogue_id} alt={alt} p={pj:.3f} judged on {how} inside={d['inside']} auto={d['auto'][j]:+.2f} zev={d['zev'][j]:+.2f} turns={turns} ref={ch[5]} intruder={intr} target={m['target_speaker']} s2={m['meta']['s2_speaker']} unc={alt in u}")
