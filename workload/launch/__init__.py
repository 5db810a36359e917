"""Launch layer: SLURM, torchrun and user variables resolved for torch.distributed.

``python -m workload.launch env`` prints the resolution for a shell; ``check``
explains layout mistakes; ``jobs DEST`` copies the job scripts out; ``train`` applies
the same rules by itself at start, and a user's own script calls :func:`setup`.

The names in ``__all__`` are the stable API (docs/your-script.md): ``setup`` and
``Launch`` for a script's first lines, ``PreemptionFlag``, ``exit_for_requeue`` and
``REQUEUE_EXIT_STATUS`` for its preemption handling, ``end_process`` for its last line.
Importing this package imports the standard library and python-hostlist only.
"""

from workload.errors import LaunchError
from workload.launch.devices import GPU_VARIABLE
from workload.launch.ending import end_process
from workload.launch.preemption import REQUEUE_EXIT_STATUS, PreemptionFlag, exit_for_requeue
from workload.launch.resolve import (PER_TASK, SINGLE, TORCHRUN, Resolution, resolve,
                                     resolve_for_torchrun)
from workload.launch.script import Launch, setup

__all__ = ["setup", "Launch", "PreemptionFlag", "exit_for_requeue", "REQUEUE_EXIT_STATUS",
           "end_process",
           "GPU_VARIABLE", "LaunchError", "Resolution", "resolve", "resolve_for_torchrun",
           "SINGLE", "PER_TASK", "TORCHRUN"]
