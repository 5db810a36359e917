"""Every command's flags that are config settings come from the schema's fields (their help,
choices and default in one place), and the docs' flag tables name only flags that exist,
with the defaults the fields have."""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

import pytest

from workload.config import FIELDS, KEYS, TrainConfig, flag_of

COMMANDS = ("workload.train", "workload.evaluate", "workload.predict", "workload.doctor.cli",
            "workload.bench.cli")
FLAG_KEYS = {flag_of(key): key for key in KEYS}
# Flags that share a setting's name but are another setting, deliberately.
NOT_THE_SETTING = {
    ("workload.predict", "--batch-size"): "images per forward pass, not a training batch",
    ("workload.doctor.cli", "--output-dir"): "an existing folder to check, no timestamped default",
}
DOCS = Path(__file__).resolve().parents[2] / "docs"


def options(parser: argparse.ArgumentParser):
    """Every option of a parser and of its subcommands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from options(sub)
        elif action.option_strings:
            yield action


@pytest.mark.parametrize("command", COMMANDS)
def test_every_commands_setting_flags_are_generated_from_the_schema(command):
    parser = importlib.import_module(command).build_parser()
    for action in options(parser):
        flag = next((f for f in action.option_strings if f in FLAG_KEYS), None)
        if flag is None or (command, flag) in NOT_THE_SETTING:
            continue
        field = FIELDS[FLAG_KEYS[flag]]
        assert action.help.startswith(field.metadata["help"]), (command, flag, action.help)
        assert tuple(action.choices or ()) == tuple(field.metadata["choices"]), (command, flag)
