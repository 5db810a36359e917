"""Command-line flags generated from the config's fields: one argument group per section,
the help text and default taken from the field, so they live in one place.

Every generated flag defaults to None ("not given"): a recipe or the field's default fills
it later (workload.config.recipes). Hand-written argparse rather than jsonargparse or tyro:
the flags must stay exactly as they were (`--model`, `--dist-timeout`; every boolean with
its `--no-` form) and the standard library keeps `train --help` free of heavy imports.
"""

from __future__ import annotations

import argparse
import dataclasses

from workload.config.schema import KEYS, SECTIONS, TrainConfig, flag_of, key_of
from workload.config.values import Every


def add_flags(parser: argparse.ArgumentParser, sections=tuple(SECTIONS),
              only: set[str] | None = None) -> None:
    """Add the flags of these sections (or only the keys in `only`), grouped by section."""
    defaults = TrainConfig()
    for name in sections:
        section = SECTIONS[name]
        fields = [f for f in dataclasses.fields(section) if only is None or key_of(f) in only]
        if not fields:
            continue
        group = parser.add_argument_group(section.__doc__)
        for f in fields:
            _add(group, f, getattr(getattr(defaults, name), f.name))


def _add(group, f: dataclasses.Field, default) -> None:
    meta, key = f.metadata, key_of(f)
    # A default made at run time (the output folder's timestamp) is described in the help.
    made_at_run_time = f.default_factory is not dataclasses.MISSING and f.type is str
    shown = "" if made_at_run_time or default is False or default == "" else f" (default: {default})"
    kwargs = dict(dest=key, default=None, help=meta["help"] + shown)
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
