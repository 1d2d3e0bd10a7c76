#!/usr/bin/env bash
# Regenerates the committed gRPC stubs from proto/ into service/sleuthd/v1/.
# The proto path sleuthd/v1/... makes the generated imports read `from sleuthd.v1 import ...`,
# which resolves inside our own package.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-service}"
python -m grpc_tools.protoc -I proto \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  proto/sleuthd/v1/sleuthd.proto
touch "$out/sleuthd/v1/__init__.py"
