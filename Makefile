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

# Until the CO runtime lands, the demo is plan inspection: the default experiment on this
# machine, then the paper's GSM8K setting on a 64-chip TPU v7x slice.
demo: $(STAMP)
	$(BIN)/python -m locojax.plan +experiment=arith_co
	$(BIN)/python -m locojax.plan +experiment=gsm8k_co mesh=v7x mesh.chips=64

test: $(STAMP)
	$(BIN)/python -m ruff check conf locojax compiler tests benchmarks
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/python -m ruff check conf locojax compiler tests benchmarks

clean:
	rm -rf $(VENV)
