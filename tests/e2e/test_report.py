"""`report` draws PNG figures from a real short run and from bench-shaped JSON files;
`train --tensorboard` writes event files that TensorBoard can read back, into a folder
of the user's own that no one else may write (nor link elsewhere), as W&B's is."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import TINY, read_jsonl, run_train, tmpfs
from workload.report import BenchPoint, read_bench
from workload.report import main as report_main

SYNTHETIC = ["--dataset", "synthetic", "--synthetic-size", "128", "--num-classes", "4",
             "--batch-size", "32", "--image-size", "16"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """One real two-epoch run with --tensorboard, shared by the tests of this module."""
    out = tmp_path_factory.mktemp("report") / "run"
    run_train([*TINY, *SYNTHETIC, "--epochs", "2", "--tensorboard"], out)
    return out


def bench_file(path, world_size: int, rate: float):
    """A file shaped like `bench train --json`: results by name, and a fingerprint."""
    path.write_text(json.dumps({
        "fingerprint": {"host": "nid001", "torch": "2.14.1", "world_size": world_size},
        "results": {"wrn-bs64": {"images_per_second": rate / world_size,
                                 "images_per_second_total": rate, "world_size": world_size},
                    "resnet18-bs64": {"images_per_second": 2 * rate}},
    }))
    return path


def assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5_000, path


@pytest.mark.slow
def test_report_draws_training_and_throughput_into_the_run(real_run, capsys):
    report_main([str(real_run)])
    printed = capsys.readouterr().out
    for name in ("training.png", "throughput.png", "startup.png"):
        assert_png(real_run / name)
        assert f"report: wrote {real_run / name}" in printed
    assert not (real_run / "scaling.png").exists()  # no bench file given


@pytest.mark.slow
def test_report_with_bench_files_draws_scaling_into_out(real_run, tmp_path):
    files = [bench_file(tmp_path / f"bench-{n}.json", n, 1000.0 * n) for n in (1, 2, 4)]
    out = tmp_path / "figures"
    report_main([str(real_run), *map(str, files), "--out", str(out)])
    assert {p.name for p in out.iterdir()} == {"training.png", "throughput.png", "scaling.png",
                                               "startup.png"}
    for png in out.iterdir():
        assert_png(png)


def test_bench_results_are_found_by_name_with_their_world_size(tmp_path):
    points = read_bench(bench_file(tmp_path / "b.json", 4, 3000.0))
    assert sorted(points, key=lambda p: p.name) == [
        # no world size of its own: the fingerprint's
        BenchPoint("results/resnet18-bs64", 4, 6000.0),
        # the total over all devices is plotted, not the per-device rate
        BenchPoint("results/wrn-bs64", 4, 3000.0),
    ]


@pytest.mark.slow
def test_tensorboard_events_hold_every_epoch(real_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = list((real_run / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1
    board = EventAccumulator(str(events[0]))
    board.Reload()
    records = read_jsonl(real_run / "metrics.jsonl")
    for tag, key in (("loss/train", "train_loss"), ("accuracy/test", "accuracy")):
        scalars = board.Scalars(tag)
        assert [s.step for s in scalars] == [1, 2]
        assert [s.value for s in scalars] == pytest.approx([r[key] for r in records])


@pytest.mark.slow
@pytest.mark.parametrize("flag, folder", [("--tensorboard", "tensorboard"), ("--wandb", "wandb")])
def test_a_link_at_a_boards_folder_is_refused_in_one_line(tmp_path, capsys, monkeypatch, flag,
                                                         folder):
    """Someone sharing the run folder puts a link where TensorBoard (or W&B) makes its
    folder: the library wrote its files through it, wherever it led."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / folder).symlink_to(elsewhere)
    with pytest.raises(SystemExit) as stop:
        run_train([*TINY, *SYNTHETIC, "--epochs", "1", flag], out)
    [line] = capsys.readouterr().err.splitlines()
    assert stop.value.code == 2 and f"{flag}: {out / folder} is a symbolic link" in line, line
    assert list(elsewhere.iterdir()) == []


BAD = {
    "not a run dir": (lambda p: [str(p / "nowhere")], ["RUN_DIR", "nowhere", "--output-dir"]),
    "run without metrics": (lambda p: [str(p)], ["no metrics.jsonl"]),
    "bench not json": (lambda p: [str(p / "run"), str(p / "bad.json")],
                       ["bad.json", "not JSON", "bench --json"]),
    "bench without results": (lambda p: [str(p / "run"), str(p / "empty.json")],
                              ["empty.json", "images_per_second"]),
}


@pytest.mark.parametrize("case", BAD)
@pytest.mark.slow
def test_bad_input_exits_2_with_one_line_and_writes_nothing(case, real_run, tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text((real_run / "metrics.jsonl").read_text())
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "empty.json").write_text(json.dumps({"fingerprint": {}, "results": {}}))
    build, words = BAD[case]
    with pytest.raises(SystemExit) as exit_info:
        report_main(build(tmp_path))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("report: error:")
    for word in words:
        assert word in err
    assert not list(tmp_path.rglob("*.png"))


@pytest.mark.parametrize("command, blocked", [
    ("from workload.report import main; main(['.'])", "matplotlib"),
    ("from workload.train import main; main(['--tensorboard', '--dataset', 'digits'])",
     "tensorboard"),
])
def test_missing_report_extra_names_the_install_command(command, blocked, tmp_path):
    # A None entry in sys.modules makes the import fail as if the package were absent.
    done = subprocess.run([sys.executable, "-c", f"import sys; sys.modules[{blocked!r}] = None; "
                           + command], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "pip install matplotlib tensorboard" in done.stderr and blocked in done.stderr
    assert not list(tmp_path.iterdir())  # nothing written


GOOD_EPOCH = {"train_loss": 1.5, "test_loss": 1.4, "accuracy": 0.4, "images_per_second": 900.0}


def report_command(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workload.report", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def test_damaged_metrics_lines_are_skipped_with_a_warning_and_the_rest_drawn(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lines = [json.dumps({"epoch": 1, **GOOD_EPOCH}),
             json.dumps({"epoch": 2, "accuracy": 0.5, "images_per_second": 900.0}),
             json.dumps({"epoch": 1e308, **GOOD_EPOCH}),
             "[1, 2]",
             json.dumps({"epoch": 3, **GOOD_EPOCH, "accuracy": "high"}),
             json.dumps({"epoch": 4, **GOOD_EPOCH})]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    done = report_command(run)
    assert done.returncode == 0, done.stderr
    for name in ("training.png", "throughput.png"):
        assert_png(run / name)
    warning = done.stderr.strip().splitlines()
    assert len(warning) == 1 and warning[0].startswith("report: warning: skipped 4 of 6 lines")
    for words in (str(run / "metrics.jsonl"), "line 2: no train_loss", "line 3: epoch 1e+308",
                  "line 4: not a JSON object", "line 5: accuracy"):
        assert words in warning[0], warning[0]


def test_metrics_without_a_usable_line_is_one_line_and_exit_2(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"epoch": 1e308, **GOOD_EPOCH}) + "\n")
    done = report_command(run)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no line of" in lines[0] and "line 1: epoch" in lines[0], lines
    assert not (run / "training.png").exists()


def test_ranks_busy_times_from_steps_jsonl_are_drawn(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"epoch": 1, **GOOD_EPOCH}) + "\n")
    steps = [{"step": 4 * i, "step_busy_by_rank_s": [0.02, 0.05, 0.02]} for i in (1, 2, 3)]
    (run / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    done = report_command(run)
    assert done.returncode == 0, done.stderr
    assert f"wrote {run / 'ranks.png'}" in done.stdout
    assert_png(run / "ranks.png")


def test_power_from_steps_jsonl_is_drawn_and_a_run_without_a_counter_has_none(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"epoch": 1, **GOOD_EPOCH}) + "\n")
    steps = [{"step": 4 * i, "gpu_power_w": 650.0 + i, "cpu_package_power_w": 210.0}
             for i in (1, 2, 3)]
    (run / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    done = report_command(run)
    assert done.returncode == 0, done.stderr
    assert f"wrote {run / 'power.png'}" in done.stdout
    assert_png(run / "power.png")
    (run / "power.png").unlink()
    unavailable = [{"step": 4, "gpu_power_w": None, "cpu_package_power_w": None}]
    (run / "steps.jsonl").write_text(json.dumps(unavailable[0]) + "\n")
    assert report_command(run).returncode == 0 and not (run / "power.png").exists()


@pytest.mark.parametrize("damage", [b"[" * 100_000 + b"]" * 100_000, b'{"epoch": 2, "x": "\xff"}'],
                         ids=["nested", "not UTF-8"])
@pytest.mark.parametrize("damaged", ["metrics.jsonl", "steps.jsonl"])
def test_a_nested_or_non_utf8_line_is_skipped_not_a_traceback(tmp_path, damaged, damage):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"epoch": 1, **GOOD_EPOCH}) + "\n")
    steps = [{"step": 4 * i, "step_busy_by_rank_s": [0.02, 0.05]} for i in (1, 2)]
    (run / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    with open(run / damaged, "ab") as f:
        f.write(damage + b"\n")
    done = report_command(run)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert_png(run / "training.png")
    assert_png(run / "ranks.png")
    if damaged == "metrics.jsonl":
        assert "line 2: not a JSON object" in done.stderr


@pytest.mark.parametrize("huge", ["metrics.jsonl", "steps.jsonl"])
def test_a_file_larger_than_any_runs_is_one_line_not_read_whole(tmp_path, huge):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"epoch": 1, **GOOD_EPOCH}) + "\n")
    with open(run / huge, "ab") as file:
        file.truncate(3 << 30)  # sparse: 3 GiB that take no disk, and no memory unless read
    done = report_command(run)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == [f"report: error: {run / huge} cannot be read ({run / huge} holds "
                     f"{3 << 30} bytes, more than the {1 << 30} such a file may have); pass a "
                     "run folder you can read"]


@pytest.mark.root  # a read-only tmpfs
def test_a_read_only_run_folder_names_out_before_any_figure(tmp_path):
    with tmpfs(tmp_path / "ro", "size=1m") as run:
        (run / "metrics.jsonl").write_text(json.dumps({"epoch": 1, **GOOD_EPOCH}) + "\n")
        subprocess.run(["mount", "-o", "remount,ro", str(run)], check=True)
        done = report_command(run)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and f"RUN_DIR {run}" in lines[0] and "--out DIR" in lines[0]
        done = report_command(run, "--out", tmp_path / "figures")
        assert done.returncode == 0, done.stderr
        assert_png(tmp_path / "figures" / "training.png")


def test_out_naming_a_file_is_one_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"epoch": 1, **GOOD_EPOCH}) + "\n")
    (tmp_path / "a-file").write_text("")
    done = report_command(run, "--out", tmp_path / "a-file")
    assert done.returncode == 2 and "--out" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
