"""The GPU check's benchmark part: the reference loop against `train`'s defaults, side by
side in one process, for the Wide ResNet and ResNet-18 on CIFAR-100-shaped data at batch
256; MFU against the GPU's dense bf16 peak; a torch.profiler summary of one train step.

`make gpu-check` (tools/gpu_check.py) runs it; by hand:
    python -m workload.bench.kit --json bench.json                 # on a GPU
    python -m workload.bench.kit --device cpu --quick --json b.json  # CPU smoke run
    python -m workload.bench.kit --facts                           # device and versions only

The profile: torch.profiler over a few steps of `train`'s own step (the bench Runner:
train's defaults, its data backend and Trainer.train_step), summarised as the top
operators and kernels, the share of data, forward, backward and optimizer, and the host
synchronisations inside the steps. The shares are of device time on a GPU (kernels
attributed to the host operator that launched them) and of host time on a CPU. Backward
is autograd's evaluate_function events, the optimizer is torch's
Optimizer.step/zero_grad annotations, data is the next batch (`data` below), and forward
is what is left of the step.
"""

from __future__ import annotations

import argparse
import json
import sys

from torch.profiler import ProfilerActivity, profile, record_function

from workload import distributed
from workload.bench.common import bench_process, config_from, fingerprint
from workload.bench.train import Runner, peak_tflops, specs_for
from workload.bench.train import run as bench_train
from workload.training.trainer import sync

# The comparison at full size (GPU) and at tiny sizes (--quick: CI on a 2-core CPU). Both
# models at the reference's batch size; synthetic data shaped as CIFAR-100 (32x32 RGB).
FULL = dict(batch_size=256, synthetic_size=10_000, num_classes=100, warmup=3, steps=20,
            rounds=3, models={"wrn": {}, "resnet18": {}})
QUICK = dict(batch_size=4, synthetic_size=32, num_classes=10, warmup=1, steps=1, rounds=1,
             models={"wrn": dict(width=8, blocks_per_stage=1),
                     "resnet18": dict(image_size=16)})


def bench_args(device: str, size: dict, model: str) -> dict:
    """`bench train --versus-reference` for one model, as its flags would give them."""
    return dict(command="train", device=device, dataset="synthetic",
                synthetic_size=size["synthetic_size"], num_classes=size["num_classes"],
                model=model, batch_size=size["batch_size"], batch_sizes="256",
                versus_reference=True, precision="auto", channels_last=device != "cpu",
                compile=False, warmup=size["warmup"], steps=size["steps"],
                rounds=size["rounds"], json=None, threads=0, seed=0,
                **size["models"][model])


def mfu(result: dict, device) -> float | None:
    """Model FLOPs utilisation: achieved TFLOP/s over the GPU's dense bf16 peak; None on a
    CPU or a GPU without a known peak."""
    peak = peak_tflops(device, "bf16")
    return None if peak is None else result["achieved_tflops"] / peak[1]


def row(model: str, results: dict, device) -> dict:
    reference, optimised = results["reference"], results["optimised"]
    return dict(model=model, batch_size=optimised["batch_size"],
                reference_images_per_second=reference["images_per_second"],
                images_per_second=optimised["images_per_second"],
                ratio=optimised["vs_reference"], mfu=mfu(optimised, device),
                reference_mfu=mfu(reference, device), precision=optimised["precision"],
                reference_precision=reference["precision"],
                channels_last=optimised["channels_last"], pipeline=optimised["pipeline"],
                flops_per_image=optimised["flops_per_image"])


def facts() -> dict:
    """The device and the versions the figures depend on."""
    found = fingerprint()
    return dict(device=found["devices"][0], driver=found["driver"], versions=found["versions"],
                fingerprint=found)


def run_bench(device_flag: str, quick: bool) -> dict:
    size = QUICK if quick else FULL
    device = distributed.resolve_device(device_flag)
    rows = [row(model, bench_train(bench_args(device_flag, size, model)), device)
            for model in size["models"]]
    summary = profile_step(bench_args(device_flag, size, "wrn"))
    print_summary(summary)
    return dict(rows=rows, profile=summary, sizes={k: v for k, v in size.items()},
                peak_note="mfu: achieved TFLOP/s (FlopCounterMode's count) over the GPU's "
                          "dense bf16 datasheet peak")


# ---------------------------------------------------------------- the profile of a step
WARMUP_STEPS, PROFILED_STEPS, TOP = 2, 2, 10
BACKWARD = "autograd::engine::evaluate_function"
OPTIMIZER = ("Optimizer.step#", "Optimizer.zero_grad#")
# Operators that make the host wait for the device: each one inside a step is a stall.
HOST_SYNCS = ("aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize",
              "cudaEventSynchronize", "cudaMemcpy")


def profile_step(args: dict) -> dict:
    """Profile PROFILED_STEPS steps of train's defaults after WARMUP_STEPS; the summary."""
    cfg = config_from(args)
    with bench_process(args, cfg) as info:
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
                phases=phase_shares(prof.events(), on_device),
                host_syncs=host_syncs(prof.events()), top=top_ops(prof, on_device))


def _time(event, on_device: bool) -> float:
    """Microseconds of one event, its children included: device or host time."""
    if on_device:
        return _device_attribute(event, "device_time_total")
    return event.cpu_time_total


def _device_attribute(event, name: str) -> float:
    """torch's device-time figure (named cuda_... before torch 2.4, deprecated since)."""
    if hasattr(event, name):
        return getattr(event, name)
    return getattr(event, name.replace("device", "cuda"))


def _under(event, name: str) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name == name:
            return True
        parent = parent.cpu_parent
    return False


def _outermost(events, prefixes) -> list:
    """Events named with a prefix that no ancestor of the same kind encloses."""
    return [e for e in events if e.name.startswith(prefixes)
            and not (e.cpu_parent is not None and e.cpu_parent.name.startswith(prefixes))]


def phase_shares(events, on_device: bool) -> dict:
    """Milliseconds and share of the profiled steps in data, forward, backward, optimizer."""
    step = [e for e in events if e.name == "train_step"]
    parts = {"backward": _outermost(events, (BACKWARD,)),
             "optimizer": _outermost(events, OPTIMIZER)}
    us = {name: sum(_time(e, on_device) for e in found) for name, found in parts.items()}
    inside = sum(_time(e, on_device) for found in parts.values() for e in found
                 if _under(e, "train_step"))
    us["forward"] = max(0.0, sum(_time(e, on_device) for e in step) - inside)
    us["data"] = sum(_time(e, on_device) for e in events if e.name == "data")
    total = sum(us.values()) or 1.0
    return {name: dict(ms=us[name] / 1e3, share=us[name] / total)
            for name in ("data", "forward", "backward", "optimizer")}


def host_syncs(events) -> dict:
    counts: dict[str, int] = {}
    for event in events:
        if event.name.startswith(HOST_SYNCS):
            counts[event.name] = counts.get(event.name, 0) + 1
    return dict(total=sum(counts.values()), by_name=counts)


def top_ops(prof, on_device: bool) -> list[dict]:
    """The operators and kernels with the most self time (device time on a GPU)."""
    def self_us(avg) -> float:
        if on_device:
            return _device_attribute(avg, "self_device_time_total")
        return avg.self_cpu_time_total

    averages = sorted(prof.key_averages(), key=self_us, reverse=True)[:TOP]
    return [dict(name=a.key, self_ms=self_us(a) / 1e3, calls=a.count) for a in averages]


def print_summary(summary: dict) -> None:
    print(f"profile: {summary['model']} at batch {summary['batch_size']}, "
          f"{summary['precision']}, {summary['steps']} steps, shares of {summary['basis']}")
    for name, phase in summary["phases"].items():
        print(f"  {name:<10} {phase['ms']:10.2f} ms  {100 * phase['share']:5.1f} %")
    print(f"  host syncs inside the steps: {summary['host_syncs']['total']}")
    for op in summary["top"]:
        print(f"  {op['self_ms']:10.2f} ms  {op['calls']:5d}x  {op['name'][:90]}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m workload.bench.kit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--quick", action="store_true", help="tiny sizes (a CPU smoke run)")
    p.add_argument("--facts", action="store_true", help="only the device and versions")
    p.add_argument("--json", help="write the result here (else stdout)")
    args = p.parse_args(argv)
    result = facts()
    if not args.facts:
        result["bench"] = run_bench(args.device, args.quick)
    text = json.dumps(result, indent=2, default=str)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
