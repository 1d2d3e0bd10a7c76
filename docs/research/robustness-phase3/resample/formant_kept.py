"""Cosine of an FSDD speaker's clip moved 350 cents (sox pitch: envelope moves; rubberband -F: envelope kept; WORLD-free)
to the speaker's other clips, per encoder."""
import subprocess, sys, io
from pathlib import Path
import numpy as np, soundfile as sf
from sleuthd.api import SpeakerEncoder
from sleuthd.domain import AudioInput
from sleuthd.audio.pitch import median_pitch_octaves
from sleuthd_bench.robustness.render import _sox, _wav_bytes, _read
from sleuthd.audio.decode import decode_encoded, to_model_rate

root = Path("data/robustness/sources/fsdd")
speakers = sorted(p.name for p in root.iterdir() if p.is_dir())[:6]
def load(p): return to_model_rate(decode_encoded(p.read_bytes(), 60)).samples
def rb(x, semis, extra):
    out = subprocess.run(["rubberband", "-q", *extra, "-p", str(semis), "-", "-"], input=_wav_bytes(x, subtype="FLOAT"), capture_output=True)
    if out.returncode:
        # rubberband needs files
        import tempfile, os
        with tempfile.TemporaryDirectory() as d:
            sf.write(f"{d}/a.wav", x, 16000, subtype="FLOAT")
            subprocess.run(["rubberband", "-q", *extra, "-p", str(semis), f"{d}/a.wav", f"{d}/b.wav"], check=True)
            y, _ = sf.read(f"{d}/b.wav", dtype="float32")
            return y
    return _read(out.stdout)
encs = {e: SpeakerEncoder.load(Path("models"), encoder=e) for e in ("ge2e", "campplus")}
def emb(xs):
    wavs = [AudioInput(_wav_bytes(x)) for x in xs]
    return {e: np.stack([r.embedding for r in enc.embed_sync(wavs)]) for e, enc in encs.items()}
for cents in (350, -350):
    res = {k: {e: [] for e in encs} for k in ("sox", "rb-F", "rb-F3", "rb")}
    f0s = {k: [] for k in res}
    for s in speakers:
        clips = sorted((root / s).glob("*.wav"))[:6]
        xs = [load(c) for c in clips]
        base = emb(xs[1:])
        variants = {"sox": _sox(xs[0], ["pitch", str(cents)]), "rb-F": rb(xs[0], cents / 100, ["-F"]),
                    "rb-F3": rb(xs[0], cents / 100, ["-F", "-3"]), "rb": rb(xs[0], cents / 100, [])}
        for k, y in variants.items():
            f0s[k].append(median_pitch_octaves(y) - median_pitch_octaves(xs[0]))
            e = emb([y])
            for name in encs:
                res[k][name].append(float((base[name] @ e[name][0]).mean()))
        orig = emb([xs[0]])
        for name in encs:
            res.setdefault("orig", {n: [] for n in encs})[name].append(float((base[name] @ orig[name][0]).mean()))
    print(f"cents {cents}")
    for k, v in res.items():
        print(f"  {k:6s} " + "  ".join(f"{n} {np.mean(v[n]):.3f}" for n in encs) + (f"  F0 moved {np.mean(f0s[k]):+.3f} oct" if k in f0s else ""))
