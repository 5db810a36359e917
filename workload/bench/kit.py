"""The GPU check's benchmark part, in order of priority (PARTS): the Wide ResNet under
each speed lever beside the reference loop in one process, a row each (levers.py:
train's defaults, torch.compile, max-autotune, CUDA graphs, per-block compile; images/s,
MFU against the GPU's dense bf16 peak, J/image, compile time, step memory) and the config
bench would choose; the first step taken apart, cold, warm and under cuDNN's settings
(first_step.py); ResNet-18's rows; a torch.profiler summary of one train step. Synthetic
CIFAR-100-shaped data at batch 256.

`make gpu-check` (tools/gpu_check.py) runs it; by hand:
    python -m workload.bench.kit --json bench.json                 # on a GPU
    python -m workload.bench.kit --device cpu --quick --json b.json  # CPU smoke run
    python -m workload.bench.kit --skip max-autotune,profile       # leave rows or parts out
    python -m workload.bench.kit --facts                           # device and versions only

The profile: torch.profiler over a few steps of `train`'s own step (the bench Runner:
train's defaults, its data backend and Trainer.train_step), summarised as the top
operators and kernels, the share of data, forward, backward and optimizer, and the host
synchronisations inside the steps. The shares are of device time on a GPU (kernels
attributed to the host operator that launched them) and of host time on a CPU. Backward
is autograd's evaluate_function events, the optimizer is torch's
Optimizer.step/zero_grad annotations, data is the next batch (`data` below), and forward
is what is left of the step (step_profile.py reads the events).

The JSON is written as the figures come: the facts first, then after each part (and each
start of the first step). A part or a row that fails is named under `errors` (the exit
status is then 1) and the others still run, so one failure or a stop loses nothing
measured before it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from torch.profiler import ProfilerActivity, profile, record_function

from workload import distributed
from workload.bench import first_step, levers, step_profile
from workload.bench.common import bench_process, config_from, fingerprint, print_table
from workload.bench.train import Runner, specs_for
from workload.files import replace_file
from workload.training.probe import sync

# The comparison at full size (GPU) and at tiny sizes (--quick: CI on a 2-core CPU). Both
# models at the reference's batch size; synthetic data shaped as CIFAR-100 (32x32 RGB).
FULL = dict(batch_size=256, synthetic_size=10_000, num_classes=100, warmup=3, steps=20,
            rounds=3, models={"wrn": {}, "resnet18": {}})
QUICK = dict(batch_size=4, synthetic_size=32, num_classes=10, warmup=1, steps=1, rounds=1,
             models={"wrn": dict(width=8, blocks_per_stage=1),
                     "resnet18": dict(image_size=16)})
# The kit's parts in order of priority: a part stopped at its limit loses the last ones.
PARTS = ("wrn", "first step", "resnet18", "profile", "wrn max-autotune",
         "resnet18 max-autotune")


def bench_args(device: str, size: dict, model: str) -> dict:
    """`bench train --versus-reference` for one model, as its flags would give them."""
    return dict(command="train", device=device, dataset="synthetic",
                synthetic_size=size["synthetic_size"], num_classes=size["num_classes"],
                model=model, batch_size=size["batch_size"], batch_sizes="256",
                versus_reference=True, precision="auto", channels_last=device != "cpu",
                compile=False, warmup=size["warmup"], steps=size["steps"],
                rounds=size["rounds"], json=None, threads=0, seed=0,
                **size["models"][model])


def facts() -> dict:
    """The device and the versions the figures depend on (CUDA, cuDNN and NCCL among them)."""
    found = fingerprint()
    versions = dict(found["versions"], cuda=found["cuda"], cudnn=found["cudnn"],
                    nccl=found["nccl"])
    return dict(device=found["devices"][0], devices=found["devices"], driver=found["driver"],
                versions=versions, fingerprint=found)


def measured_data(size: dict) -> dict:
    """What the figures were measured on, for the report."""
    sizes = {model: extra.get("image_size", 32) for model, extra in size["models"].items()}
    return dict(kind="synthetic", shaped_as="CIFAR-100", images=size["synthetic_size"],
                classes=size["num_classes"], channels=3, image_size=sizes,
                note="random uint8 images and labels generated in memory (no dataset read)")


@contextmanager
def recorded(bench: dict, part: str) -> Iterator[None]:
    """Run one model's comparison or the profile; a failure is written into the result
    (and its traceback into the log) so the rows of the others still count."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 -- any failure of one part is reported, not fatal
        traceback.print_exc()
        bench["errors"].append(dict(part=part, error=f"{type(exc).__name__}: {exc}"[:500]))


class OutOfTime(BaseException):
    """The kit's --time-limit came (SIGALRM, in the main thread). A BaseException: torch's
    own `except Exception` (Inductor's autotuning drops a failing candidate so) must not
    swallow it and compile on."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """OutOfTime raised `seconds` from now, wherever the kit is (0: no limit)."""
    if not seconds:
        yield
        return

    def ring(signum, frame):
        raise OutOfTime(f"the kit's time limit of {seconds:.0f} s (--time-limit: the GPU "
                        "check's part limit less its reserve) came")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_bench(device_flag: str, quick: bool, save, skip: frozenset = frozenset(),
              limit_s: float = 0) -> dict:
    """The parts in PARTS order, each named under `errors` if it fails; `save(bench)`
    after each (and after each start of the first step), so a later failure or a stop
    keeps what was measured. At `limit_s` the part running ends, its unfinished rows and
    the parts not reached saying why (`stopped`), and the JSON is saved."""
    size = QUICK if quick else FULL
    device = distributed.resolve_device(device_flag)
    bench = dict(rows=[], choice={}, profile=None, first_step=None, errors=[],
                 sizes=dict(size), data=measured_data(size), skipped=sorted(skip),
                 parts=[part for part in PARTS if part not in skip], parts_done=[],
                 stopped=None,
                 peak_note="mfu: achieved TFLOP/s (FlopCounterMode's count) over the GPU's "
                           "dense bf16 datasheet peak")
    save(bench)
    started = time.monotonic()
    try:
        with time_limit(limit_s):
            run_parts(bench, device, device_flag, size, save, skip)
    except OutOfTime as stop:
        part = next(p for p in bench["parts"] if p not in bench["parts_done"])
        bench["stopped"] = (f"{part}: not finished after {time.monotonic() - started:.0f} s: "
                            f"{stop}; the parts after it not reached")
        bench["errors"].append(dict(part=part, error=bench["stopped"]))
        save(bench)
    return bench


def run_parts(bench: dict, device, device_flag: str, size: dict, save, skip) -> None:
    for part in PARTS:
        if part in skip:
            continue
        with recorded(bench, part):
            if part == "first step":
                bench["first_step"] = first_step.measure(device, size is QUICK, lambda found: save(
                    dict(bench, first_step=found)))
            elif part == "profile":
                bench["profile"] = profile_step(bench_args(device_flag, size, "wrn"))
                print_summary(bench["profile"])
            else:
                model = part.split()[0]
                late = part.endswith(levers.LATE)
                model_part(bench, bench_args(device_flag, size, model), device, skip, late)
        bench["parts_done"].append(part)
        save(bench)


def model_part(bench: dict, args: dict, device, skip: frozenset, late: bool) -> None:
    """One model's rows (MAIN, or LATE beside the reference again, whose row is then not
    repeated); a failed row is also an error of the kit; bench's choice from all the
    model's rows so far."""
    configs = ("reference", *levers.LATE) if late else levers.MAIN
    rows = levers.planned(args["model"], args["batch_size"], configs, device, skip)
    if levers.worth_a_process(rows):
        cfg = config_from(args)
        try:
            with bench_process(args, cfg, None) as info:
                found = levers.measure_rows(rows, args, cfg, info)
        except OutOfTime as stop:  # the rows as far as they came, then the stop goes on
            bench["rows"] += levers.unfinished(rows, str(stop))
            raise
    else:
        found = [levers.described(row, None, device, None, None) for row in rows]
    found = [row for row in found if not (late and row["config"] == "reference")]
    bench["rows"] += found
    mine = [row for row in bench["rows"] if row["model"] == args["model"]]
    bench["choice"][args["model"]] = levers.choice(mine)
    bench["errors"] += [dict(part=f"{r['model']} {r['config']}", error=r["reason"])
                        for r in found if r["status"] == "failed"]
    print_rows(found, bench["choice"][args["model"]])


def print_rows(rows: list[dict], chosen: dict) -> None:
    print_table(["model", "config", "status", "images/s", "x reference", "MFU %", "J/image",
                 "compile s", "step GiB"],
                [[r["model"], r["config"], r["status"], r.get("images_per_second"),
                  r.get("ratio"), None if r.get("mfu") is None else 100 * r["mfu"],
                  r.get("energy_j_per_image"), r.get("compile_s"),
                  r.get("peak_step_memory_gib")] for r in rows])
    for r in rows:
        if r["reason"]:
            print(f"  {r['config']}: {r['reason']}")
    print(f"  would choose: {chosen['config']} ({chosen['why']})", flush=True)


def save_result(path: str | None, result: dict, bench: dict | None) -> None:
    """The JSON (the facts, and the bench so far) in its key order (the phases in step
    order), through a temporary file so the kit never reads half a file."""
    if not path:
        return
    data = result if bench is None else dict(result, bench=bench)
    replace_file(Path(path), (json.dumps(data, indent=2, default=str) + "\n").encode())


# ---------------------------------------------------------------- the profile of a step
WARMUP_STEPS = 2
PROFILED_STEPS = 2


def profile_step(args: dict) -> dict:
    """Profile PROFILED_STEPS steps of train's defaults after WARMUP_STEPS; the summary."""
    cfg = config_from(args)
    with bench_process(args, cfg, None) as info:
        return profiled(args, cfg, info)


def profiled(args: dict, cfg, info) -> dict:
    spec = next(s for s in specs_for(args, cfg, info.device) if not s.reference)
    runner = Runner(spec, cfg, info)
    runner.steps(WARMUP_STEPS)  # also sets TF32 as the run does
    activities = [ProfilerActivity.CPU]
    if info.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        for _ in range(PROFILED_STEPS):
            with record_function("data"):
                images, labels = next(runner.stream)
            with record_function("train_step"):
                runner.step(images, labels)
        sync(info.device)
    on_device = info.device.type == "cuda"
    return dict(model=spec.model, batch_size=spec.batch_size, precision=runner.precision,
                steps=PROFILED_STEPS, basis="device time" if on_device else "host time",
                **step_profile.summarise(prof.events(), on_device))


def print_summary(summary: dict) -> None:
    print(f"profile: {summary['model']} at batch {summary['batch_size']}, "
          f"{summary['precision']}, {summary['steps']} steps, shares of {summary['basis']}")
    for name, phase in summary["phases"].items():
        print(f"  {name:<10} {phase['ms']:10.2f} ms  {100 * phase['share']:5.1f} %")
    print(f"  host syncs inside the steps: {summary['host_syncs']['total']}")
    for op in summary["top"]:
        print(f"  {op['self_ms']:10.2f} ms  {op['calls']:5d}x  {op['name'][:90]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workload.bench.kit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--quick", action="store_true", help="tiny sizes (a CPU smoke run)")
    p.add_argument("--facts", action="store_true", help="only the device and versions")
    p.add_argument("--json", help="write the result here (else stdout)")
    p.add_argument("--time-limit", type=float, default=0, metavar="SECONDS",
                   help="end by then: the part running stops, its unfinished rows and the "
                        "parts not reached say so in the JSON (0: no limit)")
    p.add_argument("--skip", default="", help="comma-separated configs (" + ", ".join(
        levers.CONFIGS) + ") or parts (" + ", ".join(PARTS) + ") to leave out")
    args = p.parse_args(argv)
    if args.device == "cpu":  # scalar C++ kernels: a third less of the CPU form's compiles
        os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "0")
    skip = frozenset(filter(None, (word.strip() for word in args.skip.split(","))))
    if unknown := skip - set(levers.CONFIGS) - set(PARTS):
        p.error(f"--skip {args.skip}: {', '.join(sorted(unknown))} is not a config or part; "
                f"known: {', '.join([*levers.CONFIGS, *PARTS])}")
    result = facts()
    save = partial(save_result, args.json, result)
    save(None)
    bench = None if args.facts else run_bench(args.device, args.quick, save, skip,
                                              args.time_limit)
    if not args.json:
        print(json.dumps(result if bench is None else dict(result, bench=bench), indent=2,
                         default=str))
    errors = bench["errors"] if bench else []
    for error in errors:
        print(f"bench: {error['part']} failed: {error['error']}", file=sys.stderr)
    return 1 if errors else 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
