"""Screen 8: noise matching composed with band and clip matching (2026-11-27, session 22).

The served rule (sleuthd.judgment.channel_matching) noise-matches only a speaker matched neither by band nor by
clipping: Screen 5 screened it there. Under channel drift (a different channel per turn) a speaker is often band-
or clip-mixed *and* noise-mixed; it is then judged on narrowband (or clipped) copies in which its noisy turn is still
the one noisy piece. Rule screened: such a speaker's copies are also made noisy, to its noisiest piece's SNR with
that piece's own noise (the server's own ``channel_copy``: clipped, then noise added, then low-passed), and the
speaker is judged on them with the served blend, not refitted. Every other instance keeps its served verdict.
Offline on the robustness matrix, from the repository root:

    PYTHONPATH=service:tools:. python docs/research/robustness-phase3/compose/compose_screen.py SPLIT CONDITIONS [DB]

DB: the noise trigger of a composed speaker (default 3, the server's --noise-match-db; the served judgment keeps 3). COMPOSE_ONLY=band|clip composes only the speakers matched
that way (a clip-matched speaker's copies are low-passed too where it is band-mixed). Copies' embeddings are cached in /tmp/compose_<split>.pkl.
"""
import os, sys, time, pickle
from dataclasses import replace
from pathlib import Path
import numpy as np
from sleuthd.api import SpeakerEncoder, copy_snr
from sleuthd.domain import AudioInput
from sleuthd.encoders.clips import ChannelCopy, channel_copy
from sleuthd.judgment.calibration import Calibration
from sleuthd.judgment.evidence import EvidenceCalibration
from sleuthd_bench import paired
from sleuthd_bench.instances import scenario_turns
from sleuthd_bench.manifest import read_manifest
from sleuthd_bench.robustness import judges
from sleuthd_bench.robustness.cli import _load_all
from sleuthd_bench.robustness.embed import ENCODERS, MAX_SECONDS, fused
from sleuthd_bench.robustness.instances import FUSED, _view

BAND, CLIP, NOISE = 0.3, 0.005, 3.0  # the server's defaults
root = Path(os.environ.get("COMPOSE_ROOT", "data/robustness"))
split, names = sys.argv[1], sys.argv[2].split(",")
db = float(sys.argv[3]) if len(sys.argv) > 3 else 3.0
ONLY = os.environ.get("COMPOSE_ONLY", "")  # "band" or "clip": compose only speakers matched that way
enc = SpeakerEncoder.load(Path("models"), encoder="fused"); raw = enc.manifest.raw; enc.close()
fcal = Calibration.from_manifest(raw, "fused"); ev = EvidenceCalibration.from_manifest(raw)
embs, instances = _load_all(root, split, names)
lines = {l.dialogue_id: l for n in names for l in read_manifest(root / f"{split}-{n}.jsonl")}
encoders = {e: SpeakerEncoder.load(Path("models"), encoder=e) for e in ENCODERS}
cache_file = Path(f"/tmp/compose_{root.name}_{split}.pkl")
emb_cache = pickle.loads(cache_file.read_bytes()) if cache_file.exists() else {}


def embed_copies(keys, copy):
    todo = [k for k in keys if k not in emb_cache]
    for start in range(0, len(todo), 16):
        chunk = todo[start:start + 16]
        audios = [channel_copy(AudioInput((root / k[0]).read_bytes()), MAX_SECONDS, copy) for k in chunk]
        for e, encoder in encoders.items():
            for k, c in zip(chunk, encoder.embed_sync(audios)):
                emb_cache.setdefault(k, {})[e] = (c.embedding, c.speech_seconds)
    return emb_cache


t0 = time.time()
served_all, composed_all = {}, {}
for cond in names:
    insts = [i for i in instances if i.condition == cond]
    base = [judges.evidence_flags(i, ev, fcal, BAND, CLIP, NOISE)[0] for i in insts]
    rb = [judges.record(i, f) for i, f in zip(insts, base)]
    flags, trig, kinds = [], 0, {"band": 0, "clip": 0}
    for i, b in zip(insts, base):
        band = i.band_matched(BAND)
        clipped = i.clip_matched(CLIP, i.band_mixed(BAND)) is not None
        if not (band or clipped) or not i.noise_mixed(db) or (ONLY and ("clip" if clipped else "band") != ONLY):
            flags.append(b); continue
        line = lines[i.dialogue_id]
        turns = scenario_turns(line, i.scenario)
        low, _, noisiest = i.noise
        copy = ChannelCopy(
            narrow=i.band_mixed(BAND), plateau=i.clip_target() if clipped else None,
            snr_db=copy_snr(low), noise=AudioInput((root / noisiest).read_bytes()),
        )
        keys = [(p, copy.narrow, copy.plateau, copy.snr_db, noisiest) for p in (*turns, line.reference)]
        got = embed_copies(keys, copy)
        views, parts = {}, {}
        for e in ENCODERS:
            parts[e] = [got[k][e][0] for k in keys]
            views[e] = _view(parts[e][:-1], [got[k][e][1] for k in keys[:-1]], parts[e][-1], embs[e].vectors.shape[1])
        joined = [fused([parts[e][k] for e in ENCODERS]) for k in range(len(keys))]
        dim = sum(embs[e].vectors.shape[1] for e in ENCODERS)
        views[FUSED] = _view(joined[:-1], [got[k][ENCODERS[0]][1] for k in keys[:-1]], joined[-1], dim)
        if not np.array_equal(views[FUSED].index, i.views[FUSED].index) or views[FUSED].reference is None:
            flags.append(b); continue  # the server judges such a speaker on its served copies
        trig += 1
        kinds["clip" if clipped else "band"] += 1
        mi = replace(i, views=views, band_octaves=0.0, narrow_views={}, plateaus=None, clip_views={}, noise=None)
        flags.append(judges.evidence_flags(mi, ev, fcal, 0.0, 0.0, 0.0)[0])
    rm = [judges.record(i, f) for i, f in zip(insts, flags)]
    mb, m = judges.metrics(rb), judges.metrics(rm)
    c = paired.compare("composed", rm, "served", rb)
    served_all[cond], composed_all[cond] = mb["bal"], m["bal"]
    print(
        f"{cond:20s} served {mb['bal']:5.1f} ({mb['S1']:.0f}/{mb['S2']:.0f}/{mb['S3']:.0f}) | composed: matched "
        f"{trig:3d} of {len(insts)} (band {kinds['band']}, clip {kinds['clip']}) {m['bal']:5.1f} "
        f"({m['S1']:.0f}/{m['S2']:.0f}/{m['S3']:.0f}) {c.bal.difference:+.2f} [{c.bal.low:+.2f}, {c.bal.high:+.2f}]"
        f" ({time.time() - t0:.0f}s)", flush=True,
    )
    cache_file.write_bytes(pickle.dumps(emb_cache))
print("mean Bal served", round(float(np.mean(list(served_all.values()))), 2),
      "composed", round(float(np.mean(list(composed_all.values()))), 2))
