"""Long dialogues of short turns, outside the matrix (5 turns a speaker there): does the served judgment find an
intruder among 30 short turns, and what would the CAM++ outlier flag (screen.py, chosen tau 0.2, pitch matching's band
left out) add? espeak-ng voices en-us+m1..m5 and en-us+f1..f5 as targets, 30 distinct sentences each cut to 1.2-1.6 s
(from 0.3 s), no reference; S1 as is, S2 the turn at position 3 replaced by a 1.2 s cut of the opposite gender's voice
of the same index, S3 by one of the same gender (the next index). Also 5-turn dialogues (the first 5 turns) for
comparison. Judged through sleuthd.api.Judge (the server's path, defaults); the rule from CAM++ embeddings and the
clips' pitches measured as the server measures them.

    PYTHONPATH=service:tools:. python docs/research/robustness-phase3/outlier/long_short.py
"""
import io
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf
from sleuthd.api import Judge, SpeakerEncoder, clip_pitch, guard_margin
from sleuthd.config import EngineConfig
from sleuthd.domain import AudioInput
from sleuthd_bench import synth

TAU, SLOT = 0.2, 3
MEN = [f"en-us+m{k}" for k in range(1, 6)]
WOMEN = [f"en-us+f{k}" for k in range(1, 6)]


def espeak(voice: str, text: str) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        subprocess.run(["espeak-ng", "-v", voice, "-w", f"{d}/a.wav", text], check=True)
        return Path(f"{d}/a.wav").read_bytes()


def cut(b: bytes, seconds: float, start: float = 0.3) -> bytes:
    x, r = sf.read(io.BytesIO(b), dtype="float32")
    buf = io.BytesIO()
    sf.write(buf, x[int(start * r) : int((start + seconds) * r)], r, format="WAV")
    return buf.getvalue()


texts = synth.sentences(320, seed=23)
campplus = SpeakerEncoder.load(Path("models"), encoder="campplus")


def rule_flags(turns: list[bytes]) -> set[int]:
    res = campplus.embed_sync([AudioInput(t) for t in turns])
    keep = [j for j, r in enumerate(res) if r.embedding is not None]
    emb = np.stack([res[j].embedding for j in keep])
    gram = emb @ emb.T
    pitch = [clip_pitch(AudioInput(turns[j]), 600.0) for j in keep]
    out = set()
    for row, j in enumerate(keep):
        others = [p for k, p in enumerate(pitch) if k != row and p is not None]
        if pitch[row] is not None and others and 0.25 <= abs(pitch[row] - float(np.median(others))) < 0.5:
            continue
        if guard_margin(gram, [row]) < -TAU:
            out.add(j)
    return out


counts: dict = {}
with Judge.from_config(EngineConfig(default_encoder="fused")) as judge:
    for t, target in enumerate(MEN + WOMEN):
        own = [cut(espeak(target, texts[30 * t + k]), 1.2 + 0.1 * (k % 5)) for k in range(30)]
        men = target in MEN
        opposite = (WOMEN if men else MEN)[t % 5]
        same = (MEN if men else WOMEN)[(t + 1) % 5]
        for scenario, voice in (("S1", None), ("S2", opposite), ("S3", same)):
            turns = list(own)
            if voice is not None:
                turns[SLOT] = cut(espeak(voice, texts[319 - t]), 1.2)
            for n in (5, 30):
                part = turns[:n]
                v = judge.check([("A", a) for a in part])
                served = {k for k, x in enumerate(v.turns) if x.status == "inconsistent"}
                ruled = served | rule_flags(part)
                for name, flagged in (("served", served), ("served + outlier flag", ruled)):
                    ok = not flagged if scenario == "S1" else SLOT in flagged
                    counts.setdefault((n, name, scenario), []).append(ok)
            print(f"{target} {scenario} done", flush=True)
campplus.close()
for n in (5, 30):
    for name in ("served", "served + outlier flag"):
        row = {s: 100 * np.mean(counts[(n, name, s)]) for s in ("S1", "S2", "S3")}
        bal = 0.5 * (row["S1"] + 0.5 * (row["S2"] + row["S3"]))
        print(f"{n} turns, {name}: S1 {row['S1']:.0f} S2 {row['S2']:.0f} S3 {row['S3']:.0f} Bal {bal:.1f} "
              f"(10 dialogues a scenario)")
