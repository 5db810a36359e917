"""The kit's rows: one model under each speed lever, side by side in one process with the
reference loop, one row each (`bench.rows`, named by `config`).

    reference        the Olivia guide's loop (FP32, TF32 on a GPU, per-sample pipeline)
    defaults         train's defaults (on a GPU: bf16, channels-last, fused SGD, `device`
                     data)
    compile          + torch.compile, default mode (--compile)
    max-autotune     + --compile-mode max-autotune-no-cudagraphs
    cudagraphs       + --compile-mode reduce-overhead (CUDA graphs over forward and backward)
    compile-blocks   + --compile-scope blocks (each residual block a compiled region:
                     BatchNorm, ReLU and the add fused by Inductor)
    compile-step     + --compile-scope step (the whole step compiled: the model with its
                     loss, and the optimizer step; workload/training/step_graph.py)
    cudagraphs-step  + --compile-scope step --compile-mode reduce-overhead (the whole step
                     in CUDA graphs)

Each row: images/s (median of the alternating rounds), x reference, MFU, GPU energy per
image (NVML's board counter over the timed steps, where it reads), the compile time (the
warm-up's excess over ordinary steps) and the step's peak memory (above what the process
held when the step began: activations and workspaces, not the models of the other rows).
A row that fails, or does not apply on this device, says so in `status` and `reason`, and
the other rows still run. `choice` names the fastest measured row among the configs whose
exact resume is tested, and why.
"""

from __future__ import annotations

import statistics
import traceback

import torch

from workload.config import image_size_of
from workload.bench.train import Runner, Spec, flops_per_image, peak_tflops
from workload.training.energy import gpu_meter

# name -> (compile mode, compile scope); None: not compiled. MAIN run side by side in one
# process per model; LATE (max-autotune: its compile time is the least known) in a part
# of its own at the end, beside the reference again, so a stop at the part's limit
# loses it alone.
CONFIGS = {"reference": None, "defaults": None, "compile": ("default", "model"),
           "cudagraphs": ("reduce-overhead", "model"), "compile-blocks": ("default", "blocks"),
           "compile-step": ("default", "step"), "cudagraphs-step": ("reduce-overhead", "step"),
           "max-autotune": ("max-autotune-no-cudagraphs", "model")}
CPU_SKIPPED = ("not run in the CPU form: Inductor's C++ build of even the tiny model takes "
               "minutes on a small CPU (docs/performance.md); `bench train --versus-reference "
               "--compile` measures a compiled model there")
LATE = ("max-autotune",)
# The configs whose exact resume the suite tests (tests/e2e/test_compile_cache.py on the
# CPU, the GPU tier's bit-exact resume): the only ones train may take as its default.
RESUME_TESTED = ("defaults", "compile", "compile-blocks", "compile-step")
# Compiled rows the CPU form runs all the same (model, config): the whole step's graph of
# the Wide ResNet, the kit's one row that shows on any machine that the optimizer step
# compiles into the step (ResNet-18's took 233 s more of a loaded 2-core machine).
ON_THE_CPU = (("wrn", "compile-step"),)
MAIN = tuple(config for config in CONFIGS if config not in LATE)
GPU_ONLY = "CUDA graphs need a GPU: does not apply on the CPU"
GIB = 2**30


def not_applicable(config: str, device: torch.device, model: str) -> str | None:
    """Why a config is not run for this model on this device, or None."""
    if device.type == "cuda" or CONFIGS[config] is None or (model, config) in ON_THE_CPU:
        return None
    return GPU_ONLY if CONFIGS[config][0] == "reduce-overhead" else CPU_SKIPPED


def spec_for(config: str, model: str, batch: int, device: torch.device) -> Spec:
    if config == "reference":
        return Spec(config, model, batch, "tf32" if device.type == "cuda" else "fp32", False,
                    reference=True)
    mode, scope = CONFIGS[config] or ("default", "model")
    # train's defaults: bf16 and channels-last on a GPU; fp32 and NCHW on a CPU (whose
    # emulated bf16 is slower, docs/performance.md).
    return Spec(config, model, batch, "auto", device.type == "cuda",
                compile=CONFIGS[config] is not None, compile_mode=mode, compile_scope=scope)


class Row:
    """One config's runner and what its timed runs measured."""

    def __init__(self, config: str, model: str, batch: int):
        self.config = config
        self.model = model
        self.batch = batch
        self.runner = None
        self.reason = None
        self.status = "measured"
        self.warm = None
        self.runs = []
        self.joules = []
        self.peak = 0

    def fail(self, stage: str, exc: Exception) -> None:
        traceback.print_exc()
        self.status = "failed"
        self.reason = f"{stage}: {type(exc).__name__}: {exc}"[:500]
        self.runner = None  # its model and graphs are not kept for later rounds


def planned(model: str, batch: int, configs, device: torch.device,
            skip=frozenset()) -> list[Row]:
    """The rows of one part; those left out or not for this device already say why."""
    rows = [Row(config, model, batch) for config in configs]
    for row in rows:
        if row.config in skip:
            row.status = "not run"
            row.reason = "left out (--skip)"
        elif reason := not_applicable(row.config, device, model):
            row.status = "not run"
            row.reason = reason
    return rows


def worth_a_process(rows: list[Row]) -> bool:
    """Whether any row but the reference (there only to compare with) is to be measured."""
    return any(r.status == "measured" and r.config != "reference" for r in rows)


def measure_rows(rows: list[Row], args: dict, cfg, info, meter=None) -> list[dict]:
    """The planned rows of one model side by side in this process, alternating rounds."""
    device = info.device
    meter = meter or gpu_meter(device, info.local_rank)
    for row in rows:
        if row.status != "measured":
            continue
        try:
            row.runner = Runner(spec_for(row.config, row.model, row.batch, device), cfg, info)
            row.warm = row.runner.steps(args["warmup"])
        except Exception as exc:  # noqa: BLE001 -- one lever's failure is its row's
            row.fail("build and warm-up", exc)
    for _ in range(args["rounds"]):
        for row in rows:  # alternating, so a busy machine slows them all alike
            if row.runner is not None:
                timed_run(row, args["steps"], meter, device)
    built = [r.runner for r in rows if r.runner is not None]
    flops = flops_per_image(cfg.replace(model=args["model"]), built[0].num_classes,
                            image_size_of(cfg)) if built else None
    return [described(row, flops, device, reference_rate(rows), meter) for row in rows]


def timed_run(row: Row, steps: int, meter, device: torch.device) -> None:
    """One timed run of a row: images and seconds, its board energy and step memory."""
    on_gpu = device.type == "cuda"
    try:
        if on_gpu:
            torch.cuda.reset_peak_memory_stats(device)
            held = torch.cuda.memory_allocated(device)
        before = meter.update(fresh=True)
        row.runs.append(row.runner.steps(steps))
        after = meter.update(fresh=True)
        if before is not None and after is not None:
            row.joules.append(after - before)
        if on_gpu:
            row.peak = max(row.peak, torch.cuda.max_memory_allocated(device) - held)
    except Exception as exc:  # noqa: BLE001
        row.fail("timed steps", exc)


def unfinished(rows: list[Row], why: str) -> list[dict]:
    """The rows of a part stopped at the kit's time limit (the rounds alternate, so no
    row had all its rounds): those not planned or failed as they are, the others `not
    finished`, saying where they were."""
    out = []
    for row in rows:
        if row.status == "measured":
            row.status = "not finished"
            where = "timed" if row.runs else "built, compiled or warmed up (or not started)"
            row.reason = f"{why} while this row was {where}"
        out.append(dict(model=row.model, config=row.config, batch_size=row.batch,
                        status=row.status, reason=row.reason))
    return out


def reference_rate(rows: list[Row]) -> float | None:
    reference = next((r for r in rows if r.config == "reference"), None)
    return images_per_second(reference) if reference and reference.runs else None


def images_per_second(row: Row) -> float:
    return statistics.median(n / s for n, s in row.runs)


def described(row: Row, flops: float, device, reference: float | None, meter) -> dict:
    out = dict(model=row.model, config=row.config, batch_size=row.batch, status=row.status,
               reason=row.reason)
    if not row.runs or row.status != "measured":
        return out
    spec = row.runner.spec
    runner = row.runner
    rate = images_per_second(row)
    step_s = statistics.median(s / (n / row.batch) for n, s in row.runs)
    peak = peak_tflops(device, "bf16")
    images = sum(n for n, _ in row.runs)
    out.update(
        images_per_second=rate, runs_images_per_second=[n / s for n, s in row.runs],
        ratio=rate / reference if reference else None,
        mfu=None if peak is None else flops * rate / 1e12 / peak[1],
        flops_per_image=flops, precision=runner.precision, channels_last=spec.channels_last,
        pipeline="reference per-sample" if spec.reference else runner.backend,
        compile_mode=spec.compile_mode if spec.compile else None,
        compile_scope=spec.compile_scope if spec.compile else None,
        compile_s=(row.warm[1] - step_s * row.warm[0] / row.batch) if spec.compile else None,
        peak_step_memory_gib=row.peak / GIB if device.type == "cuda" else None,
        energy_j_per_image=sum(row.joules) / images if len(row.joules) == len(row.runs)
        else None,
        energy_note=meter.reason or "the GPU board's energy counter (NVML) over the timed steps")
    return out


def choice(rows: list[dict]) -> dict:
    """Which config train would take for this model, and why: the fastest measured one
    among those whose exact resume the suite tests (RESUME_TESTED); a faster one without
    that test is named, as the next to test."""
    measured = [r for r in rows if r["status"] == "measured" and r["config"] != "reference"]
    candidates = [r for r in measured if r["config"] in RESUME_TESTED]
    if not candidates:
        return dict(config=None, why="no config with a tested exact resume was measured")
    best = max(candidates, key=lambda r: r["images_per_second"])
    defaults = next((r for r in measured if r["config"] == "defaults"), None)
    gain = best["images_per_second"] / defaults["images_per_second"] if defaults else None
    why = f"the fastest measured, {best['images_per_second']:,.0f} images/s"
    if best is not defaults and gain:
        why += f", {gain:.2f}x train's defaults"
    if best.get("compile_s"):
        why += f", for {best['compile_s']:.0f} s of compile at the start"
    faster = [r["config"] for r in measured
              if r["images_per_second"] > best["images_per_second"] and r not in candidates]
    if faster:
        why += f"; faster but without a tested exact resume: {', '.join(faster)}"
    return dict(model=best["model"], config=best["config"], why=why, vs_defaults=gain)
