# Two commands for a fresh machine:
#   make demo   # create/choose a virtual environment, install the package and its runtime
#               # dependencies only, train the quick-start recipe
#   make test   # install the test tools too (requirements/test.txt) and run the whole suite
#
# The environment is $VIRTUAL_ENV when one is active, else ./.venv (override: make VENV=...).

VENV ?= $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV),.venv)
PY := $(VENV)/bin/python
# One stamp per install level: the demo's (the package and its runtime dependencies) and
# the test environment's (everything in requirements/test.txt on top).
RUNTIME_STAMP := $(VENV)/.hpc-train-runtime
STAMP := $(VENV)/.hpc-train-installed
PYTEST_ARGS ?= --durations=15

.PHONY: demo test install system-deps clean

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

test: system-deps $(STAMP)
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf runs .pytest_cache
