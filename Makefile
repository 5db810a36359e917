# Two commands for a fresh machine:
#   make demo   # create/choose a virtual environment, install, train the quick-start recipe
#   make test   # install the test tools and run the whole suite
#
# The environment is $VIRTUAL_ENV when one is active, else ./.venv (override: make VENV=...).

VENV ?= $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV),.venv)
PY := $(VENV)/bin/python
STAMP := $(VENV)/.hpc-train-installed
PYTEST_ARGS ?= --durations=15

.PHONY: demo test install system-deps clean

$(PY):
	python3 -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml requirements/test.txt
	$(PY) -m pip install --quiet -r requirements/test.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

install: $(STAMP)

demo: $(STAMP)
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
