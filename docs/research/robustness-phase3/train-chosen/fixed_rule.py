"""The clean control's train-chosen rule (GE2E centroid distance above 0.057) on every eval condition: what a threshold
tuned on clean espeak-ng does elsewhere.

PYTHONPATH=service:tools:. python docs/research/robustness-phase3/train-chosen/fixed_rule.py"""
import sys
sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common
from sleuthd_bench.robustness import judges
from sleuthd_bench.robustness.build import CONDITIONS
import os
conds = [c.name for c in CONDITIONS if os.path.exists(f"data/robustness/eval-{c.name}.jsonl")]
_, insts = common.load("eval", conds)
insts = [i for i in insts if not i.refused]
for c in conds:
    recs = [judges.record(i, judges.paper_flags(i.views["ge2e"], "centroid", 0.057)) for i in insts if i.condition == c]
    m = judges.metrics(recs)
    print(f"{c}: ge2e centroid @0.057 Bal {m['bal']:.1f} ({m['S1']:.1f}/{m['S2']:.1f}/{m['S3']:.1f})")
