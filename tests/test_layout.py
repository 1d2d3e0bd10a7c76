"""The shape of the code: leaf modules stay leaves, the product never leans on the tools, the tools use
only the product's public modules, and one config source drives the server's flags."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from sleuthd.config import BatcherConfig, ConfigError, EngineConfig, ServerConfig, add_cli_args, from_cli_args

from tests.support import REPO

PRODUCT = REPO / "service" / "sleuthd"
TOOLS = REPO / "tools" / "sleuthd_bench"
# What the tools may use: the in-process API, the client and stubs, and the product's data types and
# pure functions. Never the engine's internals (embedder, batcher, engine, servicer, ...).
PUBLIC = {
    "sleuthd",
    "sleuthd.api",
    "sleuthd.audio.decode",
    "sleuthd.client",
    "sleuthd.config",
    "sleuthd.domain",
    "sleuthd.encoders.manifest",
    "sleuthd.encoders.runner",  # the ONNX model timed alone (sleuthd_bench.model_rate)
    "sleuthd.errors",
    "sleuthd.judgment.calibration",
    "sleuthd.judgment.drift",
    "sleuthd.judgment.evidence",  # the evidence model (pure NumPy): the tools fit and evaluate it
    "sleuthd.judgment.scoring",
    "sleuthd.report",
    # The LALM judge's tools (sleuthd-bench judge): the benchmark times the in-process model and its audio
    # encoder alone (no server: the model call is what is measured), on prompts of synthetic voices; the
    # calibration fit writes the calibration file the server reads, with the server's own fitting functions.
    "sleuthd.lalm.audio_encoder",
    "sleuthd.lalm.calibration",
    "sleuthd.lalm.local",
    "sleuthd.lalm.prompts",
    "sleuthd.lalm.tiny",
    "sleuthd.lalm.types",
    "sleuthd.v1",
}


def _modules_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    return set(out.stdout.split())


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_client_loads_neither_the_engine_nor_onnxruntime_nor_audio_libraries() -> None:
    loaded = _modules_after("import sleuthd.client")
    assert not {"onnxruntime", "soxr", "soundfile", "numpy", "sleuthd.engine.facade", "sleuthd.audio.decode"} & loaded
    assert "grpc" in loaded


def test_the_report_is_as_light_as_the_client() -> None:
    loaded = _modules_after("import sleuthd.report")
    assert not {"onnxruntime", "soxr", "soundfile", "numpy", "sleuthd.engine", "sleuthd.audio"} & loaded


def test_domain_types_import_only_the_standard_library() -> None:
    loaded = _modules_after("import sleuthd.domain")
    assert {m for m in loaded if m.startswith("sleuthd")} == {"sleuthd", "sleuthd.domain"}
    assert "numpy" not in loaded


def test_the_engine_never_imports_grpc() -> None:
    loaded = _modules_after("import sleuthd.engine.facade, sleuthd.engine.stream, sleuthd.api")
    assert not {m for m in loaded if m == "grpc" or m.startswith("grpc.")}


def test_the_product_never_imports_the_tools_and_the_tools_use_only_public_modules() -> None:
    for path in PRODUCT.rglob("*.py"):
        assert not any(m.startswith("sleuthd_bench") for m in _imports(path)), path
    for path in TOOLS.rglob("*.py"):
        used = {m for m in _imports(path) if m == "sleuthd" or m.startswith("sleuthd.")}
        # "sleuthd" itself is public, not everything under it.
        private = {m for m in used if not any(m == p or (p != "sleuthd" and m.startswith(p + ".")) for p in PUBLIC)}
        assert not private, f"{path.name} reaches into engine internals: {sorted(private)}"


# The product's layers, outermost first, in the order a request crosses them (README, "Layout"). A package
# may import only itself and the packages listed after it; the leaves import nothing of the product.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli",),  # the command line: serve, check, rank, health, voices, models
    ("report",),  # the HTML review report (client side: it imports the client, never the engine)
    # The in-process façade (sleuthd.api): what the tools, scripts and `check --local` use without a server.
    # Above the edge, because it answers with the edge's own conversions (rpc.convert) around the same engine.
    ("api",),
    ("rpc",),  # the gRPC edge: server, gate, servicer, conversions
    ("export",),  # building the ONNX models (`sleuthd models export`)
    ("engine",),  # façade, stream sessions, loading, admission
    ("judgment",),  # the Dialogue protocol, verdict rules, scoring, calibration, drift, ranking
    ("registry",),  # the voice registry: stores and the registering of voices
    ("lalm",),  # the LALM judge
    ("encoders",),  # clip embedder, batcher, ONNX runners, fusion, manifests
    ("audio",),  # decoding, VAD, windows
    ("client",),  # the client library (grpc and the stubs only)
    ("ops",),  # metrics, logs, observers
    ("aio", "config", "domain", "errors", "threads", "v1", "__init__"),  # leaves
)


def _product_modules() -> dict[str, Path]:
    out = {}
    for path in PRODUCT.rglob("*.py"):
        parts = path.relative_to(PRODUCT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _edges(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Every import of every product module (function-level ones too), resolved to product modules:
    ``from sleuthd.x import y`` is the module sleuthd.x.y when that exists, else sleuthd.x."""
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    found.add(sub if sub in modules else node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        edges[name] = {m for m in found if m in modules and m != name}
    return edges


def _layer_of(module: str) -> int:
    top = module.split(".")[1] if module.count(".") else "__init__"
    for rank, names in enumerate(LAYERS):
        if top in names:
            return rank
    raise AssertionError(f"{module}: its package {top!r} is in no layer of LAYERS; add it where it belongs")


def test_each_layer_imports_only_the_layers_below_it() -> None:
    modules = _product_modules()
    leaves = len(LAYERS) - 1
    wrong = []
    for module, imported in _edges(modules).items():
        own = _layer_of(module)
        for other in imported:
            theirs = _layer_of(other)
            same_package = module.split(".")[:2] == other.split(".")[:2]
            if (own == leaves and not same_package and other != "sleuthd") or theirs < own:
                wrong.append(f"{module} -> {other}")
    assert not wrong, "imports that climb up the layers:\n" + "\n".join(sorted(wrong))


def test_the_product_has_no_import_cycle() -> None:
    edges = _edges(_product_modules())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_config_dataclasses_generate_the_flags_and_read_the_environment() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_cli_args(parser, EngineConfig, env={"SLEUTHD_MAX_WAIT_MS": "2.5", "SLEUTHD_VAD": "silero"})
    args = parser.parse_args(["--max-batch-windows", "32", "--encoder", "other"])
    config = from_cli_args(EngineConfig, args)
    assert config.batcher == BatcherConfig(max_batch_windows=32, max_wait_ms=2.5)
    assert config.vad == "silero" and config.default_encoder == "other"
    assert "SLEUTHD_EMBEDDING_CACHE_ENTRIES" in parser.format_help()  # the help names each variable
    # A malformed variable names itself and what it accepts.
    with pytest.raises(ConfigError, match="SLEUTHD_VAD='webrtc' is not one of: energy, silero"):
        add_cli_args(argparse.ArgumentParser(), EngineConfig, env={"SLEUTHD_VAD": "webrtc"})
    with pytest.raises(ConfigError, match="SLEUTHD_PORT='http' is not a valid int"):
        add_cli_args(argparse.ArgumentParser(), ServerConfig, env={"SLEUTHD_PORT": "http"})
    # A value that cannot work is refused with the option's name.
    with pytest.raises(ConfigError, match="max_wait_ms must be 0 or more, got -1"):
        BatcherConfig(max_wait_ms=-1)
    with pytest.raises(ConfigError, match="metrics_port must be -1"):
        ServerConfig(metrics_port=70000)


def _sleuthd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "sleuthd.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )


def test_startup_errors_are_one_line(tmp_path: Path) -> None:
    no_models = _sleuthd("serve", "--port", "0", "--metrics-port", "-1", "--models-dir", str(tmp_path))
    assert no_models.returncode == 2
    assert no_models.stderr.strip().splitlines()[-1].startswith("error: no encoder manifests under")
    assert "Traceback" not in no_models.stderr
    bad_env = _sleuthd("serve", "--port", "0", env={"SLEUTHD_BATCHING": "sometimes"})
    assert bad_env.returncode == 2 and "Traceback" not in bad_env.stderr
    assert "error: SLEUTHD_BATCHING='sometimes' is not one of: on, off" in bad_env.stderr
    bad_value = _sleuthd("serve", "--port", "0", "--max-wait-ms", "-3", "--models-dir", str(tmp_path))
    assert bad_value.returncode == 2 and "error: max_wait_ms must be 0 or more, got -3.0" in bad_value.stderr
    version = _sleuthd("--version")
    assert version.returncode == 0 and version.stdout.startswith("sleuthd ")
