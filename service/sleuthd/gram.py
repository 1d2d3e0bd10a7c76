"""Exact cosine matrices of unit embeddings, and order statistics over their pairs. Pure NumPy.

Why exact: a streamed dialogue learns one turn at a time and computes the new turn's cosines with one
matrix-vector product; CheckDialogue computes all of them at once. In floating point the two can differ
in the last bits (BLAS sums in different orders, blocked differently for different shapes), and a verdict
must not depend on how it was computed. So every embedding is rounded to a multiple of 2^-26 per
component (about float32's own spacing for the components of a 256-dimensional unit vector; cosines move
by ~1e-8) and dot products are taken between these integers in float64: every product and every partial
sum is an integer below 2^53 (|q_a . q_b| <= |q_a| |q_b| <= (1.4 * 2^26 + rounding)^2), so the result is
the exact dot product whatever order BLAS adds in. A cosine is then the same bits however, in whatever
order and in whatever batch it was computed.

Order statistics: `auto` summarises "how alike the speaker's other evidence is" by medians over every pair
of the pool *except the pairs of turn i*, for every i. Re-sorting the pairs once per turn costs
O(m^2 log m) each, O(m^3 log m) in all; with the pairs sorted once, the k-th smallest value without row i
lies at most m-1 places after position k, so a band of m+1 sorted values per row is enough (O(m^2)).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

SCALE_BITS = 26
_TO_COSINE = 2.0 ** (-2 * SCALE_BITS)
MAX_NORM = 1.4  # keeps every integer dot product below 2^53 (see above)
_ONE_THREAD = 2**18  # OpenBLAS runs a product of k*l*D multiply-adds up to this on the calling thread


def quantize(rows: np.ndarray) -> np.ndarray:
    """(k, D) embeddings -> (k, D) float64 integers, the embeddings in units of 2^-26. Element-wise, so a
    row's integers never depend on which other rows it was quantized with."""
    x = np.asarray(rows, dtype=np.float64)
    norms = np.sqrt((x * x).sum(axis=-1))
    if x.size and not np.all(norms <= MAX_NORM):
        raise ValueError(f"embeddings must have unit length; got a row of norm {float(norms.max()):.3f}")
    return np.rint(x * 2.0**SCALE_BITS)


def products(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b.T for (k, D) and (l, D) rows, in pieces OpenBLAS runs on one thread each (it spreads a
    product over threads above k*l*D = 2^18): judging shares a few cores with the model's own threads,
    and at these sizes BLAS threads waiting for a busy CPU cost far more than they save. Deterministic:
    the same shapes are always cut the same way."""
    k, d = a.shape
    ll = len(b)
    cols = min(ll, max(1, int(np.sqrt(_ONE_THREAD / max(d, 1)))))
    rows = max(1, _ONE_THREAD // (cols * max(d, 1)))
    out = np.empty((k, ll), np.result_type(a, b))
    for i in range(0, k, rows):
        for j in range(0, ll, cols):
            out[i : i + rows, j : j + cols] = a[i : i + rows] @ b[j : j + cols].T
    return out


def cosines(qa: np.ndarray, qb: np.ndarray) -> np.ndarray:
    """Exact dot products of quantized rows: (k, D) x (l, D) -> (k, l) float64."""
    return products(qa, qb) * _TO_COSINE


def gram(q: np.ndarray) -> np.ndarray:
    """(m, D) quantized rows -> (m, m) exact, symmetric cosine matrix."""
    m, d = q.shape
    tile = max(1, int(np.sqrt(_ONE_THREAD / max(d, 1))))
    g = np.empty((m, m))
    for a in range(0, m, tile):
        for b in range(0, a + 1, tile):
            block = (q[a : a + tile] @ q[b : b + tile].T) * _TO_COSINE
            g[a : a + tile, b : b + tile] = block
            g[b : b + tile, a : a + tile] = block.T
    return g


@dataclass(frozen=True)
class SortedPairs:
    """Every pair (a < b) of a pool's cosine matrix, ascending by value. Ties come in any order: every
    statistic below depends on the values only, so two ways of building this give the same answers."""

    values: np.ndarray  # (P,) float64
    a: np.ndarray  # (P,) int32 pool index of one member
    b: np.ndarray  # (P,) int32 the other

    @classmethod
    def of(cls, g: np.ndarray) -> SortedPairs:
        a, b = np.triu_indices(len(g), 1)
        v = g[a, b]
        order = np.argsort(v)
        return cls(v[order], a[order].astype(np.int32), b[order].astype(np.int32))

    def inserted(self, g: np.ndarray, z: int) -> SortedPairs:
        """These pairs after pool index ``z`` was inserted (``g``: the new matrix; old indices >= z
        moved up by one): O(P) instead of re-sorting."""
        a = self.a + (self.a >= z)
        b = self.b + (self.b >= z)
        others = np.delete(np.arange(len(g), dtype=np.int32), z)
        new = g[z, others]
        order = np.argsort(new)
        new, others = new[order], others[order]
        at = np.searchsorted(self.values, new)
        return SortedPairs(
            np.insert(self.values, at, new),
            np.insert(a, at, np.minimum(others, z)),
            np.insert(b, at, np.maximum(others, z)),
        )

    def _involves(self, positions: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """(len(rows), ...) bool: whether the pair at each position involves the row's pool index."""
        r = rows.reshape((-1,) + (1,) * (positions.ndim - 1 if positions.ndim > 1 else 1))
        return (self.a[positions] == r) | (self.b[positions] == r)

    def median_without(self, m: int, rows: np.ndarray) -> np.ndarray:
        """For each pool index i in ``rows``: the median of the pair values not involving i."""
        p = len(self.values)
        count = p - (m - 1)
        k = (count - 1) // 2
        width = min(k + m + 1, p) - k  # the value sought for row i is at most m-1 places after k
        band = np.arange(k, k + width)
        # Pairs of i before the band push i's k-th value that many places right.
        before = np.bincount(self.a[:k], minlength=m) + np.bincount(self.b[:k], minlength=m)
        kept = np.cumsum(~self._involves(band, rows), axis=1)

        def kth(extra: int) -> np.ndarray:
            at = np.argmax(kept >= (before[rows] + 1 + extra)[:, None], axis=1)
            return np.asarray(self.values[k + at])

        return kth(0) if count % 2 else (kth(0) + kth(1)) / 2

    def median_deviation_without(self, m: int, rows: np.ndarray, centers: np.ndarray) -> np.ndarray:
        """For each pool index i in ``rows``: median over pairs not involving i of |value - centers[i]|
        (the median absolute deviation, unscaled)."""
        v = self.values
        p = len(v)
        count = p - (m - 1)
        k = (count - 1) // 2
        need = 1 if count % 2 else 2
        # The k values closest to the center form a run [lo, lo + k) of the sorted values: the first lo
        # where the value just right of the run is no closer than the run's leftmost (bisection).
        lo = np.zeros(len(rows), np.intp)
        hi = np.full(len(rows), p - k, np.intp)
        while np.any(lo < hi):
            mid = (lo + hi) // 2
            ok = v[np.minimum(mid + k, p - 1)] - centers >= centers - v[mid]
            hi = np.where(ok, mid, hi)
            lo = np.where(ok, lo, mid + 1)
        # i's pairs inside the run do not count, so the answer is the (inside)-th value of i's
        # complement beyond the run, among the next m - 1 + need values on either side (at most m - 1
        # of them are i's own). Rows whose runs start close together share one band of candidates.
        width = m - 1 + need
        order = np.argsort(lo, kind="stable")
        starts = [0]
        while starts[-1] < len(order):
            # A group's band is its spread plus twice the width: a quarter width keeps it near the minimum.
            starts.append(int(np.searchsorted(lo[order], lo[order[starts[-1]]] + width // 4, side="right")))
        groups = [order[a:b] for a, b in itertools.pairwise(starts)]
        anchors = sorted({x for g in groups for x in (max(int(lo[g[0]]) - width, 0), int(lo[g[0]]) + k)})
        before = self._pairs_before(m, anchors)
        out = np.empty(len(rows))
        for g in groups:
            out[g] = self._deviation_group(m, rows[g], centers[g], lo[g], k, need, width, before)
        return out

    def _pairs_before(self, m: int, positions: list[int]) -> dict[int, np.ndarray]:
        """For each position x: (m,) how many pairs of each pool index lie before x (one sweep)."""
        out, running, prev = {}, np.zeros(m, np.intp), 0
        for x in positions:
            running = running + np.bincount(self.a[prev:x], minlength=m) + np.bincount(self.b[prev:x], minlength=m)
            out[x], prev = running, x
        return out

    def _deviation_group(
        self,
        m: int,
        rows: np.ndarray,
        centers: np.ndarray,
        lo: np.ndarray,
        k: int,
        need: int,
        width: int,
        before: dict[int, np.ndarray],
    ) -> np.ndarray:
        """median_deviation_without for rows whose runs start within ``width`` of each other: candidates
        are the sorted positions [lo_min - width, lo_max) left of the runs and [lo_min + k, lo_max + k +
        width) right of them; for row i only those outside its own run [lo_i, lo_i + k) count."""
        v, p, g = self.values, len(self.values), len(rows)
        ls, le = max(int(lo[0]) - width, 0), int(lo[-1])
        rs, re = int(lo[0]) + k, min(int(lo[-1]) + k + width, p)
        nl = le - ls
        dev = np.abs(np.concatenate([v[ls:le], v[rs:re]])[None, :] - centers[:, None])
        col = np.arange(dev.shape[1])
        # Inside row i's run: left candidates from lo_i on, right candidates before lo_i + k.
        np.putmask(dev, (col >= (lo - ls)[:, None]) & (col < nl + (lo + k - rs)[:, None]), np.inf)
        # Row i's own pairs never count. Each candidate is a pair of two pool indices, so mark by scatter.
        which = np.full(m, -1, np.intp)
        which[rows] = np.arange(g)
        pos = np.concatenate([np.arange(ls, le), np.arange(rs, re)])
        inside = before[rs][rows] - before[ls][rows]
        for ids in (np.concatenate([self.a[ls:le], self.a[rs:re]]), np.concatenate([self.b[ls:le], self.b[rs:re]])):
            r = which[ids]
            hit = r >= 0
            dev[r[hit], col[hit]] = np.inf
            # Row i's pairs in the bands up to its run's edges move the count of those inside the run.
            left_hit = hit & (col < nl)
            inside -= np.bincount(r[left_hit], weights=pos[left_hit] < lo[r[left_hit]], minlength=g).astype(np.intp)
            right_hit = hit & (col >= nl)
            right_r = r[right_hit]
            inside += np.bincount(right_r, weights=pos[right_hit] < (lo + k)[right_r], minlength=g).astype(np.intp)
        dev.sort(axis=1)
        first = np.take_along_axis(dev, inside[:, None], axis=1)[:, 0]
        if need == 1:
            return np.asarray(first)
        return np.asarray((first + np.take_along_axis(dev, inside[:, None] + 1, axis=1)[:, 0]) / 2)


def median_without(x: np.ndarray) -> np.ndarray:
    """(L,) -> (L,): element i is the median of x without x[i] (np.median's convention: the mean of the
    two middle values for an even count). L >= 2."""
    n = len(x)
    order = np.argsort(x, kind="stable")
    s = x[order]
    rank = np.empty(n, np.intp)
    rank[order] = np.arange(n)

    def kth(k: int) -> np.ndarray:  # k-th smallest of x without x[i]
        return np.where(k < rank, s[k], s[min(k + 1, n - 1)])

    left = n - 1
    return kth(left // 2) if left % 2 else (kth(left // 2 - 1) + kth(left // 2)) / 2


def std_without(x: np.ndarray) -> np.ndarray:
    """(L,) -> (L,): element i is the population standard deviation of x without x[i]. L >= 2."""
    y = x - x.mean()  # shifted: the sums below then lose no precision to a large common level
    left = len(x) - 1
    mean = (y.sum() - y) / left
    return np.sqrt(np.maximum(((y * y).sum() - y * y) / left - mean * mean, 0.0))
