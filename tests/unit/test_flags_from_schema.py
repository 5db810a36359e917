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

COMMANDS = ("workload.train", "workload.evaluate", "workload.predict", "workload.doctor",
            "workload.bench.cli")
FLAG_KEYS = {flag_of(key): key for key in KEYS}
# Flags that share a setting's name but are another setting, deliberately.
NOT_THE_SETTING = {
    ("workload.predict", "--batch-size"): "images per forward pass, not a training batch",
    ("workload.doctor", "--output-dir"): "an existing folder to check, no timestamped default",
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


def flag_rows():
    """(page, flags, text) of every table row of docs/ whose first cell names flags."""
    for page in sorted(DOCS.rglob("*.md")):
        for line in page.read_text(encoding="utf-8").splitlines():
            cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
            if line.startswith("| `--") and len(cells) >= 2:
                yield page.name, re.findall(r"--[a-z][a-z0-9-]*", cells[0]), cells[1]


def stated_defaults(text: str) -> list[str]:
    """The defaults a row's text states: "(default 3)", "default `30m`", "`auto` (default)"."""
    found = re.findall(r"\(default:? `?([^`;),\s]+)`?[;),]", text)
    found += re.findall(r"default `([^`]+)`", text)
    found += re.findall(r"`?([^`\s(]+)`? \(default\)", text)
    return [value for value in found if "<" not in value]  # runs/<timestamp>: made at run time


def same_value(text: str, default) -> bool:
    """The docs' "600" is the field's 600.0."""
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        return re.fullmatch(r"-?[0-9.]+", text) is not None and float(text) == default
    return text == str(default)


def test_the_docs_flag_tables_name_trains_flags_with_their_defaults():
    import workload.train

    flags = {f for action in options(workload.train.build_parser())
             for f in action.option_strings}
    defaults = TrainConfig().to_dict()
    rows = list(flag_rows())
    assert len(rows) > 20  # the tables of data-and-models.md, checkpoints.md, cluster.md
    for page, named, text in rows:
        for flag in named:
            assert flag in flags, f"{page} lists {flag}, which train does not have"
        keys = {FLAG_KEYS[f] for f in named if f in FLAG_KEYS}
        if len(keys) != 1:  # a row of several settings states no one default
            continue
        key = keys.pop()
        for value in stated_defaults(text):
            assert same_value(value, defaults[key]), (
                f"{page} says {flag_of(key)} defaults to {value}; the field says "
                f"{defaults[key]}")
