import sys
sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common
from sleuthd_bench import paired
from sleuthd_bench.robustness import judges
split = sys.argv[1]; conds = sys.argv[2].split(",")
insts, judge = common.load_served(split, conds)
band, clip, noise, comp, tel = common.MATCH
for c in conds:
    mine = [i for i in insts if i.condition == c]
    a = [judges.record(i, judge(i)[0]) for i in mine]
    b = [judges.record(i, judge(i, (band, clip, 0.0, 0.0, tel))[0]) for i in mine]
    ma, mb = judges.metrics(a), judges.metrics(b)
    d = paired.compare("off", b, "served", a).bal
    print(f"{c}: served {ma['bal']:.1f} ({ma['S1']:.1f}/{ma['S2']:.1f}/{ma['S3']:.1f}) -> noise matching off {mb['bal']:.1f} ({mb['S1']:.1f}/{mb['S2']:.1f}/{mb['S3']:.1f}) {d.difference:+.2f} [{d.low:+.2f}, {d.high:+.2f}]", flush=True)
