#!/usr/bin/env python3
"""The GPU check: install the package without network, run the GPU test tier and the GPU
benchmarks, and write gpu-check.json and gpu-check.md. Standard library only, so it runs
with any Python that has torch (a bare GPU machine, the container image, a CI venv).

    make gpu-check                                   # on a GPU machine: everything
    make gpu-check PART=tests   /   PART=bench       # the two halves, each under 8 minutes
    make gpu-check DEVICE=cpu QUICK=1 GPU_CHECK_OUT=DIR   # CI: the whole kit, tiny, on a CPU
    python3 tools/gpu_check.py --help                # the same without make

Steps: (1) `pip install --no-deps --no-index` of the wheels listed in
requirements/gpu-wheels.txt (from --wheels, filled here by `make gpu-wheels`) and of this
repository, into a throwaway folder put first on PYTHONPATH (the console scripts on PATH);
(2) `pytest -m gpu tests/gpu` (only that folder: no recursion into the suite, no SLURM or
image tests); (3) `python -m workload.bench.kit`; (4) the report. Exit status 0 when every
part that ran passed, 1 when something failed, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEEL_LIST = REPO / "requirements" / "gpu-wheels.txt"
# Each part must end inside the GPU machine's 10-minute command limit, report included.
PART_TIMEOUT_S = 450
PACKAGE_FILES = ("pyproject.toml", "README.md", "LICENSE", "NOTICE")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--quick", action="store_true", help="tiny sizes (the CPU form in CI)")
    p.add_argument("--part", default="all", choices=("all", "tests", "bench"))
    p.add_argument("--out", default="runs/gpu-check", help="report folder")
    p.add_argument("--wheels", default=str(REPO / ".gpu-wheels"),
                   help="folder holding the wheels of requirements/gpu-wheels.txt")
    return p.parse_args(argv)


def run_logged(command: list[str], log: Path, env: dict, timeout: float) -> int:
    """Run `command` in the repository, its output into `log` and echoed; its exit status
    (124 when it ran out of time)."""
    print("gpu-check: $ " + " ".join(command), flush=True)
    with open(log, "w") as out:
        try:
            done = subprocess.run(command, cwd=REPO, env=env, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=timeout)
            status = done.returncode
        except subprocess.TimeoutExpired:
            out.write(f"\ngpu-check: stopped after {timeout:.0f} s\n")
            status = 124
    sys.stdout.write(log.read_text()[-4000:])
    return status


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


def install(site: Path, wheels: Path, log: Path) -> dict:
    """The carried wheels, then the repository, into `site`: no network, no dependencies
    resolved (the machine's torch, torchvision, numpy and safetensors are used)."""
    # One pip command: a second one into the same --target would leave out the scripts
    # (pip does not merge into an existing bin/ folder). Building the repository needs
    # setuptools from this interpreter: no isolated build environment, which needs network.
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
               "--no-cache-dir", "--no-compile", "--no-build-isolation", "--target", str(site),
               "--find-links", str(wheels), "-r", str(WHEEL_LIST),
               str(package_source(site.parent / "src"))]
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    if run_logged(command, log, env, PART_TIMEOUT_S) != 0:
        raise SystemExit(f"gpu-check: installing without network failed (see {log}); "
                         f"are the wheels of {WHEEL_LIST.name} in {wheels}? Run "
                         "`make gpu-wheels` where there is network and carry that folder")
    return dict(wheels=sorted(p.name for p in wheels.glob("*.whl")),
                into="a temporary pip --target folder, first on PYTHONPATH")


def kit_env(site: Path, args: argparse.Namespace) -> dict:
    """The installed copy first on the path; no pytest settings from a calling test run."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(site / "bin"), env.get("PATH", "")])
    env.update(GPU_CHECK_DEVICE=args.device, GPU_CHECK_QUICK="1" if args.quick else "0",
               PYTHONUNBUFFERED="1")
    return env


def run_tests(out: Path, env: dict) -> dict:
    junit = out / "junit.xml"
    junit.unlink(missing_ok=True)  # an earlier run's must not stand in for this one's
    started = time.perf_counter()
    status = run_logged([sys.executable, "-m", "pytest", "-m", "gpu", "tests/gpu", "-q",
                         "-p", "no:cacheprovider", f"--junitxml={junit}"],
                        out / "tests.log", env, PART_TIMEOUT_S)
    counts = read_junit(junit) if junit.exists() else dict(passed=0, failed=1, skipped=0)
    return dict(counts, exit_status=status, seconds=time.perf_counter() - started)


def read_junit(path: Path) -> dict:
    """passed/failed/skipped counts and the names of failed and skipped tests (with why)."""
    failed, skipped, total = [], [], 0
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        total += 1
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(name)
        elif (skip := case.find("skipped")) is not None:
            skipped.append(dict(test=name, reason=skip.get("message", "")))
    return dict(passed=total - len(failed) - len(skipped), failed=len(failed),
                skipped=len(skipped), failures=failed, skips=skipped)


def run_bench(out: Path, env: dict, args: argparse.Namespace) -> tuple[dict | None, int]:
    (out / "bench.json").unlink(missing_ok=True)
    command = [sys.executable, "-m", "workload.bench.kit", "--device", args.device,
               "--json", str(out / "bench.json"), *(["--quick"] if args.quick else [])]
    status = run_logged(command, out / "bench.log", env, PART_TIMEOUT_S)
    if status != 0 or not (out / "bench.json").exists():
        return None, status or 1
    return json.loads((out / "bench.json").read_text()), 0


def read_facts(out: Path, env: dict) -> dict:
    """The device and versions, from the installed package (the bench part has them too)."""
    facts = out / "facts.json"
    status = run_logged([sys.executable, "-m", "workload.bench.kit", "--facts", "--json",
                         str(facts)], out / "facts.log", env, 120)
    if status != 0:
        return {}
    found = json.loads(facts.read_text())
    for path in (facts, out / "facts.log"):  # keep $OUT to a few files (the device's limit)
        path.unlink()
    return found


def build_report(args: argparse.Namespace, facts: dict, previous: dict, tests: dict | None,
                 bench: dict | None, install_info: dict) -> dict:
    """gpu-check.json; a part not run this time keeps what an earlier part wrote."""
    bench_part = bench["bench"] if bench else None
    return dict(
        device=facts.get("device"), driver=facts.get("driver"),
        versions=facts.get("versions"), quick=args.quick, requested_device=args.device,
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        install=install_info,
        tests=tests if tests is not None else previous.get("tests"),
        bench=bench_part["rows"] if bench_part else previous.get("bench"),
        profile=bench_part["profile"] if bench_part else previous.get("profile"),
        bench_sizes=bench_part["sizes"] if bench_part else previous.get("bench_sizes"),
    )


def markdown(report: dict) -> str:
    lines = [f"# GPU check: {report['device']}", "",
             f"{report['date']}; driver {report['driver'] or '-'}; " + ", ".join(
                 f"{k} {v}" for k, v in (report["versions"] or {}).items()), ""]
    if tests := report["tests"]:
        lines += [f"## Tests (`pytest -m gpu tests/gpu`): {tests['passed']} passed, "
                  f"{tests['failed']} failed, {tests['skipped']} skipped", ""]
        lines += [f"- failed: `{name}`" for name in tests.get("failures", [])]
        lines += [f"- skipped: `{s['test']}`: {s['reason']}" for s in tests.get("skips", [])]
        lines.append("")
    if rows := report["bench"]:
        lines += ["## Reference loop against train's defaults", "",
                  "| model | batch | reference images/s | train images/s | ratio | MFU (bf16) |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        lines += [f"| {r['model']} | {r['batch_size']} | {r['reference_images_per_second']:,.1f}"
                  f" | {r['images_per_second']:,.1f} | {r['ratio']:.2f} | {percent(r['mfu'])} |"
                  for r in rows]
        lines.append("")
    if profile := report["profile"]:
        lines += profile_lines(profile)
    return "\n".join(lines) + "\n"


def percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f} %"


def profile_lines(profile: dict) -> list[str]:
    lines = [f"## One train step, profiled ({profile['model']}, batch {profile['batch_size']}, "
             f"{profile['precision']}; shares of {profile['basis']})", "",
             "| phase | ms | share |", "| --- | ---: | ---: |"]
    lines += [f"| {name} | {p['ms']:,.2f} | {percent(p['share'])} |"
              for name, p in profile["phases"].items()]
    syncs = profile["host_syncs"]
    lines += ["", f"Host synchronisations inside the steps: {syncs['total']} "
              f"({', '.join(f'{k} {v}' for k, v in syncs['by_name'].items()) or 'none'}).", "",
              "| top operators and kernels (self time) | ms | calls |", "| --- | ---: | ---: |"]
    lines += [f"| `{op['name'][:80]}` | {op['self_ms']:,.2f} | {op['calls']} |"
              for op in profile["top"]]
    return lines + [""]


def run_parts(args: argparse.Namespace, out: Path) -> tuple[dict, int]:
    """Install, then the parts asked for; the report and the exit status."""
    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    site = scratch / "site"
    try:
        install_info = install(site, Path(args.wheels), out / "install.log")
        (out / "install.log").unlink()
        env = kit_env(site, args)
        tests = run_tests(out, env) if args.part in ("all", "tests") else None
        bench, bench_status = (run_bench(out, env, args) if args.part in ("all", "bench")
                               else (None, 0))
        facts = bench or read_facts(out, env)  # the bench's JSON holds them too
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    previous_path = out / "gpu-check.json"
    previous = json.loads(previous_path.read_text()) if previous_path.exists() else {}
    report = build_report(args, facts, previous, tests, bench, install_info)
    failed = bench_status != 0 or not facts or (tests is not None and (
        tests["failed"] or tests["exit_status"] != 0))
    return report, 1 if failed else 0


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    report, status = run_parts(args, out)
    (out / "gpu-check.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "gpu-check.md").write_text(markdown(report))
    print(markdown(report))
    print(f"gpu-check: {'passed' if status == 0 else 'FAILED'}; report in "
          f"{out / 'gpu-check.json'} and gpu-check.md")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
