# Two commands: `make demo` (set up and run the demo) and `make test` (set up and run the tests).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

.PHONY: setup demo test lint
setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/depositd demo

test: $(STAMP)
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check worker tests bench
	$(BIN)/ruff format --check worker tests bench
	$(BIN)/mypy worker
