"""`python -m workload.doctor` (what torchrun starts): the same as the `doctor` command.

    torchrun --nproc-per-node=2 -m workload.doctor --device cpu
"""

from workload.doctor.cli import main

main()
