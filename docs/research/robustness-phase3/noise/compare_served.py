"""Noise matching served (session 19): the server's auto verdicts of a replay against the screen's (offline) ones,
instance by instance. Run from the repository root after the screen with NOISE_DUMP=<file>:

    PYTHONPATH=service:tools:. python docs/research/robustness-phase3/noise/compare_served.py DUMP REPLAY_DIR...
"""
import json
import sys
from pathlib import Path

from sleuthd_bench import paired
from sleuthd_bench.robustness import judges

offline = {}
for line in Path(sys.argv[1]).read_text().splitlines():
    cond, _, dialogue, scenario, flags = line.split("\t")
    offline[(dialogue, scenario)] = frozenset(json.loads(flags))
for folder in sys.argv[2:]:
    predictions = Path(folder) / "predictions.jsonl"
    served = paired.detection_records(json.loads(x) for x in predictions.read_text().splitlines())["auto"]
    differ = [r for r in served if offline[(r.dialogue_id, r.scenario)] != r.pred_turns]
    m = judges.metrics(served)
    print(f"{Path(folder).name}: auto, {len(served)} instances, {len(differ)} judged differently from the screen; "
          f"server Bal {m['bal']:.2f} (S1 {m['S1']:.1f} S2 {m['S2']:.1f} S3 {m['S3']:.1f})")
