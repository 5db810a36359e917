"""`train --compile` carries its compiled kernels to the next job in one file of the run
folder: a job in a fresh temp folder (another node: its node-local caches empty) unpacks
it and takes its graphs from the cache, and ends bit-exact with the cold-compiled job.
Nothing is written under $HOME (set to an empty folder, then unset), and nothing of the
compilers' own lands in the run folder but that one file. The jobs run as subprocesses
(`python -m workload.train`), as a job script starts them: a cold job of four steps, then
one on "another node" that resumes from its step-2 checkpoint (`--resume PATH`) and
compiles from the file, so that both end at step 4 and one cold compilation serves both
the first job's test and the reference (each takes about a minute of CPU here). Both
with the whole model compiled and with each residual block compiled on its own
(`--compile-scope blocks`) and with the whole step compiled, the optimizer step in its
graph (`--compile-scope step`): each keeps exact resume.

What makes the jobs cheaper without touching what is tested (measured on the 2-core
machine, the whole model compiled, CPU-s of a cold job and a warm one: 120 and 29 before,
111 and 25 with one evaluation batch, 82 and 25 with scalar kernels too): the test split
is 16 images, one evaluation batch (25 gave a second batch of 9, a graph Inductor
compiled once more for its shape), and both jobs build scalar C++ kernels
(TORCHINDUCTOR_VEC_ISA_OK=0: the vectorised ones made a cold job a third dearer; how
the kernels are carried and found is the same for either kind).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import CHECKPOINT_ARGS, clean_env
from workload.caches import CACHE_KEYS

pytestmark = pytest.mark.slow

COMPILED = [*CHECKPOINT_ARGS, "--synthetic-size", "80", "--epochs", "1", "--compile"]
INDUCTOR = {"TORCHINDUCTOR_VEC_ISA_OK": "0"}  # scalar kernels: see the docstring


def start(out: Path, top: Path, name: str, *args: str, home: Path | None = None):
    """`train` as a new job on a node of its own: a fresh temp folder, no cache variable."""
    tmp = top / f"tmp-{name}"
    tmp.mkdir()
    env = {k: v for k, v in clean_env().items() if k not in CACHE_KEYS and k != "HOME"}
    env.update(TMPDIR=str(tmp), **INDUCTOR, **({"HOME": str(home)} if home else {}))
    log = open(top / f"{name}.log", "w")
    return subprocess.Popen([sys.executable, "-m", "workload.train", *COMPILED, *args,
                             "--output-dir", str(out)], env=env, stdout=log,
                            stderr=subprocess.STDOUT, cwd=top)


def finish(proc, top: Path, name: str, out: Path) -> tuple[dict, str]:
    proc.wait(timeout=600)
    text = (top / f"{name}.log").read_text()
    assert proc.returncode == 0, text[-4000:]
    return json.loads((out / "summary.json").read_text()), text


@pytest.fixture(scope="module", params=["model", "blocks", "step"])
def jobs(request, tmp_path_factory):
    """The cold job (home: an empty folder), then the warm one on "another node", with HOME
    unset, from the cold job's step-2 checkpoint to the same step 4; the whole model
    compiled, each residual block (--compile-scope blocks, the regions in which
    Inductor fuses BatchNorm, ReLU and the residual add), or the whole step (--compile-scope
    step: the optimizer step compiled too, its state and the step count carried by the
    checkpoint)."""
    top = tmp_path_factory.mktemp("compile")
    home = top / "home"
    home.mkdir()
    scope = ["--compile-scope", request.param]
    ran = {"first": finish(start(top / "run", top, "first", "--max-steps", "4", *scope,
                                 home=home), top, "first", top / "run")}
    middle = top / "run" / "checkpoints" / "step-000000002"
    ran["second"] = finish(start(top / "run", top, "second", "--max-steps", "4", *scope,
                                 "--resume", str(middle)), top, "second", top / "run")
    return top, ran


def test_the_first_job_compiles_saves_one_file_and_writes_nothing_in_home(jobs):
    top, ran = jobs
    summary, text = ran["first"]
    assert summary["steps_run"] == 4 and summary["first_step_s"] > 0
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


def test_the_next_job_on_another_node_compiles_from_the_file_bit_exact_with_the_cold_one(
        jobs):
    _, ran = jobs
    summary, text = ran["second"]
    facts = summary["compile_cache"]
    assert facts["files_loaded"] > 0 and facts["graphs_from_cache"] > 0, facts
    assert f"compile cache: {facts['files_loaded']} files from {facts['artifact']}" in text
    assert "resumed from" in text and "step-000000002" in text, text[-3000:]
    # A resumed job's first step (its compilation) is timed apart too, not as throughput.
    assert summary["first_step_s"] > 0
    assert summary["steps_run"] == 4  # the run's steps, the first job's two included
    assert summary["model_sha256"] == ran["first"][0]["model_sha256"]

