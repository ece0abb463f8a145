# Quick start: `make demo` and `make test`. Both create .venv on first use.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast lint protos bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fl-sim examples/quickstart.toml

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# Regenerate the committed gRPC/protobuf code (tests/test_protos.py checks it is current).
protos: $(STAMP)
	$(PY) -m flmesh.v1.generate

bench: $(STAMP)
	$(PY) benchmarks/transport.py

clean:
	rm -rf $(VENV) runs .pytest_cache
