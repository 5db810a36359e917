"""The GPU check's own machinery (tools/gpu_check*.py) with tiny fake parts: a hung test, a
part stopped at its limit with what it started, a failed or stopped benchmark, a rerun
after a failure, a run past its deadline, a failed install. Each ends in a report that
says what happened. (tests/e2e/test_gpu_check.py runs the whole kit once.)"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import REPO
from workload.files import proc_stat_fields

sys.path.insert(0, str(REPO / "tools"))
import gpu_check  # noqa: E402
import gpu_check_procs  # noqa: E402
from gpu_check_procs import Finished, run_logged  # noqa: E402
from gpu_check_report import Report, markdown  # noqa: E402

ROW = dict(model="wrn", config="compile", batch_size=256, status="measured", reason=None,
           images_per_second=5000.0, ratio=5.0, mfu=0.4, precision="bf16",
           energy_j_per_image=0.0571, compile_s=12.9, peak_step_memory_gib=3.5)


def running(pid: int) -> bool:
    """Alive and not a zombie waiting for a parent that is gone."""
    fields = proc_stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def fake_tier(folder: Path, hang_body: str) -> Path:
    """A GPU tier of three tests; the middle one runs `hang_body`."""
    folder.mkdir()
    (folder / "test_tier.py").write_text(textwrap.dedent("""\
        import subprocess, sys, time
        import pytest
        pytestmark = pytest.mark.gpu
        def test_before():
            pass
        def test_hangs(tmp_path):
        {body}
        def test_after():
            pass
        """).format(body=textwrap.indent(textwrap.dedent(hang_body), "    ")))
    return folder


def report_for(tmp_path: Path, parts=("install", "tests", "bench")) -> Report:
    header = dict(device="NVIDIA H100 80GB HBM3", devices=None, driver="570.1",
                  versions=dict(torch="2.11.0", cudnn=91002, nccl="2.27.3"),
                  requested_device="cuda", quick=False, deadline_s=540)
    return Report(tmp_path, header, parts)


@pytest.mark.slow
def test_a_hung_test_fails_by_its_own_timeout_and_the_others_still_count(tmp_path,
                                                                         monkeypatch):
    tier = fake_tier(tmp_path / "tier", "time.sleep(600)")
    monkeypatch.setattr(gpu_check, "TEST_TIMEOUT_S", 2)
    junit = tmp_path / "junit.xml"
    finished = run_logged(gpu_check.tests_command(junit, str(tier)), tmp_path / "tests.log",
                          gpu_check.kit_env(tmp_path, gpu_check.parse_args([])), 120, REPO)
    record = gpu_check.tests_record(finished, "the part's limit", tmp_path)
    assert record["status"] == "failed" and (record["passed"], record["failed"]) == (2, 1)
    failure, = record["failures"]
    assert failure["test"].endswith("::test_hangs") and "Timeout" in failure["message"]


@pytest.mark.slow
def test_a_part_stopped_at_its_limit_reports_its_tests_and_stops_their_children(tmp_path,
                                                                               monkeypatch):
    # The hung test's child ignores SIGTERM: only the group's SIGKILL ends it.
    monkeypatch.setattr(gpu_check_procs, "TERM_GRACE_S", 1)
    pid_file = tmp_path / "child.pid"
    tier = fake_tier(tmp_path / "tier", f"""\
        child = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                  "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                  "time.sleep(600)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(600)""")
    out = tmp_path / "out"
    out.mkdir()
    limit_s = 8
    # As from a backgrounded shell (`make gpu-check &`, or this suite started with `&`):
    # SIGINT ignored, which the part inherits unless run_logged restores it.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        finished = run_logged(gpu_check.tests_command(out / "junit.xml", str(tier)),
                              out / "tests.log", gpu_check.kit_env(
                                  tmp_path, gpu_check.parse_args([])), limit_s, REPO)
    finally:
        signal.signal(signal.SIGINT, previous)
    record = gpu_check.tests_record(finished, "the part's limit", out)
    assert finished.stopped and record["status"] == "stopped"
    assert record["note"] == f"stopped after {limit_s} s (the part's limit)"
    assert record["passed"] == 1  # test_before, from the junit.xml pytest wrote on SIGINT
    assert record["running"].endswith("test_tier.py::test_hangs")
    assert not running(int(pid_file.read_text()))
    md = markdown(dict(report_for(out).data, tests=dict(record, run=None)))
    assert f"## Tests (`pytest -m gpu tests/gpu`): STOPPED; stopped after {limit_s} s" in md
    assert "stopped while running: `" in md


def test_nothing_a_part_started_outlives_it_even_in_a_session_of_its_own(tmp_path):
    # As torchrun starts its workers: a new session, outside the part's process group;
    # the part then ends (its worker re-parented to the kit, their subreaper).
    pid_file = tmp_path / "worker.pid"
    part = [sys.executable, "-c", "import subprocess, sys; w = subprocess.Popen(['sleep', "
            f"'600'], start_new_session=True); open({str(pid_file)!r}, 'w').write(str(w.pid))"]
    driver = ("import json, sys; sys.path.insert(0, 'tools'); import gpu_check_procs as p; "
              "from pathlib import Path; p.adopt_orphans(); "
              f"f = p.run_logged({part!r}, Path({str(tmp_path / 'part.log')!r}), None, 60, "
              "Path('.')); print(json.dumps(f.__dict__))")
    done = subprocess.run([sys.executable, "-c", driver], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["exit_status"] == 0
    assert not running(int(pid_file.read_text()))


def test_subprocess_timeouts_in_the_gpu_tier_stay_inside_its_part():
    for path in sorted((REPO / "tests" / "gpu").glob("*.py")):
        text = path.read_text()
        limits = re.findall(r"timeout=(\d+)", text) + re.findall(r"mark\.timeout\((\d+)", text)
        too_long = [int(s) for s in limits if int(s) >= gpu_check.PART_LIMIT_S]
        assert not too_long, f"{path.name}: timeouts {too_long} reach the part's limit"


def write_bench_json(out: Path, rows: list, errors=(), profile=None, **more) -> None:
    sizes = dict(models={"wrn": {}, "resnet18": {}})
    data = dict(kind="synthetic", shaped_as="CIFAR-100", images=10_000, classes=100,
                channels=3, image_size={"wrn": 32, "resnet18": 32}, note="random images")
    (out / "bench.json").write_text(json.dumps(dict(bench=dict(
        rows=rows, errors=list(errors), profile=profile, sizes=sizes, data=data, **more))))


def stopped_bench_markdown(tmp_path: Path) -> str:
    """gpu-check.md of a bench part stopped at its limit, from the bench.json there."""
    report = report_for(tmp_path, ("bench",))
    report.set("bench", gpu_check.bench_record(Finished(-2, 451.0, 450, True),
                                               "the part's limit", tmp_path))
    return (tmp_path / "gpu-check.md").read_text()


def test_the_report_shows_rows_not_run_the_first_step_and_the_parts_not_reached(tmp_path):
    """A row that did not run says why; the starts of train phase by phase; the part the
    stop cut short, and each it never reached, is named as such."""
    starts = [dict(name="cold", status="measured", to_first_step_s=13.3,
                   images_per_second=19_000.0,
                   phases_s={"imports": 3.1, "cudnn autotune": 4.5, "first step": 1.8}),
              dict(name="benchmark-off", status="failed", reason="train exited 1")]
    write_bench_json(tmp_path, [ROW, dict(model="wrn", config="cudagraphs", status="not run",
                                          reason="left out (--skip)")],
                     first_step=dict(command=["train", "--model", "wrn"], starts=starts),
                     choice={"wrn": dict(config="compile", why="the fastest measured")},
                     parts=["wrn", "first step", "wrn max-autotune", "resnet18 max-autotune"],
                     parts_done=["wrn", "first step"])
    md = stopped_bench_markdown(tmp_path)
    assert "| wrn | cudagraphs | not run: left out (--skip) |" in md
    assert "- bench would choose for wrn: compile (the fastest measured)" in md
    assert "| start | imports | cudnn autotune | first step | to first step |" in md
    assert "| cold | 3.10 | 4.50 | 1.80 | 13.30 | 19,000.0 |" in md
    assert "| benchmark-off | failed: train exited 1 |" in md
    assert "- stopped while running: wrn max-autotune\n- not reached: resnet18 max-autotune" in md
    assert "- not reached: wrn max-autotune" not in md and "Command: `train --model wrn`" in md


def test_a_stopped_benchmark_says_so_and_shows_the_rows_measured_before(tmp_path):
    write_bench_json(tmp_path, [ROW])
    md = stopped_bench_markdown(tmp_path)
    assert "Benchmark (`python -m workload.bench.kit`): STOPPED; stopped after 450 s" in md
    assert "| wrn | compile | 5,000.0 | 5.00 | 40.0 % | bf16 | 0.0571 | 12.9 | 3.50 |" in md
    assert "- not measured: resnet18" in md and "- profile: not measured" in md
    assert "CIFAR-100-shaped: 10,000 images of 3 channels (wrn 32x32, resnet18 32x32), " \
           "100 classes" in md
    assert "cudnn 91002, nccl 2.27.3" in md


def test_a_failed_rerun_never_shows_the_earlier_runs_rows(tmp_path):
    write_bench_json(tmp_path, [ROW, dict(ROW, model="resnet18")])
    first = report_for(tmp_path)
    first.set("tests", dict(status="passed", seconds=100.0, note="", passed=9, failed=0,
                            skipped=1, failures=[], skips=[]))
    first.set("bench", gpu_check.bench_record(Finished(0, 300.0, 450, False), "", tmp_path))
    (tmp_path / "bench.json").unlink()  # as the kit does before the bench part
    rerun = report_for(tmp_path, ("bench",))
    rerun.data["date"] = "2099-01-01T00:00:00Z"  # a later run
    rerun.set("bench", gpu_check.bench_record(Finished(1, 12.0, 450, False), "", tmp_path))
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert report["bench"]["status"] == "failed" and report["bench"]["rows"] == []
    md = (tmp_path / "gpu-check.md").read_text()
    assert "| wrn |" not in md and "## Benchmark (`python -m workload.bench.kit`): FAILED; " \
                                  "exit status 1; 12 s\n" in md
    # The tests part, not run again, is the first run's and says so.
    assert f"passed; 100 s (from the run of {first.data['date']})" in md


@pytest.mark.slow
def test_a_run_past_its_deadline_stops_the_part_and_reports_the_rest_not_run(tmp_path,
                                                                             monkeypatch):
    monkeypatch.setattr(gpu_check, "MIN_PART_S", 1)
    clock = gpu_check.Clock(gpu_check.STOP_RESERVE_S + 3)
    report = report_for(tmp_path, ("tests", "bench"))
    hang = lambda _: [sys.executable, "-c", "import time; time.sleep(600)"]  # noqa: E731
    assert not gpu_check.run_part(report, clock, "tests", hang, None,
                                  lambda f, why: gpu_check.part_record(f, why))
    assert not gpu_check.run_part(report, clock, "bench", hang, None,
                                  lambda f, why: gpu_check.part_record(f, why))
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert report["tests"]["status"] == "stopped"
    assert re.fullmatch(rf"stopped after \d s \(the run's deadline of "
                        rf"{gpu_check.STOP_RESERVE_S + 3} s\)", report["tests"]["note"])
    assert report["bench"]["status"] == "not run"
    assert "too little to start" in report["bench"]["note"]


@pytest.mark.slow
def test_a_failed_install_still_writes_the_report(tmp_path):
    wheels = tmp_path / "no-wheels"
    wheels.mkdir()
    done = subprocess.run([sys.executable, "tools/gpu_check.py", "--device", "cpu", "--out",
                           str(tmp_path / "report"), "--wheels", str(wheels)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "report" / "gpu-check.json").read_text())
    assert report["install"]["status"] == "failed"
    assert any("python-hostlist" in line for line in report["install"]["log_tail"])
    assert report["tests"]["status"] == report["bench"]["status"] == "not run"
    md = (tmp_path / "report" / "gpu-check.md").read_text()
    assert "## Install: FAILED; exit status 1" in md and "make gpu-wheels" in md


@pytest.mark.parametrize("argv, quick", [(["--device", "cpu"], True), ([], False)])
def test_the_cpu_form_runs_the_quick_sizes(argv, quick):
    assert gpu_check.parse_args(argv).quick is quick


@pytest.mark.parametrize("available, count, why", [
    (False, 0, "CUDA is absent"), (True, 1, "left out: 1 GPU visible, 2 needed"),
    (True, 2, None)])
def test_the_two_rank_nccl_test_is_left_out_where_one_gpu_is_visible(monkeypatch, available,
                                                                     count, why):
    import torch

    from tests.helpers.gpus import fewer_gpus_than

    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    found = fewer_gpus_than(2)
    assert found == why if why is None else found.startswith(why)


@pytest.mark.parametrize("deadline", ["5", "-1", "nan"])
def test_a_deadline_too_short_for_any_part_is_refused_before_any_work(tmp_path, deadline):
    done = subprocess.run([sys.executable, "tools/gpu_check.py", "--deadline", deadline,
                           "--out", str(tmp_path / "report")], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and f"--deadline {deadline}: expected 0" in done.stderr
    assert not (tmp_path / "report").exists()
