"""The whole train step in compiled graphs (`--compile --compile-scope step`): the model's
forward with its loss in one compiled region (AOTAutograd compiles the backward with it),
and the optimizer step in another, so that nothing of a step is launched from Python one
kernel at a time (the eager step launches the loss, its backward and the SGD update
kernel by kernel: on an H200 the step was bound by the host's launches). Under
--compile-mode reduce-overhead both regions are CUDA graphs.

The learning rate enters the compiled optimizer step as a tensor: a Python float would be
a constant of the graph, and the schedule's new value at every step a recompile. Only the
live step sees the tensor; the optimizer's param_groups keep the schedule's floats between
steps, so its state dict, the schedule and the checkpoints are those of an eager run and a
checkpoint resumes under either (the optimizer's state, momentum buffers and any step
count, is the optimizer's own, saved and loaded as ever).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn


def compiles_step(hardware) -> bool:
    """--compile --compile-scope step (the config's `hardware` settings)."""
    return hardware.compile and hardware.compile_scope == "step"


def forward_and_loss(model: nn.Module, loss_fn: nn.Module, hardware) -> Callable:
    """The step's forward: `loss_fn(model(images), labels)`, compiled as one region in the
    step scope, else as it is."""
    def forward(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return loss_fn(model(images), labels)

    if not compiles_step(hardware):
        return forward
    return torch.compile(forward, mode=hardware.compile_mode, dynamic=False)


class CompiledOptimizerStep:
    """`optimizer.step` compiled, the learning rates handed in as tensors (see above).
    Installed as the optimizer's own `step`, so the gradient scaler and the schedule call
    it as they call the eager one."""

    # The schedule's check that the optimizer steps before it (it wraps `step` when it is
    # built) finds this mark; the compiled step calls the schedule's wrapper inside.
    _wrapped_by_lr_sched = True

    def __init__(self, optimizer: torch.optim.Optimizer, mode: str):
        self.optimizer = optimizer
        device = optimizer.param_groups[0]["params"][0].device
        self.rates = [torch.tensor(float(group["lr"]), device=device)
                      for group in optimizer.param_groups]
        with_momentum(optimizer)
        eager_step = optimizer.step
        # fullgraph off: the step's profiler hooks and the schedule's call counter are
        # Python around the update, which Dynamo may leave out of the graph.
        self.graph = torch.compile(lambda: eager_step(), mode=mode, fullgraph=False)
        optimizer.step = self

    def __call__(self, closure=None):
        if closure is not None:
            raise ValueError("the compiled optimizer step takes no closure (SGD needs none)")
        self.optimizer._opt_called = True  # what the schedule's wrapper marks
        groups = self.optimizer.param_groups  # a loaded checkpoint replaces the groups
        floats = [group["lr"] for group in groups]
        for group, rate, lr in zip(groups, self.rates, floats):
            rate.fill_(lr)  # the one launch of the step from Python: the schedule's value
            group["lr"] = rate
        try:
            return self.graph()
        finally:
            for group, lr in zip(groups, floats):
                group["lr"] = lr


@torch.no_grad()
def with_momentum(optimizer: torch.optim.Optimizer) -> None:
    """SGD's momentum buffers made before the first step, as zeros: SGD's first step
    otherwise copies the gradient into a new buffer, a graph of its own, so the step would
    compile twice (the second time inside the run's timed steps). A zero buffer gives the
    first step the same values (momentum x 0 + gradient); a checkpoint's loaded buffers
    replace them."""
    for group in optimizer.param_groups:
        if group.get("momentum", 0):
            for param in group["params"]:
                state = optimizer.state[param]
                if state.get("momentum_buffer") is None:
                    state["momentum_buffer"] = torch.zeros_like(
                        param, memory_format=torch.preserve_format)
