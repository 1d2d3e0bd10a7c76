"""A real NVIDIA Triton server on loopback, from the ``nvidia-pytriton`` wheel (tests and benchmarks).

The wheel (``nvidia-pytriton==0.7.0``, installed ``--no-deps`` by the Makefile) carries ``tritonserver``
2.51 with the Python backend, its shared libraries (``nvidia_pytriton.libs/``, found through
LD_LIBRARY_PATH) and Python-backend stubs for Python 3.8-3.13; not the ONNX Runtime backend, so the
repository is the ``--python-backend`` one (``sleuthd models triton-repo --python-backend``).

The stub runs ``model.py`` with the first ``python`` on PATH. It was built against numpy 1.x: under numpy 2
every output tensor reaches the server empty ("output tensor shape does not match size of output"), so the
models run in a small environment of their own with numpy<2 and the same onnxruntime as the serving venv
(``.venv/triton-python``, made by the Makefile; ``$SLEUTHD_TRITON_PYTHON`` points elsewhere).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from sleuthd_bench.footprint import tree


class TritonUnavailable(RuntimeError):
    """No Triton server can be started here; the message says what is missing and how to get it."""


@dataclass(frozen=True)
class TritonInstall:
    binary: Path  # pytriton/tritonserver/bin/tritonserver
    libs: Path  # nvidia_pytriton.libs
    python_backend: Path  # pytriton/tritonserver/backends/python
    stub: Path  # python_backend_stubs/<X.Y>/triton_python_backend_stub
    python_env: Path  # the models' Python environment (numpy<2, onnxruntime)


def find_install() -> TritonInstall:
    """Where the wheel's server and the models' environment are, or TritonUnavailable saying how to get them."""
    # Found, not imported: the wheel's Python code needs packages the serving venv leaves out (numpy<2,
    # tritonclient's http client); only its files are used.
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TritonUnavailable(
            "the nvidia-pytriton wheel is not installed: pip install --no-deps nvidia-pytriton==0.7.0 (make setup does)"
        )
    root = Path(next(iter(spec.submodule_search_locations))).resolve() / "tritonserver"
    env = Path(os.environ.get("SLEUTHD_TRITON_PYTHON", Path(sys.prefix) / "triton-python"))
    python = env / "bin" / "python"
    if not python.exists():
        raise TritonUnavailable(
            f"no Python environment for Triton's models at {env}: python3 -m venv {env} && {env}/bin/pip install "
            "'numpy<2' onnxruntime (make setup does; $SLEUTHD_TRITON_PYTHON names another)"
        )
    version = subprocess.run([str(python), "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
                             capture_output=True, text=True, check=True, timeout=30).stdout.strip()  # fmt: skip
    install = TritonInstall(
        binary=root / "bin" / "tritonserver",
        libs=root.parent.parent / "nvidia_pytriton.libs",
        python_backend=root / "backends" / "python",
        stub=root / "python_backend_stubs" / version / "triton_python_backend_stub",
        python_env=env,
    )
    for path in (install.binary, install.libs, install.python_backend, install.stub):
        if not path.exists():
            raise TritonUnavailable(f"{path} is missing from the nvidia-pytriton wheel (Python {version})")
    return install


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class TritonProcess:
    """A running ``tritonserver``; :meth:`kill` and :meth:`restart` keep its port (clients reconnect)."""

    install: TritonInstall
    repository: Path
    grpc_port: int
    workdir: Path
    log_path: Path
    startup_timeout_s: float = 60.0
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self) -> None:
        """Start and wait (at most startup_timeout_s) until every model is ready; on failure the process is
        killed and TritonUnavailable carries the end of its log."""
        backends = self.workdir / "backends"
        if not backends.exists():
            (backends / "python").mkdir(parents=True)
            for f in self.install.python_backend.iterdir():
                if f.is_file():
                    (backends / "python" / f.name).symlink_to(f)
            shutil.copy(self.install.stub, backends / "python" / "triton_python_backend_stub")
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = ":".join(p for p in (str(self.install.libs), env.get("LD_LIBRARY_PATH", "")) if p)
        env["PATH"] = f"{self.install.python_env / 'bin'}:{env.get('PATH', '')}"
        # The models' environment must not see the serving venv's packages (numpy 2).
        env.pop("PYTHONPATH", None)
        env.pop("VIRTUAL_ENV", None)
        command = [
            str(self.install.binary),
            f"--model-repository={self.repository}",
            f"--backend-directory={backends}",
            f"--grpc-port={self.grpc_port}",
            "--grpc-address=127.0.0.1",
            "--allow-http=false",
            "--allow-metrics=false",
            "--allow-gpu-metrics=false",
            "--exit-on-error=true",
            "--strict-readiness=true",
            "--exit-timeout-secs=2",
            # Shared memory between the server and each model's stub: a region of our own (several servers can
            # run on one machine) and room for a batch of CAM++ windows (64 x 48240 floats = 12 MB) at once.
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            "--backend-config=python,shm-default-byte-size=16777216",
            "--backend-config=python,shm-growth-byte-size=16777216",
        ]
        log = open(self.log_path, "ab")  # the child keeps its own copy of the descriptor
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.workdir)
        log.close()
        self._wait_ready()

    def _wait_ready(self) -> None:
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        assert self.process is not None
        client = grpcclient.InferenceServerClient(self.url)
        give_up = time.monotonic() + self.startup_timeout_s
        try:
            while time.monotonic() < give_up:
                if self.process.poll() is not None:
                    break
                try:
                    if client.is_server_ready(client_timeout=1.0):
                        return
                except InferenceServerException:
                    pass
                time.sleep(0.2)
        finally:
            client.close()
        code = self.process.poll()
        self.kill()
        why = f"exited with {code}" if code is not None else f"was not ready after {self.startup_timeout_s:.0f} s"
        raise TritonUnavailable(f"tritonserver {why}; the end of its log ({self.log_path}):\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        text = self.log_path.read_bytes().decode(errors="replace") if self.log_path.exists() else ""
        return text[-chars:]

    def kill(self) -> None:
        """SIGKILL the server and its model processes (an outage, not a shutdown), reap it and remove its shared
        memory. The stubs would notice their server's death only by polling its pid, which a busy machine may
        already have given to another process: one outlived its server here, so they are killed too."""
        if self.process is not None and self.process.poll() is None:
            stubs = tree(self.process.pid)[1:]
            self.process.send_signal(signal.SIGKILL)
            for pid in stubs:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        for region in Path("/dev/shm").glob(f"{self.shm_prefix}*"):
            region.unlink(missing_ok=True)
        self.process = None

    @property
    def shm_prefix(self) -> str:
        return f"sleuthd{os.getpid()}x{self.grpc_port}_"

    def restart(self) -> None:
        self.kill()
        self.start()


def start(repository: Path, grpc_port: int = 0, startup_timeout_s: float = 60.0,
          workdir: Path | None = None) -> TritonProcess:  # fmt: skip
    """A Triton server for ``repository`` on 127.0.0.1 (``grpc_port`` 0: a free one), ready to serve."""
    install = find_install()
    work = workdir or Path(tempfile.mkdtemp(prefix="sleuthd-triton-"))
    server = TritonProcess(install, repository, grpc_port or free_port(), work, work / "tritonserver.log",
                           startup_timeout_s)  # fmt: skip
    server.start()
    return server
