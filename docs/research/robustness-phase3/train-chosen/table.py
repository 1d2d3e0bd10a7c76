"""The served default against the train-chosen rule, one row per condition, from `robustness report --json`.

PYTHONPATH=service:tools:. python docs/research/robustness-phase3/train-chosen/table.py REPORT.json"""

import json
import sys

rep = json.loads(open(sys.argv[1]).read())["conditions"]
print("| condition | hindsight oracle Bal (which) | train-chosen rule @τ (Bal on train) | its eval Bal (S1/S2/S3) | "
      "served Bal (S1/S2/S3) | served − train-chosen [95 %, over voices] |")
print("| :--- | :--- | :--- | :--- | :--- | :--- |")
gaps, deltas = [], []
for cond, r in rep.items():
    ob, f = r["oracle_best"], r["runs"]["evidence"]
    tc = r.get("train_chosen")
    served = f"{f['bal']:.1f} ({f['S1']:.1f}/{f['S2']:.1f}/{f['S3']:.1f})"
    if tc is None:
        print(f"| {cond} | {ob['bal']:.1f} ({ob['run']}) | no train split | - | {served} | - |")
        continue
    c = next(x for x in r["paired"] if x["vs"] == "train-chosen")
    gaps.append(ob["bal"] - tc["bal"])
    deltas.append(c["bal"])
    print(f"| {cond} | {ob['bal']:.1f} ({ob['run']}) | {tc['run']} @{tc['threshold']:.3f} ({tc['train_bal']:.1f}) | "
          f"{tc['bal']:.1f} ({tc['S1']:.1f}/{tc['S2']:.1f}/{tc['S3']:.1f}) | {served} | "
          f"{c['bal']:+.2f} [{c['low']:+.2f}, {c['high']:+.2f}] |")
print()
print(f"Over the {len(gaps)} conditions with a train split: the hindsight oracle is above the train-chosen rule by "
      f"{sum(gaps) / len(gaps):.2f} Bal points on average (0 to {max(gaps):.2f}); served − train-chosen averages "
      f"{sum(deltas) / len(deltas):+.2f}; the served default is ahead beyond its interval on "
      f"{sum(x['low'] > 0 for r in rep.values() for x in r.get('paired', []) if x['vs'] == 'train-chosen')}, "
      f"behind beyond it on "
      f"{sum(x['high'] < 0 for r in rep.values() for x in r.get('paired', []) if x['vs'] == 'train-chosen')}.")
