"""The first odd-channel rule's kept flags on train's d-reverb and d-noise consistent speakers, beside the speaker's
pieces' SNRs and bandwidths and the copies' probabilities (run odd_channel.py's prerequisites first).

PYTHONPATH=service:tools:. python docs/research/robustness-phase3/train-chosen/odd_diag.py"""
import sys, runpy
sys.argv = ["x", "train"]
g = runpy.run_path("docs/research/robustness-phase3/train-chosen/odd_channel.py")
insts, judged, odd_turns = g["insts"], g["judged"], g["odd_turns"]
hz, snrs, plateaus = g["hz"], g["snrs"], g["plateaus"]
import numpy as np
for i in insts:
    if i.condition not in ("d-reverb", "d-noise") or i.scenario != "S1": continue
    served, sent, pm = judged[(i.dialogue_id, i.scenario)]
    if sent is None: continue
    kept = frozenset(sent) - odd_turns(i) - served
    if kept:
        idx = list(i.views["fused"].index)
        ps = [i.paths[k] for k in idx] + [i.reference_path]
        print(i.condition, i.dialogue_id, "kept", sorted(kept), "snr", [round(snrs.get(p, np.nan), 1) for p in ps], "hz", [int(hz.get(p, 0)) for p in ps], "pm", {k: round(v, 2) for k, v in pm.items()})
