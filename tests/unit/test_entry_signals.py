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
from workload.launch.preemption import (REQUEUE_EXIT_STATUS, REQUEUE_FILE_ENV, PreemptionFlag,
                                        StartUpFlag, status_while_waiting)

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
    """A preemption flag is passed to whoever reads it (train's to its checkpoints and its
    rendezvous, the start-up flag to train by run_command and to the other commands'
    rendezvous), never found as the bound method's `__self__` of whatever handler is
    installed: no module names `__self__` at all, as an attribute or a string."""
    readers = set()
    for path in sorted((REPO / "workload").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (getattr(node, "attr", None) == "__self__"
                    or getattr(node, "value", None) == "__self__"):
                readers.add(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not readers, f"a flag found through the installed handler ({sorted(readers)}); " \
        "pass the flag as an argument instead"


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


def test_a_signal_while_the_ranks_meet_is_judged_by_the_flag_passed(tmp_path, monkeypatch):
    """The thread that stands in for the handlers during the rendezvous asks the command's
    flag, passed to it (workload.distributed.init_distributed), what a signal means."""
    requeue = tmp_path / ".requeue"
    monkeypatch.setenv(REQUEUE_FILE_ENV, str(requeue))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    early = StartUpFlag("test", frozenset({signal.SIGTERM})).install_all()
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert status_while_waiting(early, "SIGUSR1") is None  # the stack dump's: recorded
        assert status_while_waiting(early, "SIGTERM") == REQUEUE_EXIT_STATUS
        assert requeue.read_text() == "preempted by SIGTERM at start-up\n"
        assert status_while_waiting(early, "SIGINT") == 130  # Python's own Ctrl-C
        assert status_while_waiting(None, "SIGTERM") is None  # no flag: not ours to act on
        trains = PreemptionFlag().install(("INT",))
        try:
            assert status_while_waiting(trains, "SIGINT") == REQUEUE_EXIT_STATUS
            assert status_while_waiting(trains, "SIGHUP") is None  # not its signal
        finally:
            trains.uninstall()
    finally:
        signal.signal(signal.SIGINT, previous_int)
        early.uninstall()
