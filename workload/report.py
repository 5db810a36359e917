"""`report`: PNG figures from a training run and from `bench` JSON files (headless).

After a run (any machine, no display needed):
    report runs/digits                       # figures into runs/digits/
    report runs/digits --out docs/img        # figures elsewhere

With a scaling chart from `bench train --json` files of several world sizes:
    report runs/wrn bench-1gpu.json bench-4gpu.json bench-8gpu.json

On a cluster, after the job (the login node is fine; it reads files only):
    apptainer exec image.sif report $SCRATCH/runs/wrn --out $HOME/figures

Figures:
    training.png    train and test loss, and test accuracy, per epoch (metrics.jsonl)
    throughput.png  images/s per epoch, with the run's overall rate (summary.json)
    scaling.png     images/s against the number of devices, one line per configuration,
                    with the ideal linear line from the smallest world size (bench JSON)
    ranks.png       each rank's busy time per step, several ranks (steps.jsonl; hangs.md)
    power.png       the GPUs' and the nodes' CPU packages' mean power over each log
                    interval, apart (steps.jsonl; energy.md)
    startup.png     where the last job's time to its first step went, phase by phase, the
                    slowest rank's (summary.json's startup; monitoring.md)

Expected bench JSON shape (read defensively; unknown fields are ignored). Every dict
anywhere in the file that has a numeric `images_per_second` is one result, named by its
key. Its world size is the first of `world_size`, `num_devices`, `devices` found in the
result, else in the file's top level or its `fingerprint`, else 1. The rate plotted is
`images_per_second_total` when present (all devices together, as `bench train` writes
it), else `images_per_second`.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from workload.commands import command_parser, main_of
from workload.config import out_of_range, record_problem
from workload.errors import UsageError
from workload.files import (read_json_file, read_jsonl_lines, read_jsonl_records, replacing,
                            unwritable_reason)
from workload.launch.diagnostics import STARTUP_ORDER
from workload.logs import warn
from workload.runfolder import RunFolder

PROG = "report"
# The packages of the `report` extra (pyproject.toml), named directly: the package is not
# on PyPI, so an install of the extra by the package's name would find nothing or a stranger's.
INSTALL_HINT = "pip install matplotlib tensorboard"
WORLD_SIZE_KEYS = ("world_size", "num_devices", "devices")
# What every epoch line of metrics.jsonl carries for the figures (each within the
# package's bounds, workload.config.bounds: a damaged line would break the axes).
EPOCH_FIELDS = ("train_loss", "accuracy", "images_per_second")
# The most bytes report reads of one file: a run of a million log intervals writes a few
# hundred MB of steps.jsonl; a larger file is no run's, and would be held in memory whole.
MAX_FILE_BYTES = 1 << 30


def import_pyplot():
    """matplotlib with the headless Agg backend, or a UsageError naming the install command."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError(f"report needs matplotlib, which is not installed; {INSTALL_HINT}"
                         ) from None
    matplotlib.use("Agg")  # batch nodes have no display
    import matplotlib.pyplot as plt
    return plt


# ----------------------------------------------------------------------------- reading
def read_metrics(run: RunFolder) -> list[dict]:
    path = run.metrics
    if not path.is_file():
        raise UsageError(f"RUN_DIR {run.root} has no metrics.jsonl; pass the --output-dir of "
                         "a train run that finished at least one epoch")
    try:
        lines = read_jsonl_lines(path, MAX_FILE_BYTES)
    except OSError as error:
        raise UsageError(f"{path} cannot be read ({error.strerror}); pass a run folder "
                         "you can read") from None
    if not lines:
        raise UsageError(f"{path} is empty; the run has not finished an epoch yet")
    return usable_epochs(path, lines)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def epoch_problem(record) -> str | None:
    """Why a metrics.jsonl record cannot be drawn, or None."""
    for key in ("epoch", *EPOCH_FIELDS, *(["test_loss"] if "test_loss" in record else [])):
        if key not in record:
            return f"no {key}"
        if not _number(record[key]):
            return f"{key} {record[key]!r} is not a number"[:120]
    return record_problem(record) or None


def usable_epochs(path: Path, lines: list[tuple[int, dict | None, str]]) -> list[dict]:
    """The records that can be drawn; one warning naming the others (or a UsageError)."""
    problems = [(line, unread or epoch_problem(record)) for line, record, unread in lines
                if unread or epoch_problem(record) is not None]
    named = "; ".join(f"line {line}: {why}" for line, why in problems[:5]) + (
        f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
    if len(problems) == len(lines):
        raise UsageError(f"no line of {path} is an epoch record train writes ({named}); pass "
                         "the --output-dir of a train run")
    if problems:
        warn(PROG, f"skipped {len(problems)} of {len(lines)} lines of {path} that are not "
                   f"epoch records train writes ({named})")
    return [record for _, record, unread in lines
            if not unread and epoch_problem(record) is None]


def read_summary(run: RunFolder) -> dict:
    """summary.json, or {} for a run still going (figures are drawn from the epochs so far)."""
    path = run.summary
    try:
        summary = read_json_file(path, MAX_FILE_BYTES)
    except (OSError, ValueError):
        return {}
    return within_bounds(path, summary) if isinstance(summary, dict) else {}


def within_bounds(path: Path, record: dict) -> dict:
    """`record` without its fields out of the package's bounds, each named in a warning."""
    kept = dict(record)
    while problem := record_problem(kept):
        warn(PROG, f"left out of {path}: {problem}")
        kept.pop(next(key for key in kept if out_of_range(key, kept[key])))
    return kept


@dataclass(frozen=True)
class BenchPoint:
    name: str
    world_size: int
    images_per_second: float


def _world_size(*sources: dict) -> int:
    for source in sources:
        for key in WORLD_SIZE_KEYS:
            value = source.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 1:
                return int(value)
    return 1


def _results(node, name: str = ""):
    """(name, result) for every dict that carries an images_per_second (and an
    images_per_second_total, where it has one) within the package's bounds."""
    if isinstance(node, dict):
        rates = [node.get(key) for key in ("images_per_second", "images_per_second_total")
                 if key in node]
        if "images_per_second" in node and not any(out_of_range("images_per_second", rate)
                                                   for rate in rates):
            yield name, node
        for key, value in node.items():
            if key != "fingerprint":
                yield from _results(value, f"{name}/{key}" if name else str(key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _results(value, f"{name}[{index}]")


def read_bench(path: Path) -> list[BenchPoint]:
    try:
        data = read_json_file(path, MAX_FILE_BYTES)
    except OSError as error:
        raise UsageError(f"bench file {path} cannot be read ({error.strerror}); pass the "
                         "file that `bench --json PATH` wrote") from None
    except ValueError as error:  # not UTF-8, not JSON, nested too deeply
        raise UsageError(f"bench file {path} is not JSON ({str(error)[:80]}); pass the file "
                         "that `bench --json PATH` wrote") from None
    top = data if isinstance(data, dict) else {}
    fingerprint = top.get("fingerprint") if isinstance(top.get("fingerprint"), dict) else {}
    points = []
    for name, result in _results(data):
        rate = result.get("images_per_second_total", result["images_per_second"])
        points.append(BenchPoint(name or path.stem, _world_size(result, top, fingerprint),
                                 float(rate)))
    if not points:
        raise UsageError(f"bench file {path} holds no result with an images_per_second "
                         "field; pass a file written by `bench input|train --json PATH`")
    return points


# ----------------------------------------------------------------------------- drawing
def plot_training(plt, records: list[dict], path: Path) -> None:
    epochs = [r["epoch"] for r in records]
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(10, 4))
    loss_ax.plot(epochs, [r["train_loss"] for r in records], "o-", label="train")
    if all("test_loss" in r for r in records):
        loss_ax.plot(epochs, [r["test_loss"] for r in records], "s-", label="test")
    loss_ax.set(xlabel="epoch", ylabel="loss", title="Loss per epoch")
    loss_ax.legend()
    acc_ax.plot(epochs, [r["accuracy"] for r in records], "o-", color="tab:green")
    acc_ax.set(xlabel="epoch", ylabel="test accuracy", title="Test accuracy per epoch",
               ylim=(0, 1))
    _save(plt, fig, path)


def plot_throughput(plt, records: list[dict], summary: dict, path: Path) -> None:
    epochs = [r["epoch"] for r in records]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(epochs, [r["images_per_second"] for r in records], color="tab:blue",
           label="per epoch")
    overall = summary.get("images_per_second")
    if _number(overall) and overall > 0:  # summary.json is data: a damaged one is left out
        ax.axhline(overall, color="tab:red", linestyle="--",
                   label=f"run: {overall:,.0f} img/s (first step left out)")
    where = ", ".join(str(summary[k]) for k in ("device", "precision") if k in summary)
    world = summary.get("world_size", 1)
    ax.set(xlabel="epoch", ylabel="images/s (all ranks)",
           title=f"Throughput per epoch ({where}, world size {world})" if where
           else "Throughput per epoch")
    ax.legend(loc="lower right")
    _save(plt, fig, path)


def step_records(path: Path) -> list[dict]:
    """steps.jsonl's records, [] without one; one that cannot be read is a usage error."""
    if not path.is_file():
        return []
    try:
        records = read_jsonl_records(path, MAX_FILE_BYTES)[0]
    except OSError as error:
        raise UsageError(f"{path} cannot be read ({error.strerror}); pass a run folder "
                         "you can read") from None
    problems = [problem for record in records if (problem := record_problem(record))]
    if problems:
        warn(PROG, f"left out {len(problems)} lines of {path} with a value out of its "
                   f"bounds (the first: {problems[0]})")
    return [record for record in records if not record_problem(record)]


def rank_times(path: Path) -> list[dict]:
    """steps.jsonl's lines with every rank's busy time per step (several ranks only)."""
    found = step_records(path)
    return [r for r in found if isinstance(r.get("step_busy_by_rank_s"), list)
            and all(_number(v) for v in r["step_busy_by_rank_s"]) and _number(r.get("step"))]


def plot_ranks(plt, lines: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for rank in range(min(len(r["step_busy_by_rank_s"]) for r in lines)):
        ax.plot([r["step"] for r in lines],
                [r["step_busy_by_rank_s"][rank] * 1000 for r in lines], label=f"rank {rank}")
    ax.set(xlabel="step", ylabel="ms of its own work per step", title="Busy time by rank")
    ax.legend(loc="upper right", fontsize="small", ncol=2)
    _save(plt, fig, path)


POWER = (("gpu_power_w", "GPUs, all ranks (NVML)"),
         ("cpu_package_power_w", "CPU packages, whole nodes (RAPL)"))


def power_lines(path: Path) -> list[dict]:
    """steps.jsonl's lines with a mean power of their interval (GPU or CPU packages)."""
    found = step_records(path)
    return [r for r in found if _number(r.get("step"))
            and any(_number(r.get(key)) for key, _ in POWER)]


def plot_power(plt, lines: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in POWER:
        if drawn := [r for r in lines if _number(r.get(key))]:
            ax.plot([r["step"] for r in drawn], [r[key] for r in drawn], "o-", label=label)
    ax.set(xlabel="step", ylabel="mean power over the log interval (W)", title="Power")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right", fontsize="small")
    _save(plt, fig, path)


def startup_phases(summary: dict) -> dict[str, float]:
    """summary.json's start-up phases in their order, the numbers only."""
    found = summary.get("startup")
    phases = found.get("phases_s") if isinstance(found, dict) else None
    if not isinstance(phases, dict):
        return {}
    return {name: phases[name] for name in STARTUP_ORDER if _number(phases.get(name))}


def plot_startup(plt, phases: dict[str, float], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 3))
    names = list(phases)[::-1]  # the first phase on top
    ax.barh(names, [phases[name] for name in names])
    ax.set(xlabel="seconds (the slowest rank of each phase)",
           title=f"Start-up: {sum(phases.values()):.1f} s to the first step")
    _save(plt, fig, path)


def plot_scaling(plt, points: list[BenchPoint], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in sorted({p.name for p in points}):
        mine = sorted((p for p in points if p.name == name), key=lambda p: p.world_size)
        sizes = [p.world_size for p in mine]
        line, = ax.plot(sizes, [p.images_per_second for p in mine], "o-", label=name)
        base = mine[0]
        if len(mine) > 1:  # perfect scaling from the smallest measured world size
            ax.plot(sizes, [base.images_per_second * s / base.world_size for s in sizes],
                    ":", color=line.get_color(), alpha=0.6)
    ax.set(xlabel="devices (world size)", ylabel="images/s", title="Scaling (dotted: linear)")
    ax.legend(fontsize="small")
    _save(plt, fig, path)


def _save(plt, fig, path: Path) -> None:
    from matplotlib.ticker import MaxNLocator
    for ax in fig.axes:  # epochs and device counts are whole numbers
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    with replacing(path) as file:  # never through a link planted at its name
        fig.savefig(file, format="png", dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- command
def build_parser() -> argparse.ArgumentParser:
    p = command_parser(PROG, __doc__)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a train --output-dir")
    p.add_argument("bench", metavar="BENCH_JSON", nargs="*", help="bench --json files")
    p.add_argument("--out", metavar="DIR", help="where the PNGs go (default: RUN_DIR)")
    return p


def output_dir(run_dir: Path, out_flag: str | None) -> Path:
    """--out (made if missing), else RUN_DIR, checked for writing before any figure is
    drawn: a run folder may be read-only (another user's, a finished project's)."""
    out = Path(out_flag).expanduser() if out_flag else run_dir
    problem = unwritable_reason(out, create=bool(out_flag))
    if problem:
        named = f"--out {out_flag}" if out_flag else f"RUN_DIR {run_dir}"
        raise UsageError(f"{named} cannot take the figures ({problem}); pass --out DIR, a "
                         "folder you can write to")
    return out


def make_report(run: RunFolder, bench_files: list[Path], out_flag: str | None) -> list[Path]:
    """Check every input first, then draw; returns the PNGs written."""
    plt = import_pyplot()
    run_dir = run.root
    if not run_dir.is_dir():
        raise UsageError(f"RUN_DIR {run_dir} is not a directory; pass the --output-dir "
                         "of a train run")
    records = read_metrics(run)
    summary = read_summary(run)
    points = [point for path in bench_files for point in read_bench(path)]
    out = output_dir(run_dir, out_flag)
    written = [out / "training.png", out / "throughput.png"]
    plot_training(plt, records, written[0])
    plot_throughput(plt, records, summary, written[1])
    if points:
        written.append(out / "scaling.png")
        plot_scaling(plt, points, written[-1])
    if ranks := rank_times(run.steps):
        written.append(out / "ranks.png")
        plot_ranks(plt, ranks, written[-1])
    if power := power_lines(run.steps):
        written.append(out / "power.png")
        plot_power(plt, power, written[-1])
    if phases := startup_phases(summary):
        written.append(out / "startup.png")
        plot_startup(plt, phases, written[-1])
    return written


def report(args: argparse.Namespace) -> None:
    for path in make_report(RunFolder(Path(args.run_dir)), [Path(b) for b in args.bench],
                            args.out):
        print(f"report: wrote {path}")


main = main_of(PROG, build_parser(), report)


if __name__ == "__main__":
    sys.exit(main())
