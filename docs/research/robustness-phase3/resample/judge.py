"""Pitch-and-envelope matching, judged offline: the served fused `auto` judged again where it flags a turn whose F0
lies DELTA..HI octave from the speaker's other pieces, with that turn replaced by its resampled copy (copies.py).

    python judge.py SPLIT [--root R] [--grid] [--variant MODE:DELTA:HI ...] [--dump MODE:DELTA:HI]

The served judgment is the blend with every channel matching at the server's defaults (runs/expressive/turns_*.pkl,
equal to judges.evidence_flags). An instance judged on its clips as sent is judged again on them with the moved
turns' copies in their place; one judged on narrowband copies, on those with the moved turns' narrowband copies;
instances under other channel matching are left as served. MODE ``re``: the new verdict replaces the served one;
``un``: it may only unflag. A copy that is unusable leaves the served verdict. Paired bootstrap over dialogues, 2000
resamples, 95 %; the mean over conditions resamples each condition's dialogues on their own."""
import argparse
import pickle
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, "docs/research/robustness-phase3/expressive")
sys.path.insert(0, "docs/research/robustness-phase3/resample")
import common  # noqa: E402
from copies import key_of, load_f0, shifts  # noqa: E402
from sleuthd_bench import paired  # noqa: E402
from sleuthd_bench.metrics import DetectionRecord  # noqa: E402
from sleuthd_bench.robustness import judges  # noqa: E402
from sleuthd_bench.robustness.embed import fused  # noqa: E402
from sleuthd_bench.robustness.instances import Turns  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("split")
ap.add_argument("--root", type=Path, default=common.ROOT)
ap.add_argument("--grid", action="store_true")
ap.add_argument("--grid-guard", action="store_true")
ap.add_argument("--variant", action="append", default=[])
ap.add_argument("--dump", action="append", default=[])
ap.add_argument("--conditions")
args = ap.parse_args()
root = args.root
plan = pickle.loads(Path(f"runs/resample/plan_{args.split}_{root.name}.pkl").read_bytes())
names, keep = plan["names"], plan["keep"]
if args.conditions:
    names = [n for n in names if n in args.conditions.split(",")]
copies = pickle.loads(Path(f"runs/resample/copies_{root.name}.pkl").read_bytes())
table = pickle.loads(Path(f"runs/expressive/turns_{args.split}_{root.name}.pkl").read_bytes())
served_flags = {(r["dialogue"], r["scenario"]): r["flagged"] for c in names for r in table[c] if r["dialogue"] in keep[c]}
items = {(it["dialogue"], it["scenario"]): it for it in plan["items"]}
F0 = load_f0(root)
fcal, ev = common.load_models()
_, insts = common.load(args.split, names, root)
insts = [i for i in insts if i.dialogue_id in keep[i.condition]]
cands = [i for i in insts if (i.dialogue_id, i.scenario) in items]
ENC = ("ge2e", "campplus")


def base_views(inst, it):
    return inst.narrow_views if it["kind"] == "narrow" else inst.views


def copy_views(inst, it, delta, hi):
    move = shifts(it, F0, delta, hi)
    if not move:
        return None
    base = base_views(inst, it)
    idx = base["fused"].index
    rows = {e: [] for e in ENC}
    secs = []
    for pos in idx:
        j = int(np.searchsorted(idx, pos))
        if pos in move:
            c = copies.get(key_of(it["turns"][pos], move[pos], it["kind"]))
            if c is None or c[0] is None or c[1] is None:
                return None
            rows["ge2e"].append(c[0]); rows["campplus"].append(c[1]); secs.append(c[2])
            continue
        for e in ENC:
            v = base[e]
            rows[e].append(v.emb[int(np.searchsorted(v.index, pos))])
        secs.append(float(base["fused"].seconds[j]))
    views = {e: Turns(idx.copy(), np.stack(rows[e]).astype(np.float32), np.array(secs), base[e].reference) for e in ENC}
    fz = np.stack([fused([rows["ge2e"][j], rows["campplus"][j]]) for j in range(len(idx))])
    views["fused"] = Turns(idx.copy(), fz, np.array(secs), base["fused"].reference)
    return views, move


_cache = {}


def rejudged(inst, delta, hi):
    it = items[(inst.dialogue_id, inst.scenario)]
    move = shifts(it, F0, delta, hi)
    key = (inst.dialogue_id, inst.scenario, tuple(sorted(move.items())))
    if key not in _cache:
        cv = copy_views(inst, it, delta, hi)
        _cache[key] = None if cv is None else judges.evidence_flags(replace(inst, views=cv[0]), ev, fcal)[0]
    return _cache[key]


# The served verdict reproduced from the views this script starts from (no copy): the replay is faithful.
for inst in cands[:: max(1, len(cands) // 150)]:
    it = items[(inst.dialogue_id, inst.scenario)]
    got = judges.evidence_flags(replace(inst, views=base_views(inst, it)), ev, fcal)[0]
    assert got == served_flags[(inst.dialogue_id, inst.scenario)], (inst.dialogue_id, inst.scenario, got)


def margins(inst, delta, hi):
    """(encoder -> min over the moved turns of: the copy's mean cosine to the speaker's other pieces - the speaker's
    level, the median over those other pieces of their mean cosine to the rest), from the copies' views."""
    it = items[(inst.dialogue_id, inst.scenario)]
    cv = copy_views(inst, it, delta, hi)
    if cv is None:
        return None
    views, move = cv
    out = {}
    for e in ENC:
        t = views[e]
        pool = t.emb if t.reference is None else np.vstack([t.emb, t.reference[None]])
        g = pool.astype(np.float64) @ pool.T.astype(np.float64)
        moved_rows = [int(np.searchsorted(t.index, pos)) for pos in move]
        rest = [j for j in range(len(pool)) if j not in moved_rows]
        sub = g[np.ix_(rest, rest)]
        level = float(np.median((sub.sum(1) - np.diag(sub)) / max(len(rest) - 1, 1)))
        out[e] = min(float(g[j, rest].mean()) - level for j in moved_rows)
    return out


def flags_of(inst, variant):
    mode, delta, hi, guard = variant
    served = served_flags[(inst.dialogue_id, inst.scenario)]
    if (inst.dialogue_id, inst.scenario) not in items:
        return served
    new = rejudged(inst, delta, hi)
    if new is None:
        return served
    if np.isfinite(guard) and new != served:
        m = margins(inst, delta, hi)
        if m is None or m["campplus"] < guard:
            return served
    return new if mode == "re" else frozenset(served & new)


def records(cond, variant=None):
    return [DetectionRecord(i.dialogue_id, cond, i.scenario, i.gold, f, bool(f))
            for i in insts if i.condition == cond
            for f in [served_flags[(i.dialogue_id, i.scenario)] if variant is None else flags_of(i, variant)]]


served = {c: records(c) for c in names}
mserved = {c: judges.metrics(served[c]) for c in names}
print(f"{args.split}: {len(names)} conditions, {sum(len(keep[c]) for c in names)} dialogues, {len(cands)} candidate "
      f"instances; served mean Bal {np.mean([m['bal'] for m in mserved.values()]):.2f}")


def parse(spec):
    """MODE:DELTA:HI[:GUARD]: GUARD, when given, keeps the served verdict unless the moved turn's copy sits at
    least GUARD (a cosine difference, e.g. -0.05) from the speaker's CAM++ level (see margins)."""
    m, x, h, *g = spec.split(":")
    return m, float(x), float(h), float(g[0]) if g else -np.inf


def grid_line(label, v, means=False):
    ms = {c: judges.metrics(records(c, v)) for c in names}
    d = {c: ms[c]["bal"] - mserved[c]["bal"] for c in names}
    worst = min(d, key=d.get)
    s2 = {c: ms[c]["S2"] - mserved[c]["S2"] for c in names}
    ws2 = min(s2, key=s2.get)
    tail = (f"; S1/S2/S3 {np.mean([m['S1'] for m in ms.values()]):.1f}/{np.mean([m['S2'] for m in ms.values()]):.1f}/"
            f"{np.mean([m['S3'] for m in ms.values()]):.1f}") if means else ""
    print(f"  {label}  mean Bal {np.mean([m['bal'] for m in ms.values()]):6.2f} "
          f"({np.mean(list(d.values())):+.2f}); worst {worst} {d[worst]:+.2f}; worst S2 {ws2} {s2[ws2]:+.1f}; "
          f"b-espeak-sox {d.get('b-espeak-sox', np.nan):+.2f}{tail}", flush=True)


if args.grid_guard:
    for delta, hi in ((0.15, 0.5), (0.15, 0.4), (0.2, 0.5)):
        for guard in (-np.inf, -0.15, -0.1, -0.075, -0.05, -0.025, 0.0, 0.025):
            grid_line(f"un:{delta:g}:{hi:g}:{guard:g}", ("un", delta, hi, guard))

if args.grid:
    for mode in ("un", "re"):
        for hi in (0.4, 0.5, 0.6, 0.7):
            for delta in (0.15, 0.2, 0.25, 0.3, 0.35):
                if delta < hi:
                    grid_line(f"{mode}:{delta:g}:{hi:g}", (mode, delta, hi, -np.inf), means=True)

for spec in args.dump:
    v = parse(spec)
    print(f"\nflags changed by {spec}")
    for i in cands:
        s, f = served_flags[(i.dialogue_id, i.scenario)], flags_of(i, v)
        if s != f:
            it = items[(i.dialogue_id, i.scenario)]
            print(f"  {i.condition:20s} {i.dialogue_id:28s} {i.scenario} gold {sorted(i.gold)} served {sorted(s)} -> "
                  f"{sorted(f)}  shifts {shifts(it, F0, v[1], v[2])} kind {it['kind']}")

for spec in args.variant:
    v = parse(spec)
    print(f"\n{args.split}: resampled copies {spec} against the served fused `auto` (paired over dialogues, 95 % bootstrap)")
    common.paired_table(spec, names, keep, served, mserved, lambda c, v=v: records(c, v))

if args.dump:
    print("\nchanged instances: the moved turn's mean cosine to the speaker's other pieces (GE2E / CAM++) as judged, "
          "then on its copy; the speaker's level (median leave-one-out cosine of the other pieces)")
    for spec in args.dump:
        v = parse(spec)
        for i in cands:
            s, f = served_flags[(i.dialogue_id, i.scenario)], flags_of(i, v)
            if s == f:
                continue
            it = items[(i.dialogue_id, i.scenario)]
            base = base_views(i, it)
            cv, move = copy_views(i, it, v[1], v[2])
            out = []
            for e in ENC:
                for views in (base, cv):
                    t = views[e]
                    pool = t.emb if t.reference is None else np.vstack([t.emb, t.reference[None]])
                    g = pool @ pool.T
                    for pos in move:
                        j = int(np.searchsorted(t.index, pos))
                        out.append(float((g[j].sum() - g[j, j]) / (len(pool) - 1)))
                others = [j for j in range(len(base[e].index)) if base[e].index[j] not in move]
                pool = base[e].emb[others]
                if base[e].reference is not None:
                    pool = np.vstack([pool, base[e].reference[None]])
                g = pool @ pool.T
                out.append(float(np.median((g.sum(1) - 1) / (len(pool) - 1))))
            print(f"  {i.condition:20s} {i.scenario} {'GOOD' if i.scenario == 'S1' else 'BAD '} shift {list(move.values())} "
                  f"ge2e {out[0]:.3f}->{out[1]:.3f} (lvl {out[2]:.3f})  campplus {out[3]:.3f}->{out[4]:.3f} (lvl {out[5]:.3f})")
