"""f-fsdd-prosody rebuilt with a formant-preserving pitch change: every clip of its eval manifest rendered again from
the same FSDD source with the same cents and tempo, through Rubber Band's R3 engine with formants kept
(`rubberband -3 -F`, Debian rubberband-cli) instead of sox `pitch`/`tempo`; written with a manifest of the same shape
under OUT (default data/robustness-formant), so `sleuthd-bench robustness embed|report --out OUT --conditions
f-fsdd-prosody` judge it as the matrix's condition.

    python formant_condition.py [OUT]
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf
from sleuthd_bench.robustness import render

SRC = Path("data/robustness")
OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("data/robustness-formant")


def moved(x: np.ndarray, cents: float, tempo: float) -> np.ndarray:
    with tempfile.TemporaryDirectory() as d:
        sf.write(f"{d}/a.wav", x, render.SAMPLE_RATE, subtype="FLOAT")
        subprocess.run(["rubberband", "-q", "-3", "-F", "-p", f"{cents / 100:.2f}", "-T", f"{tempo:.3f}",
                        f"{d}/a.wav", f"{d}/b.wav"], check=True, capture_output=True)
        y, _ = sf.read(f"{d}/b.wav", dtype="float32")
    return y


lines = [json.loads(line) for line in (SRC / "eval-f-fsdd-prosody.jsonl").read_text().splitlines()]
# The manifest's clips are its specs in this order: the five target turns, the reference, the S2 and S3 clips.
check = lines[0]["meta"]["specs"][5]
assert render.apply(render.fsdd(check["src"], SRC), check["fx"]) == (SRC / lines[0]["reference"]).read_bytes()
out_lines = []
for n, line in enumerate(lines):
    specs = line["meta"]["specs"]
    paths = []
    for spec in specs:
        (_, cents, tempo), = spec["fx"]
        rel = render.relpath({"src": spec["src"], "fx": [["rubberband-formant", cents, tempo]]})
        path = OUT / rel
        if not path.is_file():
            y = moved(render.fsdd(spec["src"], SRC), cents, tempo)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(render._wav_bytes(y))
        paths.append(rel)
    new = dict(line, target_turns=paths[:5], reference=paths[5], s2_audio=paths[6], s3_audio=paths[7])
    new["meta"] = dict(line["meta"], specs=[dict(s, fx=[["rubberband-formant", *s["fx"][0][1:]]]) for s in specs])
    out_lines.append(json.dumps(new))
    if n % 10 == 9:
        print(f"{n + 1}/{len(lines)} dialogues", flush=True)
(OUT / "eval-f-fsdd-prosody.jsonl").write_text("\n".join(out_lines) + "\n")
print(f"wrote {OUT / 'eval-f-fsdd-prosody.jsonl'}")
