"""What the loop's probe and the energy readings cost a training step.

Three measurements, in one process:

  probe     the probe's six calls of one step (workload.training.probe.StepProbe),
            repeated, on the host clock; with --device cuda also with the CUDA events
            the straggler check records on a GPU (several ranks);
  energy    one reading of every energy counter this process has (the GPU's NVML
            counter on a GPU, the node's RAPL packages where readable), as the log
            interval's exchange makes it (the GPU's latest background reading): its
            cost is spread over --log-every steps; and a fresh one, as a checkpoint
            takes it;
  step      the training step it is compared with: the same model's steps timed with
            and without the probe's calls, alternating rounds, medians.

and prints each, and the probe's and the energy's share of a step.

    python tools/bench_probe.py                               # CPU, a small Wide ResNet
    python tools/bench_probe.py --device cuda --width 160 --batch-size 256   # a GPU
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn as nn

from workload.models import build_model
from workload.training.energy import cpu_meter, gpu_meter
from workload.training.probe import StepProbe


class NoProbe:
    """The probe's calls, doing nothing: the step without the probe."""

    def step_start(self): ...
    def data_ready(self): ...
    def forward_start(self): ...
    def backward_start(self): ...
    def optimizer_start(self): ...
    def step_end(self, step, images): ...


def one_step(probe, step: int) -> None:
    probe.step_start()
    probe.data_ready()
    probe.forward_start()
    probe.backward_start()
    probe.optimizer_start()
    probe.step_end(step, 64)


def probe_cost_us(on_gpu: bool, cycles: int) -> float:
    probe = StepProbe()
    if on_gpu:
        probe.time_on_gpu()
    for step in range(100):  # warm-up
        one_step(probe, step)
    start = time.perf_counter()
    for step in range(cycles):
        one_step(probe, step)
        if on_gpu and step % 100 == 99:  # as the exchange does, once per interval
            probe.busy_total_s()
    return (time.perf_counter() - start) / cycles * 1e6


def energy_cost_us(device: torch.device, readings: int,
                   fresh: bool) -> tuple[float | None, str]:
    """One reading of every counter: the log interval's (the latest background reading)
    or a checkpoint's (fresh: waits for the counter)."""
    meters = [m for m in (gpu_meter(device, 0), cpu_meter(0)) if m.counting]
    said = ", ".join(m.name for m in meters) or "no counter readable here"
    if not meters:
        return None, said
    start = time.perf_counter()
    for _ in range(readings):
        for meter in meters:
            meter.update(fresh=fresh)
    return (time.perf_counter() - start) / readings * 1e6, said


def step_s(args, device: torch.device) -> tuple[float, float]:
    """Median step time with the probe's calls and without, alternating rounds."""
    model = build_model("wrn", num_classes=10, width=args.width, blocks_per_stage=1,
                        stem="small").to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(args.batch_size, 3, 32, 32, device=device)
    labels = torch.randint(0, 10, (args.batch_size,), device=device)
    loss_fn = nn.CrossEntropyLoss()

    def steps(probe, count: int) -> float:
        start = time.perf_counter()
        for step in range(count):
            probe.step_start()
            probe.data_ready()
            probe.forward_start()
            loss = loss_fn(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            probe.backward_start()
            loss.backward()
            probe.optimizer_start()
            optimizer.step()
            probe.step_end(step, args.batch_size)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - start) / count

    steps(NoProbe(), 3)  # warm-up
    with_probe, without = [], []
    for _ in range(args.rounds):
        with_probe.append(steps(StepProbe(), args.steps))
        without.append(steps(NoProbe(), args.steps))
    return statistics.median(with_probe), statistics.median(without)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--width", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--log-every", type=int, default=50, help="steps per energy reading")
    args = p.parse_args()
    device = torch.device(args.device)
    host = probe_cost_us(False, 200_000)
    print(f"probe, host clock: {host:.2f} us per step")
    gpu = probe_cost_us(True, 20_000) if device.type == "cuda" else None
    if gpu is not None:
        print(f"probe, CUDA events: {gpu:.2f} us per step")
    energy, said = energy_cost_us(device, 200, fresh=False)
    print(f"energy reading ({said}): " +
          ("not measured" if energy is None else f"{energy:.1f} us per log interval"))
    fresh, _ = energy_cost_us(device, 50, fresh=True)
    if fresh is not None:
        print(f"fresh energy reading, once per checkpoint and at the end: {fresh:.1f} us")
    with_probe, without = step_s(args, device)
    print(f"step: {with_probe * 1e3:.2f} ms with the probe, {without * 1e3:.2f} ms without "
          f"(medians of {args.rounds} rounds of {args.steps})")
    cost = max(host, gpu or 0.0) + (energy or 0.0) / args.log_every
    print(f"probe and energy: {cost:.2f} us per step = {cost / (without * 1e6) * 100:.4f} % "
          f"of a step")


if __name__ == "__main__":
    main()
