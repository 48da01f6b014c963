# The two commands of the README. Each creates or updates .venv from pyproject.toml first.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast venv lint clean peers wheelhouse install-offline

$(BIN)/python:
	$(PY) -m venv $(VENV) || python3 -m venv $(VENV)

# uv installs what pip would (the same resolution from pyproject.toml) in ~9 s where pip takes
# ~28 s here; pip is the fallback when uv cannot be had. Neither byte-compiles the installed
# modules: Python compiles what it imports on first use.
$(STAMP): pyproject.toml | $(BIN)/python
	($(BIN)/python -m pip install -q uv && $(BIN)/python -m uv pip install -q \
		--python $(BIN)/python -e '.[test,tpu]') || \
		$(BIN)/python -m pip install -q --no-compile -e '.[test,tpu]'
	touch $(STAMP)

venv: $(STAMP)

# The peers' venv for benchmarks/rollout.py and benchmarks/grpo.py: HF transformers, tunix and
# TRL at the pins of benchmarks/peers-requirements.txt (~4-6 min). LOCOJAX_PEERS_PYTHON points
# the benchmarks at another interpreter instead.
PEERS := .venv-peers
PEERS_STAMP := $(PEERS)/.installed

$(PEERS_STAMP): benchmarks/peers-requirements.txt
	$(PY) -m venv $(PEERS) || python3 -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install -q --upgrade pip
	$(PEERS)/bin/python -m pip install -q -r benchmarks/peers-requirements.txt
	touch $(PEERS_STAMP)

peers: $(PEERS_STAMP)

# Every wheel the project needs for a host with no registry, in wheelhouse/ (git-ignored;
# docs/tpu.md): pyproject's dependencies and EXTRAS (test, tpu) plus the build requirements,
# resolved by uv for PY (3.11 or python3.11) and PLATFORM (a manylinux tag, e.g.
# manylinux_2_28_x86_64; default: this machine's), downloaded by pip, the sdist-only ones built.
# HOST_HAS leaves out what the host ships (a TPU image's jax, jaxlib, libtpu, numpy, ...: the
# install checks them there), SKIP what its runs never import (ray, on one host); each with
# what only it needs. Needs the registry.
WHEELHOUSE ?= wheelhouse
wheelhouse: | $(BIN)/python
	$(BIN)/python -m uv --version >/dev/null 2>&1 || $(BIN)/python -m pip install -q uv
	$(BIN)/python scripts/wheelhouse.py --python $(PY) --platform "$(PLATFORM)" \
		--extras "$(EXTRAS)" --host-has "$(HOST_HAS)" --skip "$(SKIP)" --out $(WHEELHOUSE)

# Installs from wheelhouse/ with no index (scripts/install_offline.sh) into VENV (created with
# the system's packages in view if missing) or TARGET (a folder for PYTHONPATH, where no venv
# can be made), keeping what the host has at versions every requirement accepts (a TPU image's
# jax, jaxlib and libtpu). Then `locojax` runs (TARGET: `python3 -m locojax`).
install-offline:
	scripts/install_offline.sh $(if $(TARGET),--target $(TARGET),--venv $(VENV)) \
		--wheelhouse $(WHEELHOUSE)

# The built-in default: GRPO on generated arithmetic with LoCoJAX-CO on this machine.
demo: $(STAMP)
	$(BIN)/python -m locojax +experiment=arith_co

# Everything CI runs: tests/compiler, tests/runtime and tests/e2e (multi-process, Ray, smoke
# runs of the benchmarks, the TPU compiler's checks: the venv has the `tpu` extra), on
# WORKERS xdist workers (0: in this process); Ray's tests share one worker, libtpu's another
# (tests/conftest.py). Three workers on 2 cores: the e2e runs wait on Ray, heartbeats and
# sockets, so two left the cores ~20% idle. The budget is 20 minutes on 2 cores
# (docs/testing.md); the 30 slowest tests are listed at the end and every test's time is in
# .pytest_cache/junit.xml.
WORKERS ?= 3
test: lint
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist loadgroup --durations=30 \
		--junitxml=.pytest_cache/junit.xml

# The compiler and unit layers only: no multi-host runs, Ray or benchmarks.
test-fast: lint
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist loadgroup tests/compiler tests/runtime

lint: $(STAMP)
	$(BIN)/python -m ruff check conf locojax compiler tests benchmarks scripts

clean:
	rm -rf $(VENV) $(PEERS)
