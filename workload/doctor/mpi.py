"""What `doctor` checks of the MPI plugin srun started the task with (`srun --mpi=...`, or
the site's `MpiDefault`). train, torchrun and doctor need none: their ranks meet through
torch.distributed's rendezvous. An MPI program in the image (an `mpirun`-free Open MPI
or MPICH binary, NCCL tests, a user's mpi4py script) needs the plugin to reach this
process, and inside a container that fails quietly: PMIx's server publishes its files
in the node's slurmd spool folder, which a container that does not bind it cannot see
(the client then reports PMIX_ERR_UNREACH or hangs), and PMI-2 hands the task an open
file descriptor. Standard library only; the variables are those srun exports.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from workload.doctor.findings import OK, WARN, Finding

NO_MPI_FIX = "srun --mpi=none: train, torchrun and doctor use no MPI"


def mpi_check(env: Mapping[str, str] | None = None) -> Finding | None:
    """The finding for this task's MPI plugin; None outside a SLURM step."""
    env = os.environ if env is None else env
    kind = env.get("SLURM_MPI_TYPE")
    if not kind:
        return None
    if kind == "none":
        return Finding("mpi", OK, "srun started this task without an MPI plugin (--mpi=none)")
    if kind.startswith("pmix"):
        return pmix_check(kind, env)
    if kind == "pmi2":
        return pmi2_check(env)
    return Finding("mpi", OK, f"srun started this task with --mpi={kind}")


def pmix_check(kind: str, env: Mapping[str, str]) -> Finding:
    if not any(key.startswith("PMIX_SERVER_URI") for key in env):
        return Finding("mpi", WARN, f"SLURM_MPI_TYPE={kind} but no PMIX_SERVER_URI variable "
                       "reached this process: an MPI program here cannot find SLURM's PMIx "
                       "server", f"{NO_MPI_FIX}; for MPI programs ask your centre which "
                       "--mpi value works (srun --mpi=list)")
    folder = env.get("PMIX_SERVER_TMPDIR", "")
    if folder and not Path(folder).is_dir():
        spool = Path(folder).parent
        return Finding("mpi", WARN, f"srun --mpi={kind}: the PMIx server's folder {folder} "
                       "is not visible here (a container that does not bind it): an MPI "
                       "program here cannot reach SLURM's PMIx server",
                       f"apptainer exec --bind {spool} (enroot/pyxis: --container-mounts="
                       f"{spool}); or {NO_MPI_FIX}")
    return Finding("mpi", OK, f"srun --mpi={kind}: the PMIx server's variables and folder "
                   f"({folder or 'none named'}) reach this process")


def pmi2_check(env: Mapping[str, str]) -> Finding:
    fd = env.get("PMI_FD", "")
    try:
        os.fstat(int(fd))
    except (ValueError, OSError):
        return Finding("mpi", WARN, f"srun --mpi=pmi2 but PMI_FD={fd!r} is not an open file "
                       "here: an MPI program here cannot reach SLURM's PMI-2 server",
                       f"start the program directly under srun (no wrapper that closes "
                       f"file descriptors); or {NO_MPI_FIX}")
    return Finding("mpi", OK, f"srun --mpi=pmi2: the PMI-2 connection (fd {fd}) reaches "
                   "this process")
