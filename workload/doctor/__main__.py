"""`python -m workload.doctor` (what torchrun starts): the same as the `doctor` command.

    torchrun --nproc-per-node=2 -m workload.doctor --device cpu
"""

import sys

from workload.doctor import main

sys.exit(main())
