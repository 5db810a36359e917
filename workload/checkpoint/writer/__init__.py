"""What the checkpoint writer process runs, and the trainer uses too: torch-free.

The writer process (`process.py`, started by workload.checkpoint.background for the
asynchronous saves) imports only this sub-package and the bottom layer (the standard
library, safetensors, workload.files, workload.held, workload.logs, ...), never torch, so
that it starts in a fraction of a second; tests/unit/test_layers.py holds that true.

    durable.py   a checkpoint's files as bytes: the durable write, the strict JSON reader,
                 pickles and zips refused
    store.py     one checkpoint: its layout, its files with the manifest last and the
                 commit, how every save ends (end_save: the local tier's copy into the
                 run folder, then the pruning), verify
    folder.py    the run's checkpoints folder and its timeline: `latest` and the commit
                 point (publish), pruning, moving bad ones aside, rollbacks, what
                 --overwrite removes
    diskfull.py  a save that runs out of disk space: one line, the partial files removed
    process.py   the writer process itself
"""
