"""The job scripts (jobs/) wherever this package runs: a source checkout or the image.

The image carries them under /opt/hpc-train/jobs (and the example scripts under
/opt/hpc-train/examples), so someone who only pulled the image gets them with

    apptainer exec hpc-train.sif python -m workload.launch jobs ./jobs

and then submits ``sbatch jobs/multinode.sbatch`` from that folder's parent (the scripts
source ``${JOBS_DIR:-$SLURM_SUBMIT_DIR/jobs}/lib/launch.sh``: sbatch runs a copy of the
script from its spool folder, so the script cannot find its own folder, and a DEST named
otherwise needs JOBS_DIR; `submit_command` prints the line that works for any DEST).
"""

from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path

from workload.errors import WRITE_PROBLEMS, LaunchError
from workload.files import replace_file, umask_mode

# Where the Dockerfile and apptainer/*.def put jobs/; HPC_TRAIN_JOBS overrides both.
IMAGE_JOBS = Path("/opt/hpc-train/jobs")
JOBS_ENV = "HPC_TRAIN_JOBS"
MARKER = Path("lib") / "launch.sh"  # a folder holding this is a jobs/ folder
JOBSTEP_COPY = Path("lib") / "jobstep.py"  # where jobs/lib/launch.sh looks first


def candidates() -> list[Path]:
    """Where jobs/ may be, in order: the override, the source checkout, the image."""
    found = [Path(os.environ[JOBS_ENV])] if os.environ.get(JOBS_ENV) else []
    checkout = Path(__file__).resolve().parents[2] / "jobs"  # workload/launch/ is two down
    return found + [checkout, IMAGE_JOBS]


def find_jobs() -> Path:
    override = os.environ.get(JOBS_ENV)
    if override and not (Path(override) / MARKER).is_file():  # set, so meant: never skipped
        raise LaunchError(JOBS_ENV, override, f"a jobs/ folder (one with {MARKER})",
                          f"point {JOBS_ENV} at the jobs/ folder of a checkout, or unset it")
    for folder in candidates():
        if (folder / MARKER).is_file():
            return folder
    places = ", ".join(str(path) for path in candidates())
    raise LaunchError(JOBS_ENV, os.environ.get(JOBS_ENV, ""), f"a jobs/ folder (looked in "
                      f"{places})", f"set {JOBS_ENV} to the jobs/ folder of a checkout")


def copy_jobs(dest: Path, force: bool = False) -> list[Path]:
    """Copy jobs/ to `dest`, with jobstep.py in its lib/ (the batch host runs it there,
    without this package); existing files are kept unless `force`, and a link in the way
    is replaced, never written through. Returns the files."""
    source = find_jobs()
    copies = {dest / path.relative_to(source): path
              for path in sorted(source.rglob("*")) if path.is_file()}
    copies[dest / JOBSTEP_COPY] = Path(__file__).with_name("jobstep.py")
    clashes = [target for target in copies if target.exists() or target.is_symlink()]
    if clashes and not force:
        raise LaunchError("DEST", str(dest), f"a folder without the job scripts (it already "
                          f"has {clashes[0]})", "pass --force to overwrite, or another DEST")
    try:
        for target, path in copies.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            # Replaced whole (files.replace_file): a link in the way is never written through.
            replace_file(target, path.read_bytes(), umask_mode(stat.S_IMODE(path.stat().st_mode)))
    except OSError as error:
        if error.errno in WRITE_PROBLEMS:
            raise  # a full disk or a file system turned read-only: the command's one line
        raise LaunchError("DEST", str(dest), "a folder this user can create and write "
                          f"({error.strerror}: {error.filename})", "name another DEST") from None
    return list(copies)


def submit_command(dest: Path, script: str = "multinode.sbatch") -> str:
    """The shell line that submits `script` from a jobs/ copy at `dest`, whatever its name.

    The job scripts find lib/launch.sh through JOBS_DIR, else $SLURM_SUBMIT_DIR/jobs; sbatch
    exports the submitting shell's environment (--export=ALL, its default), so a JOBS_DIR
    on the sbatch line reaches the batch script. A folder named jobs needs none."""
    folder = dest.resolve()
    cd = f"cd {shlex.quote(str(folder.parent))} && "
    if folder.name == "jobs":
        return f"{cd}sbatch jobs/{script}"
    jobs_dir = shlex.quote(str(folder))
    return f"{cd}JOBS_DIR={jobs_dir} sbatch {shlex.quote(str(folder / script))}"
