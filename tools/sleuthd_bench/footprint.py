"""CPU and memory of server processes while a benchmark drives them (Linux /proc), for sizing replicas.

Each watched process counts with its descendants (Triton's Python-backend models run in stub processes of their
own). CPU: cores used on average over the window (user + system time / wall time); memory: the peak of the
summed resident set sizes, sampled every ``interval`` seconds.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """``pid`` and every descendant alive now."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                todo += [int(c) for c in task.read_text().split()]
            except OSError:
                continue
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live descendants (0 for a process that is gone)."""
    total = 0.0
    for p in tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14 and 15 of stat)
    return total


def rss_mib(pid: int) -> float:
    total = 0
    for p in tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


class Footprint:
    """``with Footprint({"server": pid}) as fp: ...`` then ``fp.fields()``: server_cores, server_rss_peak_mib."""

    def __init__(self, pids: Mapping[str, int], interval: float = 0.25) -> None:
        self.pids = dict(pids)
        self.interval = interval
        self.peak = {name: 0.0 for name in self.pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._cpu0: dict[str, float] = {}
        self._t0 = 0.0
        self._cores: dict[str, float] = {}

    def __enter__(self) -> Footprint:
        self._t0 = time.perf_counter()
        self._cpu0 = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        wall = time.perf_counter() - self._t0
        self._cores = {name: (cpu_seconds(pid) - self._cpu0[name]) / wall for name, pid in self.pids.items()}

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            for name, pid in self.pids.items():
                self.peak[name] = max(self.peak[name], rss_mib(pid))

    def fields(self) -> dict[str, float]:
        out = {}
        for name in self.pids:
            out[f"{name}_cores"] = round(self._cores.get(name, float("nan")), 3)
            out[f"{name}_rss_peak_mib"] = round(self.peak[name], 1)
        return out
