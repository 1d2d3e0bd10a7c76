"""Screen 9: the low band level (60-250 Hz over 300-3400 Hz, dB, whole-clip spectrum) of the drift conditions' train
clips (the first 60 dialogues of each), by the channel each clip went through. Output: low_share_by_channel.txt."""
import json, collections, numpy as np
from pathlib import Path
from sleuthd.domain import AudioInput
from sleuthd.encoders.clips import decode
root = Path("data/robustness")
def low_share(p):
    x = decode(AudioInput((root / p).read_bytes()), 600.0).samples.astype(np.float64)
    s = np.abs(np.fft.rfft(x)) ** 2
    f = np.fft.rfftfreq(len(x), 1 / 16000)
    lo = s[(f >= 60) & (f < 250)].sum(); mid = s[(f >= 300) & (f < 3400)].sum()
    return 10 * np.log10(max(lo, 1e-20) / max(mid, 1e-20))
vals = collections.defaultdict(list)
for cond in ["e-drift", "g-kokoro-drift"]:
    for l in (root / f"train-{cond}.jsonl").read_text().splitlines()[:60]:
        d = json.loads(l)
        clips = [*d["target_turns"], d["reference"]]
        chans = d["meta"]["channels"]
        for p, ch in zip(d["target_turns"], chans[:5]):
            vals[ch].append(low_share(p))
for ch, v in sorted(vals.items()):
    v = np.array(v); print(f"{ch:7s} n={len(v):3d} p5 {np.percentile(v,5):6.1f} p50 {np.median(v):6.1f} p95 {np.percentile(v,95):6.1f}")
