"""Where settings come from: the command line's flags, generated from the config's fields
(one argument group per section, the help text and default taken from the field, so they
live in one place), and `--config FILE`.

Every generated flag defaults to None ("not given"): a recipe or the field's default fills
it later (resolve.py). Hand-written argparse rather than jsonargparse or tyro: the flags
must stay exactly as they were (`--model`, `--dist-timeout`; every boolean with its `--no-`
form) and the standard library keeps `train --help` free of heavy imports.

`train --config FILE`: settings from a JSON (or TOML) file in config.json's flat shape
(`batch_size = 64`); flags given on the command line override them. A file is data: one
too deeply nested or not UTF-8 is one usage error, like any other bad file. The one-shot
actions (--overwrite, --resume, --download, --prepare-data, --shards) are not taken from a file:
`repeatable` leaves them out and names those that would have acted."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
from pathlib import Path

from workload.config.schema import FIELDS, KEYS, ONE_SHOT, SECTIONS, TrainConfig, flag_of, key_of
from workload.config.values import Every
from workload.errors import UsageError

def add_flags(parser: argparse.ArgumentParser, sections=tuple(SECTIONS),
              only: set[str] | None = None, field_defaults: bool = False) -> None:
    """Add the flags of these sections (or only the keys in `only`), grouped by section.
    With `field_defaults` a flag left out is the field's default at once (for a command
    with no recipe or config file to fill it)."""
    defaults = TrainConfig()
    for name in sections:
        section = SECTIONS[name]
        fields = [f for f in dataclasses.fields(section) if only is None or key_of(f) in only]
        if not fields:
            continue
        group = parser.add_argument_group(section.__doc__)
        for f in fields:
            _add(group, f, getattr(getattr(defaults, name), f.name), field_defaults)


def _add(group, f: dataclasses.Field, default, field_default: bool) -> None:
    meta = f.metadata
    key = key_of(f)
    # A default made at run time (the output folder's timestamp) is described in the help.
    made_at_run_time = f.default_factory is not dataclasses.MISSING and f.type is str
    shown = ("" if made_at_run_time or default is False or default == ""
             else f" (default: {default})")
    kwargs = dict(dest=key, default=default if field_default else None,
                  help=meta["help"] + shown)
    if f.type is bool:  # --no-compile turns off what a --config file turned on
        kwargs["action"] = argparse.BooleanOptionalAction
    else:
        kwargs["type"] = Every.parse if f.type is Every else f.type
        if meta["choices"]:
            kwargs["choices"] = meta["choices"]
        if meta["metavar"]:
            kwargs["metavar"] = meta["metavar"]
    group.add_argument(flag_of(key), **kwargs)


def given(namespace: argparse.Namespace) -> dict:
    """The config values on a parsed command line (None = not given)."""
    return {k: v for k, v in vars(namespace).items() if k in KEYS}

# Keys config.json holds that are not settings: accepted and left alone.
IGNORED = {"recipe"}


def read_config_file(path: str) -> dict:
    """`key -> value` from the file, each value checked against its field's type."""
    file = Path(path).expanduser()
    if file.exists() and not file.is_file():  # read, a FIFO waits for a writer forever
        raise UsageError(f"--config {path} is not a regular file; pass a JSON or TOML file "
                         "of settings, such as a run's config.json")
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as error:
        raise UsageError(f"--config {path}: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise UsageError(f"--config {path} is not UTF-8 text (byte {error.start}); save it "
                         "as UTF-8 JSON or TOML") from None
    values = _parse(text, path, toml=file.suffix == ".toml")
    if not isinstance(values, dict):
        raise UsageError(f"--config {path} must hold one object of settings "
                         "(key = value), such as a run's config.json")
    for key, value in values.items():
        _check(path, key, value)
    return {k: v for k, v in values.items() if k not in IGNORED}


def _parse(text: str, path: str, toml: bool):
    try:
        if toml:
            import tomllib  # Python 3.11+
            return tomllib.loads(text)
        return json.loads(text)
    except ImportError:
        raise UsageError(f"--config {path}: TOML needs Python 3.11 or later; "
                         "write the settings as JSON") from None
    except ValueError as error:  # JSONDecodeError and TOMLDecodeError
        raise UsageError(f"--config {path} is not valid {'TOML' if toml else 'JSON'}: "
                         f"{error}") from None
    except RecursionError:
        raise UsageError(f"--config {path} is nested too deeply to be settings; it must "
                         "hold one flat object of settings (key = value)") from None


def repeatable(values: dict) -> tuple[dict, list[str]]:
    """The settings of a file without its one-shot actions, and the keys of those left out
    that would have acted (a value other than the default), for a warning."""
    defaults = TrainConfig().to_dict()
    kept = {k: v for k, v in values.items() if k not in ONE_SHOT}
    ignored = sorted(k for k in ONE_SHOT if k in values and values[k] != defaults[k])
    return kept, ignored


def _check(path: str, key: str, value) -> None:
    if key in IGNORED:
        return
    if key not in KEYS:
        close = difflib.get_close_matches(key, list(KEYS), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UsageError(f"--config {path}: {key!r} is not a setting{hint}")
    kind = FIELDS[key].type
    expected, name = _TYPES[kind]
    wrong_bool = isinstance(value, bool) and kind is not bool
    if not isinstance(value, expected) or wrong_bool:
        raise UsageError(f"--config {path}: {key} must be {name}, got {value!r}")


# A field's type -> the values a file may give for it, and their name in a message.
_TYPES = {int: ((int,), "an integer"), float: ((int, float), "a number"),
          bool: ((bool,), "true or false"), str: ((str,), "a string"),
          Every: ((int, str), "a step count or a duration such as \"10m\"")}
