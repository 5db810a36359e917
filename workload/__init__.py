"""Training workload for PyTorch on HPC GPU clusters.

The package is built in layers, from the torch-free base to the console scripts: a module
imports only lower layers and its own package (the base modules may also use each other),
and no module imports a command-line module. The layers and what lives in each are the
table of docs/code-map.md, the one place they are written: tests/unit/test_layers.py
reads that table and holds every import to it.

Commands parse and validate with the base and config layers only, then import the rest:
`--help`, `--version` and every usage error answer before torch is imported.
"""

__version__ = "0.1.0"
