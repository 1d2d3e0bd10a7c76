"""Prosody matching, judged offline: the served fused `auto` re-judged on WORLD copies where it flags an F0 outlier.

    python judge.py SPLIT [--root R] [--grid] [--variant DESIGN:MODE:DELTA ...] [--dump VARIANT]

Rule (per instance, only on the dialogues plan.py kept): the served judgment (the blend with every channel matching at
the server's defaults; runs/expressive/turns_*.pkl, equal to judges.evidence_flags) flags a turn whose median F0 lies
>= DELTA octave from the median of the speaker's other pieces, and the instance is judged on its clips as sent (not
channel-matched). Then the speaker is judged again, by the same served blend (judges.evidence_flags, channel matching
off since it does not apply), on copies:

- DESIGN ``id``: every piece (usable turns and reference) through WORLD at its own F0 (identity resynthesis), each such
  flagged turn through WORLD with its F0 contour scaled so its median is the speaker's median F0 (median of the
  pieces' WORLD medians, rounded to 1/24 octave): design (2) of the brief, vocoder artefacts shared;
- DESIGN ``raw``: the moved turn's copy among the other pieces as sent (no identity copies; cheaper, artefact not
  shared);
- DESIGN ``all``: every piece moved to the speaker's median F0 (design (1), where copies.py --all-pieces made them).

MODE ``re``: the copies' verdict replaces the served one (as channel matching does); ``un``: only unflag (a turn stays
flagged when the copies' verdict flags it too; nothing is added). Copies that lose a usable turn or the reference: the
served verdict stands (as ChannelMatcher._complete). Paired bootstrap over dialogues, 2000 resamples, 95 %.
"""
import argparse
import pickle
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common  # noqa: E402
from sleuthd_bench import paired  # noqa: E402
from sleuthd_bench.metrics import DetectionRecord  # noqa: E402
from sleuthd_bench.robustness import judges  # noqa: E402
from sleuthd_bench.robustness.embed import fused  # noqa: E402
from sleuthd_bench.robustness.instances import Turns  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("split")
ap.add_argument("--root", type=Path, default=common.ROOT)
ap.add_argument("--grid", action="store_true")
ap.add_argument("--designs", default="id,raw")
ap.add_argument("--variant", action="append", default=[])
ap.add_argument("--dump")
ap.add_argument("--plan", help="plan file name under runs/prosody (default plan_<split>_<root>.pkl)")
ap.add_argument("--modes", default="re,un")
ap.add_argument("--his", default="inf", help="upper bounds on the moved turn's F0 deviation, octave (grid)")
args = ap.parse_args()
root = args.root
plan = pickle.loads(Path(f"runs/prosody/{args.plan or f'plan_{args.split}_{root.name}.pkl'}").read_bytes())
names, keep = plan["names"], plan["keep"]
copies = pickle.loads(Path(f"runs/prosody/copies_{root.name}.pkl").read_bytes())
wmed = pickle.loads(Path(f"runs/prosody/world_{root.name}.pkl").read_bytes())
table = pickle.loads(Path(f"runs/expressive/turns_{args.split}_{root.name}.pkl").read_bytes())
served_flags = {(r["dialogue"], r["scenario"]): r["flagged"] for c in names for r in table[c] if r["dialogue"] in keep[c]}
items = {(it["dialogue"], it["scenario"]): it for it in plan["items"]}
fcal, ev = common.load_models()
embs, insts = common.load(args.split, names, root)
insts = [i for i in insts if i.dialogue_id in keep[i.condition]]
cands = [i for i in insts if (i.dialogue_id, i.scenario) in items]


def moved(it, delta, hi):
    return frozenset(pos for pos in it["flagged"] if np.isfinite(it["devs"][pos]) and delta <= it["devs"][pos] < hi)


def copy_views(inst, it, design, delta, hi=np.inf):
    """The instance's views on prosody copies, or None (nothing to move at this DELTA, or a copy is missing/unusable)."""
    move = moved(it, delta, hi)
    if not move:
        return None
    pieces = [it["turns"][u] for u in it["usable"]] + [it["reference"]]
    meds = [wmed.get(p, np.nan) for p in pieces]
    if not all(np.isfinite(meds)):
        return None
    k = int(round(24 * float(np.median(meds))))
    idx = inst.views["fused"].index
    rows = {e: [] for e in ("ge2e", "campplus")}
    secs = []
    for pos in idx:
        p = inst.views and it["turns"][pos]
        if pos in move or design == "all":
            key = f"{p}#f0{k}"
        elif design == "id":
            key = f"{p}#id"
        else:
            key = None
        if key is None:
            for j, e in enumerate(("ge2e", "campplus")):
                v = inst.views[e]
                rows[e].append(v.emb[int(np.searchsorted(v.index, pos))])
            v = inst.views["fused"]
            secs.append(float(v.seconds[int(np.searchsorted(v.index, pos))]))
            continue
        c = copies.get(key)
        if c is None or c[0] is None or c[1] is None:
            return None
        rows["ge2e"].append(c[0]); rows["campplus"].append(c[1]); secs.append(c[2])
    if design == "raw":
        refs = {e: inst.views[e].reference for e in ("ge2e", "campplus")}
    else:
        c = copies.get(f"{it['reference']}#{'id' if design == 'id' else f'f0{k}'}")
        if c is None or c[0] is None or c[1] is None:
            return None
        refs = {"ge2e": c[0], "campplus": c[1]}
    if any(r is None for r in refs.values()):
        return None
    views = {}
    for e in ("ge2e", "campplus"):
        views[e] = Turns(idx.copy(), np.stack(rows[e]).astype(np.float32), np.array(secs), refs[e])
    fz = np.stack([fused([rows["ge2e"][j], rows["campplus"][j]]) for j in range(len(idx))])
    views["fused"] = Turns(idx.copy(), fz, np.array(secs), fused([refs["ge2e"], refs["campplus"]]))
    return views


_cache = {}


def rejudged(inst, design, delta, hi):
    it = items[(inst.dialogue_id, inst.scenario)]
    key = (inst.dialogue_id, inst.scenario, design, moved(it, delta, hi))
    if key not in _cache:
        views = copy_views(inst, it, design, delta, hi)
        if views is None:
            _cache[key] = None
            return None
        _cache[key] = judges.evidence_flags(replace(inst, views=views), ev, fcal)[0]
    return _cache[key]


def flags_of(inst, variant):
    design, mode, delta, hi = variant
    served = served_flags[(inst.dialogue_id, inst.scenario)]
    if (inst.dialogue_id, inst.scenario) not in items:
        return served
    new = rejudged(inst, design, delta, hi)
    if new is None:
        return served
    return new if mode == "re" else frozenset(served & new)


def records(cond, variant=None):
    return [DetectionRecord(i.dialogue_id, cond, i.scenario, i.gold, f, bool(f))
            for i in insts if i.condition == cond
            for f in [served_flags[(i.dialogue_id, i.scenario)] if variant is None else flags_of(i, variant)]]


served = {c: records(c) for c in names}
mserved = {c: judges.metrics(served[c]) for c in names}
n_dial = sum(len(keep[c]) for c in names)
print(f"{args.split}: {len(names)} conditions, {n_dial} dialogues (plan {args.plan or 'default'}: {plan.get('per') or 'all'} per condition, whole: {','.join(plan.get('full') or []) or '-'}), "
      f"{len(cands)} candidate instances; served mean Bal {np.mean([m['bal'] for m in mserved.values()]):.2f}")


def parse(spec):
    d, m, x, *h = spec.split(":")
    return d, m, float(x), float(h[0]) if h else np.inf


if args.grid:
    for design in args.designs.split(","):
        for mode in args.modes.split(","):
          for hi in [float(h) for h in args.his.split(",")]:
            for delta in (0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7):
                if delta >= hi:
                    continue
                v = (design, mode, delta, hi)
                ms = {c: judges.metrics(records(c, v)) for c in names}
                d = {c: ms[c]["bal"] - mserved[c]["bal"] for c in names}
                worst = min(d, key=d.get)
                s2 = {c: ms[c]["S2"] - mserved[c]["S2"] for c in names}
                ws2 = min(s2, key=s2.get)
                print(f"  {design}:{mode}:{delta:g}:{hi:<5g} mean Bal {np.mean([m['bal'] for m in ms.values()]):6.2f} "
                      f"({np.mean(list(d.values())):+.2f}); worst {worst} {d[worst]:+.2f}; worst S2 {ws2} {s2[ws2]:+.1f}; "
                      f"b-espeak-expressive {d.get('b-espeak-expressive', np.nan):+.2f}; "
                      f"S1/S2/S3 {np.mean([m['S1'] for m in ms.values()]):.1f}/{np.mean([m['S2'] for m in ms.values()]):.1f}/"
                      f"{np.mean([m['S3'] for m in ms.values()]):.1f}", flush=True)

if args.dump:
    v = parse(args.dump)
    print(f"\nflags changed by {args.dump}")
    for i in cands:
        s, f = served_flags[(i.dialogue_id, i.scenario)], flags_of(i, v)
        if s != f:
            it = items[(i.dialogue_id, i.scenario)]
            print(f"  {i.condition:20s} {i.dialogue_id:32s} {i.scenario} gold {sorted(i.gold)} served {sorted(s)} -> {sorted(f)}"
                  f"  devs {{{', '.join(f'{p}: {d:.2f}' for p, d in it['devs'].items())}}}")

for spec in args.variant:
    v = parse(spec)
    print(f"\n{args.split}: prosody matching {spec} against the served fused `auto` (paired over dialogues, 95 % bootstrap)")
    common.paired_table(spec, names, keep, served, mserved, lambda c, v=v: records(c, v))
