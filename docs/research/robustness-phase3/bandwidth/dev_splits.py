"""Band matching on the dev benchmark's splits (fit, transfer, fsdd): bandwidths, narrowband copies embedded,
and the served blend vs band-matched at spread 0.3 octave."""
import json, sys
from pathlib import Path
import numpy as np, soundfile as sf
from sleuthd.api import SpeakerEncoder
from sleuthd.audio.bandwidth import effective_bandwidth_hz, low_pass
from sleuthd.audio.decode import decode_encoded, to_model_rate
from sleuthd.judgment.calibration import Calibration
from sleuthd.judgment.evidence import EvidenceCalibration
from sleuthd_bench import paired
from sleuthd_bench.instances import scenario_turns
from sleuthd_bench.manifest import read_manifest
from sleuthd_bench.metrics import SCENARIOS
from sleuthd_bench.robustness import embed, judges
from sleuthd_bench.robustness.embed import Embeddings
from sleuthd_bench.robustness.instances import load_instances

root, out = Path("data/devlarge"), Path("runs/nbdev")
conds = ["dev-fit", "dev-transfer", "dev-fsdd"]
paths = embed.manifest_paths([root / f"eval-{c}.jsonl" for c in conds])
BW = {}
for p in paths:
    x = to_model_rate(decode_encoded((root / p).read_bytes(), 600.0)).samples
    bw = effective_bandwidth_hz(x)
    BW[p] = np.nan if bw is None else bw
    dst = out / (p + ".wav")
    if not dst.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        sf.write(dst, low_pass(x), 16000, subtype="FLOAT")
print("clips", len(paths), flush=True)
embed.embed_all(out, [p + ".wav" for p in paths])
embs = {e: embed.load(root, e) for e in embed.ENCODERS}
nb = {}
for e in embed.ENCODERS:
    x = embed.load(out, e)
    nb[e] = Embeddings(e, x.weights_sha256, [p.removesuffix(".wav") for p in x.paths], x.vectors, x.speech_seconds, x.audio_seconds)
enc = SpeakerEncoder.load(Path("models"), encoder="fused"); raw = enc.manifest.raw; enc.close()
fcal = Calibration.from_manifest(raw, "fused")
ev = EvidenceCalibration.from_json(json.loads(Path("service/sleuthd/cards/evidence.json").read_text()),
                                   {e: embs[e].weights_sha256 for e in embed.ENCODERS})
for cond in conds:
    a = load_instances(root, "eval", [cond], embs)
    b = load_instances(root, "eval", [cond], nb)
    spread = []
    for line in read_manifest(root / f"eval-{cond}.jsonl"):
        for sc in SCENARIOS:
            bw = np.log2([BW[p] for p in scenario_turns(line, sc)] + [BW[line.reference]])
            spread.append(float(np.nanmax(bw) - np.nanmin(bw)))
    fa = [judges.evidence_flags(i, ev, fcal)[0] for i in a]
    fb = [judges.evidence_flags(i, ev, fcal)[0] for i in b]
    base = [judges.record(i, f) for i, f in zip(a, fa)]
    mix = [judges.record(i, fbb if sp > 0.3 else faa) for i, faa, fbb, sp in zip(a, fa, fb, spread)]
    mb, mm = judges.metrics(base), judges.metrics(mix)
    c = paired.compare("mix", mix, "served", base)
    print(f"{cond:13s} n {len(a)//3} | served {mb['bal']:.1f} ({mb['S1']:.1f}/{mb['S2']:.1f}/{mb['S3']:.1f}) | band-matched {mm['bal']:.1f} "
          f"({mm['S1']:.1f}/{mm['S2']:.1f}/{mm['S3']:.1f}) | d {c.bal.difference:+.2f} [{c.bal.low:+.2f}, {c.bal.high:+.2f}] | matched {np.mean([s > 0.3 for s in spread]):.2f}", flush=True)
