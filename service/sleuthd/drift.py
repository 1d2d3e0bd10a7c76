"""Speaker drift inside one turn: where the voice of a long turn changes, and how strongly.

Pure NumPy over window embeddings (no I/O, no grpc). The engine embeds a turn's overlapping 1.6 s
windows at ``DriftConfig.window_rate_per_second`` and calls :func:`detect_drift`.

Method: least-squares change-point search with a linear transition.

* Every window is placed in time at its *anchor*, ``start + anchor * (end - start)``. GE2E embeds a
  window with an LSTM and keeps the last step's state, so the end of a window counts for more than
  its start: on spliced speech a window already looks like the new voice when about a quarter of it
  is the new voice. The anchor (fitted on the dev set) puts each window where its embedding "sits".
* A change is modelled as ``e_j ≈ (1 - r_j) μ_before + r_j μ_after`` with ``r_j`` 0 before the change,
  1 after it, and rising linearly with the anchor time across a transition of zero or more windows
  (an abrupt splice is a zero-width transition; a cross-fade is a ramp). The transition with the
  smallest squared residual is chosen, every window on each side counting; the search uses prefix
  sums, so one candidate costs O(D).
* The change's score is the cosine distance between the mean embedding of the windows before the
  transition and the mean of those after it (1 - cos, in [0, 2]; larger = stronger). The turn's
  score is that of its strongest change; a change is reported when its score exceeds
  ``DriftConfig.threshold``.
* Several changes: binary segmentation. After a reported change the windows before and after its
  transition are searched again on their own, up to ``max_changes`` changes.

A reported segment runs from the anchor of the last window wholly before the transition to the
anchor of the first window wholly after it, so an abrupt change gives a segment one window hop wide
around the switch and a cross-fade gives one that covers the fade.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["DriftConfig", "DriftResult", "DriftSegment", "detect_drift"]


@dataclass(frozen=True)
class DriftConfig:
    """How drift is searched for and decided. The card's ``drift`` block sets these (see from_manifest)."""

    # Windows started per second of speech for drift analysis; denser than judging's 1.3/s, so a change
    # is placed to within about 1/rate seconds.
    window_rate_per_second: float = 5.0
    # Decision threshold on the score scale: cosine distance (1 - cos) between the mean embeddings
    # before and after a change; a change scoring above it is reported.
    threshold: float = 0.2
    # A change needs at least this many windows wholly on each side (fewer: too little of a voice to
    # compare, and the means get noisy).
    min_side_windows: int = 4
    # Where in a window its embedding sits in time, as a fraction of the window (0 start, 1 end).
    anchor: float = 0.75
    # Longest transition considered, seconds; bounds the search and separates a slow drift from two
    # voices that just differ.
    max_transition_seconds: float = 6.0
    # At most this many changes are reported per turn (binary segmentation depth).
    max_changes: int = 4
    # A transition window must lower the squared residual by at least this much (squared norm of unit
    # embeddings) to be taken out of the sides: keeps an abrupt change from being fitted as a ramp.
    ramp_penalty: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.window_rate_per_second) and self.window_rate_per_second > 0):
            raise ValueError(f"window_rate_per_second must be > 0, not {self.window_rate_per_second}")
        if not (math.isfinite(self.threshold) and 0.0 <= self.threshold <= 2.0):
            raise ValueError(f"threshold is a cosine distance in [0, 2], not {self.threshold}")
        if self.min_side_windows < 1:
            raise ValueError(f"min_side_windows must be >= 1, not {self.min_side_windows}")
        if not 0.0 <= self.anchor <= 1.0:
            raise ValueError(f"anchor is a fraction of the window in [0, 1], not {self.anchor}")
        if not self.max_transition_seconds >= 0.0:
            raise ValueError(f"max_transition_seconds must be >= 0, not {self.max_transition_seconds}")
        if self.max_changes < 1:
            raise ValueError(f"max_changes must be >= 1, not {self.max_changes}")

    @classmethod
    def from_manifest(cls, block: Mapping[str, Any]) -> DriftConfig:
        """Read the model card's ``drift`` block; absent keys keep their defaults, unknown keys are refused.

        Descriptive keys (``how``, ``scale``, and anything ending in ``_how``) are ignored.
        """
        fields = {
            "window_rate_per_second": float,
            "threshold": float,
            "min_side_windows": int,
            "anchor": float,
            "max_transition_seconds": float,
            "max_changes": int,
        }
        unknown = [k for k in block if k not in fields and k not in ("how", "scale") and not k.endswith("_how")]
        if unknown:
            raise ValueError(f"unknown key(s) in the drift block: {', '.join(sorted(unknown))}")
        kwargs: dict[str, Any] = {}
        for key, kind in fields.items():
            if key in block:
                value = block[key]
                if kind is int and (isinstance(value, bool) or not float(value).is_integer()):
                    raise ValueError(f"drift.{key} must be an integer, not {value!r}")
                kwargs[key] = kind(value)
        return cls(**kwargs)


@dataclass(frozen=True)
class DriftSegment:
    """A stretch of a turn where the voice changes."""

    start_seconds: float  # seconds of the turn's decoded audio
    end_seconds: float
    score: float  # cosine distance (1 - cos) between the mean embeddings before and after; larger = stronger

    @property
    def change_seconds(self) -> float:
        """The single best guess of when the voice changes: the middle of the segment."""
        return 0.5 * (self.start_seconds + self.end_seconds)


@dataclass(frozen=True)
class DriftResult:
    score: float  # cosine distance of the turn's strongest change; 0.0 if too few windows to look
    segments: tuple[DriftSegment, ...]  # reported changes in time order; empty when no drift


@dataclass(frozen=True)
class _Change:
    first_ramp: int  # index of the first window of the transition (= first window after when abrupt)
    first_after: int  # index of the first window wholly after the transition
    score: float


class _Search:
    """Prefix sums over one turn's windows, for O(D) least-squares fits of any transition."""

    def __init__(self, embeddings: np.ndarray, positions: np.ndarray, ramp_penalty: float) -> None:
        self.ramp_penalty = ramp_penalty
        self.e = embeddings
        self.p = positions
        zero = np.zeros((1, embeddings.shape[1]))
        self.cum_e = np.concatenate([zero, np.cumsum(embeddings, axis=0)])  # (n + 1, D)
        self.cum_pe = np.concatenate([zero, np.cumsum(positions[:, None] * embeddings, axis=0)])
        self.cum_p = np.concatenate([[0.0], np.cumsum(positions)])
        self.cum_pp = np.concatenate([[0.0], np.cumsum(positions * positions)])

    def best(self, lo: int, hi: int, min_side: int, max_ramp_seconds: float) -> _Change | None:
        """The best single change among windows [lo, hi), or None when there is no room for one."""
        p = self.p
        # Candidate (i, j): windows [lo, i) before, [i, j) the transition, [j, hi) after.
        i_all = np.arange(lo + min_side, hi - min_side + 1)
        if len(i_all) == 0:
            return None
        pairs_i: list[np.ndarray] = []
        pairs_j: list[np.ndarray] = []
        for i in i_all:
            # a = midpoint before window i; the transition may extend while b - a stays within the limit.
            a = 0.5 * (p[i - 1] + p[i])
            j = np.arange(i, hi - min_side + 1)
            b = 0.5 * (p[j - 1] + p[j])
            keep = (j == i) | (b - a <= max_ramp_seconds)
            pairs_i.append(np.full(int(keep.sum()), i))
            pairs_j.append(j[keep])
        i_idx = np.concatenate(pairs_i)
        j_idx = np.concatenate(pairs_j)
        rss_gain = self._explained(lo, hi, i_idx, j_idx) - self.ramp_penalty * (j_idx - i_idx)
        k = int(np.argmax(rss_gain))
        first_ramp, first_after = int(i_idx[k]), int(j_idx[k])
        before = self.cum_e[first_ramp] - self.cum_e[lo]
        after = self.cum_e[hi] - self.cum_e[first_after]
        return _Change(first_ramp, first_after, _cosine_distance(before, after))

    def _explained(self, lo: int, hi: int, i: np.ndarray, j: np.ndarray) -> np.ndarray:
        """Squared norm explained by the two-voice model, per candidate (larger = smaller residual)."""
        p, ce, cpe, cp, cpp = self.p, self.cum_e, self.cum_pe, self.cum_p, self.cum_pp
        a = 0.5 * (p[i - 1] + p[i])
        b = 0.5 * (p[j - 1] + p[j])
        ramp = j > i
        width = np.where(ramp, b - a, 1.0)
        width = np.maximum(width, 1e-9)
        # Over the transition r = (p - a) / width; outside it r is 0 (before) or 1 (after).
        n_ramp = (j - i).astype(np.float64)
        sum_r = np.where(ramp, (cp[j] - cp[i] - a * n_ramp) / width, 0.0)
        sum_rr = np.where(ramp, (cpp[j] - cpp[i] - 2 * a * (cp[j] - cp[i]) + a * a * n_ramp) / (width * width), 0.0)
        n_after = (hi - j).astype(np.float64)
        n_all = float(hi - lo)
        s11 = n_after + sum_rr  # sum r^2
        s01 = sum_r - sum_rr  # sum r (1 - r)
        s00 = n_all - n_after - 2 * sum_r + sum_rr  # sum (1 - r)^2
        ramp_re = np.where(ramp[:, None], (cpe[j] - cpe[i] - a[:, None] * (ce[j] - ce[i])) / width[:, None], 0.0)
        u1 = ce[hi] - ce[j] + ramp_re  # sum r e
        u0 = (ce[hi] - ce[lo])[None, :] - u1  # sum (1 - r) e
        det = s00 * s11 - s01 * s01
        quad = (
            s11 * np.einsum("kd,kd->k", u0, u0)
            - 2 * s01 * np.einsum("kd,kd->k", u0, u1)
            + s00 * np.einsum("kd,kd->k", u1, u1)
        )
        out: np.ndarray = np.where(det > 1e-9, quad / np.maximum(det, 1e-9), -np.inf)
        return out


def _cosine_distance(x: np.ndarray, y: np.ndarray) -> float:
    nx, ny = float(np.linalg.norm(x)), float(np.linalg.norm(y))
    if nx == 0.0 or ny == 0.0:
        return 0.0
    return float(1.0 - np.dot(x, y) / (nx * ny))


def detect_drift(window_embeddings: np.ndarray, window_times: np.ndarray, config: DriftConfig) -> DriftResult:
    """Find where the voice changes inside one turn.

    ``window_embeddings``: (n, D) unit vectors of overlapping windows in time order; ``window_times``:
    (n, 2) start/end seconds of each window in the turn's audio. A turn with fewer than
    ``2 * min_side_windows`` windows is too short to judge: score 0.0 and no segments.
    """
    e = np.asarray(window_embeddings, dtype=np.float64)
    t = np.asarray(window_times, dtype=np.float64)
    if e.ndim != 2 or t.shape != (len(e), 2):
        raise ValueError(f"expected (n, D) embeddings and (n, 2) times, got {e.shape} and {t.shape}")
    if not (np.all(np.isfinite(e)) and np.all(np.isfinite(t))):
        raise ValueError("window embeddings and times must be finite")
    n, m = len(e), config.min_side_windows
    if n < 2 * m:
        return DriftResult(score=0.0, segments=())
    positions = t[:, 0] + config.anchor * (t[:, 1] - t[:, 0])
    search = _Search(e, positions, config.ramp_penalty)

    top = search.best(0, n, m, config.max_transition_seconds)
    if top is None:
        return DriftResult(score=0.0, segments=())
    found: list[_Change] = []
    # Binary segmentation: a reported change splits the turn; each side is searched on its own.
    todo: list[tuple[int, int, _Change | None]] = [(0, n, top)]
    while todo and len(found) < config.max_changes:
        lo, hi, change = todo.pop()
        if change is None:
            change = search.best(lo, hi, m, config.max_transition_seconds)
        if change is None or change.score <= config.threshold:
            continue
        found.append(change)
        todo.append((lo, change.first_ramp, None))
        todo.append((change.first_after, hi, None))
    segments = tuple(
        DriftSegment(
            start_seconds=float(positions[c.first_ramp - 1]),
            end_seconds=float(positions[c.first_after]),
            score=c.score,
        )
        for c in sorted(found, key=lambda c: c.first_ramp)
    )
    return DriftResult(score=top.score, segments=segments)
