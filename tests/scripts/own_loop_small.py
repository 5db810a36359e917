"""A user's own one-process loop with workload.checkpoint.Checkpoints, as users edit
theirs between jobs (run by tests/e2e/test_checkpoint_own_loop.py):

    python tests/scripts/own_loop_small.py FOLDER STEPS [options]

It resumes (unless --no-resume), trains STEPS steps in all, asks `preempted` after every
step (SIGTERM or SIGUSR2: save, close, exit 75) and saves every --save-every steps; it
prints "resumed at step N", "step N" after each step and "saved step N". --optimizer,
--freeze and --width change the loop; --end says how it ends: close() (the docs' way),
`none` (main() returns without close()) or `end-process` (the same under
workload.launch.end_process)."""

import argparse
import time

import torch
from torch import nn

from workload.checkpoint import Checkpoints
from workload.launch import PreemptionFlag, end_process, exit_for_requeue


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("steps", type=int)
    parser.add_argument("--save-every", type=int, default=3)
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    parser.add_argument("--freeze", action="store_true", help="freeze the first layer")
    parser.add_argument("--width", type=int, default=16, help="the hidden layer's width")
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--no-resume", action="store_true")
    parser.add_argument("--end", choices=("close", "none", "end-process"), default="close")
    return parser.parse_args()


def say(line: str) -> None:
    print(line, flush=True)


def main(args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, args.width), nn.ReLU(), nn.Linear(args.width, 4))
    if args.freeze:
        model[0].requires_grad_(False)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = (torch.optim.SGD(trained, lr=0.01, momentum=0.9) if args.optimizer == "sgd"
                 else torch.optim.Adam(trained, lr=0.01))
    flag = PreemptionFlag().install()
    ckpt = Checkpoints(args.folder)
    start = 0 if args.no_resume else ckpt.resume(model=model, optimizer=optimizer)
    say(f"resumed at step {start}")
    for step in range(start, args.steps):
        batch = torch.randn(32, 64, generator=torch.Generator().manual_seed(step))
        model(batch).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(args.step_time)
        say(f"step {step + 1}")
        if ckpt.preempted(flag):
            ckpt.save(step + 1, model=model, optimizer=optimizer)
            ckpt.close()
            exit_for_requeue(step + 1, flag.signal_name)
        if (step + 1) % args.save_every == 0:
            ckpt.save(step + 1, model=model, optimizer=optimizer, extra={"step": step + 1})
            say(f"saved step {step + 1}")
    if args.end == "close":
        ckpt.close()


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.end == "end-process":
        end_process(lambda: main(arguments))
    main(arguments)
