"""A site's module system for the job scripts of jobs/sites/, shared by the tests that run
them (tests/e2e/test_sites.py with a stub srun, tests/e2e/test_site_jobs_slurm.py on the
SLURM cluster): Lmod itself over the module files of the centre's twin
(tests/twins/twin.py, from its cited module list), with Lmod's `module` exported the
way Lmod's start-up file exports it (BASH_FUNC_module%%). As on Olivia, `module reset`
returns to init-NRIS, and an `NCCL/...` module is found only once `NRIS/GPU` is loaded
(https://documentation.sigma2.no/hpc_machines/olivia/nccl.html): before, Lmod says so
and `module load` fails.
"""

from __future__ import annotations

from pathlib import Path

from tests.twins.twin import lmod_functions, module_settings

# Lmod 8.6's words for a module it finds only behind another (its spider knows NRIS/GPU).
LMOD_BEHIND = 'cannot be loaded as requested: "{}"'


def site_modules(site: str, tmp_path: Path, nccl_library: str | None = None) -> dict[str, str]:
    """The module environment of a site's job: Lmod and the site's twin's module files; an
    NCCL module's library reports `nccl_library` (else its twin's stand-in version)."""
    return lmod_functions() | module_settings(site, tmp_path / site, nccl_library)


def olivia_settings(tmp_path: Path, nccl_library: str | None = None) -> dict[str, str]:
    return site_modules("sigma2-olivia", tmp_path, nccl_library)
