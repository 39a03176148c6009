# The two commands the README promises: `make demo` and `make test`. Everything else is a helper of those.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# Test processes: every stack a test starts has its own database, Redis database and ports, so files run in
# parallel; on 2 cores two processes take the suite from ~21 to ~15 minutes (docs/development.md).
TEST_WORKERS ?= 2

.PHONY: demo test install services lint up clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/polar demo

up: install
	$(BIN)/polar up

services:
	bash scripts/ensure-services.sh

test: install services
	$(BIN)/ruff check .
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .polar demo-trajectories.jsonl .pytest_cache
