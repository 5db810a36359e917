"""The fast tier's guard inside a process: refuses a training or a torch process group.

Python imports this module at start-up in every process a test without the `slow` marker
starts (tests/helpers/tiers.py puts this folder first on the child's PYTHONPATH and names
a report file in HPC_TRAIN_TIER_REPORT); the suite's own process uses it through
`refuse_training`. A refusal raises and appends one line to the report, which the suite
turns into the test's failure even where the test expected its command to fail.
"""

from __future__ import annotations

import importlib.abc
import os
import sys

REPORT_VARIABLE = "HPC_TRAIN_TIER_REPORT"
# module: (attribute path, what calling it starts)
GUARDED = {
    "torch.distributed": ("init_process_group", "a torch process group"),
    "workload.training.trainer": ("Trainer.fit", "a training"),
}
_report: str | None = os.environ.get(REPORT_VARIABLE) or None


class UnmarkedHeavyWork(RuntimeError):
    pass


def refuse_training(report: str | None) -> None:
    """Refuses (report set) or allows (None) what GUARDED names, in this process."""
    global _report
    _report = report
    for name in GUARDED:
        if name in sys.modules:
            _patch(sys.modules[name])
    if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


def _patch(module) -> None:
    path, what = GUARDED[module.__name__]
    *owners, attribute = path.split(".")
    owner = module
    for name in owners:
        owner = getattr(owner, name)
    original = getattr(owner, attribute)
    if getattr(original, "_tier_guarded", False):
        return

    def guarded(*args, **kwargs):
        if _report:
            message = (f"a test without the `slow` marker started {what} "
                       f"({module.__name__}.{path}): mark it slow (tests/helpers/tiers.py)")
            with open(_report, "a") as report:
                report.write(message + "\n")
            raise UnmarkedHeavyWork(message)
        return original(*args, **kwargs)

    guarded._tier_guarded = True
    setattr(owner, attribute, guarded)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches a GUARDED module right after it is first imported."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in GUARDED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        _patch(module)

    def __getattr__(self, name):  # get_data, is_package, ...: the real loader's
        return getattr(self.loader, name)


if _report:
    refuse_training(_report)
