"""Median F0 (log2 Hz) of every robustness-matrix clip: YIN-style cumulative mean normalised difference on
40 ms frames (10 ms hop) of the 16 kHz mono decode, voiced = CMND minimum < 0.2 and frame energy within
35 dB of the clip's loudest frame; 60-400 Hz.

    python f0_extract.py [ROOT [OUT.npz]]    # default data/robustness, runs/f0/f0.npz (saved every 500 clips too)
"""
import sys, time
from pathlib import Path
import numpy as np
from sleuthd.audio.decode import decode_encoded, to_model_rate
from sleuthd_bench.robustness import embed

root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("data/robustness")
OUT = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("runs/f0/f0.npz")
OUT.parent.mkdir(parents=True, exist_ok=True)
paths = embed.load(root, "ge2e").paths
SR, FR, HOP = 16000, 640, 160
LMIN, LMAX = SR // 400, SR // 60  # 40 .. 266

def f0_of(x):
    if len(x) < FR + LMAX:
        return np.nan, 0.0, 0
    n = 1 + (len(x) - FR - LMAX) // HOP
    idx = np.arange(n)[:, None] * HOP + np.arange(FR + LMAX)[None, :]
    fr = x[idx].astype(np.float64)
    e = (fr[:, :FR] ** 2).mean(axis=1)
    keep = e > e.max() * 10 ** (-3.5)
    fr = fr[keep]
    if not len(fr):
        return np.nan, 0.0, 0
    # difference function d(tau) = sum (x_t - x_{t+tau})^2 over the first FR samples, via FFT
    N = 2048
    a = fr[:, :FR]
    A = np.fft.rfft(a, N); B = np.fft.rfft(fr, N)
    cross = np.fft.irfft(np.conj(A) * B, N)[:, : LMAX + 1]
    ea = (a ** 2).sum(axis=1)
    c2 = np.cumsum(fr ** 2, axis=1)
    eb = np.stack([c2[:, tau + FR - 1] - (c2[:, tau - 1] if tau else 0) for tau in range(LMAX + 1)], axis=1)
    d = ea[:, None] + eb - 2 * cross
    d[:, 0] = 0
    cm = np.cumsum(d[:, 1:], axis=1) / np.arange(1, LMAX + 1)
    cmnd = np.ones_like(d); cmnd[:, 1:] = d[:, 1:] / np.maximum(cm, 1e-12)
    seg = cmnd[:, LMIN:LMAX + 1]
    # first dip below 0.15 (else the global minimum), as YIN does, to avoid octave errors
    below = seg < 0.15
    first = np.where(below.any(axis=1), below.argmax(axis=1), seg.argmin(axis=1))
    # walk to the local minimum after the first dip
    lag = first.copy()
    for k in range(len(lag)):
        while lag[k] + 1 < seg.shape[1] and seg[k, lag[k] + 1] < seg[k, lag[k]]:
            lag[k] += 1
    val = seg[np.arange(len(seg)), lag]
    voiced = val < 0.25
    if voiced.sum() < 5:
        return np.nan, float(voiced.mean()), int(voiced.sum())
    f0 = SR / (lag[voiced] + LMIN)
    return float(np.median(np.log2(f0))), float(voiced.mean()), int(voiced.sum())

out = np.full((len(paths), 3), np.nan)
t0 = time.time()
for k, p in enumerate(paths):
    try:
        w = to_model_rate(decode_encoded((root / p).read_bytes(), 600.0))
        out[k] = f0_of(np.asarray(w.samples, np.float32))
    except Exception as exc:
        print("fail", p, exc, file=sys.stderr)
    if k % 500 == 0:
        print(k, len(paths), round(time.time() - t0), out[k], flush=True)
        np.savez(OUT, paths=np.array(paths), f0=out, done=k)
np.savez(OUT, paths=np.array(paths), f0=out, done=len(paths))
print("done", np.isnan(out[:, 0]).sum(), "nan of", len(paths))
