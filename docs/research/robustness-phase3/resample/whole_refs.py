"""The four short-turn conditions rebuilt with whole references (session 26), through a real server: the replays of the
cut-reference build (runs/default-replay) against those of the rebuild (runs/replay-whole-refs), paired over the
dialogues the first answered (the server refused a cut reference under 1 s of speech). Output: whole_refs.txt."""
import json, sys
sys.path[:0] = ["service", "tools"]
from sleuthd_bench import paired
from sleuthd_bench.robustness import judges
for c in ("c-short", "c-mixed", "f-fsdd-short", "g-kokoro-short"):
    old = paired.detection_records(json.loads(l) for l in open(f"runs/default-replay/eval-{c}/predictions.jsonl"))["auto"]
    new = paired.detection_records(json.loads(l) for l in open(f"runs/replay-whole-refs/eval-{c}/predictions.jsonl"))["auto"]
    cmp = paired.compare("whole", new, "cut", old)
    ids = {r.dialogue_id for r in old}
    mo, mn = judges.metrics(old), judges.metrics([r for r in new if r.dialogue_id in ids])
    ma = judges.metrics(new)
    print(f"| {c} | {len(ids)} | {mo['bal']:.1f} ({mo['S1']:.1f}/{mo['S2']:.1f}/{mo['S3']:.1f}) | {mn['bal']:.1f} ({mn['S1']:.1f}/{mn['S2']:.1f}/{mn['S3']:.1f}) | {cmp.bal.difference:+.2f} [{cmp.bal.low:+.2f}, {cmp.bal.high:+.2f}] | {ma['bal']:.1f} ({ma['S1']:.1f}/{ma['S2']:.1f}/{ma['S3']:.1f}) |")
