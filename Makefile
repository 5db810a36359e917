# Two commands for a fresh machine:
#   make demo   # create/choose a virtual environment, install the package and its runtime
#               # dependencies only, train the quick-start recipe
#   make test   # install the test tools too (requirements/test.txt) and run the whole suite
# After each edit:
#   make check  # lint and the fast tier (no root, no Debian package, no SLURM, no image)
#
# The environment is $VIRTUAL_ENV when one is active, else ./.venv (override: make VENV=...).
#
# The GPU check (docs/performance.md), for a GPU machine without network:
#   make gpu-wheels    # here, with network: the wheels it installs, into .gpu-wheels/
#   make gpu-check     # there: install without network, GPU tests, benchmarks, report
#                      # (PART=tests|bench for halves, DEVICE=cpu as CI runs it (the quick
#                      #  sizes), GPU_CHECK_OUT=DIR for the report folder,
#                      #  BENCH_SKIP=max-autotune to leave benchmark rows or parts out,
#                      #  DEADLINE=SECONDS
#                      #  for the whole run, 540 unless told, 0 for none)

VENV ?= $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV),.venv)
PY := $(VENV)/bin/python
# One stamp per install level: the demo's (the package and its runtime dependencies) and
# the test environment's (everything in requirements/test.txt on top).
RUNTIME_STAMP := $(VENV)/.hpc-train-runtime
STAMP := $(VENV)/.hpc-train-installed
PYTEST_ARGS ?= --durations=15
# The fast tier: tests with none of these markers (tests/helpers/tiers.py keeps them true).
FAST_TIER := not slow and not slurm and not image and not root and not gpu
# Workers: the fast tier is CPU-bound (one per core); the rest mostly waits (SLURM
# scheduling, grace times, timeouts), so more workers than cores overlap the waits.
CHECK_WORKERS ?= 2
TEST_WORKERS ?= 4
PYTEST := PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m pytest

# The GPU check runs with the Python that has torch (python3 on PATH: a GPU machine's
# system Python, the image's, or the active venv), not one this Makefile creates.
GPU_PYTHON ?= python3
GPU_CHECK_OUT ?= runs/gpu-check
GPU_WHEELS ?= .gpu-wheels
DEVICE ?= cuda
PART ?= all
QUICK ?=
DEADLINE ?= 540

.PHONY: demo test check lint install system-deps clean gpu-check gpu-wheels

$(PY):
	python3 -m venv $(VENV)

# requirements/test.txt as constraints: the demo gets the torch release the suite is
# tested with, and a later `make test` does not replace it.
$(RUNTIME_STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet --constraint requirements/test.txt -e .
	touch $@

$(STAMP): $(RUNTIME_STAMP) requirements/test.txt
	$(PY) -m pip install --quiet -r requirements/test.txt
	touch $@

install: $(STAMP)

demo: $(RUNTIME_STAMP)
	$(VENV)/bin/train --dataset digits --device cpu --output-dir runs/demo --resume never --overwrite
	@echo "--- runs/demo/summary.json"
	@cat runs/demo/summary.json

# The suite drives a real SLURM cluster and real image builds: their Debian packages first.
system-deps:
	tools/install-debian-packages.sh

# The linter first: a finding fails the suite before any test runs (config: pyproject.toml).
lint: $(STAMP)
	$(PY) -m ruff check .

check: lint
	$(PYTEST) -m "$(FAST_TIER)" -n $(CHECK_WORKERS) $(PYTEST_ARGS)

# The whole suite: the fast tier first (a broken import fails in minutes), then the rest,
# its tests that share an image or a SLURM cluster grouped onto one worker each. Exit
# status 5 (nothing selected) is success only for the second half, where PYTEST_ARGS
# may name fast tests alone.
test: system-deps check
	$(PYTEST) -m "not ($(FAST_TIER))" -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS) \
		|| test $$? -eq 5

gpu-check:
	$(GPU_PYTHON) tools/gpu_check.py --device $(DEVICE) --part $(PART) --out $(GPU_CHECK_OUT) \
		--wheels $(GPU_WHEELS) --deadline $(DEADLINE) $(if $(filter 1 yes true,$(QUICK)),--quick) \
		$(if $(BENCH_SKIP),--skip $(BENCH_SKIP))

# A stamp per wheel list: the wheels are built again only when the list changes.
gpu-wheels: $(GPU_WHEELS)/.built

$(GPU_WHEELS)/.built: requirements/gpu-wheels.txt
	$(GPU_PYTHON) -m pip wheel --quiet --no-deps --wheel-dir $(GPU_WHEELS) -r $<
	touch $@

clean:
	rm -rf runs .pytest_cache
