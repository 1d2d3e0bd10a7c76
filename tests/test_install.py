"""Installing as a new user would: the documented commands (docs/deploy.md, "Installing with pip") build the
wheel from the source, install it with its [cpu,export] extras into a fresh virtual environment, export every
default model and serve one CheckDialogue from them. The install and export are scripts/export_models.sh,
which the Dockerfile's export stage runs too, so a model source missing from the export extra fails here
instead of ten minutes into an image build. And the export extra is the one list of model sources.

The fresh install resolves from the package index as a user's would (nothing borrowed from the test
environment): about 3 minutes on 2 cores, most of it the export's parity checks (tests/test_deploy.py's
faster wheel test borrows the dependencies).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from sleuthd.encoders.manifest import read_card

from .support import REPO

DEPLOY_DOC = REPO / "docs" / "deploy.md"
DOC_VENV, DOC_MODELS = "/opt/sleuthd", "/srv/sleuthd/models"
EXPORT_ALL = {"vad": "silero_vad", "ge2e": "ge2e", "campplus": "campplus"}  # `models export all`: name -> card


def export_extra() -> dict[str, Requirement]:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return {r.name.lower(): r for r in map(Requirement, extras["export"])}


def test_the_export_extra_is_the_one_list_of_model_sources() -> None:
    extra = export_extra()
    # Every model `export all` builds comes from a package the extra pins to the version its card records.
    for name, card_name in EXPORT_ALL.items():
        source = read_card(card_name)["source"]
        req = extra.get(source["package"].lower())
        assert req is not None, f"{name}: {source['package']} (its card's source) is not in the export extra"
        assert str(req.specifier) == f"=={source['package_version']}", (name, str(req.specifier))
    assert "torch" in extra
    # The Dockerfile's export stage and `make setup` install that extra and name none of its packages again.
    dockerfile = (REPO / "Dockerfile").read_text()
    export_stage = dockerfile.split(" AS export", 1)[1].split("\nFROM ", 1)[0]
    assert "export_models.sh" in export_stage and "pip install" not in export_stage
    script = (REPO / "scripts" / "export_models.sh").read_text()
    installs = [line for line in script.splitlines() if 'pip" install' in line]
    assert installs == ['"$venv/bin/pip" install ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} '
                        '"$wheel[cpu,export]"']  # fmt: skip
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"pip install .*-e '\.\[export[,\]]", makefile), "make setup installs the export extra"
    for name in extra:
        mentioned = re.search(rf"(?<![\w-]){re.escape(name)}\s*==", makefile + dockerfile + script, re.IGNORECASE)
        assert not mentioned, f"{name} is pinned again outside the export extra: {mentioned[0] if mentioned else ''}"
    # SpeechBrain is the one --no-deps install (torchaudio has no build for our torch); never in the extra.
    assert "speechbrain" not in extra and re.search(r"pip install -q --no-deps \$\(SPEECHBRAIN\)", makefile)


def documented_install() -> list[str]:
    """The command lines of the docs' install block, with this test's folders for the documented ones."""
    text = DEPLOY_DOC.read_text()
    marker = "<!-- tests/test_install.py runs this block"
    assert marker in text, "docs/deploy.md lost the install block this test runs"
    block = text.split(marker, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [line.split("  #", 1)[0].strip() for line in block.splitlines()]
    return [line for line in lines if line]


def copy_checkout(dest: Path) -> Path:
    """What a clone of this checkout holds (tracked and new files, nothing git ignores)."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, files):
        src = REPO / name
        if src.is_file() and not src.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def test_the_documented_install_exports_every_model_and_serves(tmp_path: Path) -> None:
    build, serve = documented_install()[:-1], documented_install()[-1]
    assert build[0].startswith("python3 -m pip wheel") and "scripts/export_models.sh" in build[1]
    assert serve.startswith(f"{DOC_VENV}/bin/sleuthd serve")
    venv, models = tmp_path / "venv", tmp_path / "models"
    checkout = copy_checkout(tmp_path / "checkout")

    def ours(line: str) -> str:
        return line.replace(DOC_MODELS, str(models)).replace(DOC_VENV, str(venv))

    # A user's shell: no PYTHONPATH into a checkout, no SLEUTHD_* settings, the system python3 first on PATH.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith(("SLEUTHD_", "VIRTUAL_ENV"))}
    test_venv_bin = Path(sys.prefix) / "bin"
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p) != test_venv_bin)
    script = "set -euo pipefail\n" + "\n".join(map(ours, build))
    done = subprocess.run(["bash", "-c", script], cwd=checkout, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    for card in EXPORT_ALL.values():
        assert (models / card / "manifest.json").is_file(), done.stdout + done.stderr
    wrote = [line for line in done.stdout.splitlines() if line.startswith("wrote ")]
    assert len(wrote) == 3 and all("parity min cosine 0.999" in w for w in wrote[1:]), done.stdout
    # The new environment serves from what it exported (onnxruntime from the cpu extra; no checkout on its path).
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import sleuthd; print(sleuthd.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert where.startswith(str(venv)), where
    server = subprocess.Popen(
        ["bash", "-c", f"exec {ours(serve)}"], cwd=tmp_path,
        env={**env, "SLEUTHD_PORT": "0", "SLEUTHD_METRICS_PORT": "-1"},  # a free port, no metrics listener
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.startswith("sleuthd listening on"), line + (server.stderr.read() if server.stderr else "")
        request = subprocess.run(
            [str(venv / "bin" / "python"), str(checkout / "scripts" / "container_request.py"), line.split()[-1]],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert request.returncode == 0, request.stdout + request.stderr
        assert "worst score g3" in request.stdout
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
    finally:
        if server.poll() is None:
            server.kill()
