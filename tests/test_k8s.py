"""deploy/k8s: every overlay renders (deploy/k8s/render.py, kustomize's subset that these files use), validates
against the Kubernetes API schemas (kubernetes-validate, offline), passes checkov's security checks but the
justified skips below, and says what the product reads: every SLEUTHD_* variable is an option, the Triton pod's
init container writes a repository the replicas accept, and vLLM serves the name the replicas ask for."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes_validate
import pytest
import yaml
from google.protobuf import text_format
from prometheus_client import generate_latest
from sleuthd.config import ConnectConfig, EngineConfig, JudgeConfig, ServerConfig, add_cli_args
from sleuthd.encoders.manifest import load_encoder_manifest
from sleuthd.encoders.triton import check_served_model
from sleuthd.ops.metrics import ServiceMetrics
from sleuthd.rpc.server import RunningServer
from tritonclient.grpc import model_config_pb2

from tests.support import REPO, VOICE_A, VOICE_F, Speech

K8S = REPO / "deploy" / "k8s"
CHECK_POD = K8S / "examples" / "check-pod.yaml"
OVERLAYS = ("cpu", "gpu", "triton", "vllm")
KUBERNETES_VERSION = "1.33"  # the API the manifests are written for (autoscaling/v2, policy/v1, grpc probes)

# checkov checks skipped, each with why (everything else must pass):
SKIPPED_CHECKS = {
    # "Image should use digest": the overlays pin images by tag; digests exist only once the deployer has built
    # and pushed the images, and the release pipeline pins them (`kustomize edit set image NAME@sha256:...`,
    # which deploy/k8s/render.py and kustomize both honour).
    "CKV_K8S_43",
    # "Prefer using secrets as files over secrets as environment variables": SLEUTHD_REGISTRY comes from the
    # sleuthd-registry Secret as a variable because sleuthd reads the registry location only from --registry /
    # SLEUTHD_REGISTRY and psycopg takes a password only from the URL, PGPASSWORD or a .pgpass file, which libpq
    # wants mode 0600 and owned by the user: a Secret volume of a non-root pod cannot be both. TLS keys and
    # tokens are files.
    "CKV_K8S_35",
}


def _renderer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("k8s_render", K8S / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    render = _renderer()
    return {overlay: render.render(K8S / "overlays" / overlay) for overlay in OVERLAYS}


def find(resources: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (match,) = [r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name]
    return match


def pod(deployment: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    (match,) = [c for c in pod(deployment)["containers"] if c["name"] == name]
    return match


def env(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def test_every_overlay_validates_against_the_api_schemas(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for overlay, resources in rendered.items():
        kinds = sorted({r["kind"] for r in resources})
        assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "NetworkPolicy"} <= set(
            kinds
        )
        for resource in resources:
            kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)  # raises with the path
            if resource["kind"] != "Namespace":
                assert resource["metadata"]["namespace"] == "sleuthd", (overlay, resource["metadata"]["name"])


def test_the_replicas_are_deployed_for_client_side_balancing_and_draining(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for resources in rendered.values():
        deployment = find(resources, "Deployment", "sleuthd")
        server = container(deployment, "sleuthd")
        variables = env(server)
        # Readiness is gRPC health over TLS (`sleuthd health`); liveness the engine's /healthz; the drain waits
        # for the pod to leave the Service's DNS answer, then gets the server's grace, inside the pod's.
        assert server["readinessProbe"]["exec"]["command"][:2] == ["sleuthd", "health"]
        assert server["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        pre_stop = int(server["lifecycle"]["preStop"]["exec"]["command"][-1])
        grace = float(variables["SLEUTHD_SHUTDOWN_GRACE_SECONDS"])
        assert pod(deployment)["terminationGracePeriodSeconds"] > pre_stop + grace
        # TLS, tokens and the registry from Secrets.
        secrets = {v["secret"]["secretName"] for v in pod(deployment)["volumes"] if "secret" in v}
        assert secrets == {"sleuthd-tls", "sleuthd-auth"}
        assert variables["SLEUTHD_REGISTRY"] == {"secretKeyRef": {"name": "sleuthd-registry", "key": "url"}}
        assert server["resources"]["requests"]["cpu"] and server["resources"]["limits"]["memory"]
        # A headless Service: its DNS name answers every ready pod, for gRPC round_robin in the clients.
        service = find(resources, "Service", "sleuthd")
        assert service["spec"]["clusterIP"] == "None"
        assert {p["port"] for p in service["spec"]["ports"]} == {50051, 9464}
        # Autoscaled on a metric the server really exports.
        hpa = find(resources, "HorizontalPodAutoscaler", "sleuthd")
        metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
        assert metric == "sleuthd_batch_queue_windows"
        assert metric in generate_latest(ServiceMetrics().registry).decode()
        assert find(resources, "PodDisruptionBudget", "sleuthd")["spec"]["maxUnavailable"] == 1
        deny = find(resources, "NetworkPolicy", "default-deny")
        assert deny["spec"]["podSelector"] == {} and deny["spec"]["policyTypes"] == ["Ingress", "Egress"]


def test_every_sleuthd_variable_in_the_manifests_is_an_option(rendered: dict[str, list[dict[str, Any]]]) -> None:
    parser = argparse.ArgumentParser()
    for cls in (ServerConfig, EngineConfig):
        add_cli_args(parser, cls, env={})
    health = argparse.ArgumentParser()
    add_cli_args(health, ConnectConfig, env={})
    known = " ".join(str(a.help) for p in (parser, health) for a in p._actions)  # each ends "env SLEUTHD_X)"
    for resources in rendered.values():
        server = container(find(resources, "Deployment", "sleuthd"), "sleuthd")
        for name in env(server):
            assert f"env {name})" in known, f"{name} is no option of `sleuthd serve` or `sleuthd health`"


def test_the_triton_init_container_writes_a_repository_the_replicas_accept(
    rendered: dict[str, list[dict[str, Any]]], models_dir: Path, tmp_path: Path
) -> None:
    resources = rendered["triton"]
    (init,) = pod(find(resources, "Deployment", "triton"))["initContainers"]
    command = list(init["command"])
    assert command[:3] == ["sleuthd", "models", "triton-repo"]
    out = tmp_path / "repo"
    run = subprocess.run([sys.executable, "-m", "sleuthd.cli", *command[1:3], str(out), *command[4:],
                          "--models-dir", str(models_dir)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr
    for name in ("ge2e", "campplus"):
        config = text_format.Parse((out / name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
        check_served_model(load_encoder_manifest(models_dir / name), config, name)
        inner = (out / f"{name}_onnx" / "config.pbtxt").read_text()
        assert 'backend: "onnxruntime"' in inner and "KIND_GPU" in inner
    server = env(container(find(resources, "Deployment", "sleuthd"), "sleuthd"))
    assert server["SLEUTHD_ENCODER_BACKEND"] == "triton"
    host, port = server["SLEUTHD_TRITON_URL"].split(":")
    service = find(resources, "Service", "triton")
    assert host.split(".")[0] == service["metadata"]["name"]
    assert int(port) in {p["port"] for p in service["spec"]["ports"]}
    triton = container(find(resources, "Deployment", "triton"), "triton")
    assert triton["image"].startswith("nvcr.io/nvidia/tritonserver:")


def test_vllm_serves_the_name_the_replicas_ask_for(rendered: dict[str, list[dict[str, Any]]]) -> None:
    resources = rendered["vllm"]
    server = env(container(find(resources, "Deployment", "sleuthd"), "sleuthd"))
    vllm = container(find(resources, "Deployment", "vllm"), "vllm")
    args = dict(a.removeprefix("--").split("=", 1) for a in vllm["args"])
    assert args["served-model-name"] == server["SLEUTHD_JUDGE_MODEL_NAME"]
    assert int(args["max-logprobs"]) >= JudgeConfig().judge_top_logprobs
    clips = json.loads(args["limit-mm-per-prompt"])["audio"]
    assert clips >= 1 + JudgeConfig().judge_max_context_clips + 1  # reference + context + the turn (detection)
    endpoint = server["SLEUTHD_JUDGE_ENDPOINT"]
    service = find(resources, "Service", "vllm")["metadata"]["name"]
    assert endpoint.startswith(f"http://{service}.") and endpoint.endswith(f":{args['port']}/v1")


def test_checkov_finds_nothing_but_the_justified_skips(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    checkov = os.environ.get("SLEUTHD_CHECKOV") or str(Path(sys.prefix) / "checkov" / "bin" / "checkov")
    if not Path(checkov).exists():
        pytest.fail(f"checkov is not installed at {checkov}: make setup puts it in .venv/checkov (see the Makefile)")
    for overlay, resources in rendered.items():
        (tmp_path / f"{overlay}.yaml").write_text(yaml.safe_dump_all(resources, sort_keys=False))
    shutil.copy(CHECK_POD, tmp_path / "check-pod.yaml")
    run = subprocess.run(
        [checkov, "--directory", str(tmp_path), "--framework", "kubernetes", "--output", "json", "--quiet",
         "--skip-check", ",".join(sorted(SKIPPED_CHECKS))],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    report = json.loads(run.stdout)
    failed = [(c["check_id"], c["resource"], c["check_name"]) for c in report["results"]["failed_checks"]]
    assert not failed, failed
    assert report["summary"]["passed"] > 100  # it did check: every resource, every container


def test_the_triton_client_image_recipe_lints() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    recipe = K8S / "images" / "triton-client.Containerfile"
    lint = subprocess.run([hadolint, str(recipe)], capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr


async def test_the_documented_check_runs_against_a_server(
    server: RunningServer, speech: Speech, tmp_path: Path
) -> None:
    """The last step from an empty cluster: deploy/k8s/check.py with a dialogue file, through the client
    library's balancing channel (here to a plaintext in-process server; in the cluster with TLS and a token)."""
    (pod_spec,) = yaml.safe_load_all(CHECK_POD.read_text())
    kubernetes_validate.validate(pod_spec, KUBERNETES_VERSION, strict=True)
    turns = []
    for k, voice in enumerate((VOICE_A, VOICE_A, VOICE_F, VOICE_A)):
        shutil.copy(speech.clips[voice][k], tmp_path / f"t{k}.wav")
        turns.append({"turn_id": f"t{k}", "speaker": "Ann", "audio": f"t{k}.wav"})
    shutil.copy(speech.clips[VOICE_A][5], tmp_path / "ref.wav")
    (tmp_path / "dialogue.json").write_text(json.dumps({"dialogue_id": "k8s-check", "turns": turns,
        "references": {"Ann": "ref.wav"}, "options": {"method": "reference"}}))  # fmt: skip
    run = await asyncio.create_subprocess_exec(
        sys.executable, str(K8S / "check.py"), f"ipv4:127.0.0.1:{server.port}", str(tmp_path / "dialogue.json"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(run.communicate(), 120)
    assert run.returncode == 0, err.decode()
    assert out.decode().splitlines() == ["dialogue k8s-check: encoder ge2e, 4 turns judged", "  Ann: flagged ['t2']"]
