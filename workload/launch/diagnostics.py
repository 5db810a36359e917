"""What a hung job leaves behind, the torch-free part: the flight recorder's variables and
the on-demand stack dump (docs/hangs.md).

`train` sets these for its own process group (its folder is ``<output-dir>/diagnostics``);
``python -m workload.launch env`` (so entrypoint.sh) and ``setup()`` set them for a user's
own script (``./diagnostics`` of the folder it starts in unless TORCH_FR_DUMP_TEMP_FILE
says otherwise). A value the user already set always wins.

The names are the installed torch's (2.14: c10d's FlightRecorder.hpp and
ProcessGroupNCCL.hpp read TORCH_FR_* first, then the older TORCH_NCCL_* spellings, which
older torch reads alone; gloo groups record into the same buffer since torch 2.8).
TORCH_NCCL_ASYNC_ERROR_HANDLING=3 ("skip cleanup"): with 1 the process is torn down
before the dump on timeout is written (pytorch/pytorch#121055).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from collections.abc import MutableMapping

from workload.files import open_append, umask_mode
from workload.held import held_path, hold_own_folder, let_go
from workload.logs import logger

DIAGNOSTICS = "diagnostics"      # the folder's name inside a run folder
FR_PREFIX = "fr-rank-"           # torch appends the rank: fr-rank-0, fr-rank-1, ...
STARTUP_PREFIX = "startup-rank-"  # train's start-up marks: startup-rank-<N>.json
# The phases of a start, in order (workload.training.startup marks each one's end).
STARTUP_PHASES = ("imports", "process group", "data", "model", "resume", "cudnn autotune",
                  "first step")
# The phases as summary.json and report show them: the time before the process where SLURM
# gives the job's start, and the compilers' share of the first step, split out of it.
STARTUP_ORDER = ("before this process", *STARTUP_PHASES[:-1], "compile", STARTUP_PHASES[-1])
FR_BUFFER_ENTRIES = "2000"       # torch's own default once enabled (FlightRecorder.hpp)
# The on-demand dump: not one of the preemption signals (workload/launch/preemption.py
# handles SIGTERM, SIGINT, SIGUSR2 and SIGHUP; torchrun forwards SIGQUIT).
DUMP_SIGNAL = signal.SIGUSR1
STALL_MARK = "stalled:"  # the first word of the stall watchdog's dump header
FINISHED = "finished"  # the last heartbeat's phase: ended, or failed
EXITED = "exited"
ERROR_CHARS = 400  # a rank's error as its records keep it: NCCL names the fault after a path
# Every variable flight_recorder_env may set (the old buffer name only for an old torch).
FLIGHT_RECORDER_KEYS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE",
                        "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_TEMP_FILE",
                        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING")


def error_text(error: BaseException | None) -> str:
    """A rank's exception as its last heartbeat and its start-up record keep it: its type
    and message (not a SystemExit's status nor a Ctrl-C: no error of the run's), cut where
    diagnose stops reading. diagnose's decision leaves the rank's node behind when it is a
    broken GPU's (workload/diagnose/hardware.py)."""
    if not isinstance(error, Exception):
        return ""
    return f"{type(error).__name__}: {error}"[:ERROR_CHARS]


def stacks_file(folder: Path, rank: int) -> Path:
    """Where rank `rank` writes its Python stacks (stall or on demand)."""
    return folder / f"rank-{rank}.txt"


def heartbeat_file(folder: Path, rank: int) -> Path:
    """Where rank `rank` says, every few seconds, which step and phase it is in."""
    return folder / f"heartbeat-{rank}.json"


def renamed_torch() -> bool:
    """Whether the installed torch reads the TORCH_FR_* names and warns, in every rank's
    log, about the old buffer name (2.14 does; torchtitan switched to the new names in
    September 2025, the 2.9 cycle: the first release with them is not confirmed, so older
    ones get both). Read from its metadata: no import."""
    try:
        major, minor = (int(part) for part in version("torch").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return False  # unknown: both names, each torch takes the one it knows
    return (major, minor) >= (2, 9)


def flight_recorder_env(folder: Path) -> dict[str, str]:
    """The flight recorder on, dumping on a collective timeout into `folder`."""
    prefix = str(folder / FR_PREFIX)
    old = {} if renamed_torch() else {"TORCH_NCCL_TRACE_BUFFER_SIZE": FR_BUFFER_ENTRIES}
    return {"TORCH_FR_BUFFER_SIZE": FR_BUFFER_ENTRIES, **old,
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_FR_DUMP_TEMP_FILE": prefix,
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix,
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}


def user_folder(env: MutableMapping[str, str], cwd: Path | None = None) -> Path:
    """A user's script's diagnostics folder: where their dump prefix points, else
    ./diagnostics of the folder the script starts in."""
    prefix = env.get("TORCH_FR_DUMP_TEMP_FILE") or env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    if prefix:
        return Path(prefix).parent
    return (cwd or Path.cwd()) / DIAGNOSTICS


# Two names of one setting: a user's value under either wins over ours under the other.
SAME_SETTING = ({"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"},
                {"TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"})


def apply_defaults(env: MutableMapping[str, str], folder: Path) -> dict[str, str]:
    """Set the flight recorder variables `env` lacks; the ones set (a user's value wins)."""
    wanted = flight_recorder_env(folder)
    given = {key for key in set(wanted).union(*SAME_SETTING) if env.get(key)}
    for names in SAME_SETTING:
        given |= names if given & names else set()
    added = {key: value for key, value in wanted.items() if key not in given}
    env.update(added)
    return added


def held_for_the_process(env: MutableMapping[str, str], folder: Path) -> Path:
    """A user's own script's diagnostics `folder` (setup() in the rank's own process, which
    is the one torch dumps from) held for the process's life (hold_diagnostics): what
    apply_defaults should name. The prefix `python -m workload.launch env` printed for it
    (entrypoint.sh: ./diagnostics by path, from a process that has ended) is taken back,
    so the held path replaces it (the same folder); a prefix of another name stays.
    `folder` itself when it cannot be held (a link, another uid's: the stack dump's
    warning says so)."""
    try:
        held = hold_diagnostics(folder)
    except OSError:
        return folder
    printed = flight_recorder_env(folder)["TORCH_FR_DUMP_TEMP_FILE"]
    for key in SAME_SETTING[1]:
        if env.get(key) == printed:
            del env[key]
    return held


@contextmanager
def defaults_for_one_run(env: MutableMapping[str, str], folder: Path | None) -> Iterator[dict]:
    """apply_defaults while one run lasts, then the variables it added removed: a second
    run in the same process (train called from Python) gets its own folder instead of
    taking the first run's for a user's value. None: no folder to dump into, none set."""
    added = apply_defaults(env, folder) if folder is not None else {}
    try:
        yield added
    finally:
        for key, value in added.items():
            if env.get(key) == value:
                del env[key]


def hold_diagnostics(folder: Path) -> Path:
    """The diagnostics folder `folder` (made when missing) as a held path (workload.files.
    held_path), for the caller to `let_go`: a run folder may be written by others, who
    could put a link at its name between two jobs (a writer would follow it into any
    folder of the user's) or rename it under a writer. Writable by no one else from now
    on (readable as the umask lets the group), and a flight recorder dump's name in it
    that is not a file of this user's removed: torch opens prefix+rank by that name,
    following a link (std::ofstream), and until now others may have written the folder.
    OSError for a link, something else than a folder, or a folder that is not this
    user's."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    fd = hold_own_folder(folder, umask_mode(0o777) & ~0o022)
    _remove_planted_dumps(fd)
    return held_path(fd)


def _remove_planted_dumps(fd: int) -> None:
    """Every fr-rank-* entry of the folder `fd` that is not a regular file of this user's
    with one name (a link, or a hard link to a file elsewhere) removed, never followed."""
    with os.scandir(fd) as entries:
        for entry in entries:
            if not entry.name.startswith(FR_PREFIX):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
                if not (stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid()
                        and info.st_nlink == 1):
                    os.unlink(entry.name, dir_fd=fd)
            except OSError:  # gone meanwhile, or a folder: torch cannot write through it
                pass


@contextmanager
def held_for_the_run(folder: Path) -> Iterator[Path | None]:
    """hold_diagnostics of a run's folder while the run lasts: its held path, the plain
    one while the run folder does not exist yet (train makes both once the inputs are
    checked), or None with one warning when it cannot be held (a link): diagnostics are
    never a reason not to train."""
    if not folder.parent.is_dir():
        yield folder
        return
    try:
        held = hold_diagnostics(folder)
    except OSError as error:
        logger.warning(f"no flight recorder dumps for this run: {error.strerror or error}")
        yield None
        return
    try:
        yield held
    finally:
        let_go(held)


def enable_dump_on_signal(folder: Path, rank: int):
    """On DUMP_SIGNAL, append every thread's Python stack to rank-<rank>.txt.

    faulthandler writes from its C signal handler, so the dump comes even while the main
    thread is blocked inside a collective, and it needs no ptrace (no py-spy, no gdb).
    Returns the open file (kept open for the process's life), or None when the folder
    cannot be written (a warning's matter, never a reason not to train)."""
    try:
        held = hold_diagnostics(folder)
    except OSError:
        return None
    try:
        stream = open_append(stacks_file(held, rank), buffering=1)  # never through a link
    except OSError:
        return None
    finally:
        let_go(held)
    faulthandler.register(DUMP_SIGNAL, file=stream, all_threads=True, chain=False)
    return stream


def dump_command(folder: Path) -> str:
    """The command that reads a diagnostics folder (printed on a timeout)."""
    return f"diagnose {folder.parent if folder.name == DIAGNOSTICS else folder}"
