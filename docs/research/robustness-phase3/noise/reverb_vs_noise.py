"""Reverberation against noise (session 19, not adopted): the SNR estimate's spread per S1 instance on the train split
when the noise power is the quietest tenth (served) or the quietest fiftieth of the frames. Run from the repository root:
    PYTHONPATH=service:tools:. python docs/research/robustness-phase3/noise/reverb_vs_noise.py
"""
import sys, os  # noqa
import numpy as np
sys.argv = ["x", "train", "d-noise,d-reverb,ctrl-espeak,c-short,e-drift,g-kokoro-channel", "1000", "transplant"]
src = open("docs/research/robustness-phase3/noise/noise_matching_screen.py").read().split("t0 = time.time()")[0]
exec(src)
for q in (10, 50):
    def snr_q(p, q=q):
        x = wave(p); fr = x[: len(x) // FRAME * FRAME].reshape(-1, FRAME).astype(np.float64)
        e = np.sort((fr**2).mean(axis=1)); speech = e[len(e)//2:].mean(); live = e[e > speech*1e-9]
        noise = live[: max(1, len(live) // q)].mean()
        return min(20.0, 10*np.log10(speech/max(noise,1e-20)))
    print("quietest 1 /", q)
    for cond in names:
        insts = [i for i in instances if i.condition == cond and i.scenario == "S1"]
        sp = []
        for i in insts:
            line = lines[i.dialogue_id]; turns = scenario_turns(line, i.scenario)
            usable = [turns[k] for k in i.views[FUSED].index] + [line.reference]
            v = [snr_q(p) for p in usable]; sp.append(max(v) - min(v))
        sp = np.array(sp)
        print(f"  {cond:18s} spread p10/50/90 {np.round(np.percentile(sp,[10,50,90]),1)}  share > 3 dB {np.mean(sp > 3):.2f}", flush=True)
