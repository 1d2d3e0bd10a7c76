"""Embed the resampled copies a plan (../prosody/plan.py --matched --out runs/resample/plan_<split>_<root>.pkl) needs.

    python copies.py SPLIT [--root R] [--min-dev 0.15] [--hi 0.7]

A resampled copy moves a clip's pitch *and* its spectral envelope by one factor, as sox's `pitch` effect (and any
change of playback rate) does: the 16 kHz decode the server embeds, resampled by 2**-shift (soxr, very high
quality) and read at 16 kHz again. For every candidate instance, each flagged turn whose YIN median F0 lies in
[min-dev, hi) octave from the median of the speaker's other pieces (usable turns and reference) gets a copy moved
by the signed difference, rounded to 1/24 octave: key ``<path>#rs<k>`` (k = round(24 * shift)); for an instance the
server judges on narrowband copies (plan kind 'narrow') the copy is low-passed as band matching's copy is:
``<path>#rs<k>#nb``. Cache: runs/resample/copies_<root>.pkl {key: (ge2e, campplus, speech_s)}."""
import argparse
import pickle
import time
from pathlib import Path

import numpy as np
import soxr
from sleuthd.api import SpeakerEncoder
from sleuthd.audio import SAMPLE_RATE
from sleuthd.audio.bandwidth import low_pass
from sleuthd.audio.decode import FLOAT_PEAK_LIMIT, decode_encoded, to_model_rate
from sleuthd.domain import AudioInput, PcmEncoding, PcmSpec

MAX_SECONDS = 600.0


def shifts(it, f0, min_dev, hi):
    """{flagged position: signed shift in 1/24 octave} for the flagged turns this instance would move."""
    pieces = [it["turns"][u] for u in it["usable"]] + [it["reference"]]
    out = {}
    for pos in it["flagged"]:
        d = it["devs"].get(pos, np.nan)
        if not (np.isfinite(d) and min_dev <= d < hi):
            continue
        mine = f0.get(it["turns"][pos], np.nan)
        others = [f0.get(p, np.nan) for p in pieces if p != it["turns"][pos]]
        others = [o for o in others if np.isfinite(o)]
        if np.isfinite(mine) and others:
            out[pos] = int(round(24 * (float(np.median(others)) - mine)))
    return out


def key_of(path, k, kind):
    return f"{path}#rs{k}" + ("#nb" if kind == "narrow" else "")


def moved_copy(raw: bytes, k: int, narrow: bool) -> AudioInput:
    x = to_model_rate(decode_encoded(raw, MAX_SECONDS)).samples
    y = soxr.resample(x, SAMPLE_RATE, SAMPLE_RATE / 2 ** (k / 24), quality="VHQ").astype(np.float32)
    if narrow:
        y = low_pass(y)
    y = np.clip(y, -FLOAT_PEAK_LIMIT, FLOAT_PEAK_LIMIT)
    return AudioInput(data=y.astype("<f4").tobytes(), pcm=PcmSpec(PcmEncoding.F32LE, SAMPLE_RATE, 1))


def load_f0(root):
    z = np.load(f"runs/expressive/f0_{root.name}.npz")
    return dict(zip(z["paths"].tolist(), z["f0"][:, 0].tolist()))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("split")
    ap.add_argument("--root", type=Path, default=Path("data/robustness"))
    ap.add_argument("--min-dev", type=float, default=0.15)
    ap.add_argument("--hi", type=float, default=0.7)
    args = ap.parse_args()
    root = args.root
    plan = pickle.loads(Path(f"runs/resample/plan_{args.split}_{root.name}.pkl").read_bytes())
    f0 = load_f0(root)
    cpath = Path(f"runs/resample/copies_{root.name}.pkl")
    copies = pickle.loads(cpath.read_bytes()) if cpath.exists() else {}
    need = {}
    for it in plan["items"]:
        for pos, k in shifts(it, f0, args.min_dev, args.hi).items():
            p = it["turns"][pos]
            need[key_of(p, k, it["kind"])] = (p, k, it["kind"] == "narrow")
    todo = [k for k in need if k not in copies]
    print(f"{args.split}: {len(need)} copies needed, {len(todo)} to make", flush=True)
    encs = {e: SpeakerEncoder.load(Path("models"), encoder=e) for e in ("ge2e", "campplus")}
    t0, cpu = time.monotonic(), [0.0, 0.0]
    for start in range(0, len(todo), 16):
        part = todo[start:start + 16]
        c0 = time.process_time()
        wavs = [moved_copy((root / need[k][0]).read_bytes(), need[k][1], need[k][2]) for k in part]
        c1 = time.process_time()
        res = {e: enc.embed_sync(wavs) for e, enc in encs.items()}
        cpu[0] += c1 - c0
        cpu[1] += time.process_time() - c1
        for j, key in enumerate(part):
            g, c = res["ge2e"][j], res["campplus"][j]
            copies[key] = (None if g.embedding is None else np.asarray(g.embedding, np.float32),
                           None if c.embedding is None else np.asarray(c.embedding, np.float32), float(g.speech_seconds))
        if (start // 16) % 10 == 9 or start + 16 >= len(todo):
            cpath.write_bytes(pickle.dumps(copies))
            n = min(start + 16, len(todo))
            print(f"{n}/{len(todo)} {time.monotonic() - t0:.0f}s; cpu per copy: resample {cpu[0] / n:.3f} s, "
                  f"embed {cpu[1] / n:.3f} s", flush=True)
    cpath.write_bytes(pickle.dumps(copies))
    for e in encs.values():
        e.close()
