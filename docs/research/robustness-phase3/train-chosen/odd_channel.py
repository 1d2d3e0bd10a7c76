"""Screen: channel matching clears a turn flagged as sent only when that turn's channel is odd for its speaker (its
bandwidth, clipped plateau fraction or SNR away from the median of the speaker's usable pieces by the matching
triggers); a flagged turn whose channel is like the rest keeps its flag. Reads the as-sent and served verdicts that
clear_clearly.py cached (run it first on the same split).

PYTHONPATH=service:tools:. python docs/research/robustness-phase3/train-chosen/odd_channel.py SPLIT [--rest]

--rest (the second try): a turn is odd unless its channel is like that of all but at most one of the speaker's other
usable pieces (turns and reference) on every measure, within the same triggers."""
import os
import pickle
import sys

import numpy as np

sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common
from sleuthd_bench import paired
from sleuthd_bench.robustness import embed, judges
from sleuthd_bench.robustness.build import CONDITIONS

split = sys.argv[1]
rest = "--rest" in sys.argv[2:]
conds = [c.name for c in CONDITIONS if os.path.exists(f"data/robustness/{split}-{c.name}.jsonl")]
judged = pickle.load(open(f"runs/train-chosen/clear_clearly_{split}.pkl", "rb"))
insts, _ = common.load_served(split, conds)
hz, plateaus, snrs, _ = embed.load_channels(common.ROOT)
band, spread, noise_db = common.MATCH[0], common.MATCH[1], common.MATCH[2]


def odd_turns(inst):
    """Dialogue positions of the usable turns whose channel is odd for the speaker (or not measured)."""
    index = inst.views["fused"].index
    pieces = [inst.paths[k] for k in index] + [inst.reference_path]
    odd = set()
    measures = (
        ({p: np.log2(hz[p]) if hz.get(p, 0) > 0 else np.nan for p in pieces}, band),
        ({p: plateaus.get(p, np.nan) for p in pieces}, spread),
        ({p: snrs.get(p, np.nan) for p in pieces}, noise_db),
    )
    if rest:
        for at, k in enumerate(index):
            for values, far in measures:
                v = values[pieces[at]]
                others = [values[q] for j, q in enumerate(pieces) if j != at]
                unlike = sum(not (np.isfinite(v) and np.isfinite(o) and abs(v - o) < far) for o in others)
                if unlike > 1:
                    odd.add(int(k))
        return odd
    for values, far in measures:
        finite = [v for v in values.values() if np.isfinite(v)]
        median = float(np.median(finite)) if finite else np.nan
        for k in index:
            v = values[inst.paths[k]]
            if not np.isfinite(v) or not np.isfinite(median) or abs(v - median) >= far:
                odd.add(int(k))
    return odd


def records(cond, rule):
    return common.kept_records(insts, judged, cond, (lambda i, sent, p: set(sent) - odd_turns(i)) if rule else None)


voices = {i.dialogue_id: i.target.partition("@")[0] for i in insts}
deltas = []
print(f"{split}: served default mean Bal over {len(conds)} conditions, and the rule")
for c in conds:
    base, new = records(c, False), records(c, True)
    a, b = judges.metrics(base), judges.metrics(new)
    deltas.append(b["bal"] - a["bal"])
    if b["bal"] != a["bal"]:
        d = paired.compare("new", new, "served", base, groups={r.dialogue_id: voices[r.dialogue_id] for r in new}).bal
        print(f"  {c}: {a['bal']:.1f} ({a['S1']:.1f}/{a['S2']:.1f}/{a['S3']:.1f}) -> {b['bal']:.1f} "
              f"({b['S1']:.1f}/{b['S2']:.1f}/{b['S3']:.1f}) {d.difference:+.2f} [{d.low:+.2f}, {d.high:+.2f}]")
print(f"mean change {np.mean(deltas):+.3f}, worst {min(deltas):+.2f}")
