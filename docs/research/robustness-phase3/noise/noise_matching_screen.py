"""Screen: noise matching (2026-11-27, session 19), the analogue of band and clip matching for noise. A speaker
whose clips differ in estimated SNR (speech power: the louder half of 20 ms frames; noise power: the quietest
10 % of frames; capped at 60 dB) by more than a trigger (dB) is judged on copies of every clip with noise added
until each reaches the speaker's noisiest piece's SNR; the other instances are judged as served (blend + band and
clip matching: a clip- or band-matched instance keeps its served verdict). Offline on the robustness matrix. Run
from the repository root:

    PYTHONPATH=service:tools:. python docs/research/robustness-phase3/noise/noise_matching_screen.py \
        SPLIT CONDITIONS TRIGGERS SOURCE

SPLIT train|eval; CONDITIONS comma-separated; TRIGGERS comma-separated SNR spreads in dB; SOURCE "white" (Gaussian
noise, seeded by the clip) or "transplant" (the noisiest piece's quietest frames, tiled). Copies' embeddings are
cached in /tmp/noisematch_<split>.pkl.
"""
import os, sys, time, pickle, hashlib
from dataclasses import replace
from pathlib import Path
import numpy as np
from sleuthd.api import SpeakerEncoder
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

root = Path(os.environ.get("NOISE_ROOT", "data/robustness"))  # data/devlarge: the dev benchmark's splits
split, names = sys.argv[1], sys.argv[2].split(",")
triggers = [float(x) for x in sys.argv[3].split(",")]
source = sys.argv[4]
enc = SpeakerEncoder.load(Path("models"), encoder="fused"); raw = enc.manifest.raw; enc.close()
fcal = Calibration.from_manifest(raw, "fused"); ev = EvidenceCalibration.from_manifest(raw)
embs, instances = _load_all(root, split, names)
lines = {l.dialogue_id: l for n in names for l in read_manifest(root / f"{split}-{n}.jsonl")}
encoders = {e: SpeakerEncoder.load(Path("models"), encoder=e) for e in ENCODERS}
cache_file = Path(f"/tmp/noisematch_{root.name}_{split}.pkl")
emb_cache = pickle.loads(cache_file.read_bytes()) if cache_file.exists() else {}
waves, snrs = {}, {}
FRAME = 320

def wave(p):
    if p not in waves:
        waves[p] = decode(AudioInput((root / p).read_bytes()), 60.0).samples.astype(np.float32)
    return waves[p]

CAP_DB = float(os.environ.get("NOISE_CAP_DB", "30"))  # cleaner than this counts as clean

def powers(x):
    """(speech power, noise power): the louder half of 20 ms frames, and the quietest 10 % of the frames that
    are not digital silence (more than 90 dB below the speech)."""
    fr = x[: len(x) // FRAME * FRAME].reshape(-1, FRAME).astype(np.float64)
    e = np.sort((fr**2).mean(axis=1))
    speech = e[len(e) // 2:].mean()
    live = e[e > speech * 1e-9]
    noise = live[: max(1, len(live) // 10)].mean() if len(live) else 0.0
    return speech, noise

def snr(p):
    if p not in snrs:
        s, n = powers(wave(p))
        snrs[p] = min(CAP_DB, 10 * np.log10(s / max(n, 1e-20)))
    return snrs[p]

def noise_source(p_noisy, n):
    if source == "white":
        return None
    x = wave(p_noisy)
    fr = x[: len(x) // FRAME * FRAME].reshape(-1, FRAME)
    e = (fr**2).mean(axis=1)
    quiet = fr[e <= np.quantile(e, 0.1)].reshape(-1)
    reps = int(np.ceil(n / len(quiet)))
    out = np.tile(quiet, reps)[:n].astype(np.float64)
    return out / (out.std() + 1e-12)

def noisy_copy(p, target, p_noisy):
    x = wave(p).astype(np.float64)
    s, n = powers(x)
    add = s / 10 ** (target / 10) - n
    if add <= 0:
        return x.astype(np.float32)
    src = noise_source(p_noisy, len(x))
    if src is None:
        seed = int(hashlib.sha256(p.encode()).hexdigest()[:8], 16)
        src = np.random.default_rng(seed).standard_normal(len(x))
    y = x + src * np.sqrt(add)
    return np.clip(y, -1.99, 1.99).astype(np.float32)

def embed_copies(items):
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
    base = [judges.evidence_flags(i, ev, fcal, 0.3, 0.005)[0] for i in insts]
    rb = [judges.record(i, f) for i, f in zip(insts, base)]
    mb = judges.metrics(rb)
    out = f"{cond:20s} served {mb['bal']:5.1f} ({mb['S1']:.0f}/{mb['S2']:.0f}/{mb['S3']:.0f})"
    for t in triggers:
        flags, n_trig = [], 0
        for i, b in zip(insts, base):
            line = lines[i.dialogue_id]
            turns = scenario_turns(line, i.scenario)
            already = i.clip_matched(0.005, 0 < 0.3 < i.band_octaves) is not None or i.band_matched(0.3)
            paths = [*turns, line.reference]
            usable = [turns[k] for k in i.views[FUSED].index] + [line.reference]
            values = {p: snr(p) for p in usable}
            spread = max(values.values()) - min(values.values())
            if already or not spread > t:
                flags.append(b); continue
            n_trig += 1
            noisiest = min(values, key=values.get)
            target = round(values[noisiest], 1)
            keys = [(p, target, source, noisiest if source != "white" else "") for p in paths]
            got = embed_copies([(k, noisy_copy(k[0], target, noisiest)) for k in keys])
            views, parts = {}, {}
            for e in ENCODERS:
                parts[e] = [got[k][e][0] for k in keys]
                views[e] = _view(parts[e][:-1], [got[k][e][1] for k in keys[:-1]], parts[e][-1], embs[e].vectors.shape[1])
            joined = [fused([parts[e][k] for e in ENCODERS]) for k in range(len(keys))]
            dim = sum(embs[e].vectors.shape[1] for e in ENCODERS)
            views[FUSED] = _view(joined[:-1], [got[k][ENCODERS[0]][1] for k in keys[:-1]], joined[-1], dim)
            if not np.array_equal(views[FUSED].index, i.views[FUSED].index) or views[FUSED].reference is None:
                flags.append(b); continue
            mi = replace(i, views=views, band_octaves=0.0, narrow_views={}, plateaus=None, clip_views={})
            flags.append(judges.evidence_flags(mi, ev, fcal, 0.0, 0.0)[0])
        if os.environ.get("NOISE_DUMP"):  # per-instance flags, to compare with a server replay
            with open(os.environ["NOISE_DUMP"], "a") as out_file:
                for i, f in zip(insts, flags):
                    out_file.write(f"{cond}\t{t}\t{i.dialogue_id}\t{i.scenario}\t{sorted(f)}\n")
        rm = [judges.record(i, f) for i, f in zip(insts, flags)]
        m = judges.metrics(rm)
        c = paired.compare("noise", rm, "served", rb)
        res[t][cond] = m["bal"]
        out += f" | T{t:g}: trig {n_trig:3d} {m['bal']:5.1f} ({m['S1']:.0f}/{m['S2']:.0f}/{m['S3']:.0f}) {c.bal.difference:+.1f} [{c.bal.low:+.1f},{c.bal.high:+.1f}]"
    base_all[cond] = mb["bal"]
    print(out, f"({time.time() - t0:.0f}s)", flush=True)
    cache_file.write_bytes(pickle.dumps(emb_cache))
print("mean Bal served", round(float(np.mean(list(base_all.values()))), 2), {t: round(float(np.mean(list(v.values()))), 2) for t, v in res.items()})
