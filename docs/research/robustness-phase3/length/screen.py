"""Screen: length matching. A short turn among long ones is judged again on copies of the speaker's other pieces cut
to its length. Why: under c-mixed every S1 false alarm of the served judgment is a 1.4-1.7 s turn among 4-5 s turns
and a whole reference (resample/short_flags.txt): a short clip's embedding lies further from its speaker's than a long
one's (fewer windows to average; CAM++ refills a short window with its own audio), so against long pieces a genuine
short turn looks like another voice. On copies of equal length the yardstick is a short one too.

The rule screened (the served judgment, channel and pitch matching at the server's defaults, then): a turn flagged by
it on a speaker judged on its clips as sent, whose speech is shorter than RATIO times the median speech of the
speaker's other pieces (usable turns and reference), is judged again with every other piece longer than it replaced by
a copy cut to its length (the middle of the piece's trimmed speech, as many samples as the turn's own trimmed speech);
if it is then not flagged it is cleared. Turns are judged again one at a time. Nothing is fitted.

    PYTHONPATH=service:tools:. python docs/research/robustness-phase3/length/screen.py train|eval [--ratio 0.4,0.5,...]

Cut copies are embedded once and cached in runs/length/cuts-<split>.npz. Refused instances are left out, as the
report does. Paired bootstrap over dialogues, 2000 resamples, 95 %."""
import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, "docs/research/robustness-phase3/expressive")
import common  # noqa: E402
from sleuthd.api import GUARD_ENCODER, SpeakerEncoder, guard_margin  # noqa: E402
from sleuthd.config import EngineConfig  # noqa: E402
from sleuthd.domain import AudioInput  # noqa: E402
from sleuthd.encoders.clips import decode, trim  # noqa: E402
from sleuthd_bench import paired  # noqa: E402
from sleuthd_bench.robustness import embed, judges  # noqa: E402
from sleuthd_bench.robustness.cli import pitch_matching  # noqa: E402
from sleuthd_bench.robustness.instances import ENCODERS, FUSED, Turns  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("split")
ap.add_argument("--ratio", default="0.4,0.5,0.6,0.7")
ap.add_argument("--below", default="0.5,0.3,0.2", help="clear when the probability judged again is below this")
ap.add_argument("--guard", default="-inf", help="clear only when the CAM++ guard margin is at least this (list)")
ap.add_argument("--dump", type=float)
ap.add_argument("--root", default=str(common.ROOT), help="data/devlarge for the dev splits (conditions dev-*)")
args = ap.parse_args()
ROOT = Path(args.root)
GATE = 0.75  # the widest ratio embedded
names = sorted(p.name[len(args.split) + 1 : -len(".jsonl")] for p in ROOT.glob(f"{args.split}-*.jsonl"))
_, insts = common.load(args.split, names, ROOT)
insts = [i for i in insts if not i.refused]
fcal, ev = common.load_models()
pitch = pitch_matching(ROOT, EngineConfig().pitch_match_octaves)
ref_seconds = embed.load(ROOT, "ge2e")

encoders = {e: SpeakerEncoder.load(Path("models"), encoder=e) for e in ENCODERS}
vad = encoders[ENCODERS[0]]._models.vad
target_dbfs = encoders[ENCODERS[0]].manifest.loudness_target_dbfs
_kept: dict[str, np.ndarray] = {}


def kept(path: str) -> np.ndarray:
    """The clip's trimmed speech (loudness-normalised, VAD-kept samples), as the encoders' windows see it."""
    if path not in _kept:
        speech = trim(decode(AudioInput((ROOT / path).read_bytes()), 600.0).samples, target_dbfs, vad)
        _kept[path] = speech.samples[speech.keep]
    return _kept[path]


cache_file = Path(f"runs/length/cuts-{ROOT.name}-{args.split}.npz")
cache: dict[tuple[str, str, int], tuple[np.ndarray | None, float]] = {}
if cache_file.is_file():
    z = np.load(cache_file, allow_pickle=True)
    for e, p, n, v, s in zip(z["enc"], z["path"], z["n"], z["vec"], z["speech"]):
        cache[(str(e), str(p), int(n))] = (None if np.isnan(v[0]) else v, float(s))


def save() -> None:
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    keys = list(cache)
    width = max(len(v) for v, _ in cache.values() if v is not None) if cache else 1
    vec = np.full((len(keys), width), np.nan, np.float32)
    for k, key in enumerate(keys):
        v = cache[key][0]
        if v is not None:
            vec[k, : len(v)] = v
    np.savez(cache_file, enc=np.array([k[0] for k in keys]), path=np.array([k[1] for k in keys]),
             n=np.array([k[2] for k in keys]), vec=vec, speech=np.array([cache[k][1] for k in keys]))


def cut(e: str, path: str, n: int) -> tuple[np.ndarray | None, float]:
    key = (e, path, n)
    if key not in cache:
        s = kept(path)
        start = max(0, (len(s) - n) // 2)
        r = encoders[e]._sync.run(encoders[e].embed_waveform(np.ascontiguousarray(s[start:start + n])))
        dim = encoders[e].manifest.embedding_size
        cache[key] = (r.embedding, r.speech_seconds) if r.embedding is not None else (None, r.speech_seconds)
        del dim
    v, s = cache[key]
    if v is not None and len(v) != encoders[e].manifest.embedding_size:
        v = v[: encoders[e].manifest.embedding_size]
    return v, s


def again(i, t: int) -> tuple[float, float] | None:
    """Turn ``t``'s probability of instance ``i`` judged with every piece other than ``t`` longer than it cut to its
    length, and its CAM++ guard margin there (pitch matching's guard_margin) (None: a cut copy is unusable)."""
    n = len(kept(i.paths[t]))
    joint = i.views[FUSED]
    views = {}
    made: dict[str, dict] = {e: {} for e in ENCODERS}
    for e in ENCODERS:
        v = i.views[e]
        emb, seconds = v.emb.copy(), v.seconds.copy()
        for j, pos in enumerate(v.index.tolist()):
            if pos == t or len(kept(i.paths[pos])) <= n:
                continue
            vec, s = cut(e, i.paths[pos], n)
            if vec is None:
                return None
            emb[j], seconds[j] = vec, s
            made[e][pos] = vec
        reference = v.reference
        if reference is not None and len(kept(i.reference_path)) > n:
            reference, _ = cut(e, i.reference_path, n)
            if reference is None:
                return None
            made[e]["ref"] = reference
        views[e] = Turns(v.index, emb, seconds, reference)
    emb, seconds = joint.emb.copy(), joint.seconds.copy()
    for j, pos in enumerate(joint.index.tolist()):
        if pos in made[ENCODERS[0]]:
            emb[j] = embed.fused([made[e][pos] for e in ENCODERS])
            seconds[j] = views[ENCODERS[0]].seconds[int(np.searchsorted(views[ENCODERS[0]].index, pos))]
    reference = joint.reference
    if "ref" in made[ENCODERS[0]]:
        reference = embed.fused([made[e]["ref"] for e in ENCODERS])
    views[FUSED] = Turns(joint.index, emb, seconds, reference)
    again_inst = replace(i, views=views)
    probability = judges._judged(again_inst, ev, fcal)[2]
    row = int(np.searchsorted(joint.index, t))
    grams, has_ref, _, _ = judges.evidence_inputs(again_inst)
    return float(probability[row]), guard_margin(grams[GUARD_ENCODER], [int(has_ref) + row])


rows = []
t0 = time.monotonic()
n_cand = 0
for k, i in enumerate(insts):
    served = judges.evidence_flags(i, ev, fcal, *common.MATCH, pitch)[0]
    sent = judges.channel_matched(i, *common.MATCH) is i
    ratio = {}
    cleared = {}
    if served and sent:
        v = i.views[FUSED]
        secs = dict(zip(v.index.tolist(), v.seconds.tolist()))
        ref_s = ref_seconds.get(i.reference_path)[1] if i.reference_path else None
        for t in sorted(served):
            others = [s for p, s in secs.items() if p != t] + ([ref_s] if ref_s else [])
            if not others or t not in secs:
                continue
            ratio[t] = secs[t] / float(np.median(others))
            if ratio[t] < GATE:
                n_cand += 1
                a = again(i, t)
                cleared[t] = (1.0, -np.inf) if a is None else a
    rows.append((i, served, ratio, cleared))
    if k % 500 == 0:
        print(f"  {k}/{len(insts)} instances, {n_cand} candidates, {time.monotonic() - t0:.0f} s", file=sys.stderr)
        save()
save()


def flags(r, below=0.5, guard=-np.inf):
    return {(i.dialogue_id, i.scenario): served - {t for t, (p, g) in cleared.items()
                                                   if p < below and g >= guard and ratio[t] < r}
            for i, served, ratio, cleared in rows}


base = flags(0.0)


def records(f, cond):
    return [judges.record(i, f[(i.dialogue_id, i.scenario)]) for i, *_ in rows if i.condition == cond]


print(f"{args.split}: {len(names)} conditions, {len(rows)} instances; flagged turns under {GATE} of the speaker's "
      f"median judged again: {n_cand}")
grid = [(float(x), float(y), float(g)) for x in args.ratio.split(",") for y in args.below.split(",")
        for g in args.guard.split(",")]
for r, below, guard in grid:
    f = flags(r, below, guard)
    out = []
    for c in names:
        a, b = records(f, c), records(base, c)
        if all(x.pred_turns == y.pred_turns for x, y in zip(a, b)):
            continue
        d = paired.compare("ratio", a, "served", b).bal
        ma, mb = judges.metrics(a), judges.metrics(b)
        out.append(f"{c} {mb['bal']:.1f}->{ma['bal']:.1f} (S1 {mb['S1']:.1f}->{ma['S1']:.1f}, S2 {mb['S2']:.1f}->"
                   f"{ma['S2']:.1f}, S3 {mb['S3']:.1f}->{ma['S3']:.1f}) {d.difference:+.2f} [{d.low:+.2f}, {d.high:+.2f}]")
    mean = np.mean([judges.metrics(records(f, c))["bal"] for c in names])
    mean0 = np.mean([judges.metrics(records(base, c))["bal"] for c in names])
    print(f"\nratio {r:g}, below {below:g}, guard {guard:g}: mean Bal {mean0:.2f} -> {mean:.2f} ({mean - mean0:+.2f})")
    for line in out:
        print("  " + line)
if args.dump is not None:
    f = flags(args.dump, float(args.below.split(",")[0]), float(args.guard.split(",")[0]))
    for i, served, ratio, cleared in rows:
        k = (i.dialogue_id, i.scenario)
        if f[k] != served:
            print(f"  {i.condition:18s} {i.dialogue_id:24s} {i.scenario} gold {sorted(i.gold)} served {sorted(served)} "
                  f"-> {sorted(f[k])}  ratio {{{', '.join(f'{t}: {ratio[t]:.2f}' for t in sorted(cleared))}}}"
                  f"  again {{{', '.join(f'{t}: {p:.2f} guard {g:+.3f}' for t, (p, g) in sorted(cleared.items()))}}}")
for e in encoders.values():
    e.close()
