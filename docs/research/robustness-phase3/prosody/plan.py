"""Which instances prosody matching would re-judge, and the copies that needs.

    python plan.py SPLIT [--root R] [--per N] [--seed S] [--min-dev 0.3]

An instance is a candidate when the served fused `auto` (runs/expressive/turns_<split>_<root>.pkl, asserted there to
equal judges.evidence_flags) flags a turn whose median F0 (YIN cache runs/expressive/f0_<root>.npz) lies >= min-dev
octave from the median of the speaker's other pieces (usable turns and reference), and the server judges it on the
clips as sent (not channel-matched: prosody copies are made of the clips as sent only). --per N keeps a fixed random
subset of N dialogues per condition (seed S). Writes runs/prosody/plan_<split>_<root>.pkl."""
import argparse
import pickle
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common  # noqa: E402
from sleuthd_bench.instances import scenario_turns  # noqa: E402
from sleuthd_bench.manifest import read_manifest  # noqa: E402
from sleuthd_bench.robustness import judges  # noqa: E402
from sleuthd_bench.robustness.cli import _conditions  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("split")
ap.add_argument("--root", type=Path, default=common.ROOT)
ap.add_argument("--per", type=int, default=0)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--min-dev", type=float, default=0.3)
ap.add_argument("--conditions")
ap.add_argument("--full", default="", help="conditions kept whole (their items first)")
ap.add_argument("--matched", action="store_true",
                help="keep instances judged on narrowband copies too (kind 'narrow'; other channel matching skipped)")
ap.add_argument("--out", type=Path, help="plan file (default runs/prosody/plan_<split>_<root>.pkl)")
args = ap.parse_args()
root = args.root
names = args.conditions.split(",") if args.conditions else [
    n for n in _conditions(None) if (root / f"{args.split}-{n}.jsonl").is_file()]
table = pickle.loads(Path(f"runs/expressive/turns_{args.split}_{root.name}.pkl").read_bytes())
_f0 = np.load(f"runs/expressive/f0_{root.name}.npz")
F0 = dict(zip(_f0["paths"].tolist(), _f0["f0"][:, 0].tolist()))
rng = np.random.default_rng(args.seed)
keep = {}
for c in names:
    ids = sorted({r["dialogue"] for r in table[c]})
    sub = set(ids if not args.per or args.per >= len(ids) else rng.choice(ids, args.per, replace=False).tolist())
    keep[c] = set(ids) if c in args.full.split(",") else sub
embs, insts = common.load(args.split, names, root)
lines = {l.dialogue_id: l for n in names for l in read_manifest(root / f"{args.split}-{n}.jsonl")}
served = {(r["dialogue"], r["scenario"]): r for c in names for r in table[c]}
plan = dict(split=args.split, root=str(root), names=names, keep=keep, min_dev=args.min_dev, items=[])
for inst in insts:
    if inst.dialogue_id not in keep[inst.condition]:
        continue
    r = served[(inst.dialogue_id, inst.scenario)]
    if not r["flagged"]:
        continue
    matched = judges.channel_matched(inst, *common.MATCH)
    kind = "sent" if matched is inst else "narrow" if matched.views is inst.narrow_views else "other"
    if kind != "sent" and not (args.matched and kind == "narrow"):
        continue
    line = lines[inst.dialogue_id]
    turns = scenario_turns(line, inst.scenario)
    usable = [int(p) for p in inst.views["fused"].index]
    devs = {}
    for pos in r["flagged"]:
        others = [F0.get(turns[p], np.nan) for p in usable if p != pos] + [F0.get(line.reference, np.nan)]
        others = [o for o in others if np.isfinite(o)]
        mine = F0.get(turns[pos], np.nan)
        devs[pos] = abs(mine - float(np.median(others))) if others and np.isfinite(mine) else np.nan
    if not any(np.isfinite(d) and d >= args.min_dev for d in devs.values()):
        continue
    plan["items"].append(dict(cond=inst.condition, dialogue=inst.dialogue_id, scenario=inst.scenario,
                              turns=list(turns), reference=line.reference, usable=usable,
                              flagged=sorted(r["flagged"]), devs=devs, gold=sorted(inst.gold), kind=kind))
first = args.full.split(",")
plan["items"].sort(key=lambda it: (first.index(it["cond"]) if it["cond"] in first else len(first)))
plan["per"], plan["full"] = args.per, first
out = args.out or Path(f"runs/prosody/plan_{args.split}_{root.name}.pkl")
out.parent.mkdir(parents=True, exist_ok=True)
out.write_bytes(pickle.dumps(plan))
clips = {p for it in plan["items"] for p in [it["reference"]] + [it["turns"][u] for u in it["usable"]]}
print(f"{args.split}: {sum(len(v) for v in keep.values())} dialogues kept, {len(plan['items'])} candidate instances, "
      f"{len(clips)} unique pieces")
from collections import Counter  # noqa: E402
print(Counter((it["cond"]) for it in plan["items"]).most_common())
print(Counter((it["scenario"]) for it in plan["items"]).most_common())
