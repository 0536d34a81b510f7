# Two commands on a fresh machine: `make demo` (the tour) and `make test` (the suite).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test bench lint venv clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, from the CPU wheel: a bare "torch" requirement would pull CUDA builds.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[torch,demo,dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/python demo/tour.py

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

bench: $(STAMP)
	$(BIN)/python benchmarks/core.py

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks demo

clean:
	rm -rf $(VENV) .cache .pytest_cache .hypothesis
