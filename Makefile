# Kiln: every target creates .venv and installs what it needs, so a fresh clone needs nothing else.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
KILN := $(VENV)/bin/kiln
# Tests also exercise .pt2 and JAX import, so they install the torch and jax extras (local CPU wheels).
DEV_EXTRAS ?= dev,torch,jax

.PHONY: run demo test lint format bench install dev clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(PY)
	$(PIP) install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(PY)
	$(PIP) install -q -e '.[$(DEV_EXTRAS)]'
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed

dev: $(VENV)/.installed-dev

## run: serve the REST API on http://127.0.0.1:8000 with one embedded worker, SQLite in ./kiln-data
run: install
	$(KILN) serve

## demo: tune the bundled example CNN on this CPU with the CLI and print untuned vs tuned latency
demo: install
	$(KILN) tune examples/small_cnn.onnx --trials $${KILN_RUN_TRIALS:-64} --out out/

# Tests at once in `make test`: they wait on workers, servers and subprocesses more than they compute.
TEST_JOBS ?= 4
# A marker expression the run is narrowed to, e.g. TEST_MARKS='not slow' (PYTEST_ARGS: paths, -k, -x...).
TEST_MARKS ?=
and_marks = $(if $(TEST_MARKS), and ($(TEST_MARKS)),)

## test: the whole suite (unit + integration; PostgreSQL tests run when KILN_TEST_DATABASE_URL is set): most
## tests in TEST_JOBS processes, then the `serial` ones alone (they measure the machine or hold work to
## wall-clock limits); both parts run, and the target fails if either did (not for a part the selection left empty).
test: dev
	@status=0; \
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist load -m "not serial$(and_marks)" --durations=25 $(PYTEST_ARGS) || { code=$$?; [ $$code -eq 5 ] || status=$$code; }; \
	$(PY) -m pytest -q -m "serial$(and_marks)" --durations=10 $(PYTEST_ARGS) || { code=$$?; [ $$code -eq 5 ] || status=$$code; }; \
	exit $$status

lint: dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: dev
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

$(VENV)/.installed-bench: pyproject.toml $(VENV)/.installed-dev
	$(PIP) install -q -e '.[$(DEV_EXTRAS),bench]'
	touch $@

## bench: side-by-side benchmarks (bench/models.py alone tunes 3 models for 30 minutes each); figures go
## to bench/RESULTS.md
bench: $(VENV)/.installed-bench
	$(PY) bench/matmul.py
	$(PY) bench/model.py
	$(PY) bench/models.py

clean:
	rm -rf $(VENV) kiln-data out bench/work .pytest_cache
