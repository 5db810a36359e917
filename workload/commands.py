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


def run_command(prog: str, work: Callable[[], object]) -> object:
    """Run `work`; a UsageError becomes one line on stderr and exit status 2. A process
    group the command joined is left on every way out (success, error, exit)."""
    try:
        return work()
    except UsageError as error:
        exit_with_usage_error(prog, error)
    finally:
        joined = sys.modules.get("workload.distributed")  # loaded only if work began
        if joined is not None:
            joined.teardown()


def main_of(prog: str, parser: argparse.ArgumentParser,
            work: Callable[[argparse.Namespace], object]):
    """The usual `main(argv)`: parse, then run with usage errors reported."""
    def main(argv: list[str] | None = None):
        args = parser.parse_args(argv if argv is not None else sys.argv[1:])
        return run_command(prog, lambda: work(args))
    return main
