"""`train --compile` carries its compiled kernels to the next job in one file of the run
folder: a resumed job in a fresh temp folder (another node: its node-local caches empty)
unpacks it and takes its graphs from the cache, and ends bit-exact with a cold-compiled
run. Nothing is written under $HOME (set to an empty folder, then unset), and nothing
of the compilers' own lands in the run folder but that one file. The jobs run as
subprocesses (`python -m workload.train`), as a job script starts them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import CHECKPOINT_ARGS, clean_env
from workload.caches import CACHE_KEYS

pytestmark = pytest.mark.slow

COMPILED = [*CHECKPOINT_ARGS, "--epochs", "1", "--compile"]


def start(out: Path, top: Path, name: str, *args: str, home: Path | None = None):
    """`train` as a new job on a node of its own: a fresh temp folder, no cache variable."""
    tmp = top / f"tmp-{name}"
    tmp.mkdir()
    env = {k: v for k, v in clean_env().items() if k not in CACHE_KEYS and k != "HOME"}
    env.update(TMPDIR=str(tmp), **({"HOME": str(home)} if home else {}))
    log = open(top / f"{name}.log", "w")
    return subprocess.Popen([sys.executable, "-m", "workload.train", *COMPILED, *args,
                             "--output-dir", str(out)], env=env, stdout=log,
                            stderr=subprocess.STDOUT, cwd=top)


def finish(proc, top: Path, name: str, out: Path) -> tuple[dict, str]:
    proc.wait(timeout=600)
    text = (top / f"{name}.log").read_text()
    assert proc.returncode == 0, text[-4000:]
    return json.loads((out / "summary.json").read_text()), text


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """A cold job stopped at step 2 (home: an empty folder) and a cold uninterrupted one
    side by side; then the first one's second job, on "another node", with HOME unset."""
    top = tmp_path_factory.mktemp("compile")
    home = top / "home"
    home.mkdir()
    first, cold = start(top / "run", top, "first", "--max-steps", "2", home=home), \
        start(top / "cold", top, "cold", "--resume", "never")
    ran = {"first": finish(first, top, "first", top / "run"),
           "cold": finish(cold, top, "cold", top / "cold")}
    ran["second"] = finish(start(top / "run", top, "second"), top, "second", top / "run")
    return top, ran


def test_the_first_job_compiles_saves_one_file_and_writes_nothing_in_home(jobs):
    top, ran = jobs
    summary, text = ran["first"]
    assert summary["steps_run"] == 2 and summary["first_step_s"] > 0
    facts = summary["compile_cache"]
    assert facts["files_loaded"] == 0 and facts["graphs_compiled"] > 0, facts
    assert f"files saved to {facts['artifact']}" in text
    phases = summary["startup"]["phases_s"]  # the compilers' share of the first step
    assert phases["compile"] > 0 and phases["compile"] + phases["first step"] > 0
    assert sum(phases.values()) == pytest.approx(summary["startup"]["to_first_step_s"])
    assert list((top / "home").iterdir()) == []
    run = top / "run"
    own = [p.relative_to(run).as_posix() for p in run.rglob("*")
           if any(word in p.relative_to(run).as_posix()
                  for word in ("inductor", "triton", "compile", "kernel"))
           or p.suffix in (".so", ".py", ".cpp", ".pkl")]
    assert own == [facts["artifact"]], own


def test_the_next_job_on_another_node_compiles_from_the_file_bit_exact_with_a_cold_one(jobs):
    _, ran = jobs
    summary, text = ran["second"]
    facts = summary["compile_cache"]
    assert facts["files_loaded"] > 0 and facts["graphs_from_cache"] > 0, facts
    assert f"compile cache: {facts['files_loaded']} files from {facts['artifact']}" in text
    assert "resumed from" in text or "resuming" in text, text[-3000:]
    # A resumed job's first step (its compilation) is timed apart too, not as throughput.
    assert summary["first_step_s"] > 0
    assert summary["model_sha256"] == ran["cold"][0]["model_sha256"]

