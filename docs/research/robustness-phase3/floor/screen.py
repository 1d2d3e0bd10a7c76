"""Screen: an absolute floor on the clips as sent, beside the served judgment. A turn whose CAM++ (or GE2E) cosine to
the centroid of its speaker's other pieces, on the clips as sent (no channel matching), lies below F is flagged
whatever the served judgment says; everything else as served. The S2 bar's misses (f-fsdd-drift: opposite-gender
intruders cleared on degraded copies) are what it is for.

PYTHONPATH=service:tools:. python docs/research/robustness-phase3/floor/screen.py train [--grid] [--variant ENC:F ...]
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "expressive"))
from common import MATCH, load, load_models, paired_table  # noqa: E402
from sleuthd.judgment.evidence import pool_evidence  # noqa: E402
from sleuthd_bench.robustness import judges  # noqa: E402

from common import threshold_screen_args  # noqa: E402


def own_as_sent(inst, enc):
    grams, has_ref, _, index = judges.evidence_inputs(inst)
    if len(index) == 0 or len(grams[enc]) < 2:
        return index, np.zeros(0)
    return index, pool_evidence(grams[enc], has_ref)["own"]


def main() -> None:
    args, names = threshold_screen_args(("--floor", {"action": "append", "default": []}))
    fcal, shipped = load_models()
    _, insts = load(args.split, names, args.root)
    by = {}
    for i in insts:
        by.setdefault(i.condition, []).append(i)
    served, base_flags, owns = {}, {}, {}
    for c in names:
        served[c], base_flags[c], owns[c] = [], [], []
        for i in by[c]:
            f = judges.evidence_flags(i, shipped, fcal, *MATCH)[0]
            base_flags[c].append(f)
            served[c].append(judges.record(i, f))
            owns[c].append({e: own_as_sent(i, e) for e in ("campplus", "ge2e")})
    mserved = {c: judges.metrics(served[c]) for c in names}

    def records(c, enc, floor):
        out = []
        for i, f, o in zip(by[c], base_flags[c], owns[c]):
            index, own = o[enc]
            extra = frozenset(int(k) for k in index[own < floor]) if len(own) else frozenset()
            out.append(judges.record(i, f | extra))
        return out

    # Where the S1 turns' and the S2 intruders' cosines lie, as sent (per encoder, every condition together)
    for enc in ("campplus", "ge2e"):
        s1 = np.concatenate([o[enc][1] for c in names for i, o in zip(by[c], owns[c]) if i.scenario == "S1"])
        s2 = []
        for c in names:
            for i, o in zip(by[c], owns[c]):
                if i.scenario == "S2":
                    index, own = o[enc]
                    s2 += [float(v) for k, v in zip(index, own) if int(k) in i.gold]
        s1q = np.quantile(s1, [0, 0.001, 0.005, 0.01])
        print(f"{enc}: S1 turns min / 0.1 % / 0.5 % / 1 %: {' / '.join(f'{v:.3f}' for v in s1q)}; "
              f"S2 intruders below those: {[int(np.sum(np.array(s2) < v)) for v in s1q]} of {len(s2)}")
    if args.grid:
        print("\n| floor | mean Bal | S1 lost | S2 won | S3 won |")
        for enc in ("campplus", "ge2e"):
            for floor in (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35):
                tot = np.zeros(4)
                bal = []
                for c in names:
                    rv = records(c, enc, floor)
                    bal.append(judges.metrics(rv)["bal"])
                    for a, r in zip(served[c], rv):
                        if a.pred_inconsistent != r.pred_inconsistent:
                            tot[{"S1": 0, "S2": 1, "S3": 2}[a.scenario]] += 1
                print(f"| {enc}:{floor:g} | {np.mean(bal):.2f} (served {np.mean([mserved[c]['bal'] for c in names]):.2f}) "
                      f"| {int(tot[0])} | {int(tot[1])} | {int(tot[2])} |", flush=True)
    for spec in args.floor:
        enc, _, floor = spec.partition(":")
        print(f"\n## floor {spec}\n")
        paired_table(spec, names, by, served, mserved, lambda c: records(c, enc, float(floor)))


if __name__ == "__main__":
    main()
