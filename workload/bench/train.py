"""`bench train`: training images/s per device across models and batch sizes, FLOPs per
image, achieved TFLOP/s and the share of a known GPU's datasheet peak; or the reference
loop against the optimised one (and what --compile adds) side by side in one run."""

from __future__ import annotations

import dataclasses
import statistics

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

from workload import distributed
from workload.bench.common import (bench_process, config_from, print_table, summarise, timed,
                                   write_report)
from workload.bench.flags import parse_sizes
from workload.bench.input import ReferenceLoader, endless
from workload.data import NATURAL_IMAGE_SIZE, DataRequest, build_data, read_in_memory
from workload.launch import PreemptionFlag
from workload.models import model_for
from workload.precision import configure_cudnn, configure_tf32, resolve_precision
from workload.training.build import build_state, place_model
from workload.training.trainer import Trainer

# Dense (no sparsity) datasheet peaks in TFLOP/s of the SXM parts; GH200 and H200 carry the
# H100's tensor cores. Matched by substring in this order. These are NVIDIA's numbers,
# not measured here: the H100 Tensor Core GPU datasheet gives the SXM5 part 1,979 BF16
# TFLOP/s "with sparsity", 989.4 dense (989.4 is also NVIDIA's dense figure in the
# Hopper architecture whitepaper); MFU in the GPU check is measured against it.
HOPPER_SXM = {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}
DATASHEET_PEAK_TFLOPS = (
    ("GH200", HOPPER_SXM),
    ("H200", HOPPER_SXM),
    ("H100 PCIe", {"bf16": 756, "fp16": 756, "tf32": 378, "fp32": 51}),
    ("H100", HOPPER_SXM),
    ("A100", {"bf16": 312, "fp16": 312, "tf32": 156, "fp32": 19.5}),
)
DEFAULT_MODELS = ("resnet18", "wrn")


@dataclasses.dataclass
class Spec:
    """One configuration to measure."""
    name: str
    model: str
    batch_size: int
    precision: str
    channels_last: bool
    compile: bool = False
    reference: bool = False
    compile_mode: str = "default"
    compile_scope: str = "model"


def reference_step(model, optimizer, loss_fn, images, labels) -> None:
    """The reference's step (the guide's train_utils.train loop body): fp32, no autocast,
    no scaler."""
    loss = loss_fn(model(images), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def peak_tflops(device: torch.device, precision: str) -> tuple[str, float] | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, peaks in DATASHEET_PEAK_TFLOPS:
        if key in name:
            return key, peaks.get(precision, peaks["fp32"])
    return None


def flops_per_image(cfg, num_classes: int, image_size: int) -> float:
    """Forward and backward FLOPs of one image, counted on the meta device (no compute)."""
    model = model_for(cfg.replace(image_size=image_size), num_classes).to("meta")
    images = torch.empty(2, 3, image_size, image_size, device="meta")
    with FlopCounterMode(display=False) as counter:
        model(images).sum().backward()
    return counter.get_total_flops() / 2


class Runner:
    """A model, optimizer and batch stream for one Spec, kept across alternating rounds."""

    def __init__(self, spec: Spec, base_cfg, info: distributed.DistInfo):
        self.spec = spec
        self.info = info
        self.device = info.device
        cfg = base_cfg.replace(model=spec.model, batch_size=spec.batch_size,
                               precision=spec.precision, channels_last=spec.channels_last,
                               compile=spec.compile, compile_mode=spec.compile_mode,
                               compile_scope=spec.compile_scope)
        self.cfg = cfg
        self.precision = resolve_precision(spec.precision, info.device)
        if spec.reference:
            self._build_reference(cfg)
        else:
            self._build_optimised(cfg)
        self.stream = endless(self.loader, 0)

    def _build_reference(self, cfg) -> None:
        split = read_in_memory(DataRequest(cfg, self.device))
        self.loader = ReferenceLoader(split.train, split.mean, split.std,
                                      cfg.training.batch_size, self.device)
        self.num_classes = split.train.num_classes
        model = place_model(cfg, self.info, self.num_classes)
        optimizer = torch.optim.SGD(model.parameters(), lr=cfg.training.base_lr)  # the guide's
        loss_fn = nn.CrossEntropyLoss()
        self.step = lambda images, labels: reference_step(model, optimizer, loss_fn,
                                                          images, labels)

    def _build_optimised(self, cfg) -> None:
        data = build_data(cfg, self.device, self.info.rank, self.info.world_size,
                          self.info.local_world_size)
        self.loader = data.train
        self.num_classes = data.num_classes
        self.backend = data.backend
        state = build_state(cfg, self.info, self.num_classes, len(data.train), self.precision)
        self.step = Trainer(cfg, self.info, state, data, self.precision).train_step

    def steps(self, count: int) -> tuple[int, float]:
        """Images and seconds of `count` steps, the device synchronised around them."""
        configure_tf32(self.precision)
        hw = self.cfg.hardware
        # the reference loop keeps torch's default (off); the others take train's setting
        configure_cudnn(self.device, hw.cudnn_benchmark and not self.spec.reference,
                        hw.cudnn_benchmark_limit)
        images_seen = 0

        def work():
            nonlocal images_seen
            for _ in range(count):
                images, labels = next(self.stream)
                self.step(images, labels)
                images_seen += len(labels)

        seconds = timed(self.device, work)
        return images_seen, seconds


def specs_for(args: dict, cfg, device: torch.device) -> list[Spec]:
    precision = args.get("precision") or cfg.hardware.precision
    if args.get("versus_reference"):
        model = args.get("model") or "wrn"
        batch = args.get("batch_size") or 64
        opt_precision = precision if args.get("precision") else "bf16"
        channels_last = args.get("channels_last") is not False
        # The reference in FP32 as NGC's PyTorch runs it: TF32 on for convolutions and
        # matmuls (NGC sets TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1); a CPU has no TF32.
        reference_precision = "tf32" if device.type == "cuda" else "fp32"
        specs = [Spec("reference", model, batch, reference_precision, False, reference=True),
                 Spec("optimised", model, batch, opt_precision, channels_last)]
        hw = cfg.hardware
        if args.get("compile"):
            specs.append(Spec("optimised+compile", model, batch, opt_precision, channels_last,
                              compile=True, compile_mode=hw.compile_mode,
                              compile_scope=hw.compile_scope))
        return specs
    models = [args["model"]] if args.get("model") else list(DEFAULT_MODELS)
    sizes = parse_sizes(args["batch_sizes"]) if not args.get("batch_size") else [args["batch_size"]]
    hw = cfg.hardware
    return [Spec(f"{m}-bs{b}", m, b, precision, hw.channels_last, hw.compile,
                 compile_mode=hw.compile_mode, compile_scope=hw.compile_scope)
            for m in models for b in sizes]


def result_for(runner: Runner, warm: tuple[int, float], runs: list[tuple[int, float]],
               flops: float, info) -> dict:
    rates = [n / s for n, s in runs]
    result = summarise(rates)
    step_s = statistics.median(s / (n / runner.spec.batch_size) for n, s in runs)
    per_device = result["images_per_second"]
    total = distributed.all_reduce_sum(torch.tensor(per_device, device=info.device)).item()
    tflops = flops * per_device / 1e12
    peak = peak_tflops(info.device, runner.precision)
    result.update(
        model=runner.spec.model, batch_size=runner.spec.batch_size, precision=runner.precision,
        channels_last=runner.spec.channels_last, compile=runner.spec.compile,
        pipeline="reference per-sample" if runner.spec.reference else runner.backend,
        world_size=info.world_size, images_per_second_total=total, step_s=step_s,
        warmup_s=warm[1], flops_per_image=flops, achieved_tflops=tflops,
        peak=None if peak is None else dict(gpu=peak[0], datasheet_tflops=peak[1],
                                           share=tflops / peak[1]),
    )
    if runner.spec.compile:
        # The warm-up holds the compilation: its excess over ordinary steps is the cost.
        result["compile_s"] = warm[1] - step_s * warm[0] / runner.spec.batch_size
    return result


def run(args: dict, flag: PreemptionFlag) -> dict:
    cfg = config_from(args)
    with bench_process(args, cfg, flag) as info:
        return measure_specs(args, cfg, info)


def measure_specs(args: dict, cfg, info: distributed.DistInfo) -> dict:
    specs = specs_for(args, cfg, info.device)
    runners = [Runner(spec, cfg, info) for spec in specs]
    warm = {r.spec.name: r.steps(args["warmup"]) for r in runners}
    runs: dict[str, list] = {r.spec.name: [] for r in runners}
    for round_index in range(args["rounds"]):
        for runner in runners:  # alternating, so load on a shared machine hits all alike
            images, seconds = runner.steps(args["steps"])
            runs[runner.spec.name].append((images, seconds))
            if info.is_main:  # progress: a long CPU run should show it is alive
                print(f"bench: round {round_index + 1}/{args['rounds']} {runner.spec.name}: "
                      f"{images / seconds:,.1f} images/s", flush=True)
    image_size = cfg.data.image_size or NATURAL_IMAGE_SIZE[cfg.data.dataset]
    flops = {m: flops_per_image(cfg.replace(model=m), runners[0].num_classes,
                                image_size) for m in {s.model for s in specs}}
    results = {r.spec.name: result_for(r, warm[r.spec.name], runs[r.spec.name],
                                       flops[r.spec.model], info) for r in runners}
    base = results.get("reference", {}).get("images_per_second")
    for result in results.values():
        result["vs_reference"] = result["images_per_second"] / base if base else None
    if info.is_main:
        report(results, args, cfg, info)
    return results


def report(results: dict, args: dict, cfg, info) -> None:
    print_table(
        ["config", "precision", "NHWC", "pipeline", "img/s/device", "img/s total",
         "x reference", "GFLOP/img", "TFLOP/s", "% datasheet peak", "compile s"],
        [[name, r["precision"], r["channels_last"], r["pipeline"], r["images_per_second"],
          r["images_per_second_total"], r["vs_reference"], r["flops_per_image"] / 1e9,
          r["achieved_tflops"], None if r["peak"] is None else 100 * r["peak"]["share"],
          r.get("compile_s")] for name, r in results.items()])
    settings = dict(dataset=cfg.data.dataset, device=str(info.device), world_size=info.world_size,
                    steps=args["steps"], warmup=args["warmup"], rounds=args["rounds"],
                    torch_threads=torch.get_num_threads(),
                    peak_note="share of the NVIDIA datasheet dense peak, not a measured peak")
    write_report(args.get("json"), "train", settings, results)
