"""What every console script shares: a parser whose help is the module's docstring, a
`--version` flag, and a usage error reported as one line with exit status 2.

Standard library only: `--help`, `--version` and every usage error answer before a
command imports torch.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from workload.errors import UsageError, exit_with_usage_error
from workload.version import add_version_argument


def command_parser(prog: str, doc: str, **kwargs) -> argparse.ArgumentParser:
    """A parser for a console script: the docstring's first line as the description, the
    rest (its launch recipes) after the flags."""
    first, _, rest = doc.strip("\n").partition("\n")
    p = argparse.ArgumentParser(prog=prog, description=first,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=rest.strip("\n"), **kwargs)
    add_version_argument(p)
    return p


# The exit statuses of every command (docs/cluster.md#exit-statuses): 0 done, 2 a usage
# error or a refusal before any work (workload.errors), 75 a checkpoint written after a
# preemption signal, asking the job script to requeue (workload.launch.preemption).
EXIT_OK = 0


def run_command(prog: str, work: Callable[[], object]) -> int:
    """Run `work`; a UsageError becomes one line on stderr and exit status 2. A process
    group the command joined is left on every way out (success, error, exit). Returns the
    exit status, 0: never what `work` returned, which the console-script wrapper would
    pass to sys.exit (a dict printed to stderr and status 1, a count taken modulo 256)."""
    try:
        work()
        return EXIT_OK
    except UsageError as error:
        exit_with_usage_error(prog, error)
    finally:
        joined = sys.modules.get("workload.distributed")  # loaded only if work began
        if joined is not None:
            joined.teardown()


def main_of(prog: str, parser: argparse.ArgumentParser,
            work: Callable[[argparse.Namespace], object]):
    """The usual `main(argv)`: parse, then run with usage errors reported; it returns the
    exit status."""
    def main(argv: list[str] | None = None) -> int:
        args = parser.parse_args(argv if argv is not None else sys.argv[1:])
        return run_command(prog, lambda: work(args))
    return main
