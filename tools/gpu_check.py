#!/usr/bin/env python3
"""The GPU check: install the package without network, run the GPU test tier and the GPU
benchmarks, and write gpu-check.json and gpu-check.md. Standard library only, so it runs
with any Python that has torch (a bare GPU machine, the container image, a CI venv).

    make gpu-check                                   # on a GPU machine: everything
    make gpu-check PART=tests   /   PART=bench       # the two halves, each under 8 minutes
    make gpu-check DEVICE=cpu GPU_CHECK_OUT=DIR      # CI: the whole kit, tiny, on a CPU
    python3 tools/gpu_check.py --part tests --out DIR   # the same without make

Steps: (1) `pip install --no-deps --no-index` of the wheels listed in
requirements/gpu-wheels.txt (from --wheels, filled here by `make gpu-wheels`) and of this
repository, into a throwaway folder put first on PYTHONPATH (the console scripts on PATH);
(2) `pytest -m gpu tests/gpu` (only that folder: no recursion into the suite, no SLURM or
image tests), each test stopped by pytest-timeout after TEST_TIMEOUT_S unless it marks a
longer limit; (3) `python -m workload.bench.kit`; the report is written after each.

Each part runs in a process group of its own and stops at PART_LIMIT_S, or earlier where
the run's --deadline would pass (gpu_check_procs.py: nothing it started outlives it); a
part that cannot start in time is reported as not run. Exit status 0 when every part that
ran passed, 1 when something failed or stopped, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from gpu_check_procs import STOP_RESERVE_S, Finished, adopt_orphans, run_logged
from gpu_check_report import Report, not_run, part_record, read_junit, running_test

REPO = Path(__file__).resolve().parents[1]
WHEEL_LIST = REPO / "requirements" / "gpu-wheels.txt"
PACKAGE_FILES = ("pyproject.toml", "README.md", "LICENSE", "NOTICE")
# One part must end inside the lent GPU machine's 10-minute command limit; the whole run
# (install, facts, the parts, their stops) inside --deadline, 9 minutes unless told.
PART_LIMIT_S, DEADLINE_S = 450, 540
TEST_TIMEOUT_S = 300  # each test's own limit; the compile test marks a longer one
FACTS_LIMIT_S, MIN_PART_S = 120, 20
KIT_RESERVE_S = 15  # the benchmark's own end before its part's: its JSON written, CUDA left


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes (the CPU form in CI); --device cpu implies it")
    p.add_argument("--part", default="all", choices=("all", "tests", "bench"))
    p.add_argument("--skip", default="", help="the benchmark's configs or parts to leave out "
                                              "(python -m workload.bench.kit --help)")
    p.add_argument("--out", default="runs/gpu-check", help="report folder")
    p.add_argument("--wheels", default=str(REPO / ".gpu-wheels"),
                   help="folder holding the wheels of requirements/gpu-wheels.txt")
    p.add_argument("--deadline", type=float, default=DEADLINE_S,
                   help=f"seconds for the whole run (default {DEADLINE_S}: under a 10-minute "
                        "command limit); 0 = none")
    args = p.parse_args(argv)
    shortest = STOP_RESERVE_S + 2 * MIN_PART_S  # room for the install and one part
    if args.deadline != 0 and not args.deadline >= shortest:
        p.error(f"--deadline {args.deadline:g}: expected 0 (no deadline) or at least "
                f"{shortest} seconds; raise it or leave it out ({DEADLINE_S})")
    if args.device == "cpu" and not args.quick:
        # The full sizes take far longer than a part's limit on a CPU.
        print("gpu-check: --device cpu runs the quick sizes", flush=True)
        args.quick = True
    return args


class Clock:
    """The run's deadline, and the limit a part may have within it."""

    def __init__(self, deadline_s: float):
        self.deadline_s = deadline_s
        self.started = time.monotonic()

    def limit(self, part_limit: float) -> tuple[float, str]:
        """Seconds the next part may run (a stop may add STOP_RESERVE_S), and why."""
        if not self.deadline_s:
            return part_limit, "the part's limit"
        left = self.deadline_s - (time.monotonic() - self.started) - STOP_RESERVE_S
        if left < part_limit:
            return left, f"the run's deadline of {self.deadline_s:.0f} s"
        return part_limit, "the part's limit"


def package_source(into: Path) -> Path:
    """What the package is built from, copied as the Dockerfile copies it: setuptools
    builds in the source folder, and its build/ there would keep modules since removed
    (and a checkout bound read-only into a container could not be written)."""
    into.mkdir()
    for name in PACKAGE_FILES:
        shutil.copy2(REPO / name, into / name)
    shutil.copytree(REPO / "workload", into / "workload",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return into


def install_command(site: Path, wheels: Path) -> list[str]:
    """The carried wheels, then the repository, into `site`: no network, no dependencies
    resolved (the machine's torch, torchvision, numpy, safetensors and pytest are used)."""
    # One pip command: a second one into the same --target would leave out the scripts
    # (pip does not merge into an existing bin/ folder). Building the repository needs
    # setuptools from this interpreter: no isolated build environment, which needs network.
    return [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
            "--no-cache-dir", "--no-compile", "--no-build-isolation", "--target", str(site),
            "--find-links", str(wheels), "-r", str(WHEEL_LIST),
            str(package_source(site.parent / "src"))]


def install_record(finished: Finished, why_limit: str, log: Path, wheels: Path) -> dict:
    record = part_record(finished, why_limit)
    if record["status"] == "passed":
        log.unlink()
        return dict(record, wheels=sorted(p.name for p in wheels.glob("*.whl")))
    tail = [line for line in log.read_text().splitlines() if line.strip()][-8:]
    return dict(record, log=log.name, log_tail=tail + [
        f"are the wheels of {WHEEL_LIST.name} in {wheels}? Run `make gpu-wheels` where there "
        "is network and carry that folder"])


def kit_env(site: Path, args: argparse.Namespace) -> dict:
    """The installed copy first on the path; no pytest settings from a calling test run."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(site / "bin"), env.get("PATH", "")])
    env.update(GPU_CHECK_DEVICE=args.device, GPU_CHECK_QUICK="1" if args.quick else "0",
               PYTHONUNBUFFERED="1")
    return env


def tests_command(junit: Path, tests: str = "tests/gpu") -> list[str]:
    """pytest of the GPU tier; -v names each test as it starts (the one a stop
    interrupted); pytest-timeout's signal method fails a hung test and goes on."""
    return [sys.executable, "-m", "pytest", "-m", "gpu", tests, "-v", "-p", "no:cacheprovider",
            f"--junitxml={junit}", f"--timeout={TEST_TIMEOUT_S}", "--timeout-method=signal"]


def tests_record(finished: Finished, why_limit: str, out: Path) -> dict:
    record = part_record(finished, why_limit)
    junit = out / "junit.xml"
    if junit.exists():
        record.update(read_junit(junit))
        if record["failed"] and record["status"] == "passed":
            record.update(status="failed", note="failures in junit.xml")
    elif record["status"] == "passed":
        record.update(status="failed", note="pytest wrote no junit.xml")
    if finished.stopped:
        record["running"] = running_test((out / "tests.log").read_text())
    return record


def bench_command(args: argparse.Namespace, out: Path, limit_s: float) -> list[str]:
    """The benchmark, told to end KIT_RESERVE_S before the part's limit: a row still
    compiling then (max-autotune's) says so in bench.json instead of being killed unsaid."""
    return [sys.executable, "-m", "workload.bench.kit", "--device", args.device,
            "--json", str(out / "bench.json"), *(["--quick"] if args.quick else []),
            *(["--skip", args.skip] if args.skip else []),
            "--time-limit", f"{max(1.0, limit_s - KIT_RESERVE_S):.0f}"]


def bench_record(finished: Finished, why_limit: str, out: Path) -> dict:
    """The part's status and what the benchmark wrote before it ended (it writes each row
    as it is measured), never an earlier run's rows: bench.json is removed before."""
    record = part_record(finished, why_limit)
    try:
        measured = json.loads((out / "bench.json").read_text()).get("bench") or {}
    except (OSError, ValueError):
        measured = {}
    record.update(rows=measured.get("rows", []), choice=measured.get("choice", {}),
                  first_step=measured.get("first_step"), profile=measured.get("profile"),
                  errors=measured.get("errors", []), sizes=measured.get("sizes"),
                  data=measured.get("data"), parts=measured.get("parts", []),
                  parts_done=measured.get("parts_done", []), stopped=measured.get("stopped"))
    return record


def read_facts(out: Path, env: dict, clock: Clock) -> dict:
    """The device and versions, from the installed package (the bench part has them too)."""
    facts, log = out / "facts.json", out / "facts.log"
    limit, _ = clock.limit(FACTS_LIMIT_S)
    if limit < MIN_PART_S:
        return {}
    command = [sys.executable, "-m", "workload.bench.kit", "--facts", "--json", str(facts)]
    if run_logged(command, log, env, limit, REPO).exit_status != 0:
        return {}
    found = json.loads(facts.read_text())
    for path in (facts, log):  # keep $OUT to a few files (the device's limit)
        path.unlink()
    return {k: found.get(k) for k in ("device", "devices", "driver", "versions")}


def run_part(report: Report, clock: Clock, name: str, command, env: dict, read) -> bool:
    """One part under its limit (`command(limit)`: its command line), its record into the
    report; whether it passed."""
    limit, why = clock.limit(PART_LIMIT_S)
    if limit < MIN_PART_S:
        report.set(name, not_run(f"{why} left {max(limit, 0):.0f} s, too little to start"))
        return False
    finished = run_logged(command(limit), report.out / f"{name}.log", env, limit, REPO)
    report.set(name, read(finished, why))
    return report.data[name]["status"] == "passed"


def run_parts(args: argparse.Namespace, report: Report, clock: Clock, site: Path) -> bool:
    """Install, read the facts, run the parts asked for; whether all passed."""
    out, wheels = report.out, Path(args.wheels)
    limit, why = clock.limit(PART_LIMIT_S)
    finished = run_logged(install_command(site, wheels), out / "install.log",
                          dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1"), limit, REPO)
    report.set("install", install_record(finished, why, out / "install.log", wheels))
    parts = [p for p in ("tests", "bench") if args.part in ("all", p)]
    if report.data["install"]["status"] != "passed":
        for part in parts:
            report.set(part, not_run("the install failed"))
        return False
    env = kit_env(site, args)
    report.data.update(read_facts(out, env, clock))
    results = [report.data.get("device") is not None]
    if "tests" in parts:
        (out / "junit.xml").unlink(missing_ok=True)  # an earlier run's must not count
        results.append(run_part(report, clock, "tests",
                                lambda _: tests_command(out / "junit.xml"), env,
                                lambda f, why: tests_record(f, why, out)))
    if "bench" in parts:
        (out / "bench.json").unlink(missing_ok=True)
        results.append(run_part(report, clock, "bench",
                                lambda limit: bench_command(args, out, limit), env,
                                lambda f, why: bench_record(f, why, out)))
    return all(results)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    adopt_orphans()
    clock = Clock(args.deadline)
    parts = ("install",) + tuple(p for p in ("tests", "bench") if args.part in ("all", p))
    report = Report(out, dict(device=None, devices=None, driver=None, versions=None,
                              requested_device=args.device, quick=args.quick,
                              deadline_s=args.deadline), parts)
    report.write()
    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    try:
        passed = run_parts(args, report, clock, scratch / "site")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report.write()
    print((out / "gpu-check.md").read_text())
    print(f"gpu-check: {'passed' if passed else 'FAILED'}; report in "
          f"{out / 'gpu-check.json'} and gpu-check.md")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
