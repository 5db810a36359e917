"""Where a `train` step's time goes: torch.profiler over a few steps of train's own step
(the bench Runner: train's defaults, its data backend and Trainer.train_step), summarised
as the top operators and kernels, the share of data, forward, backward and optimizer, and
the host synchronisations inside the steps.

The shares are of device time on a GPU (kernels attributed to the host operator that
launched them) and of host time on a CPU. Backward is autograd's evaluate_function events,
the optimizer is torch's Optimizer.step/zero_grad annotations, data is the next batch
(`data` below), and forward is what is left of the step.
"""

from __future__ import annotations

from torch.profiler import ProfilerActivity, profile, record_function

from workload import distributed
from workload.bench.common import config_from
from workload.bench.train import Runner, specs_for
from workload.training.trainer import sync

WARMUP_STEPS, PROFILED_STEPS, TOP = 2, 2, 10
BACKWARD = "autograd::engine::evaluate_function"
OPTIMIZER = ("Optimizer.step#", "Optimizer.zero_grad#")
# Operators that make the host wait for the device: each one inside a step is a stall.
HOST_SYNCS = ("aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize",
              "cudaEventSynchronize", "cudaMemcpy")


def profile_step(args: dict) -> dict:
    """Profile PROFILED_STEPS steps of train's defaults after WARMUP_STEPS; the summary."""
    info = distributed.init_distributed(args["device"])
    cfg = config_from(args)
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

