"""Screen: clip matching (2026-11-27, session 18). A speaker whose clips differ in clipping (the fraction of
samples within 1 % of a clip's peak, its "plateau") by more than a trigger is judged on copies of every clip
hard-clipped so that a fixed fraction of its samples sits on the plateau (as band matching low-passes every clip
to one fixed band), through the served blend; the other instances are judged as served (blend + band matching).
Offline on the robustness matrix. Run from the repository root:

    PYTHONPATH=service:tools:. python docs/research/robustness-phase3/clip/clip_matching_screen.py \
        SPLIT CONDITIONS TRIGGERS FRACTION MODE

SPLIT train|eval; CONDITIONS comma-separated; TRIGGERS comma-separated plateau spreads; FRACTION the copies'
plateau fraction, or "max" (the speaker's most-clipped piece's); MODE "separate" (band-matched speakers' copies are clipped and low-passed, the others clipped
only) or "union" (every matched speaker's copies clipped and low-passed, band matching's too). Copies'
embeddings are cached in /tmp/clipmatch_<root>_<split>.pkl. CLIP_ROOT=data/devlarge runs it on the dev
benchmark's splits (conditions dev-fit, dev-transfer, dev-fsdd; no band matching there: none is cached).
"""
import os, sys, time, pickle
from dataclasses import replace
from pathlib import Path
import numpy as np
from sleuthd.api import SpeakerEncoder, narrowband_copy
from sleuthd.audio.decode import PcmEncoding, PcmSpec
from sleuthd.domain import AudioInput
from sleuthd.encoders.clips import decode
from sleuthd.judgment.calibration import Calibration
from sleuthd.judgment.evidence import EvidenceCalibration
from sleuthd_bench import paired
from sleuthd_bench.instances import scenario_turns
from sleuthd_bench.manifest import read_manifest
from sleuthd_bench.robustness import judges
from sleuthd_bench.robustness.cli import _load_all
from sleuthd_bench.robustness.embed import ENCODERS, fused
from sleuthd_bench.robustness.instances import FUSED, _view

root = Path(os.environ.get("CLIP_ROOT", "data/robustness"))  # data/devlarge: the dev benchmark's splits
split, names = sys.argv[1], sys.argv[2].split(",")
triggers = [float(x) for x in sys.argv[3].split(",")]
# Every copy clipped to this plateau fraction; "max": to the speaker's most-clipped piece's fraction.
fixed = None if sys.argv[4] == "max" else float(sys.argv[4])
union = sys.argv[5] == "union"  # a matched speaker's copies are always clipped and low-passed (else: what triggered)
enc = SpeakerEncoder.load(Path("models"), encoder="fused"); raw = enc.manifest.raw; enc.close()
fcal = Calibration.from_manifest(raw, "fused"); ev = EvidenceCalibration.from_manifest(raw)
embs, instances = _load_all(root, split, names)
lines = {l.dialogue_id: l for n in names for l in read_manifest(root / f"{split}-{n}.jsonl")}
encoders = {e: SpeakerEncoder.load(Path("models"), encoder=e) for e in ENCODERS}
cache_file = Path(f"/tmp/clipmatch_{root.name}_{split}.pkl")  # keys (clip, low-passed, plateau fraction)
emb_cache = pickle.loads(cache_file.read_bytes()) if cache_file.exists() else {}
samples = {}

def wave(p, narrow):
    key = (p, narrow)
    if key not in samples:
        a = AudioInput((root / p).read_bytes())
        if narrow:
            a = narrowband_copy(a, 60.0)
        samples[key] = decode(a, 60.0).samples.astype(np.float32)
    return samples[key]

def plateau(x):
    """Fraction of samples within 1 % of the clip's peak: ~0 for a clean clip, the clipped share for a clipped one."""
    peak = float(np.abs(x).max())
    return 0.0 if peak <= 0 else float(np.mean(np.abs(x) >= 0.99 * peak))

def clipped_copy(x, frac, narrow):
    """Hard-clipped so that ``frac`` of its samples sit on the plateau, then (a band-matched speaker) low-passed at
    the common band, as the server's narrowband copy: clipping first, as the channel did."""
    from sleuthd.audio.bandwidth import low_pass
    if frac > 0:
        a = float(np.quantile(np.abs(x), 1 - frac))
        x = np.clip(x, -a, a) if a > 0 else x
    return np.clip(low_pass(x), -2, 2).astype(np.float32) if narrow else x

def embed_copies(items):
    """items: list of (key, samples) -> {key: (per-encoder embedding or None, seconds)}"""
    todo = [(k, x) for k, x in items if k not in emb_cache]
    for e, encoder in encoders.items():
        for start in range(0, len(todo), 32):
            chunk = todo[start:start + 32]
            audios = [AudioInput(x.astype("<f4").tobytes(), PcmSpec(PcmEncoding.F32LE, 16000, 1)) for _, x in chunk]
            for (k, _), c in zip(chunk, encoder.embed_sync(audios)):
                emb_cache.setdefault(k, {})[e] = (c.embedding, c.speech_seconds)
    return emb_cache

t0 = time.time()
base_all, res = {}, {t: {} for t in triggers}
for cond in names:
    insts = [i for i in instances if i.condition == cond]
    base = [judges.evidence_flags(i, ev, fcal, 0.3)[0] for i in insts]
    rb = [judges.record(i, f) for i, f in zip(insts, base)]
    mb = judges.metrics(rb)
    out = f"{cond:20s} served {mb['bal']:5.1f} ({mb['S1']:.0f}/{mb['S2']:.0f}/{mb['S3']:.0f})"
    for t in triggers:
        flags, n_trig = [], 0
        for i, b in zip(insts, base):
            line = lines[i.dialogue_id]
            turns = scenario_turns(line, i.scenario)
            narrow = i.band_matched(0.3) if i.band_octaves else False
            paths = [*turns, line.reference]
            usable = [turns[k] for k in i.views[FUSED].index] + [line.reference]
            fr = {p: plateau(wave(p, False)) for p in paths}
            spread = max(fr[p] for p in usable) - min(fr[p] for p in usable)
            clip = spread > t
            if not clip and not (union and narrow):
                flags.append(b); continue  # as served: full band, or band-matched copies
            n_trig += 1
            narrow = narrow or union
            target = fixed if fixed is not None else max(fr[p] for p in usable)
            keys = [(p, narrow, round(target, 4)) for p in paths]
            got = embed_copies([(k, clipped_copy(wave(k[0], False), k[2], narrow)) for k in keys])
            views = {}
            parts = {}
            for e in ENCODERS:
                parts[e] = [got[k][e][0] for k in keys]
                views[e] = _view(parts[e][:-1], [got[k][e][1] for k in keys[:-1]], parts[e][-1], embs[e].vectors.shape[1])
            joined = [fused([parts[e][k] for e in ENCODERS]) for k in range(len(keys))]
            dim = sum(embs[e].vectors.shape[1] for e in ENCODERS)
            views[FUSED] = _view(joined[:-1], [got[k][ENCODERS[0]][1] for k in keys[:-1]], joined[-1], dim)
            if not np.array_equal(views[FUSED].index, i.views[FUSED].index) or views[FUSED].reference is None:
                flags.append(b); continue  # a copy lost a turn: the server would judge as sent
            mi = replace(i, views=views, band_octaves=0.0, narrow_views={})
            flags.append(judges.evidence_flags(mi, ev, fcal, 0.0)[0])
            if os.environ.get("CLIP_DIAG") and flags[-1] != b:  # what changed, with each turn's plateau fraction
                plateaus = " ".join(f"{fr[p]:.3f}" for p in turns)
                print(f"  {i.dialogue_id} {i.scenario} gold {sorted(i.gold)} served {sorted(b)} -> {sorted(flags[-1])} "
                      f"plateau {plateaus} ref {fr[line.reference]:.3f} band-matched {narrow}", flush=True)
        rm = [judges.record(i, f) for i, f in zip(insts, flags)]
        m = judges.metrics(rm)
        c = paired.compare("clip", rm, "served", rb)
        res[t][cond] = m["bal"]
        out += f" | T{t}: trig {n_trig:3d} {m['bal']:5.1f} ({m['S1']:.0f}/{m['S2']:.0f}/{m['S3']:.0f}) {c.bal.difference:+.1f} [{c.bal.low:+.1f},{c.bal.high:+.1f}]"
    base_all[cond] = mb["bal"]
    print(out, f"({time.time() - t0:.0f}s)", flush=True)
    cache_file.write_bytes(pickle.dumps(emb_cache))
print("mean Bal served", round(float(np.mean(list(base_all.values()))), 2), {t: round(float(np.mean(list(v.values()))), 2) for t, v in res.items()})
