"""Training workload for PyTorch on HPC GPU clusters.

The dependency rule (held by tests/unit/test_layers.py): a module imports only modules of
lower layers and of its own package (the base modules may also use each other); no module
imports a command-line module.

    1 base      errors, commands, files, logs, launch            standard library (+ hostlist)
    2 config    config                                           standard library
    3 runtime   distributed, precision                           torch
    4 parts     models, data, checkpoint, records
    5 training  training
    6 commands  train, bench, doctor, report, evaluate, predict, launch.__main__
                (the console scripts)

Commands parse and validate with layers 1-2 only, then import the rest: `--help`,
`--version` and every usage error answer before torch is imported.
"""

__version__ = "0.1.0"
