"""Every srun line a user copies (README, docs/, jobs/, the image's run-help) gives its tasks CPUs.

Whether a step inherits the job's --cpus-per-task differs between Slurm versions, and on
a whole-node allocation a task left with one CPU trains with one thread and no data
workers; so every srun we print or run says --cpus-per-task itself.
"""

from __future__ import annotations

import re

from tests.helpers import REPO

# srun as a command word: at the start, or after a wrapper such as run_requeueable.
SRUN = re.compile(r"(^|\s)srun\s+-")
# In a page's bash block, whatever follows it: an option, `exec srun apptainer ...`, or
# "srun ..." that a reader fills in (and may fill in without --cpus-per-task).
SRUN_IN_CODE = re.compile(r"(^|[\s;&|(])srun\s")


def joined(text: str) -> list[str]:
    return text.replace("\\\n", " ").splitlines()


def doc_srun_lines() -> list[tuple[str, str]]:
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    found = []
    for page in pages:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
            found += [(page.name, line.strip()) for line in joined(block)
                      if SRUN_IN_CODE.search(line)]
    return found


def job_srun_lines() -> list[tuple[str, str]]:
    """The job scripts' srun lines, and those `apptainer run-help` prints from the image."""
    found = []
    files = [*sorted((REPO / "jobs").rglob("*")), *sorted((REPO / "apptainer").glob("*.def"))]
    for path in files:
        if path.is_file() and path.suffix in (".sh", ".sbatch", ".def"):
            for line in joined(path.read_text()):
                code = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
                if SRUN.search(code):
                    found.append((path.name, code.strip()))
    return found


def test_there_are_srun_lines_to_check():
    assert len(doc_srun_lines()) >= 15 and job_srun_lines()


def test_every_srun_line_in_docs_and_jobs_gives_cpus_per_task():
    missing = [f"{name}: {line}" for name, line in doc_srun_lines() + job_srun_lines()
               if "--cpus-per-task" not in line]
    assert not missing, "srun without --cpus-per-task:\n" + "\n".join(missing)


# One home for the srun forms: docs/cluster.md's "The srun forms". A page that starts a
# training or your script in the image (outside the centre pages, whose runtimes differ)
# uses one of its option sets, or links there, instead of a slightly different line.
FORMS = REPO / "docs" / "cluster.md"
STARTS_A_TRAINING = re.compile(r"\sapptainer exec .*\s(train|entrypoint\.sh|python)\s")


def srun_options(line: str) -> str:
    """`srun --a --b` of a joined srun line: the options before the runtime command."""
    return line[line.index("srun "):line.index(" apptainer exec")].strip()


def the_forms() -> list[str]:
    text = FORMS.read_text()
    section = text[text.index("## The srun forms"):]
    section = section[:section.index("\n## ", 1)]
    return [line.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)
            for line in joined(block) if SRUN.search(line)]


def training_lines_elsewhere() -> list[tuple[str, str]]:
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    found = []
    for page in (p for p in pages if p != FORMS):
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
            found += [(page.name, line.strip()) for line in joined(block)
                      if SRUN.search(line) and STARTS_A_TRAINING.search(line)]
    return found


def test_the_srun_forms_section_holds_both_layouts_and_your_script():
    forms = the_forms()
    assert len(forms) == 5, forms
    assert {srun_options(line) for line in forms} == {
        "srun --ntasks-per-node=4 --gpus-per-task=1 --cpus-per-task=$((SLURM_CPUS_ON_NODE / 4))"
        " --kill-on-bad-exit=1",
        "srun --ntasks=$SLURM_NNODES --ntasks-per-node=1 --cpus-per-task=$SLURM_CPUS_ON_NODE"
        " --kill-on-bad-exit=1"}


def test_other_pages_use_the_forms_options_and_do_not_repeat_the_lines():
    forms = the_forms()
    options = {srun_options(line) for line in forms}
    elsewhere = training_lines_elsewhere()
    assert elsewhere, "no training srun line outside cluster.md: the check sees nothing"
    different = [f"{name}: {line}" for name, line in elsewhere
                 if srun_options(line) not in options]
    assert not different, ("srun options other than cluster.md#the-srun-forms:\n"
                           + "\n".join(different))
    repeated = [f"{name}: {line}" for name, line in elsewhere if line in forms]
    assert not repeated, "a form repeated instead of linked:\n" + "\n".join(repeated)


SITE_PAGES = {path.name for path in (REPO / "docs" / "sites").glob("*.md")}


def test_a_site_step_inside_a_job_gives_its_task_count():
    """Inside a job, srun takes the job's task count from SLURM_NTASKS over
    --ntasks-per-node (the Alliance twin showed one process where the page meant four):
    a site page's srun that asks several tasks a node and no --nodes (a step of a job,
    not an allocation typed at the login prompt) says --ntasks too."""
    for page, line in doc_srun_lines():
        per_node = re.search(r"--ntasks-per-node=(\d+)", line)
        if page in SITE_PAGES and per_node and int(per_node.group(1)) > 1 \
                and "--nodes" not in line:
            assert "--ntasks=" in line, (page, line)

