"""The documentation holds together: every relative link in README.md and docs/*.md
resolves to an existing file (and, for `page.md#anchor`, to a heading of that page), and
README.md stays a short entry page.

Standard library only (no torch): `python3 tests/unit/test_docs.py`, or under pytest without
the suite's conftest (which needs the test environment):
`python3 -m pytest --noconftest tests/unit/test_docs.py`.
"""

from __future__ import annotations

import re
import unittest
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[2]  # the repository: tests/unit/ is two down
README_MAX_LINES = 200

# [text](target) and ![alt](target), the target up to whitespace or ")"; an optional title
# ("...") after it is allowed. Reference definitions: "[name]: target" on a line of their own.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
HTML_LINK = re.compile(r"<(?:a|img)\s[^>]*?(?:href|src)=\"([^\"]+)\"", re.IGNORECASE)
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})")
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.IGNORECASE)


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]


def strip_fenced(text: str) -> str:
    """The text with the lines of fenced code blocks blanked."""
    kept, fence = [], None
    for line in text.splitlines():
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(2)
            kept.append("")
        elif fence is not None:
            if line.strip().startswith(fence) and set(line.strip()) <= {fence[0]}:
                fence = None
            kept.append("")
        else:
            kept.append(line)
    return "\n".join(kept)


def strip_code(text: str) -> str:
    """The text without fenced code blocks, inline code spans and HTML comments."""
    text = re.sub(r"<!--.*?-->", "", strip_fenced(text), flags=re.DOTALL)
    return re.sub(r"(`+)(?:(?!\1).)+?\1", "", text, flags=re.DOTALL)


def links(text: str) -> list[str]:
    text = strip_code(text)
    found = INLINE_LINK.findall(text) + REFERENCE_DEF.findall(text) + HTML_LINK.findall(text)
    return [target for target in found if not EXTERNAL.match(target)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|__", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for line in strip_fenced(path.read_text(encoding="utf-8")).splitlines():
        match = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def broken_links(path: Path, text: str | None = None) -> list[str]:
    """What is wrong with the relative links of PATH (or of TEXT, as if it were PATH)."""
    if text is None:
        text = path.read_text(encoding="utf-8")
    problems = []
    for target in links(text):
        file_part, _, anchor = target.partition("#")
        file_part = unquote(file_part)
        resolved = path if not file_part else (path.parent / file_part).resolve()
        where = f"{path.relative_to(ROOT)}: ({target})"
        if not resolved.exists():
            problems.append(f"{where}: no such file {resolved}")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{where}: no heading #{anchor} in {resolved.relative_to(ROOT)}")
        elif ROOT not in resolved.parents and resolved != ROOT:
            problems.append(f"{where}: points outside the repository")
    return problems


class DocsTest(unittest.TestCase):
    def test_docs_exist(self):
        for name in ("README.md", "cluster.md", "checkpoints.md", "data-and-models.md",
                     "images.md", "performance.md", "monitoring.md", "development.md",
                     "code-map.md", "your-script.md", "sites/pyxis.md", "sites/cscs-alps.md",
                     "sites/sigma2-olivia.md", "sites/alliance.md"):
            self.assertTrue((ROOT / "docs" / name).is_file(), f"docs/{name} is missing")

    def test_docs_readme_is_the_one_index_of_every_page(self):
        index = ROOT / "docs" / "README.md"
        listed = {(index.parent / target.split("#")[0]).resolve()
                  for target in links(index.read_text(encoding="utf-8"))}
        pages = set(doc_files()) - {ROOT / "README.md", index}
        unlisted = sorted(str(page.relative_to(ROOT)) for page in pages - listed)
        self.assertEqual(unlisted, [], "pages docs/README.md does not list")
        # A second list in the README drifts from the first: it links the index instead.
        readme = (ROOT / "README.md").read_text(encoding="utf-8")
        self.assertIn("(docs/README.md)", readme)
        self.assertFalse("| page |" in readme, "README.md keeps a second list of the pages")

    def test_relative_links_resolve(self):
        problems = [problem for path in doc_files() for problem in broken_links(path)]
        self.assertEqual(problems, [], "\n".join(problems))

    def test_links_are_found(self):
        # The checker sees the README's links (guards against a pattern matching nothing).
        targets = links((ROOT / "README.md").read_text(encoding="utf-8"))
        self.assertIn("docs/cluster.md", targets)
        self.assertIn("docs/img/digits-training.png", targets)

    def test_checker_catches_broken_links(self):
        text = ("[gone](no-such-page.md) [bad anchor](cluster.md#no-such-heading)\n"
                "[fine](cluster.md#the-srun-forms) [web](https://example.org/x.md)\n"
                "`[in code](ignored.md)`\n```\n[in a block](ignored.md)\n```\n")
        problems = broken_links(ROOT / "docs" / "sample.md", text)
        self.assertEqual(len(problems), 2, problems)
        self.assertIn("no such file", problems[0])
        self.assertIn("no heading #no-such-heading", problems[1])

    def test_readme_is_short(self):
        lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
        self.assertLess(lines, README_MAX_LINES,
                        f"README.md has {lines} lines; move detail into docs/")

    def test_readme_keeps_the_test_command(self):
        # CI (.ci/run) calls `make test`; the README names it as the test command.
        self.assertIn("make test", (ROOT / "README.md").read_text(encoding="utf-8"))


if __name__ == "__main__":
    unittest.main()
