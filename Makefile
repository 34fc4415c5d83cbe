PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
# The tests start Python hundreds of times (xdist workers, CLI and run processes) and pytest rewrites every test
# module: both keep their bytecode in __pycache__ even where the environment asks Python not to write it, so a
# module is compiled once, not at every start.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install dev lint test test-fast test-slow schema demo-crash docs docs-build bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

install: $(BIN)/.installed

# The port of the Dagster UI (`make dev`, `make demo-crash`) or of the docs (`make docs`): `make dev PORT=3100`.
PORT ?=
UI_PORT = $(or $(PORT),3000)
DOCS_PORT = $(or $(PORT),8000)
# mkdocs-material's banner about its successor, printed on every build, is not ours to act on
export NO_MKDOCS_2_WARNING = 1

# The local LLM stand-in `make dev` starts unless RECOVERY_LLM_BASE_URL names a real one.
DEMO_LLM_PORT ?= 8765
DEMO_LLM_LATENCY ?= 1.5

## Run the demo jobs and all sensors under `dagster dev` on 127.0.0.1:$(UI_PORT) (embedded SQLite), with a
## local LLM stand-in that answers in DEMO_LLM_LATENCY s, so a run lasts long enough to crash it.
dev: install
	mkdir -p "$(DAGSTER_HOME)"
	test -f "$(DAGSTER_HOME)/dagster.yaml" || cp deploy/dagster.sqlite.yaml "$(DAGSTER_HOME)/dagster.yaml"
	$(BIN)/recovery-ext demo setup
	@if [ -n "$$RECOVERY_LLM_BASE_URL" ]; then \
	  exec $(BIN)/dagster dev -h 127.0.0.1 -p $(UI_PORT) -w workspace.yaml; \
	fi; \
	$(BIN)/python -m recovery_pipelines.demo_llm --port $(DEMO_LLM_PORT) --check || exit 1; \
	$(BIN)/python -m recovery_pipelines.demo_llm --port $(DEMO_LLM_PORT) --latency $(DEMO_LLM_LATENCY) & llm=$$!; \
	trap 'kill $$llm 2>/dev/null' EXIT INT TERM; \
	RECOVERY_LLM_BASE_URL=http://127.0.0.1:$(DEMO_LLM_PORT)/v1 RECOVERY_LLM_MODEL=demo-llm \
	  $(BIN)/dagster dev -h 127.0.0.1 -p $(UI_PORT) -w workspace.yaml

## Lint and type-check the library (ruff, then mypy; both configured in pyproject.toml).
lint: install
	$(BIN)/ruff check recovery_ext recovery_pipelines tests bench definitions.py
	$(BIN)/mypy

## The whole test suite (needs PostgreSQL at 127.0.0.1:5432; .ci/run starts it).
test: install
	$(BIN)/pytest -q -p no:cacheprovider

## What takes seconds, not minutes: tests/unit, tests/store, tests/dagster — no `dagster dev`, no killed run
## processes (tests/process), no servers (tests/e2e); a test file per worker process, one worker per core
## (TEST_WORKERS=0 runs them in this process).
TEST_WORKERS ?= auto
test-fast: install
	$(BIN)/pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile tests/unit tests/store tests/dagster

## The rest of `make test`: what starts processes or waits out real time (tests/process, a test file per worker
## process: each test has its own databases, homes and ports) and the real servers
## (tests/e2e, a module per worker: each module has its own `dagster dev` on free ports, its own databases,
## namespace hosts and PostgreSQL cluster, and the workers share one CPU hog per core between them, at least one each).
## `make test-fast` then `make test-slow` is `make test`, each test once (CI runs them so).
## One session with a worker more than the cores: most of these tests wait (sensor ticks, heartbeat timeouts, launch
## graces, killed processes) on a machine the hogs keep busy anyway, so the extra worker fills the waits. Measured
## on 2 cores: 22 min 9 s for both folders at -n 3 against 12 min 50 s + 15 min 41 s one after the other at -n 2.
SLOW_TEST_WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 2) + 1 )))
test-slow: install
	$(BIN)/pytest -q -p no:cacheprovider --durations=15 -n $(SLOW_TEST_WORKERS) --dist loadfile tests/process tests/e2e

## Rewrite sql/<dialect>/schema.sql from freshly migrated databases (after adding a migration).
schema: install
	$(BIN)/python tests/support/schema_dump.py

## Scripted crash: kill -9 the run workers mid-way and watch recovery (the UI on 127.0.0.1:$(UI_PORT)).
demo-crash: install
	PORT=$(UI_PORT) $(BIN)/python -m recovery_pipelines.demo_crash

## The documentation site on http://127.0.0.1:$(DOCS_PORT), rebuilt as its pages change.
docs: install
	$(BIN)/mkdocs serve -a 127.0.0.1:$(DOCS_PORT)

## The documentation site built as CI builds it: every warning (a broken link, a missing API name) fails.
docs-build: install
	$(BIN)/mkdocs build --strict --site-dir site

## Benchmarks (PostgreSQL at 127.0.0.1:5432); results print as tables.
bench: install
	$(BIN)/python -m bench.classify_bench
	$(BIN)/python -m bench.store_bench
	$(BIN)/python -m bench.recovery_bench
	$(BIN)/python -m bench.bulk_recovery_bench
	$(BIN)/python -m bench.liveness_bench --quick
	$(BIN)/python -m bench.resume_bench
	$(BIN)/python -m bench.overhead_bench
	$(BIN)/python -m bench.ontology_overhead_bench
	$(BIN)/python -m bench.ledger_bench
	$(BIN)/python -m bench.history_bench
	$(BIN)/python -m bench.dbos_bench    # DBOS runs in its own .venv-dbos, created on first use

clean:
	rm -rf $(VENV) .venv-dbos .dagster_home var site
