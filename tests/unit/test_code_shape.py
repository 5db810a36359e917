"""Two habits the package keeps (issue 48): a long line breaks inside brackets, never
after a backslash, and one line assigns one thing (`a, b = 1, 2` packs two unrelated
assignments; a swap, whose values read its targets, stays)."""

from __future__ import annotations

import ast
import io
import tokenize

import pytest

from tests.helpers import REPO

MODULES = sorted((REPO / "workload").rglob("*.py"))


def backslash_continuations(source: str) -> list[int]:
    """Lines that end in a backslash outside a string: the tokenizer joins them without
    a NL token, so a line's last token ends before the line does."""
    lines = source.splitlines()
    string_lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.STRING:
            string_lines.update(range(token.start[0], token.end[0]))
    return [number for number, line in enumerate(lines, 1)
            if line.rstrip().endswith("\\") and number not in string_lines
            and not line.lstrip().startswith("#")]


def packed_assignments(source: str) -> list[int]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple)
                and isinstance(node.value, ast.Tuple)
                and len(node.targets[0].elts) == len(node.value.elts)):
            targets = {ast.unparse(t) for t in node.targets[0].elts}
            read = {ast.unparse(n) for v in node.value.elts for n in ast.walk(v)
                    if isinstance(n, (ast.Name, ast.Attribute, ast.Subscript))}
            if not targets & read:  # a swap reads its targets: one statement by nature
                found.append(node.lineno)
    return found


@pytest.mark.parametrize("check", [backslash_continuations, packed_assignments])
def test_the_package_breaks_lines_in_brackets_and_assigns_one_thing_a_line(check):
    found = [f"{path.relative_to(REPO)}:{line}" for path in MODULES
             for line in check(path.read_text())]
    assert not found, f"{check.__name__}: {', '.join(found)}"


def test_the_checks_find_what_they_look_for():
    source = 'x = 1 + \\\n    2\na, b = 1, 2\na, b = b, a\ns = """a \\\nb"""\n'
    assert backslash_continuations(source) == [1]
    assert packed_assignments(source) == [3]
