"""Every console script and `python -m` entry of the package answers a job step's signals
from its first line (issue 59 D3): it runs through workload.commands.run_command (or
signals_from_the_start), which installs the StartUpFlag before torch is imported. A new
entry without it fails here; tests/e2e/test_signal_at_start_up.py sends the signals to
train, bench and doctor while torch imports."""

from __future__ import annotations

import ast
import importlib
import os
import re
import signal
import tomllib

from tests.helpers import REPO
from workload.launch.preemption import PreemptionFlag, StartUpFlag

# `python -m` entries that are not commands a job step runs, and why.
NOT_COMMANDS = {
    "workload.checkpoint.writer.process": "train's writer process: the loop's signals are "
                                          "blocked from before its exec until it ignores them",
    "workload.launch.jobstep": "builds the srun line on the batch host, before the step",
    "workload.bench.kit": "the developer's GPU check (make gpu-check), not a job command",
}


def uses_start_up_signals(function) -> bool:
    if function.__qualname__ == "main_of.<locals>.main":  # workload.commands.main_of
        return True
    names = set(function.__code__.co_names)
    for const in function.__code__.co_consts:  # lambdas and nested code
        if hasattr(const, "co_names"):
            names |= set(const.co_names)
    return bool(names & {"run_command", "signals_from_the_start"})


def test_every_console_script_answers_signals_from_its_first_line():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    for name, target in scripts.items():
        module, _, attribute = target.partition(":")
        function = getattr(importlib.import_module(module), attribute)
        assert uses_start_up_signals(function), f"{name} ({target}) runs without " \
            "run_command: a signal before its handlers are set kills it"


def test_every_python_m_entry_answers_signals_from_its_first_line():
    for path in sorted((REPO / "workload").rglob("*.py")):
        if not re.search(r'^if __name__ == "__main__":', path.read_text(), re.M):
            continue
        parts = path.relative_to(REPO).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] in ("__main__", "__init__") else parts)
        if module in NOT_COMMANDS:
            continue
        main = importlib.import_module(
            module + (".__main__" if path.name == "__main__.py" else "")).__dict__
        function = main.get("cli") if module == "workload.train" else main.get("main")
        assert function is not None and uses_start_up_signals(function), \
            f"python -m {module} runs without run_command or signals_from_the_start"


def test_no_module_finds_a_flag_through_the_installed_signal_handler():
    """A preemption flag is passed to whoever reads it (train's to its checkpoints, the
    start-up flag to train by run_command), never found as the bound method's `__self__`
    of whatever handler is installed. The one reader of a handler: the thread that stands
    in for a handler that cannot run while the main thread waits in C++ (the rendezvous),
    which must do what that handler would."""
    readers = set()
    for path in sorted((REPO / "workload").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    getattr(inner, "attr", None) == "__self__"
                    or getattr(inner, "value", None) == "__self__"
                    for inner in ast.walk(node)):
                readers.add(f"{path.relative_to(REPO)}:{node.name}")
    assert readers == {"workload/launch/preemption.py:status_while_waiting"}


def test_train_s_flag_takes_over_only_the_signals_it_answers():
    """What the start-up flag recorded goes to the flag handed to it, by the signals that
    flag says it answers (installed, not ignored since)."""
    early = StartUpFlag("test", frozenset()).install_all()  # USR1: recorded only
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        ignoring = PreemptionFlag().install(("TERM", "USR1")).ignore("USR1")
        assert ignoring.handles("SIGTERM") and not ignoring.handles("SIGUSR1")
        early.take_over(ignoring)
        ignoring.uninstall()
        assert not ignoring.is_set() and not ignoring.handles("SIGTERM")
        answering = PreemptionFlag().install(("TERM", "USR1"))
        early.take_over(answering)
        answering.uninstall()
        assert answering.signal_name == "SIGUSR1"
    finally:
        early.uninstall()
