"""The robustness report: per condition and method, Bal / Bal-F1 / S1 / S2 / S3, the oracle column
(the best hindsight threshold of each encoder x paper method on that condition), the train-chosen rule
(the encoder x paper method x threshold that is best on the condition's train split, applied unchanged to
eval: what a team that tunes one threshold on labelled data of its own condition would ship), the evidence
model's uncertain rate, and paired bootstrap intervals of the evidence model against today's fused `auto`,
the best fixed-threshold run and the train-chosen rule, over whole voices (sleuthd_bench.paired's groups).
Values in percent (0-100)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sleuthd_bench import paired
from sleuthd_bench.metrics import DetectionRecord
from sleuthd_bench.robustness.instances import Instance
from sleuthd_bench.robustness.judges import PAPER, Oracle, metrics, oracle, paper_flags, record

ORACLE_ENCODERS = ("ge2e", "campplus")  # "any single encoder": the bar is the best of these
TRAIN_CHOSEN = "train-chosen"  # the run name of the train-chosen rule's records


def oracles(instances: Sequence[Instance]) -> dict[str, Oracle]:
    """Every encoder x paper method's hindsight threshold on these instances, by ``<encoder>:<method>``."""
    found = {}
    for enc in ORACLE_ENCODERS:
        for method in PAPER:
            o = oracle(instances, enc, method)
            if o is not None:
                found[f"{enc}:{method}"] = o
    return found


def best_rule(found: Mapping[str, Oracle]) -> Oracle | None:
    """The single rule (encoder, paper method, threshold) with the highest Bal among :func:`oracles`' ``found``;
    ties go to the first in ORACLE_ENCODERS x PAPER order."""
    return max(found.values(), key=lambda o: o.bal) if found else None


def train_chosen(
    train: Sequence[Instance], evals: Sequence[Instance], conditions: Sequence[str]
) -> tuple[list[DetectionRecord], dict[str, dict[str, Any]]]:
    """Per condition, the best rule on its train instances (other voices, same condition), applied unchanged to
    its eval instances: the eval records (one run, named TRAIN_CHOSEN) and each condition's choice. A condition
    without train instances gets neither."""
    records: list[DetectionRecord] = []
    choices: dict[str, dict[str, Any]] = {}
    for cond in conditions:
        rule = best_rule(oracles([i for i in train if i.condition == cond]))
        if rule is None:
            continue
        choices[cond] = {
            "run": f"{rule.encoder}:{rule.method}",
            "threshold": round(rule.threshold, 4),
            "train_bal": round(rule.bal, 2),
        }
        for inst in evals:
            if inst.condition == cond:
                records.append(record(inst, paper_flags(inst.views[rule.encoder], rule.method, rule.threshold)))
    return records, choices


def condition_report(
    cond: str,
    instances: Sequence[Instance],
    runs: Mapping[str, Sequence[DetectionRecord]],
    uncertain: Mapping[str, Sequence[int]],
    focus: str | None,
    baseline: str = "fused:auto",
    refused: int = 0,
    chosen: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``instances``: those the server answers; ``refused``: how many more of the condition it refuses (an unusable
    reference: INVALID_ARGUMENT), reported as a share of all; ``chosen``: the condition's train-chosen rule
    (:func:`train_chosen`), whose eval records are ``runs[TRAIN_CHOSEN]``."""
    mine = [i for i in instances if i.condition == cond]
    ids = {(i.dialogue_id, i.scenario) for i in mine}
    out: dict[str, Any] = {
        "dialogues": len({i.dialogue_id for i in mine}),
        "instances": len(mine),
        "refused": round(100.0 * refused / max(len(mine) + refused, 1), 2),
        "runs": {},
        "oracle": {},
    }
    for name, recs in runs.items():
        sel = [r for r in recs if r.source == cond and (r.dialogue_id, r.scenario) in ids]
        if sel:
            row = {k: round(v, 2) for k, v in metrics(sel).items()}
            if name in uncertain:
                flags = [u for r, u in zip(recs, uncertain[name], strict=True) if r.source == cond]
                s1 = [u for r, u in zip(recs, uncertain[name], strict=True) if r.source == cond and r.scenario == "S1"]
                row["uncertain"] = round(100.0 * sum(flags) / max(len(flags), 1), 2)
                row["uncertain_S1"] = round(100.0 * sum(s1) / max(len(s1), 1), 2)
            out["runs"][name] = row
    found = oracles(mine)
    for name, o in found.items():
        out["oracle"][name] = {
            "threshold": round(o.threshold, 4),
            "S1": round(o.S1, 2),
            "S2": round(o.S2, 2),
            "S3": round(o.S3, 2),
            "bal": round(o.bal, 2),
        }
    best = best_rule(found)
    if best is not None:
        out["oracle_best"] = {"run": f"{best.encoder}:{best.method}", "bal": round(best.bal, 2)}
        # The S2 bar applies where the Bal-optimal hindsight threshold of some encoder x paper method finds
        # >= 99 % of the opposite-gender intruders (a threshold that flags everything does not count).
        out["s2_reachable"] = any(o["S2"] >= 99.0 for o in out["oracle"].values())
    if chosen is not None and TRAIN_CHOSEN in out["runs"]:
        out["train_chosen"] = {**chosen, **out["runs"][TRAIN_CHOSEN]}
    if focus is not None and focus in runs and baseline in runs:
        # Whole voices are resampled: a voice's dialogues are drawn from a few clips of it, so they repeat each other
        # (a voice is one speaker in every language, as the fit's folds take it).
        voices = {i.dialogue_id: i.target.partition("@")[0] for i in mine}
        comps = []
        for other in (baseline, *_best_fixed(out), *([TRAIN_CHOSEN] if TRAIN_CHOSEN in out["runs"] else [])):
            a = [r for r in runs[focus] if r.source == cond]
            b = [r for r in runs[other] if r.source == cond]
            c = paired.compare(focus, a, other, b, groups=voices)
            comps.append(
                {
                    "vs": other,
                    "bal": round(c.bal.difference, 2),
                    "low": round(c.bal.low, 2),
                    "high": round(c.bal.high, 2),
                    "voices": c.clusters,
                }
            )
        out["paired"] = comps
    return out


def _best_fixed(report: Mapping[str, Any]) -> list[str]:
    fixed = {k: v for k, v in report["runs"].items() if "@" in k}
    return [max(fixed, key=lambda k: fixed[k]["bal"])] if fixed else []


def markdown(report: Mapping[str, Any], focus: str | None, runs_shown: Sequence[str]) -> str:
    lines = ["# Robustness matrix", ""]
    conds = report["conditions"]
    chosen = any("train_chosen" in r for r in conds.values())
    head = "| condition | n | refused % | fused auto today Bal (S1/S2/S3) | best oracle (which) Bal | "
    align = "| :--- | ---: | ---: | :--- | :--- |"
    if chosen:
        head += "train-chosen rule (which) Bal | "
        align += " :--- |"
    if focus:
        head += f"{focus} Bal (S1/S2/S3) | uncertain % (S1) | meets Bal bar | S2 bar |"
        align += " :--- | :--- | :--- | :--- |"
        if chosen:
            head += " meets train-chosen |"
            align += " :--- |"
    lines += [head, align]
    met = {"bal": 0, "s2": 0, "s2_applies": 0, "chosen": 0, "chosen_applies": 0}
    for cond, r in conds.items():
        today = r["runs"].get("fused:auto")
        t = f"{today['bal']:.1f} ({today['S1']:.1f}/{today['S2']:.1f}/{today['S3']:.1f})" if today else "-"
        ob = r.get("oracle_best", {})
        o = f"{ob.get('bal', 0):.1f} ({ob.get('run', '-')})"
        tc = r.get("train_chosen")
        row = f"| {cond} | {r['dialogues']} | {r.get('refused', 0):.1f} | {t} | {o} |"
        if chosen:
            row += f" {tc['bal']:.1f} ({tc['run']}) |" if tc else " - |"
        if focus and focus in r["runs"]:
            f = r["runs"][focus]
            meets = f["bal"] >= ob.get("bal", 0) - 1e-9
            s2 = "-" if not r.get("s2_reachable") else ("yes" if f["S2"] >= 99.0 else "no")
            met["bal"] += meets
            met["s2_applies"] += s2 != "-"
            met["s2"] += s2 == "yes"
            row += (
                f" {f['bal']:.1f} ({f['S1']:.1f}/{f['S2']:.1f}/{f['S3']:.1f}) | "
                f"{f.get('uncertain', 0):.1f} ({f.get('uncertain_S1', 0):.1f}) | {'yes' if meets else 'no'} | {s2} |"
            )
            if chosen:
                at_least = tc is not None and f["bal"] >= tc["bal"] - 1e-9
                row += " - |" if tc is None else (" yes |" if at_least else " no |")
                met["chosen_applies"] += tc is not None
                met["chosen"] += at_least
        lines.append(row)
    if focus:
        lines += [
            "",
            f"{focus} meets the Bal bar (the hindsight oracle) on {met['bal']} of {len(conds)} conditions and the S2 "
            f"bar on {met['s2']} of the {met['s2_applies']} where it applies"
            + (
                f"; it is at least the train-chosen rule on {met['chosen']} of {met['chosen_applies']}."
                if chosen
                else "."
            ),
        ]
    lines.append("")
    others = [n for n in runs_shown if n not in (focus, TRAIN_CHOSEN) and not n.count(":")]
    if others:
        # Every further evidence run (e.g. refits without a condition group) beside the focus run.
        lines += [
            "| condition | best oracle Bal | " + " | ".join(f"{n} Bal (S1/S2/S3)" for n in others) + " |",
            "| :--- | ---: |" + " :--- |" * len(others),
        ]
        for cond, r in report["conditions"].items():
            cells = []
            for n in others:
                x = r["runs"].get(n)
                cells.append(f"{x['bal']:.1f} ({x['S1']:.1f}/{x['S2']:.1f}/{x['S3']:.1f})" if x else "-")
            lines.append(f"| {cond} | {r.get('oracle_best', {}).get('bal', 0):.1f} | " + " | ".join(cells) + " |")
        lines.append("")
    for cond, r in report["conditions"].items():
        lines += [
            f"## {cond}",
            "",
            "| run | Bal | Bal F1 | S1 | S2 | S3 | uncertain |",
            "| :--- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for name in runs_shown:
            if name in r["runs"]:
                x = r["runs"][name]
                u = f"{x['uncertain']:.1f}" if "uncertain" in x else ""
                lines.append(
                    f"| {name} | {x['bal']:.1f} | {x['bal_f1']:.1f} | {x['S1']:.1f} | {x['S2']:.1f} | {x['S3']:.1f} "
                    f"| {u} |"
                )
        for name, o in r["oracle"].items():
            lines.append(
                f"| oracle {name} @{o['threshold']:.3f} | {o['bal']:.1f} | | {o['S1']:.1f} | {o['S2']:.1f} "
                f"| {o['S3']:.1f} | |"
            )
        if "train_chosen" in r:
            tc = r["train_chosen"]
            lines.append(f"\n{TRAIN_CHOSEN}: {tc['run']} @{tc['threshold']:.3f} (Bal {tc['train_bal']:.1f} on train)")
        for c in r.get("paired", []):
            lines.append(
                f"\n{focus} − {c['vs']}: Δ Bal {c['bal']:+.2f} [{c['low']:+.2f}, {c['high']:+.2f}] "
                f"(paired bootstrap over {c.get('voices', 0) or 'the'} voices' dialogues, 95 %)"
            )
        lines.append("")
    return "\n".join(lines) + "\n"
