"""Per-RPC summary of a locust run from its ``<prefix>_stats.csv``; exits 1 on any failure or no requests.

python -m loadtest.summary runs/loadtest/<stamp>/locust
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RpcStats:
    """One row of locust's stats CSV. Times are milliseconds from call start to the last reply."""

    name: str
    requests: int
    failures: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    requests_per_s: float


def read_stats(prefix: Path) -> list[RpcStats]:
    """Rows of ``<prefix>_stats.csv`` in file order, the ``Aggregated`` row last (named ``all``)."""
    path = Path(f"{prefix}_stats.csv")
    rows = []
    with path.open(newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            rows.append(
                RpcStats(
                    name=row["Name"] if row["Name"] != "Aggregated" else "all",
                    requests=int(row["Request Count"]),
                    failures=int(row["Failure Count"]),
                    # Locust writes "N/A" for percentiles of an RPC with no requests.
                    p50_ms=_ms(row["50%"]),
                    p95_ms=_ms(row["95%"]),
                    p99_ms=_ms(row["99%"]),
                    max_ms=_ms(row["Max Response Time"]),
                    requests_per_s=float(row["Requests/s"]),
                )
            )
    return rows


def _ms(cell: str) -> float:
    try:
        return float(cell)
    except ValueError:
        return float("nan")


def table(stats: list[RpcStats]) -> str:
    header = ("rpc", "requests", "failures", "req/s", "p50 ms", "p95 ms", "p99 ms", "max ms")
    rows = [header] + [
        (
            s.name,
            str(s.requests),
            str(s.failures),
            f"{s.requests_per_s:.2f}",
            f"{s.p50_ms:.0f}",
            f"{s.p95_ms:.0f}",
            f"{s.p99_ms:.0f}",
            f"{s.max_ms:.0f}",
        )
        for s in stats
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefix", type=Path, help="the --csv prefix given to locust")
    args = parser.parse_args()
    stats = read_stats(args.prefix)
    print(table(stats))
    total = next((s for s in stats if s.name == "all"), None)
    if total is None or total.requests == 0:
        print("FAIL: no requests completed", file=sys.stderr)
        return 1
    if total.failures:
        print(
            f"FAIL: {total.failures} of {total.requests} requests failed (see {args.prefix}_failures.csv)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
