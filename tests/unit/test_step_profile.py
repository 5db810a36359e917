"""The GPU check's profile summary (workload/bench/step_profile.py) on profiler events as
kineto records them on a GPU: each record_function range twice, on the host (its device
time is the kernels launched inside it) and as a device-side user annotation spanning the
whole range; runtime calls under the ops that made them; the synchronise that closes the
profiled block outside the steps."""

from __future__ import annotations

import pytest
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from workload.bench import step_profile

CUDA = DeviceType.CUDA


class Recorder:
    """FunctionEvents with their host parents and kernels, as the profiler links them."""

    def __init__(self):
        self.events: list[FunctionEvent] = []

    def host(self, name, start, end, parent=None, kernel_us=0.0, annotation=False):
        event = FunctionEvent(len(self.events), name, thread=1, start_us=start, end_us=end,
                              use_device="cuda", is_user_annotation=annotation)
        if kernel_us:
            event.append_kernel(f"{name}_kernel", 0, kernel_us)
            self.device(f"{name}_kernel", start, start + kernel_us)
        if parent is not None:
            event.set_cpu_parent(parent)
            parent.append_cpu_child(event)
        self.events.append(event)
        return event

    def device(self, name, start, end, annotation=False):
        self.events.append(FunctionEvent(len(self.events), name, thread=7, start_us=start,
                                         end_us=end, use_device="cuda", device_type=CUDA,
                                         is_user_annotation=annotation))


def one_step_on_a_gpu() -> list[FunctionEvent]:
    r = Recorder()
    data = r.host("data", 0, 100, annotation=True)
    r.host("aten::copy_", 10, 20, parent=data, kernel_us=10)
    r.device("data", 0, 900, annotation=True)  # the GPU's view: until its work ran
    step = r.host("train_step", 100, 1100, annotation=True)
    conv = r.host("aten::convolution", 110, 200, parent=step, kernel_us=300)
    r.host("cudaMemcpyAsync", 120, 121, parent=conv)  # returns at once: not a sync
    r.host(step_profile.BACKWARD + "ConvolutionBackward0", 300, 600, parent=step,
           kernel_us=400)
    optimizer = r.host("Optimizer.step#SGD.step", 700, 900, parent=step, annotation=True)
    r.host("aten::_foreach_add_", 710, 800, parent=optimizer, kernel_us=100)
    r.device("Optimizer.step#SGD.step", 700, 1500, annotation=True)
    r.host("aten::_local_scalar_dense", 950, 1000, parent=step)  # .item(): a real stall
    r.device("train_step", 100, 2100, annotation=True)
    r.host("cudaDeviceSynchronize", 1100, 2100)  # closes the profiled block
    return r.events


def test_the_phases_count_each_range_once_not_its_device_annotation_too():
    phases = step_profile.phase_shares(one_step_on_a_gpu(), on_device=True)
    ms = {name: phase["ms"] for name, phase in phases.items()}
    # Kernel time: data 10 us; the step's 800 us are 300 forward, 400 backward, 100 optimizer.
    assert ms == pytest.approx(dict(data=0.01, forward=0.3, backward=0.4, optimizer=0.1))
    assert sum(phase["share"] for phase in phases.values()) == pytest.approx(1.0)


def test_host_syncs_are_the_stalls_inside_the_steps_only():
    syncs = step_profile.host_syncs(one_step_on_a_gpu())
    assert syncs == dict(total=1, by_name={"aten::_local_scalar_dense": 1})


def test_device_annotations_do_not_head_the_kernel_list():
    top = step_profile.top_ops(one_step_on_a_gpu(), on_device=True)
    assert top[0]["self_ms"] == pytest.approx(0.4)  # backward's kernel, not a 2 ms range
    by_name = {op["name"]: op for op in top}
    assert by_name["train_step"]["self_ms"] == 0  # the host range launches no kernel itself
    assert by_name["aten::convolution_kernel"]["calls"] == 1
