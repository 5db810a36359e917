"""The whole step compiled (`--compile --compile-scope step`, training/step_graph.py), read
from the code Inductor generates for it on the CPU: the forward with its loss is one graph,
its backward another and the optimizer step a third, whose update is one fused kernel; the
schedule's new learning rate at every step compiles nothing again (it enters as a
tensor); and BatchNorm's elementwise work is fused with the ReLU after it and with the
residual add (the bytes the H200's profile spent 22 % of its device time on), forward
and backward. One tiny Wide ResNet, one compilation (about a minute of CPU here)."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.slow

STEPS = 4
KERNEL = re.compile(r"^(cpp_fused_\w+) = ", re.M)


@pytest.fixture(scope="module")
def compiled_step():
    """Inductor's generated modules, in order, over STEPS steps of the step scope, and the
    learning rates the steps ran at."""
    import torch
    from torch._dynamo.utils import counters
    from torch._inductor import config as inductor_config
    from torch._inductor.utils import run_and_get_code

    from workload import distributed
    from workload.config import build_config
    from workload.training.build import build_state
    from workload.training.trainer import Trainer

    info = distributed.init_distributed("cpu", 600, None)
    cfg = build_config({"model": "wrn", "width": 8, "blocks_per_stage": 1, "device": "cpu",
                        "dataset": "synthetic", "image_size": 16, "num_classes": 4,
                        "compile": True, "compile_scope": "step", "warmup_epochs": 1}, "cpu")
    state = build_state(cfg, info, num_classes=4, steps_per_epoch=STEPS, precision="fp32")
    trainer = Trainer(cfg, info, state, None, "fp32")
    images, labels = torch.randn(8, 3, 16, 16), torch.randint(0, 4, (8,))
    rates, graphs = [], []

    def steps():
        for _ in range(STEPS):
            rates.append(state.optimizer.param_groups[0]["lr"])
            trainer.train_step(images, labels)
            graphs.append(counters["stats"]["unique_graphs"])

    # No cache: a graph loaded from Inductor's cache would not show its code. Scalar C++
    # kernels (vec_isa_ok): the fusions are the same, and the vectorised ones cost a
    # cold compilation a third more (tests/e2e/test_compile_cache.py).
    with torch.random.fork_rng(devices=[]), inductor_config.patch(
            force_disable_caches=True, **{"cpp.vec_isa_ok": False}):
        _, modules = run_and_get_code(steps)
    return [KERNEL.findall(code) for code in modules], rates, graphs, state


def test_the_step_is_three_graphs_and_the_update_one_kernel(compiled_step):
    modules, rates, graphs, state = compiled_step
    forward, backward, *optimizer = modules
    assert any("nll_loss_forward" in k for k in forward), forward  # the loss inside
    assert any("native_batch_norm_backward" in k for k in backward), backward
    # One optimizer graph (its momentum buffers made before the first step), one kernel.
    assert [len(kernels) for kernels in optimizer] == [1], optimizer
    assert "foreach_add" in optimizer[0][0], optimizer
    # The warm-up schedule moved the rate at every step, and after the first step nothing
    # compiled again.
    assert len(set(rates)) == STEPS, rates
    assert graphs == [graphs[0]] * STEPS, graphs
    # Between steps the optimizer holds the schedule's floats (its state dict, the
    # checkpoints), as an eager one does.
    assert all(type(g["lr"]) is float for g in state.optimizer.state_dict()["param_groups"])


def test_batchnorm_is_fused_with_the_relu_and_the_residual_add(compiled_step):
    forward, backward, *_ = compiled_step[0]
    relus = [k for k in forward if "relu" in k]
    assert relus and all("batch_norm" in k for k in relus), forward  # no ReLU on its own
    assert any("batch_norm" in k and "add" in k and "relu" in k for k in forward), forward
    # Backward: ReLU's backward (threshold_backward) inside a BatchNorm kernel, never alone.
    relu_backward = [k for k in backward if "threshold_backward" in k]
    assert relu_backward and all("batch_norm" in k for k in relu_backward), backward
    assert any("native_batch_norm_backward" in k and "threshold_backward" in k
               for k in backward), backward
