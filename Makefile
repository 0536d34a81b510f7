# Two commands on a fresh machine: `make demo` (the tour) and `make test` (the suite).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# The browser tests drive Debian's chromium; playwright must never download a browser of its own.
CHROMIUM := /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1

.PHONY: demo test bench lint venv clean chromium

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, from the CPU wheel: a bare "torch" requirement would pull CUDA builds.
	$(BIN)/pip install -q torch==2.13.0
	# The distribution was named "mgit" before it became "mgit-models": a venv made then drops it.
	$(BIN)/pip uninstall -qq -y mgit
	$(BIN)/pip install -q -e '.[torch,demo,dev,s3,gcs,azure,ray,hf,web]'
	# Azurite (Azure's storage emulator, from npm) for the tests of az:// remotes; without
	# npm those tests are skipped, saying so.
	if command -v npm >/dev/null; then npm install --silent --no-fund --no-audit --prefix $(VENV)/node azurite@3; fi
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/python demo/tour.py

# Installs Debian's chromium when it is missing (apt lists are fetched only if the first try
# fails); MGIT_NO_BROWSER=1 skips it, and the browser tests with it.
chromium:
	@if [ "$$MGIT_NO_BROWSER" != 1 ] && [ ! -x $(CHROMIUM) ]; then \
	  export DEBIAN_FRONTEND=noninteractive; \
	  $(SUDO) apt-get install -y --no-install-recommends chromium \
	  || { $(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends chromium; }; \
	fi

# The layout (ruff format), the lint rules and the import contract (pyproject.toml) first:
# each takes seconds, so a formatting or layering break fails fast.
LINTED := src tests benchmarks demo
test: $(STAMP) chromium
	$(BIN)/ruff format --check --quiet $(LINTED)
	$(BIN)/ruff check --quiet $(LINTED)
	$(BIN)/lint-imports --no-cache
	# loadscope: a module's functions stay together (test_cluster.py's one Ray cluster), its
	# classes spread over both workers (test_sharing.py's four remotes, a third of the suite's time).
	$(BIN)/python -m pytest -q -n 2 --dist loadscope

bench: $(STAMP)
	$(BIN)/python benchmarks/core.py

# Lays out every file (ruff format), then checks what make test checks.
lint: $(STAMP)
	$(BIN)/ruff format $(LINTED)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/lint-imports --no-cache

clean:
	rm -rf $(VENV) .cache .pytest_cache .hypothesis
