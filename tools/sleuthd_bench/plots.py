"""PNG figures for benchmark reports (matplotlib, Agg).

matplotlib is imported inside the plotting functions, and each figure is drawn
on an explicit Agg canvas, so importing this module neither loads matplotlib
nor changes the process-wide backend or pyplot state.

* :func:`plot_threshold_sweep` — the paper's Figure 7: balanced detection
  accuracy and balanced localization F1 (percent) against the threshold τ
  (cosine similarity for pairwise/reference, cosine distance for centroid).
* :func:`plot_bias_scatter` — the paper's Figure 5: per run, S1 accuracy
  against the mean of S2/S3 accuracy (percent).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: The paper's fixed thresholds (Section 5 / Appendix B.2). Pairwise and
#: reference are cosine similarities (flag below), centroid a cosine
#: distance (flag above).
PAPER_THRESHOLDS: Mapping[str, float] = {"pairwise": 0.4, "centroid": 0.3, "reference": 0.4}


def _method_base(name: str) -> str:
    """``"pairwise@paper"`` / ``"Pairwise"`` → ``"pairwise"``."""
    return name.split("@", 1)[0].strip().lower()


def _paper_threshold(name: str) -> float | None:
    base = _method_base(name)
    for method, tau in PAPER_THRESHOLDS.items():
        if base == method or base.startswith(method):
            return tau
    return None


def _lookup(defaults: Mapping[str, float] | None, name: str) -> float | None:
    """A default threshold for a sweep name: exact name first, then method base."""
    if not defaults:
        return None
    if name in defaults:
        return float(defaults[name])
    base = _method_base(name)
    for key, tau in defaults.items():
        if _method_base(key) == base:
            return float(tau)
    return None


def _new_figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _value_at(xs: Sequence[float], ys: Sequence[float], tau: float) -> float | None:
    """Linear interpolation of the curve at ``tau``; ``None`` outside its range."""
    import numpy as np

    if not xs or tau < min(xs) or tau > max(xs):
        return None
    order = np.argsort(xs)
    return float(np.interp(tau, np.asarray(xs)[order], np.asarray(ys)[order]))


def plot_threshold_sweep(
    sweeps: Mapping[str, Sequence[Mapping[str, float]]],
    path: Path | str,
    defaults: Mapping[str, float] | None = None,
) -> Path:
    """Draw the Figure-7-style threshold sweep and save it as a PNG.

    ``sweeps`` maps a method name (e.g. ``"pairwise"``, ``"centroid"``) to the
    output of :func:`sleuthd_bench.metrics.threshold_sweep`: entries with
    ``"threshold"`` (τ, cosine similarity or cosine distance), ``"bal"`` and
    ``"bal_f1"`` (percent). Two panels share the τ axis, one line per method.
    A star marks the paper's threshold for the method (pairwise 0.4,
    centroid 0.3, reference 0.4, matched on the name before any ``@``), a
    hollow circle the threshold given in ``defaults`` (looked up by the exact
    sweep name, then by method name). Markers sit on the curve, linearly
    interpolated when τ falls between grid points, and are skipped outside
    the swept range. Returns the written path.
    """
    if not sweeps:
        raise ValueError("no sweeps to plot")
    from matplotlib.lines import Line2D

    out = Path(path)
    fig = _new_figure(10.0, 4.2)
    axes = fig.subplots(1, 2, sharex=True)
    panels = (
        ("bal", "Balanced detection accuracy (%)", "(a) Detection"),
        ("bal_f1", "Balanced localization F1 (%)", "(b) Localization"),
    )
    for ax, (key, ylabel, title) in zip(axes, panels, strict=True):
        for idx, (name, sweep) in enumerate(sweeps.items()):
            pts = sorted((float(e["threshold"]), float(e[key])) for e in sweep)
            xs = [p[0] for p in pts]
            ys = [p[1] for p in pts]
            color = f"C{idx % 10}"
            ax.plot(xs, ys, marker=".", color=color, label=name)
            paper = _paper_threshold(name)
            if paper is not None and (y := _value_at(xs, ys, paper)) is not None:
                ax.plot(
                    [paper],
                    [y],
                    marker="*",
                    markersize=14,
                    color=color,
                    markeredgecolor="black",
                    linestyle="none",
                    zorder=3,
                )
            dflt = _lookup(defaults, name)
            if dflt is not None and (y := _value_at(xs, ys, dflt)) is not None:
                ax.plot(
                    [dflt],
                    [y],
                    marker="o",
                    markersize=11,
                    markerfacecolor="none",
                    markeredgecolor=color,
                    markeredgewidth=2,
                    linestyle="none",
                    zorder=3,
                )
        ax.axhline(50.0, color="grey", linewidth=0.8, linestyle=":")
        ax.set_ylim(0.0, 100.0)
        ax.set_xlabel("threshold τ (cosine similarity; cosine distance for centroid)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    handles, _ = axes[0].get_legend_handles_labels()
    handles = [
        *handles,
        Line2D(
            [], [], marker="*", markersize=12, color="grey", markeredgecolor="black", linestyle="none", label="paper τ"
        ),
    ]
    if defaults:
        handles.append(
            Line2D(
                [],
                [],
                marker="o",
                markersize=9,
                markerfacecolor="none",
                markeredgecolor="grey",
                markeredgewidth=2,
                linestyle="none",
                label="default τ",
            )
        )
    axes[1].legend(handles=handles, loc="best", fontsize="small")
    fig.suptitle("Threshold sensitivity (dotted line: 50 % = chance-level balance)")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out


def plot_bias_scatter(report: Mapping[str, Any], path: Path | str) -> Path:
    """Draw the Figure-5-style detection bias scatter and save it as a PNG.

    One labelled point per run in ``report["methods"]`` at
    (S1 accuracy, mean of S2 and S3 accuracy), both in percent, read from the
    rounded ``report.json`` values. The diagonal marks equal accuracy on
    consistent and inconsistent dialogues (no bias); the anti-diagonal
    ``x + y = 100`` is balanced accuracy 50 % (always-consistent sits at
    (100, 0), always-inconsistent at (0, 100)). Returns the written path.
    """
    methods: Mapping[str, Any] = report.get("methods", {})
    out = Path(path)
    fig = _new_figure(5.6, 5.2)
    ax = fig.subplots()
    ax.plot([0, 100], [0, 100], color="grey", linestyle="--", linewidth=0.9, label="diagonal: S1 = S2/S3 (unbiased)")
    ax.plot([0, 100], [100, 0], color="grey", linestyle=":", linewidth=0.9, label="anti-diagonal: Bal = 50 %")
    # Runs with identical coordinates share one point and one stacked label.
    points: dict[tuple[float, float], list[str]] = {}
    for name, res in methods.items():
        det = res["detection"]
        xy = (float(det["S1"]), 0.5 * (float(det["S2"]) + float(det["S3"])))
        points.setdefault(xy, []).append(name)
    for idx, ((x, y), names) in enumerate(points.items()):
        ax.scatter([x], [y], color=f"C{idx % 10}", s=40, zorder=3)
        right = x > 60.0  # keep labels inside the axes near the right edge
        ax.annotate(
            "\n".join(names),
            (x, y),
            textcoords="offset points",
            xytext=(-6, 6) if right else (6, 6),
            ha="right" if right else "left",
            va="bottom",
            fontsize="small",
        )
    ax.set_xlim(-3.0, 103.0)
    ax.set_ylim(-3.0, 103.0)
    ax.set_aspect("equal")
    ax.set_xlabel("S1 accuracy (%) — consistent dialogues")
    ax.set_ylabel("mean S2/S3 accuracy (%) — inconsistent dialogues")
    ax.set_title("Detection bias per run")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out


def plot_reliability(summary: Mapping[str, Any], path: Path | str, title: str) -> Path:
    """Reliability diagram: observed share of inconsistent turns against mean predicted probability per
    bin (the diagonal is perfect calibration), with the bin counts below. ``summary`` is
    sleuthd_bench.reliability.summary()."""
    out = Path(path)
    fig = _new_figure(5.4, 6.0)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1])
    bins = summary["bins"]
    xs = [b["predicted"] for b in bins]
    top.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=0.9, label="perfect calibration")
    top.plot(xs, [b["observed"] for b in bins], marker="o", label="auto")
    top.set_ylabel("observed share of inconsistent turns")
    top.set_title(f"{title}\nECE {summary['ece']:.3f}, Brier {summary['brier']:.3f}, {summary['turns']} turns")
    top.set_xlim(0, 1)
    top.set_ylim(0, 1)
    top.grid(True, alpha=0.3)
    top.legend(loc="upper left", fontsize="small")
    bottom.bar([(b["low"] + b["high"]) / 2 for b in bins], [b["count"] for b in bins], width=0.09)
    bottom.set_yscale("log")
    bottom.set_xlabel("predicted probability that the turn does not belong to its speaker")
    bottom.set_ylabel("turns")
    fig.savefig(out)
    return out
