"""Launch layer: SLURM, torchrun and user variables resolved for torch.distributed.

``python -m workload.launch env`` prints the resolution for a shell; ``check``
explains layout mistakes; ``train`` applies the same rules by itself at start.
"""

from workload.launch.errors import LaunchError
from workload.launch.resolve import (PER_TASK, SINGLE, TORCHRUN, Resolution, resolve,
                                     resolve_for_torchrun)

__all__ = ["LaunchError", "Resolution", "resolve", "resolve_for_torchrun",
           "SINGLE", "PER_TASK", "TORCHRUN"]
