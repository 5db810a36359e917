"""Every srun line a user copies (README, docs/, jobs/) gives its tasks CPUs.

Whether a step inherits the job's --cpus-per-task differs between Slurm versions, and on
a whole-node allocation a task left with one CPU trains with one thread and no data
workers; so every srun we print or run says --cpus-per-task itself.
"""

from __future__ import annotations

import re

from tests.helpers import REPO

# srun as a command word: at the start, or after a wrapper such as run_requeueable.
SRUN = re.compile(r"(^|\s)srun\s+-")


def joined(text: str) -> list[str]:
    return text.replace("\\\n", " ").splitlines()


def doc_srun_lines() -> list[tuple[str, str]]:
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    found = []
    for page in pages:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
            found += [(page.name, line.strip()) for line in joined(block) if SRUN.search(line)]
    return found


def job_srun_lines() -> list[tuple[str, str]]:
    found = []
    for path in sorted((REPO / "jobs").rglob("*")):
        if path.is_file() and path.suffix in (".sh", ".sbatch"):
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
