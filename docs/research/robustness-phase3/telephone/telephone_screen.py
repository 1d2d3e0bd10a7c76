"""Screen 9: the telephone band's low edge (2026-11-27, session 22).

After Screen 8 most false alarms left under channel drift are the speaker's telephone turn (300-3400 Hz, 8-bit
mu-law): 29-39 % of the drift conditions' telephone turns of consistent speakers are flagged, against 0-12 % of
any other channel's. Band matching low-passes every copy at 3.6 kHz, which leaves the telephone turn the one piece
without the band below 300 Hz. Rule screened: a speaker judged on narrowband copies (band matching, alone or with
clipping and noise) is judged on copies band-passed instead (the same copy, then everything below LOW Hz removed
too: x - low_pass(x, LOW)); every other instance keeps its served verdict. The served blend, not refitted. Offline on
the robustness matrix, from the repository root:

    PYTHONPATH=service:tools:. python docs/research/robustness-phase3/telephone/telephone_screen.py SPLIT CONDITIONS [LOW]

LOW_SHARE_DB (e.g. -20): only speakers with a piece lacking the low band (its energy at 60-250 Hz below this many dB
under its energy at 300-3400 Hz: telephone clips p95 -23 dB, every other channel p5 -16 dB or above on the drift
conditions' train clips) and a piece that has it. Copies' embeddings are cached in /tmp/telephone_<split>.pkl.
"""
import os, sys, time, pickle
from dataclasses import replace
from pathlib import Path
import numpy as np
from sleuthd.api import SpeakerEncoder, copy_snr
from sleuthd.audio.bandwidth import low_pass
from sleuthd.audio.decode import PcmEncoding, PcmSpec
from sleuthd.domain import AudioInput
from sleuthd.encoders.clips import ChannelCopy, channel_copy, decode
from sleuthd.judgment.calibration import Calibration
from sleuthd.judgment.evidence import EvidenceCalibration
from sleuthd_bench import paired
from sleuthd_bench.instances import scenario_turns
from sleuthd_bench.manifest import read_manifest
from sleuthd_bench.robustness import judges
from sleuthd_bench.robustness.cli import _load_all
from sleuthd_bench.robustness.embed import ENCODERS, MAX_SECONDS, fused
from sleuthd_bench.robustness.instances import FUSED, _view

BAND, CLIP, NOISE, COMPOSE = 0.3, 0.005, 3.0, 6.0  # the server's defaults
root = Path("data/robustness")
split, names = sys.argv[1], sys.argv[2].split(",")
low = float(sys.argv[3]) if len(sys.argv) > 3 else 300.0
enc = SpeakerEncoder.load(Path("models"), encoder="fused"); raw = enc.manifest.raw; enc.close()
fcal = Calibration.from_manifest(raw, "fused"); ev = EvidenceCalibration.from_manifest(raw)
embs, instances = _load_all(root, split, names)
lines = {l.dialogue_id: l for n in names for l in read_manifest(root / f"{split}-{n}.jsonl")}
encoders = {e: SpeakerEncoder.load(Path("models"), encoder=e) for e in ENCODERS}
cache_file = Path(f"/tmp/telephone_{split}.pkl")
emb_cache = pickle.loads(cache_file.read_bytes()) if cache_file.exists() else {}


LOW_SHARE = float(os.environ["LOW_SHARE_DB"]) if os.environ.get("LOW_SHARE_DB") else None
_shares = {}


def low_share(path):
    """dB of the clip's energy at 60-250 Hz under its energy at 300-3400 Hz."""
    if path not in _shares:
        x = decode(AudioInput((root / path).read_bytes()), MAX_SECONDS).samples.astype(np.float64)
        s = np.abs(np.fft.rfft(x)) ** 2
        f = np.fft.rfftfreq(len(x), 1 / 16000)
        lo, mid = s[(f >= 60) & (f < 250)].sum(), s[(f >= 300) & (f < 3400)].sum()
        _shares[path] = 10 * np.log10(max(lo, 1e-20) / max(mid, 1e-20))
    return _shares[path]


def band_passed(path, copy):
    """The server's copy of the clip, low-passed, then with the band below ``low`` removed too."""
    x = decode(channel_copy(AudioInput((root / path).read_bytes()), MAX_SECONDS, copy), MAX_SECONDS).samples
    y = np.clip(x.astype(np.float64) - low_pass(x, low), -1.99, 1.99).astype(np.float32)
    return AudioInput(y.astype("<f4").tobytes(), PcmSpec(PcmEncoding.F32LE, 16000, 1))


def embed_copies(keys, copy):
    todo = [k for k in keys if k not in emb_cache]
    for start in range(0, len(todo), 16):
        chunk = todo[start:start + 16]
        audios = [band_passed(k[0], copy) for k in chunk]
        for e, encoder in encoders.items():
            for k, c in zip(chunk, encoder.embed_sync(audios)):
                emb_cache.setdefault(k, {})[e] = (c.embedding, c.speech_seconds)
    return emb_cache


t0 = time.time()
served_all, new_all = {}, {}
for cond in names:
    insts = [i for i in instances if i.condition == cond]
    base = [judges.evidence_flags(i, ev, fcal, BAND, CLIP, NOISE, COMPOSE)[0] for i in insts]
    rb = [judges.record(i, f) for i, f in zip(insts, base)]
    flags, trig = [], 0
    for i, b in zip(insts, base):
        narrow = i.band_mixed(BAND)
        clipped = i.clip_mixed(CLIP)
        composed = i.composed_matched(COMPOSE, narrow, clipped) is not None
        on_clip = i.clip_matched(CLIP, narrow) is not None
        if not narrow or not (composed or on_clip or i.band_matched(BAND)):
            flags.append(b); continue  # not judged on narrowband copies
        line = lines[i.dialogue_id]
        turns = scenario_turns(line, i.scenario)
        if LOW_SHARE is not None:
            shares = [low_share(p) for p in [*(turns[k] for k in i.views[FUSED].index), line.reference]]
            if not (min(shares) < LOW_SHARE <= max(shares)):
                flags.append(b); continue
        plateau = i.clip_target() if (composed and clipped) or (not composed and on_clip) else None
        snr, noisiest = (copy_snr(i.noise[0]), i.noise[2]) if composed else (None, "")
        copy = ChannelCopy(True, plateau, snr, AudioInput((root / noisiest).read_bytes()) if noisiest else None)
        keys = [(p, plateau, snr, noisiest, low) for p in (*turns, line.reference)]
        got = embed_copies(keys, copy)
        views, parts = {}, {}
        for e in ENCODERS:
            parts[e] = [got[k][e][0] for k in keys]
            views[e] = _view(parts[e][:-1], [got[k][e][1] for k in keys[:-1]], parts[e][-1], embs[e].vectors.shape[1])
        joined = [fused([parts[e][k] for e in ENCODERS]) for k in range(len(keys))]
        dim = sum(embs[e].vectors.shape[1] for e in ENCODERS)
        views[FUSED] = _view(joined[:-1], [got[k][ENCODERS[0]][1] for k in keys[:-1]], joined[-1], dim)
        if not np.array_equal(views[FUSED].index, i.views[FUSED].index) or views[FUSED].reference is None:
            flags.append(b); continue
        trig += 1
        mi = replace(i, views=views, band_octaves=0.0, narrow_views={}, plateaus=None, clip_views={}, noise=None,
                     composed_views={})
        flags.append(judges.evidence_flags(mi, ev, fcal, 0.0, 0.0, 0.0, 0.0)[0])
    rm = [judges.record(i, f) for i, f in zip(insts, flags)]
    mb, m = judges.metrics(rb), judges.metrics(rm)
    c = paired.compare("band-passed", rm, "served", rb)
    served_all[cond], new_all[cond] = mb["bal"], m["bal"]
    print(
        (f"[low share < {LOW_SHARE:g} dB] " if LOW_SHARE is not None else "") + f"{cond:20s} served {mb['bal']:5.1f} ({mb['S1']:.0f}/{mb['S2']:.0f}/{mb['S3']:.0f}) | band-passed above {low:g} Hz: "
        f"{trig:3d} of {len(insts)} {m['bal']:5.1f} ({m['S1']:.0f}/{m['S2']:.0f}/{m['S3']:.0f}) "
        f"{c.bal.difference:+.2f} [{c.bal.low:+.2f}, {c.bal.high:+.2f}] ({time.time() - t0:.0f}s)", flush=True,
    )
    cache_file.write_bytes(pickle.dumps(emb_cache))
print("mean Bal served", round(float(np.mean(list(served_all.values()))), 2),
      "band-passed", round(float(np.mean(list(new_all.values()))), 2))
