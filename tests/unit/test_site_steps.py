"""The step markers of the site pages (tests/twins/page_steps.py) and the twins' data files
(tests/twins/*.toml): read right, and every value cited."""

from __future__ import annotations

import pytest

import re
import tomllib

from tests.helpers import REPO
from tests.twins.page_steps import page_steps, unmarked_blocks
from tests.twins.twin import TWINS, twin_data

PAGE = """Intro.

<!-- step: login -->
```bash
echo one
```

Not a step:

```bash
echo never
```

1. In a list:

   <!-- step: batch jobs/sites/x.sbatch -->
   ```bash
   module load A
     indented
   ```
"""


def test_a_shell_block_with_no_marker_is_found_and_a_reason_marks_one():
    assert unmarked_blocks(PAGE) == [10]
    marked = PAGE.replace("Not a step:\n\n", "<!-- not a step: needs ssh to a node -->\n")
    assert unmarked_blocks(marked) == []
    no_reason = PAGE.replace("Not a step:\n\n", "<!-- not a step: -->\n")
    assert unmarked_blocks(no_reason) == [9]


@pytest.mark.parametrize("site", sorted(path.stem for path in TWINS.glob("*.toml")))
def test_every_shell_block_of_a_site_page_is_a_step_or_says_why_not(site):
    page = (REPO / twin_data(site)["page"]).read_text()
    assert unmarked_blocks(page) == [], f"{site}: a ```bash block with no step marker"


def test_the_marked_blocks_are_the_steps_in_order_and_dedented():
    steps = page_steps(PAGE)
    assert [(s.kind, s.header, s.text, s.line) for s in steps] == [
        ("login", None, "echo one\n", 4),
        ("batch", "jobs/sites/x.sbatch", "module load A\n  indented\n", 17)]


@pytest.mark.parametrize("page, message", [
    ("<!-- step: login -->\ntext\n", "must be followed by a ``` fence"),
    ("<!-- step: login -->\n```bash\necho\n", "never closed"),
    ("<!-- step: batch -->\n```bash\necho\n```\n", "`batch` names its header file"),
    ("<!-- step: continue x.sbatch -->\n```bash\necho\n```\n", "`continue` name none"),
])
def test_a_marker_that_cannot_be_a_step_is_an_error(page, message):
    with pytest.raises(ValueError, match=message):
        page_steps(page)


@pytest.mark.parametrize("site", sorted(path.stem for path in TWINS.glob("*.toml")))
def test_every_twin_names_a_page_with_steps_and_cites_each_table(site):
    data = twin_data(site)
    assert page_steps((REPO / data["page"]).read_text())
    # How a compute node reaches the internet: the centre's proxy, directly, or (where
    # the centre does not say) not at all.
    assert data["network"]["compute"] in ("proxy", "direct", "none"), site
    assert (data["network"]["compute"] == "proxy") == ("proxy" in data["network"]), site
    for name, table in data.items():
        if isinstance(table, dict):
            sources = table.get("source", [])
            if any(s.startswith("NOT CONFIRMED") for s in sources):
                continue  # no page says it (a generic site): said so, as the pages do
            assert any(s.startswith("https://") for s in sources), (site, name)
            assert any(s.startswith("read 2026-") for s in sources), (site, name)
    for name, spec in data["modules"]["available"].items():
        assert spec.get("requires", "") in ("", *data["modules"]["available"]), name
        # Each module the twin offers, next to the centre's page that names it.
        sources = spec.get("source", [])
        assert sources and sources[0].startswith("NOT CONFIRMED") or (
            any(s.startswith("https://") for s in sources)
            and any(s.startswith("read 2026-") for s in sources)), (site, name)


SITES = sorted(path.stem for path in TWINS.glob("*.toml"))


def cited_section(site: str, title: str, table: str) -> tuple[dict, str]:
    """(the twin's table, the page's section under `## title`, its whitespace made one
    space), the section checked to cite every page the table was read from and the date."""
    data = twin_data(site)
    page = (REPO / data["page"]).read_text()
    assert page.count(f"## {title}") == 1, site
    said = " ".join(page.split(f"## {title}", 1)[1].split("\n## ", 1)[0].split())
    for source in data[table]["source"]:
        if source.startswith("https://"):
            assert source in said, (site, source)
    read = next((s for s in data[table]["source"] if s.startswith("read 2026-")), None)
    assert read is None or read.removeprefix("read ") in said, (site, read)
    return data[table], said


@pytest.mark.parametrize("site", SITES)
def test_each_page_names_its_node_local_folder_as_its_twin_cites_it(site):
    """A page's "The node-local folder" section says the folder a job has on the centre's
    GPU nodes, what it is, when it is wiped, and where the package's caches go there
    (workload/caches.py's rule), each as the twin's [node_local] table holds it, next to
    the pages it was read from and the date."""
    table, said = cited_section(site, "The node-local folder", "node_local")
    for key in ("folder", "kind", "wiped", "caches"):
        assert table[key] in said, (site, key, table[key])
    assert "cluster.md#cache-folders" in said, site


@pytest.mark.parametrize("site", SITES)
def test_each_page_states_its_centres_quotas_and_purges_as_its_twin_cites_them(site):
    """A page's "Quotas and purges" section gives the scratch purge and the quotas the
    centre documents, each as the twin's [storage] table holds it, with the pages read and
    the date; where no centre page says them, the page says NOT CONFIRMED."""
    table, said = cited_section(site, "Quotas and purges", "storage")
    for fact in table["facts"]:
        assert fact in said, (site, fact)


@pytest.mark.parametrize("site", SITES)
def test_each_page_continues_a_run_as_its_twin_cites_the_centre(site):
    """A page's "Continue a run" section states how the centre ends and continues a job
    (its longest job, requeue, preemption), each fact as the twin's [continue] table
    holds it with the pages read and the date, and ends with one continue step: the
    page's job line again with TRAIN_RUN_ID=<jobid>, its job script asking --requeue
    only where the centre's pages say a job may be requeued."""
    table, said = cited_section(site, "Continue a run", "continue")
    for fact in table["facts"]:
        assert fact in said, (site, fact)
    page = (REPO / twin_data(site)["page"]).read_text()
    steps = page_steps(page)
    assert [step.kind for step in steps].count("continue") == 1, site
    assert steps[-1].kind == "continue", site  # after every job it continues
    assert "TRAIN_RUN_ID=<jobid> sbatch" in steps[-1].text, steps[-1].text
    script = re.search(r"jobs/\S+\.sbatch", steps[-1].text).group()
    requeues = "\n#SBATCH --requeue\n" in (REPO / script).read_text()
    assert requeues == table["requeue"], (site, script)


OUR_FILES = re.compile(r"(?<![\w./:-])(docs|jobs)/[\w./-]+")


@pytest.mark.parametrize("site", SITES)
def test_no_twin_value_comes_from_our_pages(site):
    """A twin holds the centre's rules (issue 60): every `source` names the centre's pages
    (or says NOT CONFIRMED), never a file of this project, and past the header that names
    the page the twin runs, no comment gives one of our pages as where a value comes from
    ("as docs/sites/X.md states it")."""
    text = (TWINS / f"{site}.toml").read_text()

    def sources(table) -> list[str]:
        if isinstance(table, dict):
            own = table.get("source", [])
            return [*own, *(s for key, value in table.items() if key != "source"
                            for s in sources(value))]
        return []
    named = [source for source in sources(tomllib.loads(text)) if OUR_FILES.search(source)]
    assert not named, (site, named)
    body = re.split(r"\n(?:page|base) = .*\n", text, maxsplit=1)[1]  # past the header
    assert not OUR_FILES.search(body), (site, OUR_FILES.search(body).group())
