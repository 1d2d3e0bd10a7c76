"""Embed the WORLD prosody copies a plan (plan.py) needs, through sleuthd.api.SpeakerEncoder (ge2e, campplus).

    python copies.py SPLIT [--root R] [--method harvest|dio] [--min-dev 0.3]

For every candidate instance: each piece (usable turns + reference) is analysed once (WORLD medians cached); its
identity copy (F0 unchanged, same vocoder) key ``<path>#id``; each flagged turn with YIN deviation >= min-dev gets a
moved copy at the speaker's median F0 (median of the pieces' WORLD medians, flagged turn included), rounded to 1/24
octave, key ``<path>#f0<k>`` with k = round(24*log2 Hz); design (1) copies of every piece at that target too
(--all-pieces). Cache: runs/prosody/copies_<root>.pkl {key: (ge2e, campplus, speech_s)} and world_<root>.pkl
{path: WORLD median log2 F0}; CPU seconds per analysis / copy are logged."""
import argparse
import pickle
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, "docs/research/robustness-phase3/prosody")
import world  # noqa: E402
from sleuthd.api import SpeakerEncoder  # noqa: E402
from sleuthd.domain import AudioInput  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("split")
ap.add_argument("--root", type=Path, default=Path("data/robustness"))
ap.add_argument("--method", default="harvest")
ap.add_argument("--min-dev", type=float, default=0.3)
ap.add_argument("--all-pieces", action="store_true")
ap.add_argument("--conditions")
ap.add_argument("--plan", help="plan file name under runs/prosody (default plan_<split>_<root>.pkl)")
ap.add_argument("--hi", type=float, default=np.inf, help="only turns with min-dev <= deviation < hi (and their items)")
ap.add_argument("--first", default="b-espeak-expressive,b-espeak-sox,x-de-expressive-2s",
                help="with --all-pieces: these conditions' items first")
args = ap.parse_args()
root = args.root
plan = pickle.loads(Path(f"runs/prosody/{args.plan or f'plan_{args.split}_{root.name}.pkl'}").read_bytes())
items = plan["items"]
if args.conditions:
    items = [it for it in items if it["cond"] in args.conditions.split(",")]
if np.isfinite(args.hi):
    items = [it for it in items if any(np.isfinite(d) and args.min_dev <= d < args.hi for d in it["devs"].values())]
if args.all_pieces:  # design (1): only instances with a turn to move at this min-dev, key conditions first
    items = [it for it in items if any(np.isfinite(d) and d >= args.min_dev for d in it["devs"].values())]
    first = args.first.split(",")
    items.sort(key=lambda it: first.index(it["cond"]) if it["cond"] in first else len(first))
cpath, wpath = Path(f"runs/prosody/copies_{root.name}.pkl"), Path(f"runs/prosody/world_{root.name}.pkl")
copies = pickle.loads(cpath.read_bytes()) if cpath.exists() else {}
wmed = pickle.loads(wpath.read_bytes()) if wpath.exists() else {}
encs = {e: SpeakerEncoder.load(Path("models"), encoder=e) for e in ("ge2e", "campplus")}
stats = dict(analysis=0.0, synth=0.0, embed=0.0, n_an=0, n_copy=0, audio_s=0.0)


def targets(it):
    """(key -> (path, shift octaves)) for the copies this instance needs; None when a piece has no voiced F0."""
    pieces = [it["turns"][u] for u in it["usable"]] + [it["reference"]]
    meds = [wmed.get(p, np.nan) for p in pieces]
    if not all(np.isfinite(meds)):
        return None
    k = int(round(24 * float(np.median(meds))))
    need = {f"{p}#id": (p, 0.0) for p in pieces}
    move = [it["turns"][pos] for pos in it["flagged"]
            if np.isfinite(it["devs"][pos]) and args.min_dev <= it["devs"][pos] < args.hi]
    for p in (pieces if args.all_pieces else move):
        need[f"{p}#f0{k}"] = (p, k / 24 - wmed[p])
    return need


def flush():
    cpath.write_bytes(pickle.dumps(copies))
    wpath.write_bytes(pickle.dumps(wmed))


last = time.monotonic()
t_start = time.monotonic()
ana = {}


def analyse(p):
    """WORLD analysis of one piece, timed, kept in ``ana`` (F0, envelope, aperiodicity, peak)."""
    t0 = time.process_time()
    x = world.decode(root / p)
    f0, sp, ap_ = world.analyse(x, args.method)
    stats["analysis"] += time.process_time() - t0
    stats["n_an"] += 1
    stats["audio_s"] += len(x) / world.SR
    ana[p] = (f0, sp, ap_, float(np.max(np.abs(x))) or 0.5)


for n, it in enumerate(items):
    pieces = [it["turns"][u] for u in it["usable"]] + [it["reference"]]
    todo_pieces = [p for p in pieces if p not in wmed]
    need0 = None
    # analyse what is needed (only pieces without a WORLD median or whose copies are missing)
    for p in pieces:
        if p in ana:
            continue
        if p in wmed:
            continue
        analyse(p)
        wmed[p] = world.median_f0(ana[p][0])
    need = targets(it)
    if need is None:
        continue
    todo = {k: v for k, v in need.items() if k not in copies}
    if todo:
        wavs = []
        for key, (p, shift) in todo.items():
            if p not in ana:
                analyse(p)
            f0, sp, ap_, peak = ana[p]
            t0 = time.process_time()
            wavs.append(AudioInput(world.wav_bytes(world.synth(f0, sp, ap_, shift, peak))))
            stats["synth"] += time.process_time() - t0
        t0 = time.process_time()
        res = {e: enc.embed_sync(wavs) for e, enc in encs.items()}
        stats["embed"] += time.process_time() - t0
        for j, key in enumerate(todo):
            g, c = res["ge2e"][j], res["campplus"][j]
            copies[key] = (None if g.embedding is None else np.asarray(g.embedding, np.float32),
                           None if c.embedding is None else np.asarray(c.embedding, np.float32), float(g.speech_seconds))
        stats["n_copy"] += len(todo)
    if len(ana) > 400:  # keep memory bounded; analyses are re-done if needed again
        ana.clear()
    if time.monotonic() - last > 60 or n == len(items) - 1:
        flush()
        last = time.monotonic()
        s = stats
        print(f"{n + 1}/{len(items)} {time.monotonic() - t_start:.0f}s  analyses {s['n_an']} "
              f"({s['analysis'] / max(s['n_an'], 1):.2f} cpu s each, {s['analysis'] / max(s['audio_s'], 1e-9):.3f} per audio s; "
              f"mean {s['audio_s'] / max(s['n_an'], 1):.1f} s)  copies {s['n_copy']} (synth {s['synth'] / max(s['n_copy'], 1):.3f} + "
              f"embed {s['embed'] / max(s['n_copy'], 1):.3f} cpu s each)", flush=True)
flush()
for e in encs.values():
    e.close()
print("done", stats)
