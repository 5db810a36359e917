"""`doctor`: preflight checks for a node, a container and a whole allocation.

One process:        doctor [--output-dir $SCRATCH/runs] [--json doctor.json]
Every rank (srun):  srun -N2 --ntasks-per-node=4 --gpus-per-task=1 \\
                        apptainer exec --nv image.sif doctor --json doctor.json
torchrun per node:  srun -N2 --ntasks-per-node=1 apptainer exec --nv image.sif \\
                        torchrun --nproc-per-node=4 ... -m workload.doctor
CPU, two processes: torchrun --nproc-per-node=2 -m workload.doctor --device cpu

See workload/doctor/cli.py for what is checked and the exit status.
"""

from workload.doctor.cli import main

__all__ = ["main"]
