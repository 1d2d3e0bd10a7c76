import sys
import numpy as np
sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common
from sleuthd.config import EngineConfig
from sleuthd_bench import paired
from sleuthd_bench.robustness import judges
from sleuthd_bench.robustness.cli import length_matching, pitch_matching
split = sys.argv[1]; conds = sys.argv[2].split(",")
_, insts = common.load(split, conds)
insts = [i for i in insts if not i.refused]
fcal, ev = common.load_models()
cfg = EngineConfig()
pitch = pitch_matching(common.ROOT, cfg.pitch_match_octaves)
length = length_matching(common.ROOT, cfg.length_match_ratio)
band, clip, noise, comp, tel = common.MATCH
for c in conds:
    mine = [i for i in insts if i.condition == c]
    a = [judges.record(i, judges.evidence_flags(i, ev, fcal, *common.MATCH, pitch, length)[0]) for i in mine]
    b = [judges.record(i, judges.evidence_flags(i, ev, fcal, band, clip, 0.0, 0.0, tel, pitch, length)[0]) for i in mine]
    ma, mb = judges.metrics(a), judges.metrics(b)
    d = paired.compare("off", b, "served", a).bal
    print(f"{c}: served {ma['bal']:.1f} ({ma['S1']:.1f}/{ma['S2']:.1f}/{ma['S3']:.1f}) -> noise matching off {mb['bal']:.1f} ({mb['S1']:.1f}/{mb['S2']:.1f}/{mb['S3']:.1f}) {d.difference:+.2f} [{d.low:+.2f}, {d.high:+.2f}]", flush=True)
