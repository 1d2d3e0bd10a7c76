"""Thread priorities: the threads that finish admitted work run ahead of the thread that takes in new work
(a leaf: imports only the standard library).

`sleuthd serve` reads, checks, admits and refuses requests on one asyncio thread (the intake); decoding and
model calls run on worker threads. Under overload, clients that resend at once keep the intake reading and
refusing requests; on a machine with a few cores it then takes a core from the workers, and admitted work runs
up to twice as slowly and misses its deadlines (issue 33: a CheckDialogue took 1.8-2.0 s instead of 0.8-0.9 s).
Linux lets a thread lower its own priority (raise its nice value) without privilege but never raise it back, and
a thread starts with the nice value of the thread that starts it. So the workers are started first, at the
process's priority (:func:`start_threads`), and the intake lowers its own afterwards
(:func:`lower_own_priority`). gRPC's C core reads and writes the sockets on threads of its own (named
``event_engine``), started before that: they stay at the process's priority (lowering them too was measured
and showed no gain: docs/research/intake-priority/). The nice value only matters while threads compete for a
core: an idle or uncontended intake runs as fast as before. Measured in docs/serving.md, "Who gets the CPU".
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

# Starting a thread takes microseconds; this only bounds a pool that cannot start (e.g. out of threads).
_START_TIMEOUT_S = 30.0
HIGHEST_NICE = 19  # Linux's lowest priority
_PR_SET_NAME = 15  # prctl's option (linux/prctl.h)


def start_threads(executor: ThreadPoolExecutor) -> None:
    """Start every thread of ``executor`` now, from the calling thread, so that each takes the caller's
    priority rather than that of whichever thread first hands the pool work later (ThreadPoolExecutor starts
    its threads lazily, on the submitting thread)."""
    count = executor._max_workers  # no public accessor; stable since Python 3.2
    name = executor._thread_name_prefix or ""  # likewise
    # Each job holds its thread until all are running: a thread that finished its job would be reused for the
    # next one instead of a new thread being started.
    barrier = threading.Barrier(count + 1)

    def start() -> None:
        name_native(name)
        barrier.wait(_START_TIMEOUT_S)

    jobs = [executor.submit(start) for _ in range(count)]
    barrier.wait(_START_TIMEOUT_S)
    for job in jobs:
        job.result()


def name_native(name: str) -> None:
    """Give the calling thread ``name`` where the OS shows it (``top -H``, ``ps -L``, /proc/.../comm; Linux keeps
    15 bytes), so an operator and the tests can tell the decoding and model threads from the intake's. Python
    3.11 names its threads for itself only. Best effort: nothing happens off Linux or without prctl."""
    if sys.platform != "linux" or not name:
        return
    try:
        ctypes.CDLL(None).prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        return


def lower_own_priority(by: int) -> int | None:
    """Raise the calling thread's nice value by ``by`` (capped at 19) and return the new value, or None when
    ``by`` is 0 or the platform has no per-thread priority (only Linux has; elsewhere the call would lower the
    whole process, workers included). Threads this thread starts from now on inherit the lower priority."""
    if by <= 0 or sys.platform != "linux":
        return None
    me = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, me, min(os.getpriority(os.PRIO_PROCESS, me) + by, HIGHEST_NICE))
        return os.getpriority(os.PRIO_PROCESS, me)
    except OSError:  # a sandbox that forbids setpriority: serve at the priority we have
        return None
