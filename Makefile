# The two commands of the README. Each creates or updates .venv from pyproject.toml first.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test venv lint clean

$(BIN)/python:
	$(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# The built-in default: GRPO on generated arithmetic with LoCoJAX-CO on this machine.
demo: $(STAMP)
	$(BIN)/python -m locojax +experiment=arith_co

test: $(STAMP)
	$(BIN)/python -m ruff check conf locojax compiler tests benchmarks
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/python -m ruff check conf locojax compiler tests benchmarks

clean:
	rm -rf $(VENV)
