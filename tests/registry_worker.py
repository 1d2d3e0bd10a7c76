"""A separate process that registers voices through the store, for the kill -9 and concurrency tests.

    python -m tests.registry_worker loop LOCATION PREFIX COUNT  # register PREFIX-0000..; print each id acknowledged
    python -m tests.registry_worker race LOCATION ID...         # print "ok ID" or "dup ID" for each

Each line is flushed as soon as ``register`` has returned, so whatever the parent read was acknowledged.
"""

from __future__ import annotations

import sys

from sleuthd.errors import Duplicate
from sleuthd.registry import RegistryConfig, open_store

from tests.registry_support import clips_for, embedding_for

CLIPS = 3


def main(argv: list[str]) -> int:
    mode, location, *rest = argv
    store = open_store(RegistryConfig(registry=location))
    assert store is not None
    if mode == "loop":
        prefix, count = rest[0], int(rest[1])
        for i in range(count):
            voice_id = f"{prefix}-{i:04d}"
            store.register(
                voice_id, clips_for(CLIPS, start=i), metadata={"n": str(i)}, embeddings=[embedding_for(voice_id)]
            )
            print(voice_id, flush=True)
    elif mode == "race":
        for voice_id in rest:
            try:
                store.register(voice_id, clips_for(CLIPS), embeddings=[embedding_for(voice_id)])
                print("ok", voice_id, flush=True)
            except Duplicate:
                print("dup", voice_id, flush=True)
    else:
        raise SystemExit(f"unknown mode {mode!r}: loop or race")
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
