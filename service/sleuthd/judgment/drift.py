"""Speaker drift inside one turn: where the voice of a long turn changes, and how strongly.

Pure NumPy over window embeddings (no I/O, no grpc). The engine embeds a turn's overlapping 1.6 s
windows at ``DriftConfig.window_rate_per_second`` and calls :func:`detect_drift`.

Method: least-squares change points on the window embeddings, found by binary segmentation and then
pruned by merging.

* Split: for every split of the windows into "before" and "after" with at least ``min_side_windows``
  on each side, the squared residual a one-voice fit loses by fitting each side with its own mean is
  ``n_before * n_after / n * |mean_before - mean_after|^2``; the split with the largest gain is the
  change. Prefix sums make one split O(D). Unlike the largest cosine distance, this criterion does
  not favour splits with only a few noisy windows on one side.
* Candidates (binary segmentation): after the turn's best split, the windows before and after its
  transition are searched again on their own, whatever the split's score, down to ranges too short
  for two sides; windows that overlap a transition in time are left out of the next searches.
* Score: the cosine distance (1 - cos, in [0, 2]; larger = stronger) between the mean embedding of
  the windows before a change and that of the windows after it, each side running to the
  neighbouring change (or the turn's end). With one change, that is the split of the whole turn.
* Decision (merge): the weakest candidate is dropped and its neighbours re-scored until every change
  left scores above ``threshold`` and at most ``max_changes`` are left. The turn's score is its
  strongest kept change's, or the last candidate's when none is kept. Judging each change against
  its neighbours finds the two changes of a voice that drifts away and comes back, which a split of
  the whole turn dilutes.
* Transition: each window is placed between the two voices (0 = the mean before, 1 = the mean after,
  smoothed by a running median of 3, means re-taken without the first transition found); the windows
  around the split still between ``transition_level`` and ``1 - transition_level`` are the
  transition. An abrupt splice gives a transition of about one window (windows straddling the
  splice hold both voices); a cross-fade gives a longer one.
* Segment: from the centre of the last window settled in the voice before to the centre of the first
  settled in the voice after; its middle is the best guess of when the voice changes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from sleuthd.audio.windows import WindowSpec
from sleuthd.domain import DriftResult, DriftSegment, TurnResult

__all__ = ["DriftConfig", "DriftResult", "DriftSegment", "attach_drift", "detect_drift", "drift_window", "find_drift"]


@dataclass(frozen=True)
class DriftConfig:
    """How drift is searched for and decided. The card's ``drift`` block sets these (see from_manifest)."""

    # Windows started per second of speech for drift analysis; denser than judging's 1.3/s, so a change
    # is placed to within about 1/rate seconds.
    window_rate_per_second: float = 5.0
    # Decision threshold on the score scale: cosine distance (1 - cos) between the mean embeddings
    # before and after a change; a change scoring above it is reported.
    threshold: float = 0.12
    # A change needs at least this many windows on each side (fewer: too little of a voice to
    # compare, and the side means get noisy).
    min_side_windows: int = 4
    # A window is part of the transition while its position between the two voices (0 = the mean
    # before, 1 = the mean after) is above this level on the way up and below 1 - level on the way down.
    transition_level: float = 0.15
    # At most this many changes are reported per turn (binary segmentation depth).
    max_changes: int = 4

    def __post_init__(self) -> None:
        if not (math.isfinite(self.window_rate_per_second) and self.window_rate_per_second > 0):
            raise ValueError(f"window_rate_per_second must be > 0, not {self.window_rate_per_second}")
        if not (math.isfinite(self.threshold) and 0.0 <= self.threshold <= 2.0):
            raise ValueError(f"threshold is a cosine distance in [0, 2], not {self.threshold}")
        if self.min_side_windows < 1:
            raise ValueError(f"min_side_windows must be >= 1, not {self.min_side_windows}")
        if not 0.0 < self.transition_level < 0.5:
            raise ValueError(f"transition_level must be in (0, 0.5), not {self.transition_level}")
        if self.max_changes < 1:
            raise ValueError(f"max_changes must be >= 1, not {self.max_changes}")

    @property
    def min_windows(self) -> int:
        """Fewest windows a turn needs to be searched at all; below it detect_drift returns score 0.0
        and no segments, which callers should report as "too short", not as "no drift"."""
        return 2 * self.min_side_windows

    @classmethod
    def from_manifest(cls, block: Mapping[str, Any]) -> DriftConfig:
        """Read the model card's ``drift`` block; absent keys keep their defaults, unknown keys are refused.

        Descriptive keys (``how``, ``scale``, and anything ending in ``_how``) are ignored.
        """
        fields = {
            "window_rate_per_second": float,
            "threshold": float,
            "min_side_windows": int,
            "transition_level": float,
            "max_changes": int,
        }
        unknown = [k for k in block if k not in fields and k not in ("how", "scale") and not k.endswith("_how")]
        if unknown:
            raise ValueError(f"unknown key(s) in the drift block: {', '.join(sorted(unknown))}")
        kwargs: dict[str, Any] = {}
        for key, kind in fields.items():
            if key in block:
                value = block[key]
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise ValueError(f"drift.{key} must be a number, not {value!r}")
                if kind is int and not float(value).is_integer():
                    raise ValueError(f"drift.{key} must be a whole number, not {value!r}")
                kwargs[key] = kind(value)
        return cls(**kwargs)


@dataclass(frozen=True)
class _Change:
    split: int  # index of the first window on the "after" side of the least-squares split
    first_transition: int  # index of the first window of the transition (= split when abrupt)
    first_after: int  # index of the first window settled in the voice after
    score: float  # cosine distance between the side means of the range it was found in


class _Turn:
    """One turn's windows with prefix sums, so any split's side means cost O(D)."""

    def __init__(self, embeddings: np.ndarray, config: DriftConfig) -> None:
        self.e = embeddings
        self.config = config
        self.cum = np.concatenate([np.zeros((1, embeddings.shape[1])), np.cumsum(embeddings, axis=0)])

    def best_change(self, lo: int, hi: int) -> _Change | None:
        """The strongest change among windows [lo, hi), or None when there is no room for one."""
        m = self.config.min_side_windows
        k = np.arange(lo + m, hi - m + 1)
        if len(k) == 0:
            return None
        n_before = (k - lo).astype(np.float64)
        n_after = (hi - k).astype(np.float64)
        before = self.cum[k] - self.cum[lo]
        after = self.cum[hi] - self.cum[k]
        gap = before / n_before[:, None] - after / n_after[:, None]
        # Least squares: the split that removes the most squared residual from a one-voice fit.
        gain = n_before * n_after / (n_before + n_after) * np.einsum("kd,kd->k", gap, gap)
        split = int(k[int(np.argmax(gain))])
        mean_before = (self.cum[split] - self.cum[lo]) / (split - lo)
        mean_after = (self.cum[hi] - self.cum[split]) / (hi - split)
        first, after_first = self._transition(lo, hi, split, mean_before, mean_after)
        return _Change(split, first, after_first, _cosine_distance(mean_before, mean_after))

    def _transition(
        self, lo: int, hi: int, split: int, mean_before: np.ndarray, mean_after: np.ndarray
    ) -> tuple[int, int]:
        """Windows around ``split`` that sit between the two voices: (first in transition, first after).

        The side means of the split still hold the transition's mixed windows, which pulls them
        toward each other; so the transition is found once with them, then again with the means of
        the windows outside that first transition.
        """
        first, after = self._run(lo, hi, split, mean_before, mean_after)
        # _run keeps at least one window on each side (lo < first, after < hi), so both means exist.
        settled_before = (self.cum[first] - self.cum[lo]) / (first - lo)
        settled_after = (self.cum[hi] - self.cum[after]) / (hi - after)
        return self._run(lo, hi, split, settled_before, settled_after)

    def _run(self, lo: int, hi: int, split: int, mean_before: np.ndarray, mean_after: np.ndarray) -> tuple[int, int]:
        """(first window in transition, first window after) for one pair of voice means."""
        axis = mean_after - mean_before
        norm2 = float(np.dot(axis, axis))
        if norm2 <= 1e-12:
            return split, split
        # Position of each window between the voices (0 = mean before, 1 = mean after), with a
        # running median of 3 so one odd window neither ends nor stretches the transition.
        z = (self.e[lo:hi] - mean_before) @ axis / norm2
        if len(z) >= 3:
            z = np.concatenate([z[:1], np.median(np.stack([z[:-2], z[1:-1], z[2:]]), axis=0), z[-1:]])
        level = self.config.transition_level
        first = split
        while first - 1 > lo and z[first - 1 - lo] > level:
            first -= 1
        after = split
        while after < hi - 1 and z[after - lo] < 1.0 - level:
            after += 1
        return first, after


def _cosine_distance(x: np.ndarray, y: np.ndarray) -> float:
    nx, ny = float(np.linalg.norm(x)), float(np.linalg.norm(y))
    if nx == 0.0 or ny == 0.0:
        return 0.0
    return float(1.0 - np.dot(x, y) / (nx * ny))


def detect_drift(window_embeddings: np.ndarray, window_times: np.ndarray, config: DriftConfig) -> DriftResult:
    """Find where the voice changes inside one turn.

    ``window_embeddings``: (n, D) unit vectors of overlapping windows in time order; ``window_times``:
    (n, 2) start/end seconds of each window in the turn's audio. A turn with fewer than
    ``config.min_windows`` windows is too short to judge: score 0.0 and no segments.
    """
    e = np.asarray(window_embeddings, dtype=np.float64)
    t = np.asarray(window_times, dtype=np.float64)
    if e.ndim != 2 or t.shape != (len(e), 2):
        raise ValueError(f"expected (n, D) embeddings and (n, 2) times, got {e.shape} and {t.shape}")
    if not (np.all(np.isfinite(e)) and np.all(np.isfinite(t))):
        raise ValueError("window embeddings and times must be finite")
    positions = 0.5 * (t[:, 0] + t[:, 1])  # window centres
    turn = _Turn(e, config)
    candidates = _split_phase(turn, t)
    if not candidates:
        return DriftResult(score=0.0, segments=())
    kept, score = _merge_phase(turn, candidates, config)
    segments = tuple(
        DriftSegment(
            start_seconds=float(positions[c.first_transition - 1]),
            end_seconds=float(positions[c.first_after]),
            score=local,
        )
        for c, local in kept
    )
    return DriftResult(score=score, segments=segments)


def _split_phase(turn: _Turn, times: np.ndarray) -> list[_Change]:
    """Candidate changes by binary segmentation, whatever their score, in time order.

    Each side of a change is searched again without the windows that overlap its transition in
    time (1.6 s windows near a transition still hold some of it and would give a weaker copy of the
    same change). Splitting does not stop at weak changes: a voice that changes and comes back
    (A, B, A) dilutes the whole-turn split, and the change hidden behind it shows up one level down.
    """
    centres = 0.5 * (times[:, 0] + times[:, 1])
    found: list[_Change] = []
    todo = [(0, len(times))]
    while todo:
        lo, hi = todo.pop()
        change = turn.best_change(lo, hi)
        if change is None:
            continue
        found.append(change)
        start = centres[change.first_transition - 1]
        end = centres[change.first_after]
        left_end = lo + int(np.searchsorted(times[lo:hi, 1], start, side="left"))
        right_start = lo + int(np.searchsorted(times[lo:hi, 0], end, side="right"))
        todo.append((lo, min(left_end, change.first_transition)))
        todo.append((max(right_start, change.first_after), hi))
    return sorted(found, key=lambda c: c.split)


def _merge_phase(
    turn: _Turn, candidates: list[_Change], config: DriftConfig
) -> tuple[list[tuple[_Change, float]], float]:
    """Drop the weakest candidate until every one left beats the threshold (and at most max_changes are left).

    A candidate's score is the cosine distance between the mean of the windows from the previous
    candidate's split to its split and the mean from its split to the next one's (the turn's ends
    for the first and last), so each change is judged against its neighbours, not the whole turn.
    Returns the kept changes with their scores and the turn's score: the strongest kept change's,
    or, when none is kept, the score of the last one standing (the turn's strongest change).
    """
    kept = list(candidates)
    n = len(turn.e)
    while True:
        bounds = [0, *(c.split for c in kept), n]
        scores = [
            _cosine_distance(
                turn.cum[bounds[k + 1]] - turn.cum[bounds[k]], turn.cum[bounds[k + 2]] - turn.cum[bounds[k + 1]]
            )
            for k in range(len(kept))
        ]
        weakest = int(np.argmin(scores))
        if scores[weakest] > config.threshold and len(kept) <= config.max_changes:
            return list(zip(kept, scores, strict=True)), max(scores)
        if len(kept) == 1:
            return [], scores[0]
        del kept[weakest]


# ------------------------------------------------------------------------------------- serving glue


def drift_window(window: WindowSpec, config: DriftConfig) -> WindowSpec:
    """The denser window placement drift analysis uses: the encoder's windows at the card's rate."""
    return replace(window, rate_per_second=config.window_rate_per_second)


def find_drift(
    window_embeddings: np.ndarray | None, window_times: np.ndarray | None, config: DriftConfig
) -> DriftResult | None:
    """Voice changes inside one turn, from its embedding on the drift windows. None when the turn has
    too little speech to search (fewer windows than the detector needs): "too short to tell" is not
    "no drift"."""
    if window_embeddings is None or window_times is None or len(window_times) < config.min_windows:
        return None
    return detect_drift(window_embeddings, window_times, config)


def attach_drift(
    turns: Sequence[TurnResult], drift: Mapping[str, DriftResult | None], config: DriftConfig
) -> list[TurnResult]:
    """Attach drift results to the turns that were searched; a None result (too little speech) becomes
    a note in the turn's detail rather than a score."""
    needed = config.min_windows / config.window_rate_per_second
    too_short = f"drift: too little speech to search (about {needed:.0f} s needed)"
    out = []
    for t in turns:
        if t.turn_id in drift:
            result = drift[t.turn_id]
            t = replace(t, drift=result) if result is not None else replace(t, detail=f"{t.detail}; {too_short}")
        out.append(t)
    return out
