"""Writing benchmark reports: ``report.json``, ``report.md``, predictions, plots.

``report.json`` follows the schema in ``docs/benchmark-format.md``::

    {"manifest": str, "n_dialogues": int, "encoder": str,
     "methods": {<run name>: <metrics.method_report(...) object>}}

All metric values are percentages (0–100) rounded to one decimal.
"""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sleuthd_bench import plots

_MISSING = "–"


def build_report(
    manifest_name: str, n_dialogues: int, encoder: str, methods: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """Assemble the ``report.json`` object.

    ``methods`` maps a run name (``"pairwise@paper"``, ``"auto"``, …) to the
    per-run object from :func:`sleuthd_bench.metrics.method_report`; it is deep
    copied, in the given order. Raises ``ValueError`` when a run lacks
    ``"detection"`` or ``"localization"`` or has unexpected top-level keys.
    """
    allowed = {"detection", "localization", "discrimination"}
    for name, res in methods.items():
        missing = {"detection", "localization"} - set(res)
        extra = set(res) - allowed
        if missing or extra:
            raise ValueError(f"run {name!r}: missing {sorted(missing)} / unexpected {sorted(extra)} keys")
    return {
        "manifest": manifest_name,
        "n_dialogues": int(n_dialogues),
        "encoder": encoder,
        "methods": {name: copy.deepcopy(dict(res)) for name, res in methods.items()},
    }


def _fmt(value: Any) -> str:
    if value is None:
        return _MISSING
    return f"{float(value):.1f}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _sources(methods: Mapping[str, Mapping[str, Any]]) -> list[str]:
    found: set[str] = set()
    for res in methods.values():
        acc = res.get("discrimination", {}).get("accuracy", {})
        found.update(k for k in acc if k != "avg")
    return sorted(found)


def markdown_table(report: Mapping[str, Any]) -> str:
    """Render a Table-2-style markdown table, one row per run.

    Columns: detection accuracy S1, S2, S3, Bal; localization F1 for S1,
    P/R/F1 for S2 and S3, balanced F1; discrimination accuracy per source
    (sorted, union over runs) and pooled avg; NDCG@1, NDCG@2, exact match.
    The header states that values are percentages; missing values (a run
    without discrimination, or without a source) are shown as "–".
    """
    methods: Mapping[str, Mapping[str, Any]] = report["methods"]
    sources = _sources(methods)
    header = [
        "Run (values in %)",
        "Det S1",
        "Det S2",
        "Det S3",
        "Det Bal",
        "Loc S1 F1",
        "Loc S2 P",
        "Loc S2 R",
        "Loc S2 F1",
        "Loc S3 P",
        "Loc S3 R",
        "Loc S3 F1",
        "Loc Bal F1",
        *[f"Disc acc {_cell(s)}" for s in sources],
        "Disc acc avg",
        "NDCG@1",
        "NDCG@2",
        "EM",
    ]
    lines = [
        "| " + " | ".join(header) + " |",
        "| " + " | ".join([":---"] + ["---:"] * (len(header) - 1)) + " |",
    ]
    for name, res in methods.items():
        det = res["detection"]
        loc = res["localization"]
        disc = res.get("discrimination") or {}
        acc = disc.get("accuracy", {})
        cells = [
            _cell(name),
            _fmt(det["S1"]),
            _fmt(det["S2"]),
            _fmt(det["S3"]),
            _fmt(det["bal"]),
            _fmt(loc["S1"]["f1"]),
            _fmt(loc["S2"]["p"]),
            _fmt(loc["S2"]["r"]),
            _fmt(loc["S2"]["f1"]),
            _fmt(loc["S3"]["p"]),
            _fmt(loc["S3"]["r"]),
            _fmt(loc["S3"]["f1"]),
            _fmt(loc["bal_f1"]),
            *[_fmt(acc.get(s)) for s in sources],
            _fmt(acc.get("avg")),
            _fmt(disc.get("ndcg1")),
            _fmt(disc.get("ndcg2")),
            _fmt(disc.get("exact_match")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _finite_or_null(obj: Any) -> Any:
    """Replace NaN/±inf floats by ``None`` so the output is strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k: _finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_or_null(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted(_finite_or_null(v) for v in obj)
    return obj


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _markdown_document(report: Mapping[str, Any], images: Sequence[Path]) -> str:
    parts = [
        "# sleuthd benchmark report",
        "",
        f"- manifest: `{report['manifest']}`",
        f"- dialogues: {report['n_dialogues']}",
        f"- encoder: `{report['encoder']}`",
        "",
        markdown_table(report),
        "All values are percentages (0–100), rounded to one decimal (half up) after being "
        "computed at full precision. Detection Bal = ½(S1 + (S2 + S3)/2); localization "
        "P/R/F1 are macro-averaged per scenario (P = 0 for an empty prediction, R = 0 for "
        "an empty gold set, F1 = 1 when both are empty), Bal F1 = ½(F1 S1 + (F1 S2 + F1 S3)/2). "
        "Discrimination accuracy avg is pooled over all instances; ranking relevance is "
        "S1 = 2, S3 = 1, S2 = 0, and tied scores are ordered pessimistically (least relevant "
        "first). Metric definitions: Lee et al., SpeakerSleuth (ACL 2026), Appendix B.3.",
    ]
    for img in images:
        parts += ["", f"![{img.stem}]({img.name})"]
    return "\n".join(parts) + "\n"


def write_report(
    out_dir: Path,
    report: Mapping[str, Any],
    sweeps: Mapping[str, Sequence[Mapping[str, float]]] | None,
    predictions: Iterable[Mapping[str, Any]],
    *,
    sweep_defaults: Mapping[str, float] | None = None,
) -> dict[str, Path]:
    """Write a report folder and return the paths written, by role.

    Files (roles in brackets): ``report.json`` [``report_json``],
    ``report.md`` [``report_md``], ``predictions.jsonl`` [``predictions``, one
    JSON object per line in the given order, NaN/inf written as ``null`` so
    the file is strict JSON], ``bias_scatter.png`` [``bias_scatter``, when
    the report has runs] and ``threshold_sweep.png`` [``threshold_sweep``,
    when ``sweeps`` is non-empty; ``sweep_defaults`` are marked on it].
    ``out_dir`` is created if needed; text files are replaced atomically.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}

    json_path = out / "report.json"
    _atomic_write(json_path, json.dumps(report, indent=2, ensure_ascii=False, allow_nan=False) + "\n")
    written["report_json"] = json_path

    pred_path = out / "predictions.jsonl"
    tmp = pred_path.with_name(pred_path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for obj in predictions:
            fh.write(json.dumps(_finite_or_null(obj), ensure_ascii=False, allow_nan=False) + "\n")
    os.replace(tmp, pred_path)
    written["predictions"] = pred_path

    images: list[Path] = []
    if report.get("methods"):
        written["bias_scatter"] = plots.plot_bias_scatter(report, out / "bias_scatter.png")
        images.append(written["bias_scatter"])
    if sweeps:
        written["threshold_sweep"] = plots.plot_threshold_sweep(
            sweeps, out / "threshold_sweep.png", defaults=sweep_defaults
        )
        images.append(written["threshold_sweep"])

    md_path = out / "report.md"
    _atomic_write(md_path, _markdown_document(report, images))
    written["report_md"] = md_path
    return written
