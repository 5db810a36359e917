"""The GPU check's benchmark part: the reference loop against `train`'s defaults, side by
side in one process, for the Wide ResNet and ResNet-18 on CIFAR-100-shaped data at batch
256; MFU against the GPU's dense bf16 peak; a torch.profiler summary of one train step.

`make gpu-check` (tools/gpu_check.py) runs it; by hand:
    python -m workload.bench.kit --json bench.json                 # on a GPU
    python -m workload.bench.kit --device cpu --quick --json b.json  # CPU smoke run
    python -m workload.bench.kit --facts                           # device and versions only
"""

from __future__ import annotations

import argparse
import json
import sys

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
    from workload.bench.train import peak_tflops

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
    from workload.bench.fingerprint import fingerprint

    found = fingerprint()
    return dict(device=found["devices"][0], driver=found["driver"], versions=found["versions"],
                fingerprint=found)


def run_bench(device_flag: str, quick: bool) -> dict:
    from workload import distributed
    from workload.bench import profile
    from workload.bench import train as train_bench
    from workload.logs import setup_logging

    setup_logging(0)
    size = QUICK if quick else FULL
    device = distributed.resolve_device(device_flag)
    rows = [row(model, train_bench.run(bench_args(device_flag, size, model)), device)
            for model in size["models"]]
    summary = profile.profile_step(bench_args(device_flag, size, "wrn"))
    profile.print_summary(summary)
    return dict(rows=rows, profile=summary, sizes={k: v for k, v in size.items()},
                peak_note="mfu: achieved TFLOP/s (FlopCounterMode's count) over the GPU's "
                          "dense bf16 datasheet peak")


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
