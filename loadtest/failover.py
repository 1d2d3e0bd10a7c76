"""A replica killed while it answers a burst: are the calls it was answering retried on the other one?

Each trial starts two `sleuthd serve` replicas, sends ``--calls`` concurrent CheckDialogues (fresh audio each,
3 turns of ``--turn-seconds``) over one balancing channel (``ipv4:A,B``, round_robin, the client library's
retry policy), and kills replica A with SIGKILL the moment the first answer of the burst arrives: the
micro-batcher finishes a batch of calls together, so some of A's calls are between "done" and "answered" then.
A call that had received anything from A is committed to it and cannot be retried; the tool counts the calls
lost by their status. Issue 29: a unary call used to send its request id in a header of its own before the
answer, so a kill in between lost the call (``UNAVAILABLE: Stream removed``).

    .venv/bin/python -m loadtest.failover --trials 30 --calls 48
    .venv/bin/python -m loadtest.failover --pythonpath OLD/service   # replicas running another checkout
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import grpc
from sleuthd.client import channels
from sleuthd.v1 import sleuthd_pb2 as pb

from loadtest.overload import RequestBytes, ServerProcess, long_turns


async def trial(calls: int, requests: RequestBytes, first_nonce: int, env: dict[str, str], logs: Path) -> Counter[str]:
    """One trial's outcomes: "OK", or "CODE: details" of each call that failed."""
    a = ServerProcess(["--metrics-port", "-1"], logs / "a.log", env)
    b = ServerProcess(["--metrics-port", "-1"], logs / "b.log", env)
    outcomes: Counter[str] = Counter()
    killed = False
    try:
        async with channels.channel(f"ipv4:{a.target},{b.target}") as ch:
            stub = channels.stub(ch)
            await asyncio.wait_for(ch.channel_ready(), 30)
            await asyncio.sleep(0.5)  # round_robin connects to the second replica too

            async def one(k: int) -> None:
                nonlocal killed
                request = pb.CheckDialogueRequest.FromString(requests.make(first_nonce + k))
                try:
                    await stub.CheckDialogue(request, timeout=60)
                    outcomes["OK"] += 1
                except grpc.aio.AioRpcError as exc:
                    outcomes[f"{exc.code().name}: {exc.details()}"] += 1
                if not killed:
                    killed = True
                    a.proc.send_signal(signal.SIGKILL)

            await asyncio.gather(*(one(k) for k in range(calls)))
    finally:
        a.stop()
        b.stop()
    return outcomes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.failover", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=30, help="trials, two fresh replicas each (30)")
    parser.add_argument("--calls", type=int, default=48, help="concurrent CheckDialogues per trial (48)")
    parser.add_argument("--turn-seconds", type=float, default=4.0, help="audio per turn, seconds (4)")
    parser.add_argument("--pythonpath", default="", help="run the replicas with this PYTHONPATH (another checkout)")
    args = parser.parse_args(argv)
    env = {"PYTHONPATH": args.pythonpath} if args.pythonpath else {}
    requests = RequestBytes(long_turns(3, args.turn_seconds))
    total: Counter[str] = Counter()
    trials_losing = 0
    with tempfile.TemporaryDirectory() as tmp:
        for t in range(args.trials):
            got = asyncio.run(trial(args.calls, requests, t * args.calls, env, Path(tmp)))
            lost = sum(n for k, n in got.items() if k != "OK")
            trials_losing += lost > 0
            total.update(got)
            print(f"trial {t + 1}/{args.trials}: {got['OK']} OK, {lost} failed {dict(got - Counter(OK=got['OK']))}",
                  flush=True)  # fmt: skip
    calls = args.trials * args.calls
    unavailable = sum(n for k, n in total.items() if k.startswith("UNAVAILABLE"))
    print(f"{calls} calls in {args.trials} trials: {total['OK']} OK; trials with a failed call: {trials_losing}")
    # UNAVAILABLE after the channel's retries: lost to the kill. RESOURCE_EXHAUSTED: the survivor, with all of
    # the dead replica's calls moved onto it, could not finish them before their deadlines (a busy answer).
    print(f"lost to the kill (UNAVAILABLE): {unavailable}")
    for outcome, n in total.most_common():
        if outcome != "OK":
            print(f"  {n:4d}  {outcome}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
