"""Screen: channel matching clears a turn flagged as sent only when its probability on the copies is below lambda.

PYTHONPATH=service:tools:. python docs/research/robustness-phase3/train-chosen/clear_clearly.py SPLIT [LAMBDAS]

Prints, per condition, the served default's Bal and the change at each lambda (paired over whole voices), and the
mean over the split's conditions. The served and as-sent verdicts are cached under runs/train-chosen/ (git-ignored)."""
import os
import pickle
import sys

import numpy as np

sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common
from sleuthd_bench import paired
from sleuthd_bench.robustness import judges
from sleuthd_bench.robustness.build import CONDITIONS

split = sys.argv[1]
lams = [float(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "0.1,0.15,0.2,0.25,0.3,0.35,0.4").split(",")]
conds = [c.name for c in CONDITIONS if os.path.exists(f"data/robustness/{split}-{c.name}.jsonl")]
os.makedirs("runs/train-chosen", exist_ok=True)
cache = f"runs/train-chosen/clear_clearly_{split}.pkl"
insts, judge = common.load_served(split, conds)
if os.path.exists(cache):
    judged = pickle.load(open(cache, "rb"))
else:
    judged, unmatched = {}, set()
    for k, i in enumerate(insts):
        served, _, p = judge(i)
        m = judges.channel_matched(i, *common.MATCH)
        if m is i:
            judged[(i.dialogue_id, i.scenario)] = (served, None, None)
            continue
        # As sent: channel matching off, pitch and length matching as the server would apply them to such a speaker.
        # The matrix's caches hold moved and cut copies only for the instances the served default matches that way, so
        # where a copy is missing the as-sent verdict is taken without pitch and length matching (counted).
        try:
            sent = judge(i, common.AS_SENT)[0]
        except LookupError:
            sent = judge(i, common.AS_SENT, rejudging=False)[0]
            unmatched.add((i.dialogue_id, i.scenario))
        index = judges.evidence_inputs(m)[3]
        judged[(i.dialogue_id, i.scenario)] = (served, sent, dict(zip((int(t) for t in index), p.tolist())))
        if k % 1000 == 0:
            print(f"{k}/{len(insts)}", file=sys.stderr)
    pickle.dump(judged, open(cache, "wb"))
    print(f"as-sent verdicts without pitch/length matching (copies not embedded): {len(unmatched)} of "
          f"{sum(v[1] is not None for v in judged.values())} channel-matched instances")


def records(cond, lam):
    keep = None if lam is None else (lambda i, sent, p: {t for t in sent if p.get(t, 0.0) >= lam})
    return common.kept_records(insts, judged, cond, keep)


voices = {i.dialogue_id: i.target.partition("@")[0] for i in insts}
base = {c: records(c, None) for c in conds}
mixed = {c: sum(judged[(i.dialogue_id, i.scenario)][1] is not None for i in insts if i.condition == c) for c in conds}
print(f"{split}: served default mean Bal over {len(conds)} conditions "
      f"{np.mean([judges.metrics(base[c])['bal'] for c in conds]):.2f}")
for lam in lams:
    deltas, lines = [], []
    for c in conds:
        new = records(c, lam)
        a, b = judges.metrics(base[c]), judges.metrics(new)
        deltas.append(b["bal"] - a["bal"])
        if b["bal"] != a["bal"]:
            d = paired.compare("new", new, "served", base[c], groups={i: voices[i] for i in {r.dialogue_id for r in new}}).bal
            lines.append(f"  {c} ({mixed[c]} channel-matched): {a['bal']:.1f} ({a['S1']:.1f}/{a['S2']:.1f}/{a['S3']:.1f}) -> "
                         f"{b['bal']:.1f} ({b['S1']:.1f}/{b['S2']:.1f}/{b['S3']:.1f}) {d.difference:+.2f} [{d.low:+.2f}, {d.high:+.2f}]")
    print(f"lambda {lam}: mean {np.mean(deltas):+.3f}, worst {min(deltas):+.2f}")
    print("\n".join(lines))
