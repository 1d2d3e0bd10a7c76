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
of the pool *except the pairs of turn i*, for every i. Sorting those pairs once per turn costs
O(m^2 log m) for each turn, O(m^3 log m) for a speaker. With all pairs sorted once (kept sorted as turns
arrive), row i's k-th value is the first sorted position q >= k where q - k + 1 minus i's own pairs met
on the way reaches the needed count: i owns only m - 1 of the m(m-1)/2 pairs, so a fixed-point iteration
over them finds it, for all rows at once, in a few passes over the m + 1 positions after k. The median
absolute deviation is the same idea on the two sorted runs that lead away from each row's median.
"""

from __future__ import annotations

from collections.abc import Callable
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

    def _members(self, m: int, rows: np.ndarray, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """(row number, sorted position) of every pair in positions [start, stop) that involves one of
        ``rows``: each pair involves two pool indices, so this costs O(stop - start), not O(rows x that)."""
        which = np.full(m, -1, np.intp)
        which[rows] = np.arange(len(rows))
        at = np.arange(start, stop)
        r = np.concatenate([which[self.a[start:stop]], which[self.b[start:stop]]])
        q = np.concatenate([at, at])
        mine = r >= 0
        return r[mine], q[mine]

    def median_without(self, m: int, rows: np.ndarray) -> np.ndarray:
        """For each pool index i in ``rows``: the median of the pair values not involving i."""
        p = len(self.values)
        count = p - (m - 1)
        k = (count - 1) // 2
        stop = min(k + m + 1, p)  # the value sought for row i is at most m - 1 places after position k
        # Row i's pairs before position k push its k-th value that many places right; so do its pairs
        # met on the way: the answer is the first position q >= k with q - k + 1 - (i's pairs in [k, q])
        # = before + 1. Found by fixed-point iteration (each step jumps over the pairs of i passed).
        before = np.bincount(self.a[:k], minlength=m)[rows] + np.bincount(self.b[:k], minlength=m)[rows]
        member_row, member_pos = self._members(m, rows, k, stop)

        def kth(target: np.ndarray, q: np.ndarray) -> np.ndarray:
            while True:
                passed = np.bincount(member_row, weights=member_pos <= q[member_row], minlength=len(rows))
                nxt = k + target - 1 + passed.astype(np.intp)
                if np.array_equal(nxt, q):
                    return q
                q = nxt

        first = kth(before + 1, k + before)
        if count % 2:
            return np.asarray(self.values[first])
        second = kth(before + 2, first + 1)
        return np.asarray((self.values[first] + self.values[second]) / 2)

    def median_deviation_without(self, m: int, rows: np.ndarray, centers: np.ndarray) -> np.ndarray:
        """For each pool index i in ``rows``: median over pairs not involving i of |value - centers[i]|
        (the median absolute deviation, unscaled)."""
        v = self.values
        p = len(v)
        n = len(rows)
        count = p - (m - 1)
        k = (count - 1) // 2
        need = 1 if count % 2 else 2
        # The k values closest to the center form a run [lo, lo + k) of the sorted values: the first lo
        # where the value just right of the run is no closer than the run's leftmost (bisection).
        lo = np.zeros(n, np.intp)
        hi = np.full(n, p - k, np.intp)
        while np.any(lo < hi):
            mid = (lo + hi) // 2
            ok = v[np.minimum(mid + k, p - 1)] - centers >= centers - v[mid]
            hi = np.where(ok, mid, hi)
            lo = np.where(ok, lo, mid + 1)
        # Beyond the run, deviations grow along two sorted runs: leftwards from lo - 1 and rightwards
        # from lo + k. The answer is the (inside)-th element of their merge, not counting i's own pairs
        # (inside: i's pairs within the run). It lies within m - 1 + need steps of the run on either side.
        reach = m - 1 + need
        span = (max(int(lo.min()) - reach, 0), int(lo.max()), int(lo.min()) + k, min(int(lo.max()) + k + reach, p))
        before = np.bincount(self.a[: span[0]], minlength=m)[rows] + np.bincount(self.b[: span[0]], minlength=m)[rows]
        cut = np.bincount(self.a[: span[2]], minlength=m)[rows] + np.bincount(self.b[: span[2]], minlength=m)[rows]
        left_row, left_pos = self._members(m, rows, span[0], span[1])
        right_row, right_pos = self._members(m, rows, span[2], span[3])
        left_out = left_pos < lo[left_row]  # i's pairs left of its run
        right_in = right_pos < lo[right_row] + k  # i's pairs inside its run, on the right edge
        inside = (
            (cut - before)
            - np.bincount(left_row[left_out], minlength=n)
            + np.bincount(right_row[right_in], minlength=n)
        )

        every = np.arange(n)

        def left(r: np.ndarray, a: np.ndarray) -> np.ndarray:  # deviation of the a-th value left of the run
            pos = lo[r] - 1 - a
            return np.where(pos >= 0, np.abs(v[np.clip(pos, 0, p - 1)] - centers[r]), np.inf)

        def right(r: np.ndarray, b: np.ndarray) -> np.ndarray:  # ... and of the b-th value right of it
            pos = lo[r] + k + b
            return np.where(pos < p, np.abs(v[np.clip(pos, 0, p - 1)] - centers[r]), np.inf)

        def how_many(
            run: Callable[[np.ndarray, np.ndarray], np.ndarray], r: np.ndarray, x: np.ndarray, strict: bool
        ) -> np.ndarray:
            """How many of the run's first ``reach`` deviations are < x (strict) or <= x."""
            lo_, hi_ = np.zeros(len(r), np.intp), np.full(len(r), reach, np.intp)
            while np.any(lo_ < hi_):
                mid = (lo_ + hi_) // 2
                d = run(r, mid)
                ok = d < x if strict else d <= x
                lo_, hi_ = np.where(ok, mid + 1, lo_), np.where(ok, hi_, mid)
            return lo_

        # Merge order: by deviation, the left run first on ties. Each own pair's place in the merge:
        a = lo[left_row[left_out]] - 1 - left_pos[left_out]
        b = right_pos[~right_in] - lo[right_row[~right_in]] - k
        own_row = np.concatenate([left_row[left_out], right_row[~right_in]])
        own_rank = np.concatenate(
            [
                a + how_many(right, left_row[left_out], left(left_row[left_out], a), strict=True),
                b + how_many(left, right_row[~right_in], right(right_row[~right_in], b), strict=False),
            ]
        )

        def merged(u: np.ndarray) -> np.ndarray:
            """Deviation of the u-th element (0-based) of each row's merge."""
            taken = u + 1
            lo_, hi_ = np.zeros(n, np.intp), np.minimum(taken, reach)  # how many of them come from the left
            while np.any(lo_ < hi_):
                mid = (lo_ + hi_ + 1) // 2
                ok = left(every, mid - 1) <= right(every, taken - mid)
                lo_, hi_ = np.where(ok, mid, lo_), np.where(ok, hi_, mid - 1)
            last_left = np.where(lo_ > 0, left(every, lo_ - 1), -np.inf)
            last_right = np.where(taken - lo_ > 0, right(every, taken - lo_ - 1), -np.inf)
            return np.maximum(last_left, last_right)

        def kth(target: np.ndarray, u: np.ndarray) -> np.ndarray:
            """Merge position of the target-th element that is not one of i's own pairs (fixed point)."""
            while True:
                passed = np.bincount(own_row, weights=own_rank <= u[own_row], minlength=n).astype(np.intp)
                nxt = target + passed
                if np.array_equal(nxt, u):
                    return u
                u = nxt

        first = kth(inside, inside)
        if need == 1:
            return merged(first)
        return (merged(first) + merged(kth(inside + 1, first + 1))) / 2


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
