"""Two more orders, checked on the choice set after tiers was chosen (not used to choose): the fit probability within
the passing tier, and the fit log-odds. PYTHONPATH=service:tools:. python variants.py runs/ranking-fit/choice.jsonl"""
import json, sys
from collections import defaultdict
from pathlib import Path
import numpy as np
from sleuthd_bench.metrics import rank_candidates
rows = [json.loads(x) for x in Path(sys.argv[1]).read_text().splitlines()]
g = defaultdict(list)
for r in rows: g[Path(r["manifest"]).stem].append(r)
def vs(r):
    L, S, F, st = r["labels"], r["scores"], r["fits"], r["statuses"]
    c = [x == "consistent" for x in st]
    return {
        "today": rank_candidates(L, S, True),
        "tiers": rank_candidates(L, [ci * 10 + s for ci, s in zip(c, S)], True),
        "tiers_fit_in_pass": rank_candidates(L, [ci * 10 + (f if ci else s) for ci, f, s in zip(c, F, S)], True),
        "logit_fit": rank_candidates(L, [np.log(max(f,1e-300)) - np.log(max(1-f,1e-300)) + 1e-6*s for f, s in zip(F, S)], True),
    }
for name, rs in g.items():
    o = [vs(r) for r in rs]
    print(name, len(rs), {k: (round(100*np.mean([x[k][0]=="S1" for x in o]),1), round(100*np.mean([x[k]==["S1","S3","S2"] for x in o]),1)) for k in o[0]})
