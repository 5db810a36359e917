"""The test suite's own house (docs/development.md, "Layout"): the folders that tests import
stand in one direction, tests/helpers at the bottom, tests/slurm above it, tests/twins above
both; the scripts tests run as processes live in tests/scripts, which nothing imports; a
helper is never named like a test. Each module's imports are read with ast, not run."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# The folders tests import, each above the ones before it: a module imports from its own
# folder and the ones below, never one above (so no circle between them).
SUPPORT = ("helpers", "slurm", "twins")
SCRIPTS = "scripts"


def modules() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), str(path)) for path in sorted(TESTS.rglob("*.py"))}


def folder_of(path: Path) -> str:
    """The folder of tests/ a file is in ("" for tests/conftest.py)."""
    parts = path.relative_to(TESTS).parts
    return parts[0] if len(parts) > 1 else ""


def imported(path: Path, tree: ast.Module) -> list[str]:
    """The modules `path` imports anywhere in it (a function's own import too), absolute."""
    package = ".".join(("tests", *path.relative_to(TESTS).parts[:-1]))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            names.append(".".join(filter(None, (base, node.module))))
    return names


def folder_imports() -> set[tuple[str, str, str]]:
    """(importing folder, imported folder, the importing file) for each import between two
    folders of tests/."""
    found = set()
    for path, tree in modules().items():
        for name in imported(path, tree):
            parts = name.split(".")
            if parts[0] == "tests" and len(parts) > 1 and parts[1] != folder_of(path):
                found.add((folder_of(path), parts[1], str(path.relative_to(TESTS))))
    return found


def test_no_circle_between_the_test_folders():
    graph: dict[str, set[str]] = {}
    for importer, folder, _ in folder_imports():
        graph.setdefault(importer, set()).add(folder)
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as error:
        raise AssertionError(f"the test folders import each other in a circle: {error.args[1]}; "
                             "move the shared code down (tests/helpers is the bottom)") from None


def test_a_support_folder_imports_only_the_folders_below_it():
    for importer, folder, path in sorted(folder_imports()):
        if importer in SUPPORT:
            below = SUPPORT[:SUPPORT.index(importer)]
            assert folder in below, (
                f"{path} imports from tests/{folder}: tests/{importer} imports only from "
                f"{' and '.join(f'tests/{name}' for name in below) or 'its own folder'}; "
                "move what both need down")


def test_nothing_imports_a_script_and_no_module_tests_import_is_a_script():
    for _, folder, path in sorted(folder_imports()):
        assert folder != SCRIPTS, (f"{path} imports from tests/{SCRIPTS}: a script runs as a "
                                   "process; put what it shares in tests/helpers")
    for path, tree in modules().items():
        if folder_of(path) in SUPPORT and path.name != "__main__.py":  # a package's is run -m
            assert not any(is_main_guard(node) for node in tree.body), (
                f"{path.relative_to(TESTS)} runs as a script (if __name__ == '__main__'): "
                f"move it to tests/{SCRIPTS}, apart from the modules tests import")


def is_main_guard(node: ast.stmt) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def test_only_a_test_file_defines_a_function_named_like_a_test():
    for path, tree in modules().items():
        if path.name.startswith("test_"):
            continue
        named = [node.name for node in ast.walk(tree)
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and node.name.startswith("test")]
        assert not named, (f"{path.relative_to(TESTS)} defines {', '.join(named)}: a helper "
                           "named like a test reads as one; name it for what it returns")
