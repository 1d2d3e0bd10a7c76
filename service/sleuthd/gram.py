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

from dataclasses import dataclass

import numpy as np

SCALE_BITS = 26
_TO_COSINE = 2.0 ** (-2 * SCALE_BITS)
MAX_NORM = 1.4  # keeps every integer dot product below 2^53 (see above)
_TILE = 64  # rows per BLAS call when building a whole matrix: small calls stay on one thread


def quantize(rows: np.ndarray) -> np.ndarray:
    """(k, D) embeddings -> (k, D) float64 integers, the embeddings in units of 2^-26. Element-wise, so a
    row's integers never depend on which other rows it was quantized with."""
    x = np.asarray(rows, dtype=np.float64)
    norms = np.sqrt((x * x).sum(axis=-1))
    if x.size and not np.all(norms <= MAX_NORM):
        raise ValueError(f"embeddings must have unit length; got a row of norm {float(norms.max()):.3f}")
    return np.rint(x * 2.0**SCALE_BITS)


def cosines(qa: np.ndarray, qb: np.ndarray) -> np.ndarray:
    """Exact dot products of quantized rows: (k, D) x (l, D) -> (k, l) float64."""
    return np.asarray(qa @ qb.T) * _TO_COSINE


def gram(q: np.ndarray) -> np.ndarray:
    """(m, D) quantized rows -> (m, m) exact, symmetric cosine matrix."""
    m = len(q)
    g = np.empty((m, m))
    for a in range(0, m, _TILE):
        for b in range(0, a + 1, _TILE):
            block = cosines(q[a : a + _TILE], q[b : b + _TILE])
            g[a : a + _TILE, b : b + _TILE] = block
            g[b : b + _TILE, a : a + _TILE] = block.T
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
        c = centers[:, None]
        # The k values closest to the center form a run [lo, lo + k) of the sorted values: the first lo
        # where the value just right of the run is no closer than the run's leftmost (bisection).
        lo = np.zeros(len(rows), np.intp)
        hi = np.full(len(rows), p - k, np.intp)
        while np.any(lo < hi):
            mid = (lo + hi) // 2
            ok = (mid >= p - k) | (v[np.minimum(mid + k, p - 1)] - centers >= centers - v[mid])
            hi = np.where(ok, mid, hi)
            lo = np.where(ok, lo, mid + 1)
        # Pairs of i inside the run do not count, so the answer is the (inside)-th value of i's
        # complement beyond the run, found among the next m - 1 + need values on either side.
        rank = np.full((m, m), -1, np.intp)
        rank[self.a, self.b] = np.arange(p)
        rank[self.b, self.a] = np.arange(p)
        r = rank[rows]
        inside = ((r >= lo[:, None]) & (r < (lo + k)[:, None])).sum(axis=1)
        steps = np.arange(m - 1 + need)
        pos = np.concatenate([lo[:, None] - 1 - steps, (lo + k)[:, None] + steps], axis=1)
        valid = (pos >= 0) & (pos < p)
        pos = np.clip(pos, 0, p - 1)
        dev = np.abs(v[pos] - c)
        dev[~valid | self._involves(pos, rows)] = np.inf
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
