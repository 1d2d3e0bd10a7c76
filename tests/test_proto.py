"""The committed gRPC stubs are exactly what scripts/gen_proto.sh generates from proto/."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .support import REPO


def test_generated_stubs_have_not_drifted(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    subprocess.run([str(REPO / "scripts" / "gen_proto.sh"), str(tmp_path)], check=True, env=env, cwd=REPO)
    for name in ("sleuthd_pb2.py", "sleuthd_pb2.pyi", "sleuthd_pb2_grpc.py"):
        fresh = (tmp_path / "sleuthd" / "v1" / name).read_text()
        committed = (REPO / "service" / "sleuthd" / "v1" / name).read_text()
        assert fresh == committed, f"{name} is stale: run `make proto` and commit the result"
