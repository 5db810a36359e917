"""The summary of a profiled train step, from torch.profiler's events: the share of data,
forward, backward and optimizer, the host synchronisations inside the steps, and the
operators and kernels with the most self time.

The profiled loop marks each step's parts with `record_function` ranges named `data` and
`train_step` (STEP_RANGES). On a GPU, kineto records each such range twice: on the host,
where its device time is the kernels launched inside it, and as a device-side user
annotation spanning the whole range on the GPU's timeline. torch's own tables leave the
device-side ones out (pytorch/pytorch#130730, #144613); counted, they would double data,
step and optimizer and head the kernel list. So the phases and syncs are read from host
events only, and device-side annotations never enter the top list.
"""

from __future__ import annotations

from torch.autograd import DeviceType

STEP_RANGES = ("data", "train_step")
BACKWARD = "autograd::engine::evaluate_function"
OPTIMIZER = ("Optimizer.step#", "Optimizer.zero_grad#")
# Calls that make the host wait for the device. cudaMemcpyAsync is not one (it returns at
# once); a plain cudaMemcpy is. Exact names: a prefix would also match cudaMemcpyAsync.
HOST_SYNCS = frozenset(("aten::_local_scalar_dense", "cudaStreamSynchronize",
                        "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"))
TOP = 10


def summarise(events, on_device: bool) -> dict:
    """Phases, host syncs inside the steps, and the top operators and kernels."""
    return dict(phases=phase_shares(events, on_device), host_syncs=host_syncs(events),
                top=top_ops(events, on_device))


def is_device_annotation(event) -> bool:
    """A record_function range as the GPU's timeline shows it (the whole range's span)."""
    return (bool(getattr(event, "is_user_annotation", False))
            and event.device_type != DeviceType.CPU)


def host_events(events) -> list:
    return [e for e in events if e.device_type == DeviceType.CPU]


def _time(event, on_device: bool) -> float:
    """Microseconds of one host event, its children included: device or host time."""
    if on_device:
        return _device_attribute(event, "device_time_total")
    return event.cpu_time_total


def _device_attribute(event, name: str) -> float:
    """torch's device-time figure (named cuda_... before torch 2.4, deprecated since)."""
    if hasattr(event, name):
        return getattr(event, name)
    return getattr(event, name.replace("device", "cuda"))


def _under(event, names) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name in names:
            return True
        parent = parent.cpu_parent
    return False


def _outermost(events, prefixes) -> list:
    """Events named with a prefix that no ancestor of the same kind encloses."""
    return [e for e in events if e.name.startswith(prefixes)
            and not (e.cpu_parent is not None and e.cpu_parent.name.startswith(prefixes))]


def phase_shares(events, on_device: bool) -> dict:
    """Milliseconds and share of the profiled steps in data, forward, backward, optimizer."""
    events = host_events(events)
    step = [e for e in events if e.name == "train_step"]
    parts = {"backward": _outermost(events, (BACKWARD,)),
             "optimizer": _outermost(events, OPTIMIZER)}
    us = {name: sum(_time(e, on_device) for e in found) for name, found in parts.items()}
    inside = sum(_time(e, on_device) for found in parts.values() for e in found
                 if _under(e, ("train_step",)))
    us["forward"] = max(0.0, sum(_time(e, on_device) for e in step) - inside)
    us["data"] = sum(_time(e, on_device) for e in events if e.name == "data")
    total = sum(us.values()) or 1.0
    return {name: dict(ms=us[name] / 1e3, share=us[name] / total)
            for name in ("data", "forward", "backward", "optimizer")}


def host_syncs(events) -> dict:
    """The calls inside the steps' ranges that make the host wait for the device (not the
    synchronise that closes the profiled block)."""
    counts: dict[str, int] = {}
    for event in host_events(events):
        if event.name in HOST_SYNCS and _under(event, STEP_RANGES):
            counts[event.name] = counts.get(event.name, 0) + 1
    return dict(total=sum(counts.values()), by_name=counts)


def top_ops(events, on_device: bool) -> list[dict]:
    """The operators and kernels with the most self time (device time on a GPU), summed
    by name; device-side annotations left out."""
    totals: dict[str, list] = {}
    for event in events:
        if is_device_annotation(event):
            continue
        us = (_device_attribute(event, "self_device_time_total") if on_device
              else event.self_cpu_time_total)
        entry = totals.setdefault(event.name, [0.0, 0])
        entry[0] += us
        entry[1] += 1
    ranked = sorted(totals.items(), key=lambda item: item[1][0], reverse=True)[:TOP]
    return [dict(name=name, self_ms=us / 1e3, calls=calls) for name, (us, calls) in ranked]
