"""Speaker-drift dev set, second half: embed the built set, fit the detector and the paper's baseline on
``fit``, evaluate both on every split and write the report (``sleuthd-bench drift``).

Evaluation compares :func:`sleuthd.judgment.drift.detect_drift` with the paper's baseline: embed each of the
three segments (GE2E utterance embedding: the pooled windows at the encoder's own rate) and call
drift when the smallest cosine between adjacent segments is below a threshold. The baseline is given
the true segment boundaries (the known 500 ms silences; for smooth drift, voice A's layout), which
helps it; the detector sees only the whole utterance. Both thresholds are fitted for accuracy on
``fit``, the detector's with its window rate, ``min_side_windows`` and ``transition_level``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import itertools
import json
import logging
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from sleuthd.judgment.drift import DriftConfig, DriftResult, detect_drift

from sleuthd_bench.driftset import (
    SAMPLE_RATE,
    SPLITS,
    SUBTYPES,
    DriftLabel,
    DriftSetError,
    DriftSetSpec,
    build_driftset,
    read_labels,
    read_wav,
)

if TYPE_CHECKING:
    from sleuthd.api import SpeakerEncoder

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------- embedding


@dataclass(frozen=True)
class EmbeddedUtterance:
    """An utterance's windows for the detector and its three segment embeddings for the baseline.

    ``window_embeddings`` (n, D) unit vectors of windows started ``rate_per_second`` times a second,
    ``window_times`` (n, 2) their start/end seconds in the WAV; ``segment_embeddings`` (3, D): each
    segment embedded on its own (windows at the encoder's rate, pooled: GE2E's utterance embedding).
    """

    label: DriftLabel
    rate_per_second: float
    window_embeddings: np.ndarray
    window_times: np.ndarray
    segment_embeddings: np.ndarray

    def subsampled(self, every: int) -> EmbeddedUtterance:
        """The same utterance at ``rate / every``: every ``every``-th window (the same window starts
        a direct run at that rate would use, except possibly the last)."""
        if every == 1:
            return self
        return dataclasses.replace(
            self,
            rate_per_second=self.rate_per_second / every,
            window_embeddings=self.window_embeddings[::every],
            window_times=self.window_times[::every],
        )


def _file_digest(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


async def embed_driftset(
    labels_path: Path,
    encoder: SpeakerEncoder,
    rate_per_second: float,
    *,
    show_progress: bool = False,
) -> list[EmbeddedUtterance]:
    """Embed every utterance of a built dev set in-process (sleuthd.api).

    Window embeddings go through the service's own path (loudness, VAD trimming, windows at
    ``rate_per_second``, encoder); results are cached next to the labels in
    ``embeddings-<encoder>-<rate>.npz`` and reused for WAVs whose content has not changed.
    """
    from sleuthd_bench.progress import Progress

    labels_path = Path(labels_path)
    root = labels_path.parent
    labels = read_labels(labels_path)
    dense = encoder.windows_at(rate_per_second)
    cache_path = root / f"embeddings-{encoder.name}-{rate_per_second:g}.npz"
    cached: dict[str, np.ndarray] = {}
    digests: dict[str, str] = {}
    if cache_path.is_file():
        with np.load(cache_path) as npz:
            cached = {k: npz[k] for k in npz.files}
        digests = json.loads(str(cached.pop("__digests__"))) if "__digests__" in cached else {}

    out: list[EmbeddedUtterance] = []
    fresh: dict[str, np.ndarray] = {}
    fresh_digests: dict[str, str] = {}
    with Progress(len(labels), "embedding", enabled=show_progress) as bar:
        for label in labels:
            wav = root / label.path
            digest = _file_digest(wav)
            keys = (f"{label.uid}/emb", f"{label.uid}/times", f"{label.uid}/seg")
            if digests.get(label.uid) == digest and all(k in cached for k in keys):
                emb, times, seg = (cached[k] for k in keys)
            else:
                samples = read_wav(wav)
                clip = await encoder.embed_waveform(samples, dense)
                if clip.window_embeddings is None or clip.window_times is None:
                    raise DriftSetError(f"{wav}: not usable: {clip.detail}")
                emb = clip.window_embeddings
                times = clip.window_times
                seg_list = []
                for start, end in label.segments:
                    piece = samples[round(start * SAMPLE_RATE) : round(end * SAMPLE_RATE)]
                    seg_clip = await encoder.embed_waveform(piece)
                    if seg_clip.embedding is None:
                        raise DriftSetError(f"{wav}: segment {start:.2f}-{end:.2f} s not usable: {seg_clip.detail}")
                    seg_list.append(seg_clip.embedding)
                seg = np.stack(seg_list)
            fresh.update(dict(zip(keys, (emb, times, seg), strict=True)))
            fresh_digests[label.uid] = digest
            out.append(EmbeddedUtterance(label, rate_per_second, emb, times, seg))
            bar.advance()
    fresh["__digests__"] = np.array(json.dumps(fresh_digests))
    tmp = cache_path.with_name(f".{cache_path.stem}.tmp.npz")
    np.savez(tmp, **fresh)  # type: ignore[arg-type]
    os.replace(tmp, cache_path)
    return out


# ---------------------------------------------------------------------------------------------- scoring


def baseline_min_cosine(segment_embeddings: np.ndarray) -> float:
    """The paper's baseline score: the smallest cosine between adjacent segment embeddings."""
    s = np.asarray(segment_embeddings, dtype=np.float64)
    s = s / np.linalg.norm(s, axis=1, keepdims=True)
    return float(np.min(np.sum(s[:-1] * s[1:], axis=1)))


@dataclass(frozen=True)
class Prediction:
    """Both methods' output for one utterance (thresholds are applied later, per fit)."""

    label: DriftLabel
    rate_per_second: float
    detector: DriftResult  # at the config's threshold
    top_change: tuple[float, float] | None  # (start, end) of the strongest change, whatever its score
    baseline_score: float  # min adjacent-segment cosine
    detect_ms: float  # detect_drift wall time, milliseconds


def predict(utterances: Sequence[EmbeddedUtterance], config: DriftConfig) -> list[Prediction]:
    """Run the detector (at ``config``) and the baseline score on every utterance."""
    every = max(1, round(utterances[0].rate_per_second / config.window_rate_per_second)) if utterances else 1
    out = []
    for u in utterances:
        v = u.subsampled(every)
        if not math.isclose(v.rate_per_second, config.window_rate_per_second, rel_tol=1e-6):
            raise DriftSetError(
                f"embeddings at {u.rate_per_second:g}/s cannot give {config.window_rate_per_second:g}/s windows"
            )
        started = time.perf_counter()
        result = detect_drift(v.window_embeddings, v.window_times, config)
        elapsed = (time.perf_counter() - started) * 1000
        # The strongest change regardless of the threshold, for localization figures.
        top = detect_drift(
            v.window_embeddings, v.window_times, dataclasses.replace(config, threshold=0.0, max_changes=1)
        )
        top_span = (top.segments[0].start_seconds, top.segments[0].end_seconds) if top.segments else None
        out.append(
            Prediction(u.label, v.rate_per_second, result, top_span, baseline_min_cosine(u.segment_embeddings), elapsed)
        )
    return out


@dataclass(frozen=True)
class BinaryScores:
    n: int
    accuracy: float
    precision: float
    recall: float
    f1: float


def binary_scores(truth: Sequence[int], predicted: Sequence[bool]) -> BinaryScores:
    """Accuracy and F1 with drift (label 1) as the positive class."""
    tp = sum(1 for y, p in zip(truth, predicted, strict=True) if y == 1 and p)
    fp = sum(1 for y, p in zip(truth, predicted, strict=True) if y == 0 and p)
    fn = sum(1 for y, p in zip(truth, predicted, strict=True) if y == 1 and not p)
    tn = len(truth) - tp - fp - fn
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return BinaryScores(len(truth), (tp + tn) / len(truth) if truth else 0.0, precision, recall, f1)


def fit_threshold(scores: Sequence[float], truth: Sequence[int], *, drift_if: str) -> tuple[float, float]:
    """The threshold with the best accuracy on (scores, truth); returns (threshold, accuracy).

    ``drift_if`` is ``"above"`` (detector: cosine distance) or ``"below"`` (baseline: cosine).
    Candidates are midpoints between consecutive distinct scores; among equally accurate ones the
    widest gap wins (the most room on both sides).
    """
    if drift_if not in ("above", "below"):
        raise ValueError("drift_if must be 'above' or 'below'")
    values = np.unique(np.asarray(scores, dtype=np.float64))
    if len(values) == 0:
        raise DriftSetError("no scores to fit a threshold on")
    edges = np.concatenate([[values[0] - 1e-3], values, [values[-1] + 1e-3]])
    best: tuple[float, float, float] | None = None  # (accuracy, gap, threshold)
    y = np.asarray(truth)
    s = np.asarray(scores, dtype=np.float64)
    for lo, hi in itertools.pairwise(edges):
        thr = 0.5 * (lo + hi)
        flagged = s > thr if drift_if == "above" else s < thr
        acc = float(np.mean(flagged == (y == 1)))
        key = (acc, hi - lo, thr)
        if best is None or key[:2] > best[:2]:
            best = key
    assert best is not None
    return float(best[2]), best[0]


# ---------------------------------------------------------------------------------------------- localization


def _distance_to_interval(t: float, interval: tuple[float, float]) -> float:
    lo, hi = interval
    return max(0.0, lo - t, t - hi)


@dataclass(frozen=True)
class Localization:
    """Where the strongest change was put, against the truth (seconds; windows = seconds x rate)."""

    uid: str
    subtype: str
    predicted: float  # middle of the strongest change's segment
    to_change: float  # |predicted - change|: abrupt: start of the changed segment; smooth: middle of the fade
    to_interval: float  # distance to the silent gap (abrupt) or the fade (smooth); 0 inside
    coverage: float  # fraction of the gap/fade inside the reported segment
    rate_per_second: float


def localize(predictions: Iterable[Prediction]) -> list[Localization]:
    out = []
    for p in predictions:
        lab = p.label
        if lab.label != 1 or p.top_change is None or lab.change_interval is None:
            continue
        start, end = p.top_change
        mid = 0.5 * (start + end)
        truth = lab.change_seconds[0] if lab.subtype == "abrupt" else 0.5 * sum(lab.change_interval)
        lo, hi = lab.change_interval
        covered = max(0.0, min(end, hi) - max(start, lo)) / (hi - lo) if hi > lo else 0.0
        out.append(
            Localization(
                uid=lab.uid,
                subtype=lab.subtype,
                predicted=mid,
                to_change=abs(mid - truth),
                to_interval=_distance_to_interval(mid, lab.change_interval),
                coverage=covered,
                rate_per_second=p.rate_per_second,
            )
        )
    return out


# ---------------------------------------------------------------------------------------------- fitting


@dataclass(frozen=True)
class Candidate:
    """One detector setting tried on the fit split."""

    config: DriftConfig
    fit_accuracy: float
    fit_spurious_segments: int  # reported segments away from any true change (fit split)
    fit_localization_s: float  # mean distance of the strongest change to the gap/fade, fit abrupt + smooth


@dataclass(frozen=True)
class FitResult:
    config: DriftConfig  # the chosen detector setting, threshold included
    baseline_threshold: float  # min adjacent-segment cosine below this = drift
    baseline_fit_accuracy: float
    candidates: tuple[Candidate, ...]
    n_fit: int


def _split(predictions: Iterable[Prediction], split: str) -> list[Prediction]:
    return [p for p in predictions if p.label.split == split]


def shortest_turn_seconds(config: DriftConfig, window_seconds: float = 1.6) -> float:
    """Speech a turn needs before it can be searched: ``2 * min_side_windows`` windows at the config's rate."""
    return (2 * config.min_side_windows - 1) / config.window_rate_per_second + window_seconds


def spurious_segments(predictions: Iterable[Prediction]) -> tuple[int, int]:
    """(segments on a true change, segments elsewhere) among the reported segments.

    A segment is on the change when it comes within one window hop of the 500 ms gap (abrupt) or
    the fade (smooth); every segment of a label-0 utterance is elsewhere.
    """
    on, off = 0, 0
    for p in predictions:
        hop = 1.0 / p.rate_per_second
        for seg in p.detector.segments:
            interval = p.label.change_interval
            if interval is not None and seg.end_seconds >= interval[0] - hop and seg.start_seconds <= interval[1] + hop:
                on += 1
            else:
                off += 1
    return on, off


def fit_drift(
    utterances: Sequence[EmbeddedUtterance],
    *,
    rates: Sequence[float],
    min_sides: Sequence[int] = (4, 6, 8, 10),
    levels: Sequence[float] = (0.1, 0.15, 0.2),
    max_shortest_turn_seconds: float = 6.0,
    base: DriftConfig | None = None,
) -> FitResult:
    """Fit the detector and the baseline on the ``fit`` split only.

    For every (rate, min_side_windows, transition_level) the detector threshold is the accuracy-
    maximising one (:func:`fit_threshold`). The setting with the best fit accuracy wins; ties go to
    fewer spurious segments (reported away from any true change: binary segmentation on the shorter
    sides of a change is where noise gets through), then to the better localization (mean distance of
    the change point to the gap or fade), then to the lower window rate (cheaper). Settings that could
    not search a turn of ``max_shortest_turn_seconds`` of speech are not tried. The baseline threshold
    is fitted the same way.
    """
    base = base or DriftConfig()
    fit_set = [u for u in utterances if u.label.split == "fit"]
    if not fit_set:
        raise DriftSetError("the dev set has no fit split to fit on")
    truth = [u.label.label for u in fit_set]
    candidates: list[Candidate] = []
    for rate in rates:
        for m in min_sides:
            for level in levels:
                cfg = dataclasses.replace(base, window_rate_per_second=rate, min_side_windows=m, transition_level=level)
                if shortest_turn_seconds(cfg) > max_shortest_turn_seconds:
                    continue
                scores = [p.detector.score for p in predict(fit_set, cfg)]
                thr, _ = fit_threshold(scores, truth, drift_if="above")
                cfg = dataclasses.replace(cfg, threshold=round(thr, 4))
                preds = predict(fit_set, cfg)  # again, so segments are those at the fitted threshold
                acc = binary_scores(truth, [p.detector.score > cfg.threshold for p in preds]).accuracy
                loc = localize(preds)
                mean_loc = float(np.mean([x.to_interval for x in loc])) if loc else math.inf
                candidates.append(Candidate(cfg, acc, spurious_segments(preds)[1], mean_loc))
    if not candidates:
        raise DriftSetError("no detector setting can search turns as short as asked")
    best = max(
        candidates,
        key=lambda c: (
            c.fit_accuracy,
            -c.fit_spurious_segments,
            -c.fit_localization_s,
            -c.config.window_rate_per_second,
        ),
    )
    base_thr, _ = fit_threshold([baseline_min_cosine(u.segment_embeddings) for u in fit_set], truth, drift_if="below")
    base_thr = round(base_thr, 4)
    base_acc = binary_scores(truth, [baseline_min_cosine(u.segment_embeddings) < base_thr for u in fit_set]).accuracy
    return FitResult(best.config, base_thr, base_acc, tuple(candidates), len(fit_set))


# ---------------------------------------------------------------------------------------------- report


def _method_summary(preds: Sequence[Prediction], flagged: Sequence[bool], threshold: float) -> dict[str, Any]:
    scores = binary_scores([p.label.label for p in preds], flagged)
    per_subtype = {}
    for subtype in SUBTYPES:
        idx = [k for k, p in enumerate(preds) if p.label.subtype == subtype]
        if idx:
            correct = sum(1 for k in idx if flagged[k] == (preds[k].label.label == 1))
            per_subtype[subtype] = {"n": len(idx), "accuracy": correct / len(idx)}
    return {"threshold": threshold, **dataclasses.asdict(scores), "per_subtype": per_subtype}


def _localization_summary(loc: Sequence[Localization]) -> dict[str, Any]:
    if not loc:
        return {"n": 0}
    to_change = np.array([x.to_change for x in loc])
    to_interval = np.array([x.to_interval for x in loc])
    hop = 1.0 / loc[0].rate_per_second
    return {
        "n": len(loc),
        "hop_seconds": hop,
        "to_change_median_s": float(np.median(to_change)),
        "to_change_mean_s": float(np.mean(to_change)),
        "to_change_max_s": float(np.max(to_change)),
        "to_interval_median_s": float(np.median(to_interval)),
        "to_interval_mean_s": float(np.mean(to_interval)),
        "to_interval_max_s": float(np.max(to_interval)),
        "to_interval_mean_windows": float(np.mean(to_interval) / hop),
        "within_one_hop": float(np.mean(to_interval <= hop + 1e-9)),
        "coverage_mean": float(np.mean([x.coverage for x in loc])),
    }


def evaluate(utterances: Sequence[EmbeddedUtterance], fit: FitResult) -> dict[str, Any]:
    """Both methods at their fitted thresholds on every split; localization and detector runtime."""
    preds = predict(utterances, fit.config)
    report: dict[str, Any] = {
        "drift_config": dataclasses.asdict(fit.config),
        "baseline_threshold": fit.baseline_threshold,
        "splits": {},
        "localization": {},
    }
    for split in SPLITS:
        ps = _split(preds, split)
        if not ps:
            continue
        report["splits"][split] = {
            "n": len(ps),
            "detector": _method_summary(
                ps, [p.detector.score > fit.config.threshold for p in ps], fit.config.threshold
            ),
            "baseline": _method_summary(
                ps, [p.baseline_score < fit.baseline_threshold for p in ps], fit.baseline_threshold
            ),
        }
        loc = localize(ps)
        report["localization"][split] = {
            subtype: _localization_summary([x for x in loc if x.subtype == subtype]) for subtype in ("abrupt", "smooth")
        }
        # Reported segments at the fitted threshold: on a true change, or elsewhere.
        on, off = spurious_segments(ps)
        report["localization"][split]["segments"] = {"on_change": on, "elsewhere": off}
    times = np.array([p.detect_ms for p in preds])
    windows = np.array(
        [
            len(u.subsampled(max(1, round(u.rate_per_second / fit.config.window_rate_per_second))).window_times)
            for u in utterances
        ]
    )
    report["shortest_turn_seconds"] = shortest_turn_seconds(fit.config)
    report["runtime"] = {
        "detect_drift_ms_median": float(np.median(times)),
        "detect_drift_ms_p95": float(np.percentile(times, 95)),
        "detect_drift_ms_max": float(np.max(times)),
        "windows_per_turn_median": float(np.median(windows)),
        "turn_seconds_median": float(np.median([u.label.duration_seconds for u in utterances])),
    }
    report["predictions"] = [
        {
            "uid": p.label.uid,
            "split": p.label.split,
            "subtype": p.label.subtype,
            "label": p.label.label,
            "detector_score": round(p.detector.score, 5),
            "segments": [
                [round(s.start_seconds, 3), round(s.end_seconds, 3), round(s.score, 4)] for s in p.detector.segments
            ],
            "top_change": None if p.top_change is None else [round(t, 3) for t in p.top_change],
            "baseline_min_cosine": round(p.baseline_score, 5),
            "change_seconds": list(p.label.change_seconds),
            "change_interval": p.label.change_interval,
        }
        for p in preds
    ]
    return report


def drift_block(fit: FitResult, report: Mapping[str, Any]) -> dict[str, Any]:
    """The model card's ``drift`` block: the fitted setting and how it was fitted."""
    c = fit.config
    fit_det = report["splits"]["fit"]["detector"]
    how = (
        f"fitted on the fit split of `sleuthd-bench drift` ({fit.n_fit} espeak-ng utterances: 5 subtypes x "
        f"{fit.n_fit // len(SUBTYPES)}, paper layout of 3 segments + 500 ms silence): threshold = the accuracy-"
        f"maximising cut of the detector score (fit accuracy {fit_det['accuracy']:.3f}, F1 {fit_det['f1']:.3f}); "
        f"window rate, min_side_windows and transition_level chosen from {len(fit.candidates)} settings by fit "
        "accuracy, then fewest segments away from a true change, then localization, then lower rate. Turns with "
        f"less than {shortest_turn_seconds(c):.1f} s of speech are too short to search (score 0)."
    )
    if "transfer" in report["splits"]:
        tr = report["splits"]["transfer"]["detector"]
        how += (
            f" Transfer split (flite + sox voices, never fitted on): accuracy {tr['accuracy']:.3f}, F1 {tr['f1']:.3f}."
        )
    return {
        "window_rate_per_second": c.window_rate_per_second,
        "threshold": c.threshold,
        "scale": "cosine_distance",
        "min_side_windows": c.min_side_windows,
        "transition_level": c.transition_level,
        "max_changes": c.max_changes,
        "how": how,
    }


def markdown_report(report: Mapping[str, Any]) -> str:
    """The comparison and localization tables as markdown."""
    short = {"non_drift": "non-drift", "hard_negative_speed": "HN speed", "hard_negative_noise": "HN noise"}
    lines = [
        "| split | method | threshold | accuracy | F1 | precision | recall | "
        + " | ".join(short.get(s, s) for s in SUBTYPES)
        + " |",
        "|---|---|---|---|---|---|---|" + "---|" * len(SUBTYPES),
    ]
    names = {"detector": "drift detector (cos. distance >)", "baseline": "paper baseline (min adj. cos <)"}
    for split, rows in report["splits"].items():
        for method in ("detector", "baseline"):
            r = rows[method]
            subs = " | ".join(f"{r['per_subtype'][s]['accuracy']:.3f}" for s in SUBTYPES if s in r["per_subtype"])
            lines.append(
                f"| {split} (n={rows['n']}) | {names[method]} | {r['threshold']:.4f} | {r['accuracy']:.3f} | "
                f"{r['f1']:.3f} | {r['precision']:.3f} | {r['recall']:.3f} | {subs} |"
            )
    lines += [
        "",
        "Localization of the strongest change (all drift utterances, whatever their score). to change: |predicted - "
        "true| with true = start of the changed segment (abrupt) or middle of the fade (smooth); to gap/fade: "
        "distance to the 500 ms silence before the changed segment (abrupt) or to the fade (smooth), 0 inside.",
        "",
        "| split | subtype | n | to change median / mean / max (s) | to gap/fade median / mean / max (s) | "
        "to gap/fade mean (hops) | within 1 hop | coverage of gap/fade |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for split, per in report["localization"].items():
        for subtype in ("abrupt", "smooth"):
            x = per[subtype]
            if not x.get("n"):
                continue
            lines.append(
                f"| {split} | {subtype} | {x['n']} | {x['to_change_median_s']:.2f} / {x['to_change_mean_s']:.2f} / "
                f"{x['to_change_max_s']:.2f} | {x['to_interval_median_s']:.2f} / {x['to_interval_mean_s']:.2f} / "
                f"{x['to_interval_max_s']:.2f} | {x['to_interval_mean_windows']:.2f} | {x['within_one_hop']:.3f} | "
                f"{x['coverage_mean']:.2f} |"
            )
    lines.append("")
    for split, per in report["localization"].items():
        seg = per["segments"]
        lines.append(
            f"{split}: {seg['on_change']} reported segments on a true change, {seg['elsewhere']} elsewhere "
            "(label-0 utterances or away from the change)."
        )
    rt = report["runtime"]
    lines += [
        "",
        f"detect_drift: median {rt['detect_drift_ms_median']:.2f} ms, p95 {rt['detect_drift_ms_p95']:.2f} ms, "
        f"max {rt['detect_drift_ms_max']:.2f} ms per turn (median {rt['windows_per_turn_median']:.0f} windows, "
        f"{rt['turn_seconds_median']:.1f} s turns; NumPy on this machine's CPU, embeddings not included).",
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- command


@dataclass(frozen=True)
class DriftBenchResult:
    out_dir: Path
    fit: FitResult
    report: dict[str, Any]
    block: dict[str, Any]
    files: dict[str, Path] = field(default_factory=dict)


def embedding_rates(rates: Sequence[float]) -> float:
    """The one rate to embed at; every other rate must be it divided by a whole number."""
    top = max(rates)
    for r in rates:
        k = top / r
        if r <= 0 or abs(k - round(k)) > 1e-6:
            raise DriftSetError(f"window rates must be the largest one divided by whole numbers: {list(rates)}")
    return top


async def run_drift_bench(
    out_dir: Path,
    spec: DriftSetSpec,
    encoder: SpeakerEncoder,
    *,
    seed: int = 0,
    rates: Sequence[float] = (5.0, 2.5),
    workers: int = 2,
    show_progress: bool = True,
) -> DriftBenchResult:
    """Build (or reuse) the dev set, embed it, fit on ``fit``, evaluate on every split and write the report.

    Writes ``labels.jsonl`` and the audio, ``report.json``, ``report.md`` and ``drift_block.json``
    (the card's ``drift`` block) under ``out_dir``.
    """
    top_rate = embedding_rates(rates)
    labels_path = await asyncio.to_thread(build_driftset, out_dir, spec, seed=seed, workers=workers)
    utterances = await embed_driftset(labels_path, encoder, top_rate, show_progress=show_progress)
    fit = fit_drift(utterances, rates=rates)
    report = evaluate(utterances, fit)
    block = drift_block(fit, report)
    report["drift_block"] = block
    report["candidates"] = [
        {
            **dataclasses.asdict(c.config),
            "fit_accuracy": c.fit_accuracy,
            "fit_spurious_segments": c.fit_spurious_segments,
            "fit_localization_s": c.fit_localization_s,
        }
        for c in fit.candidates
    ]
    files = {
        "report.json": out_dir / "report.json",
        "report.md": out_dir / "report.md",
        "drift_block.json": out_dir / "drift_block.json",
    }
    files["report.json"].write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    files["report.md"].write_text(markdown_report(report), encoding="utf-8")
    files["drift_block.json"].write_text(json.dumps(block, indent=2) + "\n", encoding="utf-8")
    return DriftBenchResult(out_dir, fit, report, block, files)
