# Quick start: `make demo` and `make test`. Both create .venv on first use.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow test-faults test-deploy image docs lint typecheck protos bench clean FORCE

# editable_mode=strict installs a tree of links that type checkers and IDEs can
# follow (no import hook). The links cover the modules present at install time,
# so the stamp also depends on the list of modules: adding one reinstalls.
MODULES := $(VENV)/.modules

$(MODULES): FORCE
	@mkdir -p $(VENV)
	@find src -name '*.py' | sort > $@.new
	@cmp -s $@.new $@ && rm $@.new || mv $@.new $@

# PyPI's torch carries CUDA (several GB). Without an NVIDIA GPU (no nvidia-smi), torch and
# torchvision come from TORCH_INDEX, PyTorch's CPU builds (about 1 GB), when it answers; else
# from PyPI (those run on a CPU too). `make TORCH_INDEX=` always takes PyPI's.
TORCH_INDEX ?= $(if $(shell command -v nvidia-smi),,https://download.pytorch.org/whl/cpu)
# The torch and torchvision installed, as pip constraints: the extras keep them, never swap a
# CPU build for PyPI's CUDA one.
PINS := $(VENV)/torch-pins.txt

# `make demo` installs what running needs (the runtime dependencies and the vision and
# tensorboard extras); the test and development targets add the `dev` extra's tools.
# setuptools >= 70.1 builds wheels by itself: examples/custom/run.sh and tests/test_wheel.py
# (make test-slow) build packages with it, offline (--no-build-isolation).
$(STAMP): pyproject.toml $(MODULES)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip "setuptools>=70.1"
	@if [ -n "$(TORCH_INDEX)" ] && ! $(PY) -c "import torch" 2>/dev/null; then \
	  echo "make: no NVIDIA GPU: torch's CPU build from $(TORCH_INDEX) (PyPI's carries CUDA, several GB)"; \
	  if env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null $(PY) -m pip install --quiet \
	       --timeout 20 --retries 1 --index-url $(TORCH_INDEX) torch torchvision 2>/dev/null \
	     && $(PY) -c "import torchvision" 2>/dev/null; then :; else \
	    echo "make: no working pair from $(TORCH_INDEX): torch from PyPI instead (its build runs on a CPU too)"; \
	    $(PY) -m pip uninstall --quiet -y torch torchvision 2>/dev/null || true; \
	  fi; \
	fi
	$(PY) -m pip freeze | grep -iE '^(torch|torchvision)==' > $(PINS) || true
	$(PY) -m pip install --quiet -e ".[vision,tensorboard]" -c $(PINS) --config-settings editable_mode=strict
	touch $(STAMP)

DEV := $(VENV)/.installed-dev
$(DEV): $(STAMP)
	$(PY) -m pip install --quiet -e ".[dev,vision,tensorboard]" -c $(PINS) --config-settings editable_mode=strict
	$(PY) -m compileall -q build/__editable__.*  # the reinstall rebuilt the link tree (see PYC)
	touch $(DEV)

# Byte-compile flmesh as pip does for a wheel: with PYTHONDONTWRITEBYTECODE set (as on
# CI), every start would otherwise compile every module again, which delays fl-node's
# launch to SERVING (benchmarks/startup.py). A stale .pyc is only ignored, never wrong.
PYC := $(VENV)/.compiled
$(PYC): $(STAMP) $(shell find src -name '*.py')
	$(PY) -m compileall -q build/__editable__.*
	touch $(PYC)

demo: $(PYC)
	$(VENV)/bin/fl-sim examples/quickstart.toml

# The suite a newcomer runs: lint, types and every test that runs in this one process or
# starts a short-lived one. The slowest ten are printed, so the next slow test is seen.
test: $(PYC) $(DEV)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -m "not slow and not faults and not deploy" --durations=10

# Multi-process federations, environment builds (wheel, the custom example), the benchmarks'
# quick modes and the docs' tutorials run end to end; CI runs it after make test.
test-slow: $(PYC) $(DEV)
	$(PY) -m pytest -q -m "slow and not faults and not deploy" --durations=10

# Fault injection: killed and resumed processes, network namespaces with packet loss and
# partitions, slow links. Needs root for the namespaces (their tests say so when skipped);
# installs iptables from Debian's archive when it is missing.
test-faults: $(PYC) $(DEV)
	@command -v iptables >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -q >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends iptables >/dev/null; } || true
	$(PY) -m pytest -q -m faults

# Containers: the image (offline, from a wheelhouse made here) and a real federation under
# podman-compose (4 nodes, CWT with rewind, mTLS, one container killed and restarted).
# deploy/test-deploy.sh installs podman and podman-compose from Debian's archive when missing.
image: $(STAMP)
	bash deploy/build-image.sh

test-deploy: $(DEV)
	bash deploy/test-deploy.sh

# The documentation site (mkdocs, a development tool) in build/site.
docs: $(DEV)
	$(VENV)/bin/mkdocs build --strict

lint: $(DEV)
	$(VENV)/bin/ruff check .

typecheck: $(DEV)
	$(VENV)/bin/mypy

# Regenerate the committed gRPC/protobuf code (tests/test_protos.py checks it is current).
protos: $(DEV)
	$(PY) protos/generate.py

bench: $(PYC)
	$(PY) benchmarks/transport.py

clean:
	rm -rf $(VENV) runs .pytest_cache
