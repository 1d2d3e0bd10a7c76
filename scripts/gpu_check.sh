#!/usr/bin/env bash
# The whole server on a GPU, in one short run: starts `sleuthd serve --device cuda` (the real server, CUDA
# provider), drives it with `sleuthd-bench throughput` and `sleuthd-bench latency` on real speech, and prints
# audio-s/s, p50/p99, served / raw-model and where the time goes (scripts/gpu_check.py; docs/research/gpu/).
#
# On a bare GPU machine (no network, no onnxruntime-gpu, soundfile or soxr) it runs from the bundle that
# scripts/gpu_bundle.py packs into .gpu/part1 .. partN here (as many as fit 64 MiB a run), in N runs on one warm
# machine:
#   runs 1 .. N-1, carry .gpu/partK:   scripts/gpu_check.sh --unpack-only
#   run N, carry .gpu/partN:           scripts/gpu_check.sh --device cuda [--out $OUT]
# Each part is unpacked into .gpu/site (git-ignored, so it stays on the machine between the calls), and marks
# itself there; the last run checks that every part of the bundle came.
# With `--device cpu` (the dry run tests/test_gpu_check.py makes) it ignores any bundle and uses the Python it finds.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python3)}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
SITE=.gpu/site

unpack() {  # a part's archives into .gpu/site (py/, models/, speech/), its wheels into .gpu/site/py
  local part=$1 k n stamp
  [ -f "$part/PART" ] || return 0
  read -r k n stamp <"$part/PART"
  # A part left on the machine by an earlier call (ignored paths stay) is not unpacked twice.
  [ "$(cat "$SITE/part$k.done" 2>/dev/null)" = "$stamp" ] && return 0
  mkdir -p "$SITE/py"
  for a in "$part"/*.tar.xz; do
    [ -e "$a" ] || continue
    echo "unpacking $a" >&2
    tar -xJf "$a" -C "$SITE"
  done
  for w in "$part"/wheels/*.whl; do
    [ -e "$w" ] || continue
    "$PY" -m zipfile -e "$w" "$SITE/py"  # a wheel is a zip of importable files; nothing to build
  done
  echo "$n" >"$SITE/PARTS"
  echo "$stamp" >"$SITE/part$k.done"
}

BUNDLE=1
for a in "$@"; do [ "$a" = cpu ] && BUNDLE=0; done  # --device cpu: the dry run uses the Python it finds
if [ "$BUNDLE" = 1 ]; then
  for part in .gpu/part*; do unpack "$part"; done
fi
if [ "${1:-}" = "--unpack-only" ]; then
  ls -la "$SITE" "$SITE/py/onnxruntime/capi" 2>/dev/null | head -20
  exit 0
fi

[ "$BUNDLE" = 0 ] && SITE=.gpu/none
if [ -f "$SITE/PARTS" ]; then
  for k in $(seq 1 "$(cat "$SITE/PARTS")"); do
    if [ ! -e "$SITE/part$k.done" ]; then
      echo "part $k of the bundle is missing: run it first (carry .gpu/part$k, scripts/gpu_check.sh --unpack-only) on the same warm machine" >&2
      exit 2
    fi
  done
fi
# onnxruntime-gpu's module (shadowing the machine's CPU onnxruntime), the wheels, the product and its tools.
export PYTHONPATH="$PWD/$SITE/py:$PWD/service:$PWD/tools:$PWD${PYTHONPATH:+:$PYTHONPATH}"
# CUDA 13 and cuDNN 9 come as torch's nvidia-* packages there: let the CUDA provider find them.
NV=$("$PY" - <<'EOF'
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
dirs = sorted({os.path.dirname(p) for r in roots for p in glob.glob(os.path.join(r, "nvidia", "**", "lib*.so*"), recursive=True)})
print(":".join(dirs))
EOF
)
[ -n "$NV" ] && export LD_LIBRARY_PATH="$NV${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
MODELS=models
[ -d "$SITE/models" ] && MODELS="$SITE/models"
SPEECH=data
[ -d "$SITE/speech" ] && SPEECH="$SITE/speech"
export SLEUTHD_MODELS_DIR="$PWD/$MODELS" PYTHONUNBUFFERED=1
exec "$PY" scripts/gpu_check.py --models-dir "$MODELS" --speech "$SPEECH" "$@"
