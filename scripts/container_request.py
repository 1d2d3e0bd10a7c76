"""One CheckDialogue against a running server, on real FSDD speech (sleuthd/export/parity_clips; scripts/container.sh).

One FSDD speaker's four turns (five spoken digits joined each) and a reference; the last turn is really
another speaker, so the verdict must flag it with the worst reference score (GE2E on real 8 kHz speech also
flags some genuine turns at its synthetic-voice threshold: the paper's point about fixed thresholds).
"""

from __future__ import annotations

import asyncio
import sys

import numpy as np
import soundfile as sf
from sleuthd.client import Dialer
from sleuthd.export import parity_clips_dir
from sleuthd.v1 import sleuthd_pb2 as pb
from sleuthd.v1 import sleuthd_pb2_grpc as pb_grpc

FSDD = parity_clips_dir()  # the FSDD takes shipped in the package: a checkout's or the image's


def turn(speaker: str, start: int) -> pb.Audio:
    files = sorted(FSDD.glob(f"*_{speaker}_*.wav"))[start : start + 5]
    samples = np.concatenate([sf.read(f, dtype="int16")[0] for f in files])
    return pb.Audio(pcm=pb.PcmAudio(data=samples.astype("<i2").tobytes(), encoding=pb.PCM_S16LE,
                                    sample_rate_hz=8000, channels=1))  # fmt: skip


async def main(target: str) -> None:
    req = pb.CheckDialogueRequest(dialogue_id="container", options=pb.CheckOptions(method=pb.METHOD_REFERENCE))
    for k in range(3):
        req.turns.add(turn_id=f"g{k}", speaker="George", audio=turn("george", 5 * k))
    req.turns.add(turn_id="g3", speaker="George", audio=turn("jackson", 0))
    req.references.add(speaker="George", audio=turn("george", 15))
    async with Dialer(target).aio() as channel:
        verdict = await pb_grpc.SleuthStub(channel).CheckDialogue(req, timeout=120)
    flagged = list(verdict.speakers[0].inconsistent_turn_ids)
    worst = min(verdict.turns, key=lambda t: t.score).turn_id
    print(f"CheckDialogue through the container: flagged {flagged}, worst score {worst}")
    if "g3" not in flagged or worst != "g3":
        sys.exit(f"expected g3 flagged with the worst score: {[t.detail for t in verdict.turns]}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
