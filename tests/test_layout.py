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
    "sleuthd.audio",
    "sleuthd.calibration",
    "sleuthd.client",
    "sleuthd.config",
    "sleuthd.domain",
    "sleuthd.drift",
    "sleuthd.errors",
    "sleuthd.judgment",  # the evidence model (pure NumPy): tools fit and evaluate it
    "sleuthd.manifest",
    "sleuthd.scoring",
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
    assert not {"onnxruntime", "soxr", "soundfile", "numpy", "sleuthd.engine", "sleuthd.audio"} & loaded
    assert "grpc" in loaded


def test_domain_types_import_only_the_standard_library() -> None:
    loaded = _modules_after("import sleuthd.domain")
    assert {m for m in loaded if m.startswith("sleuthd")} == {"sleuthd", "sleuthd.domain"}
    assert "numpy" not in loaded


def test_the_engine_never_imports_grpc() -> None:
    loaded = _modules_after("import sleuthd.engine, sleuthd.stream, sleuthd.api")
    assert not {m for m in loaded if m == "grpc" or m.startswith("grpc.")}


def test_the_product_never_imports_the_tools_and_the_tools_use_only_public_modules() -> None:
    for path in PRODUCT.rglob("*.py"):
        assert not any(m.startswith("sleuthd_bench") for m in _imports(path)), path
    for path in TOOLS.rglob("*.py"):
        used = {m for m in _imports(path) if m == "sleuthd" or m.startswith("sleuthd.")}
        private = {m for m in used if not any(m == p or m.startswith(p + ".") for p in PUBLIC)}
        assert not private, f"{path.name} reaches into engine internals: {sorted(private)}"


def test_no_product_module_is_over_400_lines_and_the_engine_facade_is_small() -> None:
    sizes = {p: len(p.read_text().splitlines()) for p in PRODUCT.rglob("*.py") if "v1" not in p.parts}
    assert max(sizes.values()) <= 400, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
    assert sizes[PRODUCT / "engine.py"] <= 250


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
