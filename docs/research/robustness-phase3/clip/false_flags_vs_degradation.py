"""Which turns are false-flagged in consistent speakers (S1) under d-clip / d-loud / d-noise / e-drift: are they
their speaker's most degraded turn (clipping fraction, noise floor)?"""
import sys
from pathlib import Path
import numpy as np
from sleuthd.api import SpeakerEncoder
from sleuthd.judgment.calibration import Calibration
from sleuthd.judgment.evidence import EvidenceCalibration
from sleuthd.encoders.clips import decode
from sleuthd.domain import AudioInput
from sleuthd_bench.instances import scenario_turns
from sleuthd_bench.manifest import read_manifest
from sleuthd_bench.robustness import judges
from sleuthd_bench.robustness.cli import _load_all

root = Path("data/robustness")
enc = SpeakerEncoder.load(Path("models"), encoder="fused"); raw = enc.manifest.raw; enc.close()
fcal = Calibration.from_manifest(raw, "fused"); ev = EvidenceCalibration.from_manifest(raw)
names = sys.argv[1].split(",")
embs, instances = _load_all(root, "eval", names)
lines = {l.dialogue_id: l for n in names for l in read_manifest(root / f"eval-{n}.jsonl")}
cache = {}
def feats(p):
    if p not in cache:
        x = decode(AudioInput((root / p).read_bytes()), 60).samples
        peak = float(np.abs(x).max()) or 1e-9
        clipfrac = float(np.mean(np.abs(x) >= 0.98 * peak))
        fr = x[: len(x) // 400 * 400].reshape(-1, 400)
        e = 10 * np.log10(np.mean(fr**2, axis=1) + 1e-12)
        floor = float(np.percentile(e, 95) - np.percentile(e, 10))  # dynamic range: low = noisy
        cache[p] = (clipfrac, floor)
    return cache[p]
for cond in names:
    insts = [i for i in instances if i.condition == cond and i.scenario == "S1"]
    n_fp = 0; top_clip = 0; top_noise = 0; n_inst_fp = 0
    for i in insts:
        flags = judges.evidence_flags(i, ev, fcal, 0.3)[0]
        if not flags: continue
        n_inst_fp += 1
        line = lines[i.dialogue_id]
        turns = scenario_turns(line, i.scenario)
        f = np.array([feats(p) for p in turns])
        for k in flags:
            n_fp += 1
            top_clip += int(k == int(np.argmax(f[:, 0])) and f[k, 0] > 1e-3)
            top_noise += int(k == int(np.argmin(f[:, 1])))
    print(f"{cond}: S1 instances {len(insts)}, with a false flag {n_inst_fp}, false flags {n_fp}; on the most-clipped turn {top_clip}, on the noisiest turn {top_noise}", flush=True)
