#!/usr/bin/env bash
# Build the real Dockerfile with podman, run the image, and check it end to end:
# health via the image's own HEALTHCHECK command, one CheckDialogue on real FSDD speech (sleuthd/export/parity_clips) from this
# checkout's client (.venv, after `make setup`; in a clean clone, from a second container of the image), and a
# clean SIGTERM stop. Takes several minutes; not part of `make test` (docs/deploy.md).
#
#   scripts/container.sh            # base image (if missing) + build + run + check
#   RUNTIME=gpu scripts/container.sh build
#
# No container registry is reachable where this was written, so the base image is made from Debian packages
# (debootstrap bookworm: python 3.11, like python:3.11-slim-bookworm) unless PYTHON_IMAGE names one you have.
# Needs root, podman, debootstrap (and runc: crun refuses hybrid cgroups). The podman settings below are those
# that work inside an unprivileged-ish VM without a Docker daemon: vfs storage, cgroupfs, runc, host network,
# no default ulimits (raising RLIMIT_NOFILE is refused there). Override PODMAN to use your own.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-localhost/sleuthd:dev}
BASE=${BASE:-localhost/sleuthd-base:bookworm}
PYTHON_IMAGE=${PYTHON_IMAGE:-$BASE}
RUNTIME=${RUNTIME:-cpu}
CONF=$(mktemp)
trap 'rm -f "$CONF"' EXIT
printf '[containers]\ndefault_ulimits = []\n' >"$CONF"
export CONTAINERS_CONF=${CONTAINERS_CONF:-$CONF}
read -r -a PODMAN <<<"${PODMAN:-podman --storage-driver vfs --runtime runc --cgroup-manager cgroupfs}"

# A non-root user must be able to run python3 in the base (the image runs as uid 10001).
base_usable() { "${PODMAN[@]}" run --rm --network none --user 10001:10001 "$BASE" python3 -c pass >/dev/null 2>&1; }

base() {
  if "${PODMAN[@]}" image exists "$BASE"; then
    base_usable && { echo "$BASE exists: python3 runs in it as uid 10001"; return 0; }
    echo "$BASE cannot be used by a non-root user (made by an older script with / at mode 0700): rebuilding it"
    "${PODMAN[@]}" rmi -f "$BASE" >/dev/null
  fi
  echo "building $BASE from Debian packages (debootstrap, a few minutes)"
  local root
  root=$(mktemp -d)
  # mktemp makes the folder 0700 and tar keeps that mode for the image's /: then only root could traverse
  # it and `podman run` of the non-root image answers `exec: "sleuthd": executable file not found in $PATH`.
  chmod 0755 "$root"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" \
    http://deb.debian.org/debian >/dev/null
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | "${PODMAN[@]}" import --change 'CMD ["python3"]' - "$BASE" >/dev/null
  rm -rf "$root"
  base_usable || { echo "error: uid 10001 cannot run python3 in $BASE" >&2; exit 1; }
  echo "$BASE: python3 runs as uid 10001"
}

build() {
  # pip inside the build uses this machine's pip configuration (index, certificate bundle, local wheels),
  # mounted for the RUN steps only; nothing of it lands in the image.
  local mounts=()
  for path in /etc/pip.conf /etc/xdg/pip "$HOME/.config/pip" "$HOME/.pip" /opt/wheels /opt/pypi /opt/pypi-more; do
    [ -e "$path" ] && mounts+=(-v "$path:${path/#$HOME//root}:ro")
  done
  [ -e /etc/ssl/certs/ca-certificates.crt ] && mounts+=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
  "${PODMAN[@]}" build --format docker --isolation chroot --network host "${mounts[@]}" \
    --build-arg PYTHON_IMAGE="$PYTHON_IMAGE" --build-arg CUDA_IMAGE="${CUDA_IMAGE:-$PYTHON_IMAGE}" \
    --build-arg RUNTIME="$RUNTIME" --build-arg TORCH_INDEX_URL="${TORCH_INDEX_URL:-https://pypi.org/simple}" \
    -t "$IMAGE" .
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

NAME=sleuthd-check-$$

check() {
  local port metrics
  port=$(free_port)
  metrics=$(free_port)
  # The HEALTHCHECK runs on demand below (`podman healthcheck run`); podman's own timer needs systemd.
  "${PODMAN[@]}" run -d --name "$NAME" --network host --health-interval disable \
    -e SLEUTHD_PORT="$port" -e SLEUTHD_TARGET="127.0.0.1:$port" -e SLEUTHD_METRICS_PORT="$metrics" "$IMAGE" >/dev/null
  trap '"${PODMAN[@]}" rm -f "$NAME" >/dev/null 2>&1 || true; rm -f "$CONF"' EXIT
  echo "container $NAME: gRPC on 127.0.0.1:$port, metrics on $metrics"
  for _ in $(seq 1 60); do
    "${PODMAN[@]}" healthcheck run "$NAME" >/dev/null 2>&1 && break
    sleep 2
  done
  "${PODMAN[@]}" healthcheck run "$NAME" || { "${PODMAN[@]}" logs "$NAME"; echo "never became healthy" >&2; exit 1; }
  echo "healthcheck: healthy (sleuthd health inside the container)"
  echo "user in the container: $("${PODMAN[@]}" exec "$NAME" id -u)"
  "${PODMAN[@]}" exec "$NAME" python3 -c 'import importlib.metadata as m; d={x.metadata["Name"] for x in m.distributions()}; print("torch" in d, "onnxruntime" in d)' |
    grep -qx "False True" || { echo "the runtime image must have onnxruntime and no torch" >&2; exit 1; }
  curl -fsS "http://127.0.0.1:$metrics/readyz"
  if [ -x .venv/bin/python ]; then  # this checkout's client, from the host
    .venv/bin/python scripts/container_request.py "127.0.0.1:$port"
  else  # a clean clone has no .venv: the image's own client library, from a second container
    "${PODMAN[@]}" run --rm --network host --entrypoint python -v "$PWD/scripts:/check/scripts:ro" \
      "$IMAGE" /check/scripts/container_request.py "127.0.0.1:$port"
  fi
  "${PODMAN[@]}" stop -t 30 "$NAME" >/dev/null
  local code
  code=$("${PODMAN[@]}" inspect --format '{{.State.ExitCode}}' "$NAME")
  "${PODMAN[@]}" logs "$NAME" 2>&1 | tail -n 4
  [ "$code" = 0 ] || { echo "exit code after SIGTERM: $code" >&2; exit 1; }
  echo "stopped cleanly on SIGTERM (exit 0)"
}

case "${1:-all}" in
  base) base ;;
  build) base; build ;;
  check) check ;;
  all) base; build; check ;;
  *) echo "usage: $0 [base|build|check|all]" >&2; exit 2 ;;
esac
