"""What every console script shares: a parser whose help is the module's docstring, a
`--version` flag, and a usage error reported as one line with exit status 2.

Standard library only: `--help`, `--version` and every usage error answer before a
command imports torch.

What `--version` prints: this package's version and the torch, CUDA and DALI it runs with
(`add_version_argument(parser)`, which every CLI's parser gets). Nothing here imports
torch or DALI (a `--version` that takes seconds to load CUDA libraries answers the wrong
question). Versions come from installed package metadata, and the CUDA versions from the
installed files read as text: torch's `torch/version.py` (`cuda = '13.0'`) and DALI's
`nvidia/dali/__init__.py` (`__cuda_version__ = int('12.9.86'...)`), matched with regular
expressions, never executed. `doctor` reads the same facts through `installed()`.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib.metadata as metadata
import importlib.util
import math
import platform
import re
import signal
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable, Iterator

from workload.errors import UsageError, exit_with_usage_error, failed_write_line
from workload.launch.preemption import StartUpFlag, signals_from_the_start
from workload.logs import logging_kept

DISTRIBUTION = "hpc-train"
# DALI's wheels are named after the CUDA major they are built for (NGC's images too).
DALI_DISTRIBUTIONS = ("nvidia-dali-cuda130", "nvidia-dali-cuda120", "nvidia-dali-cuda110",
                      "nvidia-dali")

# `cuda = '13.0'`, `cuda: Optional[str] = '12.8'` or `cuda = None` in torch/version.py.
_TORCH_VERSION_RE = re.compile(r"""^__version__\s*(?::[^=]*)?=\s*['"]([^'"]+)['"]""", re.M)
_TORCH_CUDA_RE = re.compile(r"""^cuda\s*(?::[^=]*)?=\s*(?:['"]([^'"]*)['"]|None)""", re.M)
# `__version__ = '2.4.0'` and `__cuda_version__ = int('12.9.86'.replace('.', ''))`.
_DALI_VERSION_RE = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.M)
_DALI_CUDA_RE = re.compile(r"""^__cuda_version__\s*=\s*int\(\s*['"]([\d.]+)['"]""", re.M)


@dataclass(frozen=True)
class Installed:
    """Versions as installed; None where a package is absent or says nothing."""

    package: str | None
    torch: str | None
    torch_cuda: str | None  # the CUDA torch was built for; None for a CPU-only build
    dali: str | None
    dali_cuda: str | None   # the CUDA DALI was built for


def distribution_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def package_file(module: str, relative: str) -> Path | None:
    """A file inside an installed package, located without importing the package."""
    top, _, rest = module.partition(".")
    try:
        spec = importlib.util.find_spec(top)  # a top-level name: finds, imports nothing
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:  # a namespace package has several
        path = Path(folder, *rest.split(".") if rest else (), relative)
        if path.is_file():
            return path
    return None


def read_text(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def first_match(pattern: re.Pattern, text: str) -> str | None:
    found = pattern.search(text)
    return (found.group(1) or None) if found else None


def torch_versions(text: str | None = None) -> tuple[str | None, str | None]:
    """(torch version, CUDA it was built for) from torch/version.py's text."""
    if text is None:
        text = read_text(package_file("torch", "version.py"))
    version = first_match(_TORCH_VERSION_RE, text) or distribution_version("torch")
    return version, first_match(_TORCH_CUDA_RE, text)


def dali_versions(text: str | None = None) -> tuple[str | None, str | None]:
    """(DALI version, CUDA it was built for) from nvidia/dali/__init__.py's text."""
    if text is None:
        text = read_text(package_file("nvidia.dali", "__init__.py"))
    version = first_match(_DALI_VERSION_RE, text)
    if version is None:
        version = next(filter(None, map(distribution_version, DALI_DISTRIBUTIONS)), None)
    return version, first_match(_DALI_CUDA_RE, text)


def installed() -> Installed:
    torch, torch_cuda = torch_versions()
    dali, dali_cuda = dali_versions()
    return Installed(distribution_version(DISTRIBUTION), torch, torch_cuda, dali, dali_cuda)


def version_text(prog: str = DISTRIBUTION, found: Installed | None = None) -> str:
    """Lines for `--version`, e.g.

    train (hpc-train 0.1.0)
    torch 2.14.1+cu130, built for CUDA 13.0
    DALI 2.4.0, built for CUDA 12.9.86
    Python 3.11.7 on Linux x86_64
    """
    found = found or installed()
    package = f"{DISTRIBUTION} {found.package or 'not installed, run from a checkout'}"
    head = package if prog == DISTRIBUTION else f"{prog} ({package})"
    if found.torch is None:
        torch_line = "torch not installed"
    else:
        cuda = f"built for CUDA {found.torch_cuda}" if found.torch_cuda else "CPU-only build"
        torch_line = f"torch {found.torch}, {cuda}"
    if found.dali is None:
        dali_line = "DALI not installed"
    else:
        dali_line = f"DALI {found.dali}" + (f", built for CUDA {found.dali_cuda}"
                                            if found.dali_cuda else "")
    python = f"Python {platform.python_version()} on {platform.system()} {platform.machine()}"
    return "\n".join((head, torch_line, dali_line, python))


class _VersionAction(argparse.Action):
    """argparse's own 'version' action re-wraps the text into one paragraph; this prints
    the lines as they are, and only when asked (nothing is read at parser build time)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="print the versions of hpc-train, torch, CUDA and DALI, then exit"):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text(parser.prog))
        parser.exit()


def add_version_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action=_VersionAction)


def finite_float(text: str) -> float:
    """A number flag's value: `nan` and `inf` are refused (`float` would take them, and
    they pass every `< 0` check: a sweep of `inf` MiB doubles its size until memory runs
    out). A flag that means them would name another type."""
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number; pass a number "
                                         "such as 10 or 0.5")
    return value


class CommandParser(argparse.ArgumentParser):
    """argparse's parser, with every `type=float` flag (the generated config flags and
    the hand-written ones of each command, its subcommands' included) typed as
    `finite_float`: the one place a flag's number is typed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("type", float, finite_float)


def command_parser(prog: str, doc: str, **kwargs) -> argparse.ArgumentParser:
    """A parser for a console script: the docstring's first line as the description, the
    rest (its launch recipes) after the flags."""
    first, _, rest = doc.strip("\n").partition("\n")
    p = CommandParser(prog=prog, description=first,
                      formatter_class=argparse.RawDescriptionHelpFormatter,
                      epilog=rest.strip("\n"), **kwargs)
    add_version_argument(p)
    return p


# The signals SLURM may send a step (scancel, preemption, --signal) that end a command
# with nothing to save: the requeue status and one line. Ctrl-C (SIGINT) keeps Python's
# meaning (130), except in train, where it is a preemption too (TRAIN_ENDING_SIGNALS).
ENDING_SIGNALS = frozenset({signal.SIGTERM, signal.SIGUSR2, signal.SIGHUP})
TRAIN_ENDING_SIGNALS = ENDING_SIGNALS | {signal.SIGINT}

# The exit statuses of every command (docs/cluster.md#exit-statuses): 0 done, 2 a usage
# error or a refusal before any work (workload.errors), 75 a checkpoint written after a
# preemption signal, asking the job script to requeue (workload.launch.preemption).
EXIT_OK = 0


def run_command(prog: str, work: Callable[[], object],
                ending: frozenset[int] = ENDING_SIGNALS, keep_signals: bool = False) -> int:
    """Run `work`; a UsageError becomes one line on stderr and exit status 2. A process
    group the command joined is left on every way out (success, error, exit). Returns the
    exit status, 0: never what `work` returned, which the console-script wrapper would
    pass to sys.exit (a dict printed to stderr and status 1, a count taken modulo 256).

    The job's signals are answered from here, before anything is imported (torch's
    import takes seconds): a signal of `ending` exits with the requeue status and one
    line, the stack dump's USR1 kills nothing (workload.launch.preemption.StartUpFlag;
    `work` is given that flag, and train hands what it recorded over to its own flag once
    its config is parsed). `keep_signals`:
    the handlers stay until the process ends (a console script's run)."""
    try:
        # A program that runs commands in its own process keeps its own logging.
        with (signals_from_the_start(prog, ending, keep_signals) as early, logging_kept(),
              collector_paused_for_start_up()):
            work(early)
        return EXIT_OK
    except UsageError as error:
        exit_with_usage_error(prog, error)
    except OSError as error:  # a full disk, a file system turned read-only: the user's fix
        if (line := failed_write_line(error)) is None:
            raise
        exit_with_usage_error(prog, UsageError(line))
    finally:
        joined = sys.modules.get("workload.distributed")  # loaded only if work began
        if joined is not None:
            joined.teardown()


# What a command's start-up makes lives as long as its process: torch and what it pulls in
# (dynamo's modules too, through the first optimizer) are some 300,000 objects, which
# Python's cyclic collector walks again and again while they are made, and all at once more
# as the interpreter ends. So the start-up runs with the collector paused, the loop with it
# on and the start-up's objects frozen (gc.freeze: never walked again, still freed when
# their last reference goes), and the exit with everything frozen: 0.89 of a tiny
# `train`'s CPU time and 0.75 of an `evaluate`'s (docs/performance.md#start-up).
_paused_here = False  # whether a start-up pause that this module made is on


@contextmanager
def collector_paused_for_start_up() -> Iterator[None]:
    """Pause the cyclic collector until `start_up_over()` or the command's end, and freeze
    what is left when the interpreter exits. A program that runs commands in its own
    process gets its collector back as it had it (one it had switched off stays off),
    and none of its objects frozen unless a command's loop began."""
    global _paused_here
    # A collector already off (the caller's, or the pause of a command that runs this one)
    # is its owner's to switch on.
    mine = gc.isenabled()
    if mine:
        gc.disable()
        _paused_here = True
    atexit.unregister(gc.freeze)  # once, however many commands a process runs
    atexit.register(gc.freeze)
    try:
        yield
    finally:
        if mine and _paused_here:
            _paused_here = False
            gc.enable()


def start_up_over() -> None:
    """The start-up's objects frozen and the collector back on, if a command's start-up
    paused it: called where a command's loop begins (training, evaluation, prediction,
    bench's timed work)."""
    global _paused_here
    if _paused_here:
        _paused_here = False
        gc.freeze()  # else the collector's first passes walk all that the pause made
        gc.enable()


def main_of(prog: str, parser: argparse.ArgumentParser, work: Callable[..., object],
            takes_flag: bool = False):
    """The usual `main(argv)`: parse, then run `work(args)` with usage errors reported; it
    returns the exit status. `takes_flag`: `work(args, flag)` is given run_command's
    StartUpFlag, for a command that joins a process group (a signal while its ranks meet
    is acted on through it: workload.distributed.init_distributed)."""
    def main(argv: list[str] | None = None) -> int:
        args = parser.parse_args(argv if argv is not None else sys.argv[1:])

        def run(early: StartUpFlag) -> object:
            return work(args, early) if takes_flag else work(args)
        # argv None: the console script or `python -m`, whose process ends after this.
        return run_command(prog, run, keep_signals=argv is None)
    return main
