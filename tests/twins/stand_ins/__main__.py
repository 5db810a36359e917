"""The stand-in command NAME with ARGS: `python -P -m tests.twins.stand_ins NAME ARGS...`."""

from __future__ import annotations

import sys

from tests.twins.stand_ins.container_engine import ce_task
from tests.twins.stand_ins.pyxis import pyxis_task
from tests.twins.stand_ins.runtimes import apptainer, enroot, podman
from tests.twins.stand_ins.shifter import shifter, shifterimg
from tests.twins.stand_ins.slurm import sbatch, srun
from tests.twins.stand_ins.tools import git, lfs

COMMANDS = {"srun": srun, "sbatch": sbatch, "apptainer": apptainer, "podman": podman,
            "enroot": enroot, "git": git, "lfs": lfs, "ce-task": ce_task, "pyxis-task": pyxis_task,
            "shifter": shifter, "shifterimg": shifterimg}

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](sys.argv[2:])
