"""The package's shape: the dependency rule of docs/code-map.md (its layer table is read
here, the one place it is written), small modules and functions, and command lines that
answer before torch is imported."""

from __future__ import annotations

import ast
import graphlib
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

import workload

ROOT = Path(workload.__file__).parent
CODE_MAP = ROOT.parent / "docs" / "code-map.md"


def layer_table(text: str) -> dict[int, set[str]]:
    """The layers of the code map's table, the ground floor 1: a row starts with the
    layer's name, a row that starts with spaces goes on with the one above it; files and
    folders count (`train.py` is train, `bench/` bench, `launch/__main__.py`
    launch.__main__), a `(...)` aside and a `<- ...` note do not."""
    table = re.search(r"^```\n(.*?)^```", text, re.S | re.M).group(1)
    rows: list[set[str]] = []
    for line in table.splitlines():
        line = re.sub(r"\(.*?\)|<-.*", "", line)
        if not line.startswith(" "):
            line = line.split(maxsplit=1)[1] if " " in line.strip() else ""
            rows.append(set())
        rows[-1] |= {re.sub(r"\.py$|/$", "", name).replace("/", ".") for name in line.split()}
    return {len(rows) - index: units for index, units in enumerate(rows)}


LAYERS = layer_table(CODE_MAP.read_text())
COMMAND_MODULES = {"workload.train", "workload.bench.cli", "workload.doctor",
                   "workload.report", "workload.evaluate", "workload.predict",
                   "workload.launch.__main__", "workload.diagnose"}
# A module's cap counts its code lines: docstrings, comments and blank lines are free, so
# that explaining why never competes with the code for room. A function's counts all.
MAX_MODULE_CODE_LINES = 300
MAX_FUNCTION_LINES = 50


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(module: str) -> str:
    """The name LAYERS knows a module by: `launch.__main__`, else its first part."""
    parts = module.split(".")[1:]
    if parts[:2] == ["launch", "__main__"]:
        return "launch.__main__"
    return parts[0] if parts else ""


def layer_of(module: str) -> int:
    unit = unit_of(module)
    if unit == "":
        return 1  # the package itself: its version
    return next(layer for layer, units in LAYERS.items() if unit in units)


def lazy_homes(package: str) -> dict[str, str]:
    """A package's names that its __init__ imports only when asked (a `_HOMES` table of
    name: module, read by its module __getattr__), as {name: the module that holds it}."""
    init = ROOT.parent.joinpath(*package.split("."), "__init__.py")
    if not init.is_file():
        return {}
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == "_HOMES"
                                                for target in node.targets):
            return {name: f"{package}.{home}"
                    for name, home in ast.literal_eval(node.value).items()}
    return {}


def imports_of(path: Path) -> set[str]:
    """Every workload module this file imports, at the top or inside a function; a name
    taken from a package that imports it lazily counts as its own module's import."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("workload")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("workload"):
            homes = lazy_homes(node.module)
            found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES
                      else homes.get(a.name, node.module) for a in node.names}
    return found


SOURCES = sorted(ROOT.rglob("*.py"))
MODULES = {module_name(p) for p in SOURCES}


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_follow_the_layers(path):
    me = module_name(path)
    for target in imports_of(path):
        same_package = unit_of(target) == unit_of(me) or target == "workload"
        if not same_package:
            # The base helpers (layer 1) may use each other, and nothing above them.
            allowed = 1 if layer_of(me) == 1 else layer_of(me) - 1
            assert layer_of(target) <= allowed, (
                f"{me} (layer {layer_of(me)}) imports {target} (layer {layer_of(target)})")
        if target in COMMAND_MODULES:
            assert unit_of(target) == unit_of(me), f"{me} imports the command {target}"


def import_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One circle of imports in `graph` (module -> the modules it imports), as the
    modules along it, the first again at the end; [] when there is none."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return list(reversed(error.args[1]))
    return []


def test_an_import_cycle_is_found():
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) in (
        ["a", "b", "c", "a"], ["b", "c", "a", "b"], ["c", "a", "b", "c"])
    assert import_cycle({"a": {"b"}, "b": {"c"}, "d": {"a", "c"}}) == []


def test_no_import_cycle_anywhere():
    # Within a package too, which the layer rule does not look into. Every import counts,
    # those inside a function included: a lazy import that closes a circle only hides it.
    graph = {module_name(path): {target for target in imports_of(path)
                                 if target in MODULES and target != module_name(path)}
             for path in SOURCES}
    cycle = import_cycle(graph)
    assert not cycle, f"an import circle: {' -> '.join(cycle)}"


def test_every_module_has_a_layer():
    for module in MODULES:
        assert layer_of(module) in LAYERS, module


def test_the_layer_table_names_only_modules_that_exist():
    assert {unit for units in LAYERS.values() for unit in units} <= {
        unit_of(module) for module in MODULES}


def test_the_layer_table_is_read_row_by_row():
    text = ("intro\n```\ntop     a.py  b/  (x.py, y.py)\n        b/__main__.py\n"
            "bottom  c/   d.py                 <- no torch\n```\n")
    assert layer_table(text) == {2: {"a", "b", "b.__main__"}, 1: {"c", "d"}}


def docstring_lines(tree: ast.Module) -> set[int]:
    """The lines of the module's, its classes' and its functions' docstrings."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                lines |= set(range(first.lineno, first.end_lineno + 1))
    return lines


def code_lines(source: str) -> int:
    """The lines that hold code: not blank, not only a comment, not in a docstring (a
    string that is no docstring is code, every line of it)."""
    layout = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
              tokenize.DEDENT, tokenize.ENDMARKER}
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in layout:
            lines |= set(range(token.start[0], token.end[0] + 1))
    return len(lines - docstring_lines(ast.parse(source)))


def test_code_lines_leave_out_docstrings_comments_and_blank_lines():
    source = ('"""A module.\n\nWhy it is here.\n"""\n\n# a comment\nimport os\n\n\n'
              'def f(x):\n    """What f does,\n    at length."""\n    # why\n'
              '    text = """a string\n    that is code"""\n    return x  # a remark\n')
    assert code_lines(source) == 5  # import, def, both lines of the string, return


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_and_functions_stay_small(path):
    source = path.read_text()
    assert code_lines(source) <= MAX_MODULE_CODE_LINES, (
        f"{path} has {code_lines(source)} code lines, over {MAX_MODULE_CODE_LINES}")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            assert length <= MAX_FUNCTION_LINES, f"{path}:{node.lineno} {node.name}: {length} lines"


def heavy_imports(code: str) -> list[str]:
    """The heavy modules (torch, numpy, torchvision) that running `code` imports."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code],
                          capture_output=True, text=True, timeout=120)
    names = [line.split("|")[-1].strip() for line in done.stderr.splitlines()
             if line.startswith("import time:")]
    return [n for n in names if n.split(".")[0] in ("torch", "numpy", "torchvision")]


def test_the_config_package_imports_only_the_standard_library():
    assert heavy_imports("import workload.config") == []


def test_the_config_package_imports_nothing_of_the_package_but_its_errors():
    for path in sorted((ROOT / "config").glob("*.py")):
        outside = {m for m in imports_of(path) if not m.startswith("workload.config")}
        assert outside <= {"workload.errors"}, (path.name, outside)


@pytest.mark.parametrize("package", ["config", "models"])
def test_other_code_imports_these_packages_through_their_public_names(package):
    inner = f"workload.{package}."
    others = [p for p in SOURCES if (ROOT / package) not in p.parents]
    others += sorted((ROOT.parent / "tests").rglob("*.py"))
    others += sorted((ROOT.parent / "tools").rglob("*.py"))
    for path in others:
        reaching = sorted(m for m in imports_of(path) if m.startswith(inner))
        assert not reaching, f"{path.name} imports {reaching}; import from workload.{package}"


def test_the_model_json_format_imports_no_torch():
    # evaluate and predict check model.json before torch; the package loads its torch
    # names on first use (workload/models/__init__.py).
    assert heavy_imports("import workload.models; from workload.models import locate, "
                         "read_description, describe_model") == []


def test_the_launch_api_for_a_users_script_imports_no_torch():
    # workload.launch.setup() imports torch only when called; the import is cheap.
    assert heavy_imports("import workload.launch; from workload.launch import setup, "
                         "PreemptionFlag, exit_for_requeue") == []


def test_the_checkpoint_api_for_a_users_loop_imports_no_torch():
    # workload/checkpoint/__init__.py loads its names on first use; Checkpoints imports
    # torch only when created.
    assert heavy_imports("import workload.checkpoint; "
                         "from workload.checkpoint import Checkpoints") == []


def test_the_checkpoint_writer_process_imports_no_torch():
    # It starts at a run's first asynchronous save, a preemption's within SLURM's grace
    # time: torch's import would take seconds of it (workload/checkpoint/writer/process.py).
    assert heavy_imports("import workload.checkpoint.writer.process") == []


def module_level_imports(path: Path) -> set[str]:
    """What importing this file imports (the imports outside its functions), workload's
    modules by the name MODULES knows them, others by their top package."""
    found = set()

    def visit(nodes):
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.update(imports_of_node(node))
            visit(ast.iter_child_nodes(node))

    visit(ast.parse(path.read_text()).body)
    return found


def imports_of_node(node: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(node, ast.Import):
        return {a.name if a.name.startswith("workload") else a.name.split(".")[0]
                for a in node.names}
    module = node.module or ""
    if not module.startswith("workload"):
        return {module.split(".")[0]}
    return {f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module
            for a in node.names}


def imports_torch(module: str, seen: set[str] | None = None) -> bool:
    """Whether importing `module` imports torch, through any module it imports."""
    seen = set() if seen is None else seen
    seen.add(module)
    path = next(p for p in SOURCES if module_name(p) == module)
    found = module_level_imports(path)
    return "torch" in found or any(imports_torch(m, seen) for m in found
                                   if m in MODULES and m not in seen)


def checkpoint_table() -> dict[str, tuple[str, str]]:
    """The code map's table of checkpoint/'s modules: module -> (runs in, imports torch);
    `writer/store.py` is workload.checkpoint.writer.store, `writer/__init__.py` the
    sub-package itself."""
    rows = re.findall(r"^\| `([\w/]+)\.py` \| [^|]+ \| ([^|]+) \| ([^|]+) \|$",
                      CODE_MAP.read_text(), re.M)
    return {f"workload.checkpoint.{name.removesuffix('/__init__').replace('/', '.')}":
            (runs.strip(), torch.strip().split()[0]) for name, runs, torch in rows}


WRITER_PACKAGE = "workload.checkpoint.writer"


def test_the_code_maps_checkpoint_table_is_true():
    table = checkpoint_table()
    package = {m for m in MODULES if m.startswith("workload.checkpoint.")}
    assert set(table) == package
    for module, (runs, torch) in table.items():
        assert torch == ("yes" if imports_torch(module) else "no"), module
        # The sub-package holds what the writer process may import, and only that.
        in_writer = module == WRITER_PACKAGE or module.startswith(WRITER_PACKAGE + ".")
        assert (runs in ("both", "writer process")) == in_writer, module


def test_the_writer_process_imports_only_its_sub_package_and_the_bottom_layer():
    code = ("import sys, workload.checkpoint.writer.process; print(' '.join(m for m in "
            "sys.modules if m.startswith('workload')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=120).stdout.split()
    outside = [m for m in loaded if not m.startswith(WRITER_PACKAGE)
               and m not in ("workload", "workload.checkpoint") and layer_of(m) != 1]
    assert outside == []
    sub_package = {m for m in MODULES if m.startswith(WRITER_PACKAGE)}
    assert sorted(m for m in loaded if m.startswith(WRITER_PACKAGE)) == sorted(sub_package)


@pytest.mark.parametrize("command, argv", [
    ("workload.train", ["--help"]),
    ("workload.train", ["--version"]),
    ("workload.train", ["--batch-size", "0"]),
    ("workload.train", ["--checkpoint-every", "soon"]),
    ("workload.bench.cli", ["--help"]),
    ("workload.bench.cli", ["train", "--steps", "0"]),
    ("workload.doctor", ["--help"]),
    ("workload.doctor", ["--probe-iters", "0"]),
    ("workload.report", ["--help"]),
    ("workload.evaluate", ["--help"]),
    ("workload.evaluate", ["--version"]),
    ("workload.evaluate", ["runs/x", "--batch-size", "0"]),
    ("workload.evaluate", ["no/such/run"]),
    ("workload.predict", ["--help"]),
    ("workload.predict", ["--version"]),
    ("workload.predict", ["runs/x", "a.png", "--top-k", "0"]),
    ("workload.predict", ["no/such/run", "a.png"]),
])
def test_help_version_and_usage_errors_import_no_torch(command, argv):
    code = (f"import sys; from {command} import main; sys.argv[0] = 'x'; main({argv!r})")
    assert heavy_imports(code) == []


def test_no_test_module_imports_another():
    tests = ROOT.parent / "tests"
    for path in tests.rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                last = node.module.split(".")[-1]
                assert not (last.startswith("test_") or last == "conftest"), (
                    f"{path} imports {node.module}: shared code belongs in tests/helpers")
