"""Render a kustomization of deploy/k8s without kubectl: `python deploy/k8s/render.py deploy/k8s/overlays/cpu`.

A small subset of kustomize, exactly what these manifests use, so CI can render and validate them offline
(tests/test_k8s.py); on a cluster use `kubectl apply -k` (kustomize itself), which reads the same files:

- ``resources``: YAML files, or folders holding a kustomization.yaml (rendered first, in order);
- ``namespace``: set on every resource but Namespaces;
- ``images``: ``name`` -> ``newName`` / ``newTag`` / ``digest`` in every container and init container;
- ``patches`` with a ``path``: strategic-merge patches matched by kind and name. Maps merge key by key; lists of
  containers, init containers, env, volumes, volume mounts and ports merge by their merge keys (name,
  mountPath, containerPort), as Kubernetes' strategic merge does; other lists are replaced.

Anything else in a kustomization.yaml is refused, so a file that kustomize would read differently cannot pass.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml

KNOWN = {"apiVersion", "kind", "resources", "namespace", "images", "patches"}
# Strategic merge keys of the list fields these manifests patch (Kubernetes' patchMergeKey).
MERGE_KEYS = {"containers": "name", "initContainers": "name", "env": "name", "volumes": "name",
              "volumeMounts": "mountPath", "ports": "containerPort"}  # fmt: skip

Resource = dict[str, Any]


class RenderError(ValueError):
    """A kustomization this renderer does not understand; the message names the file and the field."""


def _load_all(path: Path) -> list[Resource]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def merge(base: Any, patch: Any, field: str = "") -> Any:
    """Strategic merge of ``patch`` into ``base`` (a new object; neither argument is changed)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for key, value in patch.items():
            out[key] = merge(out[key], value, key) if key in out else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list) and field in MERGE_KEYS:
        key = MERGE_KEYS[field]
        out = copy.deepcopy(base)
        for item in patch:
            match = [i for i, old in enumerate(out) if isinstance(old, dict) and old.get(key) == item.get(key)]
            if match:
                out[match[0]] = merge(out[match[0]], item, "")
            else:
                out.append(copy.deepcopy(item))
        return out
    return copy.deepcopy(patch)


def _containers(resource: Resource) -> list[dict[str, Any]]:
    spec = resource.get("spec", {}).get("template", {}).get("spec", {})
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def split_image(ref: str) -> tuple[str, str, str]:
    """``registry/name:tag@digest`` -> (``registry/name``, tag, digest); absent parts are ""."""
    name, _, digest = ref.partition("@")
    tag = ""
    if ":" in name.rsplit("/", 1)[-1]:
        name, tag = name.rsplit(":", 1)
    return name, tag, digest


def _set_image(resource: Resource, image: dict[str, str]) -> None:
    for container in _containers(resource):
        name, tag, _ = split_image(container.get("image", ""))
        if name != image["name"]:
            continue
        new = image.get("newName", name)
        if "digest" in image:
            container["image"] = f"{new}@{image['digest']}"
        else:
            tag = image.get("newTag", tag)
            container["image"] = f"{new}:{tag}" if tag else new


def render(folder: Path) -> list[Resource]:
    """The resources of the kustomization in ``folder``, as kustomize would emit them (for these files)."""
    path = folder / "kustomization.yaml"
    if not path.exists():
        raise RenderError(f"{folder} has no kustomization.yaml")
    spec = yaml.safe_load(path.read_text()) or {}
    unknown = set(spec) - KNOWN
    if unknown:
        raise RenderError(f"{path}: fields this renderer does not implement: {sorted(unknown)}")
    resources: list[Resource] = []
    for entry in spec.get("resources", []):
        target = (folder / entry).resolve()
        resources += render(target) if target.is_dir() else _load_all(target)
    for patch in spec.get("patches", []):
        if set(patch) != {"path"}:
            raise RenderError(f"{path}: only patches with a path are implemented, got {sorted(patch)}")
        for doc in _load_all(folder / patch["path"]):
            matches = [i for i, r in enumerate(resources)
                       if r["kind"] == doc["kind"] and r["metadata"]["name"] == doc["metadata"]["name"]]  # fmt: skip
            if len(matches) != 1:
                raise RenderError(f"{folder / patch['path']}: {doc['kind']}/{doc['metadata']['name']} matches "
                                  f"{len(matches)} resources, expected 1")  # fmt: skip
            resources[matches[0]] = merge(resources[matches[0]], doc)
    for image in spec.get("images", []):
        for resource in resources:
            _set_image(resource, image)
    if "namespace" in spec:
        for resource in resources:
            if resource["kind"] != "Namespace":
                resource.setdefault("metadata", {})["namespace"] = spec["namespace"]
    return resources


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python deploy/k8s/render.py FOLDER   (a folder with a kustomization.yaml)", file=sys.stderr)
        return 2
    try:
        docs = render(Path(argv[0]))
    except (RenderError, OSError, yaml.YAMLError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(yaml.safe_dump_all(docs, sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
