PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: install dev test demo-crash bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

install: $(BIN)/.installed

## Run both jobs and all sensors under `dagster dev` on 127.0.0.1:3000 (embedded SQLite).
dev: install
	mkdir -p "$(DAGSTER_HOME)"
	test -f "$(DAGSTER_HOME)/dagster.yaml" || cp deploy/dagster.sqlite.yaml "$(DAGSTER_HOME)/dagster.yaml"
	$(BIN)/recovery-ext demo setup
	$(BIN)/dagster dev -h 127.0.0.1 -p 3000 -w workspace.yaml

## The whole test suite (needs PostgreSQL at 127.0.0.1:5432; .ci/run starts it).
test: install
	$(BIN)/pytest -q -p no:cacheprovider

## Scripted crash: kill -9 the run workers mid-way and watch recovery.
demo-crash: install
	$(BIN)/python -m recovery_ext.demo_crash

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
	$(BIN)/python -m bench.dbos_bench    # DBOS runs in its own .venv-dbos, created on first use

clean:
	rm -rf $(VENV) .venv-dbos .dagster_home var
