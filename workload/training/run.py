"""`run(cfg)`: one training run, top to bottom: start the process, read the data, build
the training state, resume, fit, write the summary."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from workload import checkpoint, distributed
from workload.checkpoint import Checkpointer
from workload.config import TrainConfig, describe_stem
from workload.data import build_data, stage_data, write_shards
from workload.distributed import DistInfo
from workload.launch.nccl_net import SYS_CLASS, nccl_log_for_one_run, tcp_fallback_warning
from workload.errors import UsageError
from workload.files import append_jsonl, read_json_file, write_json
from workload.held import let_go
from workload.launch import PreemptionFlag
from workload.launch.diagnostics import (DUMP_SIGNAL, defaults_for_one_run, enable_dump_on_signal,
                                        held_for_the_run)
from workload.logs import logger, messages_rewritten
from workload.models import count_parameters, describe_model, save_weights
from workload.records import model_sha256, open_board, prepare_output_dir, versions
from workload.runfolder import RunFolder
from workload.training.energy import EnergyAccount, summary_fields
from workload.training.build import build_state, lr_scale, planned_steps, start_process
from workload.training.compile_cache import CompileCache
from workload.training.startup import (StartupClock, across_ranks, log_startup, record_name,
                                       tune_convolutions)
from workload.training.interval import IntervalExchange
from workload.training.progress import ProgressLog, TerminalBar
from workload.training.trainer import Hooks, Trainer, TrainState
from workload.training.stragglers import StragglerJudge
from workload.training.probe import StepProbe
from workload.training.watchdog import StallWatchdog, attempt_id


def run(cfg: TrainConfig, flag: PreemptionFlag | None = None) -> dict:
    """Train as configured; `flag` is set by the preemption signal handlers (see train)."""
    started = time.perf_counter()
    folder = RunFolder.of(cfg.logging.output_dir)
    clock = StartupClock(folder.diagnostics / record_name())
    clock.mark("imports")
    # Before the process group forms: torch reads the flight recorder's variables then.
    # NCCL's INFO log, to a private file, before any communicator forms: which network it
    # took, checked after the first step (nccl_transport_warning).
    try:
        with (held_for_the_run(folder.diagnostics) as diagnostics,
              defaults_for_one_run(os.environ, diagnostics),
              nccl_log_for_one_run(os.environ) as nccl_log,
              start_process(cfg, flag,
                            cfg.distributed.dist_start_timeout_s) as (info, precision)):
            clock.mark("process group")
            return run_in_process(folder, cfg, info, precision, flag, started, clock,
                                  nccl_log)
    except Exception as error:  # its start-up record says how the rank failed
        clock.failed(error)
        raise


def run_in_process(folder: RunFolder, cfg: TrainConfig, info: DistInfo, precision: str,
                   flag: PreemptionFlag | None, started: float, clock: StartupClock,
                   nccl_log: Path | None = None) -> dict:
    """The data, then (unless --prepare-data) the training in the run folder."""
    if cfg.data.shards:
        return shards_written(cfg, info)
    data_dir = stage_data(cfg, info, flag)
    data = build_data(cfg.replace(data_dir=data_dir), info.device, info.rank, info.world_size,
                      info.local_world_size, for_training=not cfg.data.prepare_data)
    if cfg.data.prepare_data:
        return data_ready(cfg, data, data_dir)
    clock.mark("data")
    folder = prepare_output_dir(folder, cfg.logging.output_dir)
    try:
        clock.write_in(folder.diagnostics_reached)
        with (messages_rewritten(folder.said),  # the folder named as given, never as held
              checkpoint.lock_run_folder(folder.reached, info)):  # one writer: first
            summary = train_in(folder, cfg, info, data, precision, flag, clock, nccl_log)
            summary["total_time_s"] = time.perf_counter() - started
            if info.is_main:
                write_summary(folder, summary)
        return summary
    finally:  # a program that runs train in its own process keeps no descriptor of it
        let_go(folder.held)


def train_in(folder: RunFolder, cfg: TrainConfig, info: DistInfo, data, precision: str,
             flag: PreemptionFlag | None, clock: StartupClock,
             nccl_log: Path | None = None) -> dict:
    """Build and resume the state, choose what runs beside the loop, fit: the summary."""
    previous = previous_startup(folder) if info.is_main else None
    probe = StepProbe(device=info.device)
    state, energy = training_state(folder, cfg, info, data, precision, clock, probe)
    checkpointer = Checkpointer(cfg, info, state, folder, len(data.train),
                                flag or PreemptionFlag(), data.num_classes)
    compiled = compile_cache(cfg, info, folder)
    probe.begin(state.step)  # the loop's clocks: from here, the cache unpacked
    wings = Wings(checkpointer, compiled, probe, energy, FirstStep(clock, info, previous),
                  nccl_log)
    watchdog = stall_watchdog(cfg, info, folder, wings.probe,
                              checkpointer.session.waited_writer)
    wandb = cfg.recorded() if cfg.logging.wandb and info.is_main else None
    board_wanted = cfg.logging.tensorboard and info.is_main
    # The checkpointer's end commits the save in flight: before the final model, the
    # summary and the lock's release, and before a preempted run's exit.
    with (watching(watchdog), open_board(board_wanted, folder, wandb) as board,
          wings.checkpointer):
        hooks = choose_hooks(cfg, info, folder, len(data.train), wings, board)
        summary = Trainer(cfg, info, state, data, precision, hooks, wings.probe).fit()
    save_model(cfg, data, state.model, folder, info.is_main)
    return {**summary, **summary_fields(wings.energy.gather_across_ranks(), state.step),
            **run_facts(cfg, info, state.model, precision), **wings.facts()}


def training_state(folder: RunFolder, cfg: TrainConfig, info: DistInfo, data,
                   precision: str, clock: StartupClock,
                   probe: StepProbe) -> tuple[TrainState, EnergyAccount]:
    """The run folder prepared, the model built (energy counted from here, one of the
    checkpoint's parts, its images those `probe` counts) and resumed, cuDNN tuned, and
    config.json written."""
    checkpoint.prepare(cfg, folder, info.is_main)
    energy = EnergyAccount.for_rank(info, probe)  # this job's energy counts from here
    state = build_state(cfg, info, data.num_classes, len(data.train), precision)
    state.parts["energy"] = energy
    clock.mark("model")
    log_start(cfg, info, data, state.model, precision)
    checkpoint.resume(cfg, info, state, folder, data.num_classes)
    clock.mark("resume")
    tune_convolutions(state.model, cfg, info.device, precision)
    clock.mark("cudnn autotune")
    if info.is_main:  # only now: a refused resume leaves the run's config.json as it was
        write_json(folder.config, cfg.recorded())
    return state, energy


@dataclass
class Wings:
    """What runs beside the training loop in this job, each made once."""
    checkpointer: Checkpointer
    compiled: CompileCache | None
    probe: StepProbe
    energy: EnergyAccount
    first_step: FirstStep
    nccl_log: Path | None = None  # NCCL's INFO log of this process (nccl_log_for_one_run)

    def facts(self) -> dict:
        """summary.json's fields of the wings: the compile cache, the start-up."""
        cache = dict(compile_cache=self.compiled.facts) if self.compiled else {}
        return {**cache, "startup": self.first_step.found or None}  # None: took no step


def choose_hooks(cfg: TrainConfig, info: DistInfo, folder: RunFolder, steps_per_epoch: int,
                 wings: Wings, board) -> Hooks:
    """Which wing runs where beside the loop, in order."""
    packs = [wings.compiled.save] if wings.compiled else []  # after the first step, epochs
    checkpointer = wings.checkpointer
    bar = TerminalBar(steps_per_epoch, info.is_main)
    return Hooks(after_step=[first_step_only(wings.first_step), checkpointer.after_step,
                             shorten_timeout(cfg, info), *map(first_step_only, packs),
                             first_step_only(nccl_transport_warning(info, wings.nccl_log))],
                 after_epoch=[*epoch_records(cfg, info, folder, board),
                              checkpointer.after_epoch, *packs],
                 progress=[*progress_hooks(cfg, info, folder, steps_per_epoch, wings), bar],
                 at_step_limit=[checkpointer.at_step_limit], epoch_end=[bar.close])


class FirstStep:
    """The after-step hook that ends the start-up (the probe waited for the device at the
    step's end): its phases across ranks, logged (rank 0), in `found` for the summary."""

    def __init__(self, clock: StartupClock, info: DistInfo, previous: dict | None):
        self.clock = clock
        self.info = info
        self.previous = previous
        self.found = {}

    def __call__(self) -> None:
        self.clock.mark("first step")
        self.found.update(across_ranks(self.clock, self.info.device))
        if self.info.is_main:
            log_startup(self.found, self.previous)


def stall_watchdog(cfg: TrainConfig, info: DistInfo, folder: RunFolder, probe: StepProbe,
                   waited_writer: Callable[[], object | None]) -> StallWatchdog:
    """The stall watchdog of this rank (`waited_writer`: the checkpoint writer the loop
    waits for now, named in its stall line), and the stack dump on SIGUSR1 where the
    preemption signal is another."""
    watchdog = StallWatchdog(probe, folder.diagnostics, info.rank, info.world_size,
                             cfg.distributed.stall_timeout_s,
                             attempt_id(info.is_main, info.device), folder.diagnostics_reached,
                             waited_writer)
    if cfg.checkpoint.preempt_signal != DUMP_SIGNAL.name.removeprefix("SIG"):
        enable_dump_on_signal(watchdog.reached, info.rank)
    return watchdog


def previous_startup(folder: RunFolder) -> dict | None:
    """The start-up of the run's previous job, from the summary.json it left."""
    try:
        return read_json_file(folder.summary).get("startup")
    except (OSError, ValueError, AttributeError):
        return None


def compile_cache(cfg: TrainConfig, info: DistInfo, folder: RunFolder) -> CompileCache | None:
    """With --compile: the run folder's compile cache, unpacked before the first step."""
    if not cfg.hardware.compile:
        return None
    cache = CompileCache(folder, info.device, info.is_main)
    cache.load()
    return cache


def first_step_only(hook):
    """An after-step hook that runs after this job's first step only."""
    pending = [True]

    def after_step() -> None:
        if pending[0]:
            pending[0] = False
            hook()
    return after_step


@contextmanager
def watching(watchdog: StallWatchdog):
    """The stall watchdog while the training runs, or, when its folder cannot be written
    (a file, a dangling link or a read-only folder named diagnostics), one warning and the
    training without it: diagnostics are never a reason not to train."""
    try:
        watchdog.__enter__()
    except OSError as error:
        logger.warning(f"no heartbeats or stall dumps for this run: {watchdog.folder} cannot "
                       f"be written ({error.strerror or error}); training on")
        yield None
        return
    try:
        yield watchdog
    except BaseException as error:  # its last heartbeat says how the rank failed
        watchdog.__exit__(type(error), error, error.__traceback__)
        raise
    watchdog.__exit__(None, None, None)


def nccl_transport_warning(info: DistInfo, nccl_log: Path | None, sys_class: Path = SYS_CLASS):
    """The hook that, after this process's first step (its collectives have run), warns
    in the log when NCCL took TCP sockets on a node with a faster fabric: the doctor's
    transport check (workload/doctor/ranks.py), said once a node (its local rank 0)."""
    def warn() -> None:
        if info.local_rank != 0:
            return
        warning = tcp_fallback_warning(info.backend, nccl_log, info.num_nodes, sys_class)
        if warning:
            logger.warning(f"transport: {warning}")
    return warn


def shorten_timeout(cfg: TrainConfig, info: DistInfo):
    """The hook that, after this process's first step, moves the collectives from
    --dist-start-timeout to --dist-timeout (start-up, staging and compilation are done)."""
    def shorten() -> None:
        distributed.set_collective_timeout(cfg.distributed.dist_timeout_s)
        logger.info(f"collective timeout now {cfg.distributed.dist_timeout_s:g} s "
                    f"(--dist-timeout; --dist-start-timeout until the first step)")
    return first_step_only(shorten if info.world_size > 1 else lambda: None)


def save_model(cfg: TrainConfig, data, model, folder: RunFolder, write: bool) -> None:
    """The final model: model.safetensors (FSDP shards gathered on every rank; rank 0
    writes) and model.json, its architecture, classes and input, both written atomically."""
    with checkpoint.guarded_final_model(folder.root,
                                        checkpoint.tensor_bytes(model.state_dict())):
        save_weights(model, folder.weights, write)
    if write:
        write_json(folder.model, describe_model(cfg, data.num_classes, data.classes,
                                                    data.mean, data.std))


def epoch_records(cfg: TrainConfig, info: DistInfo, folder: RunFolder, board) -> list:
    """Rank 0's epoch hooks: the log line, metrics.jsonl, TensorBoard."""
    if not info.is_main:
        return []

    def log_epoch(record: dict) -> None:
        logger.info(f"epoch {record['epoch']}/{cfg.training.epochs}: loss "
                    f"{record['train_loss']:.4f}, test loss {record['test_loss']:.4f}, "
                    f"accuracy {record['accuracy']:.4f}, time {record['epoch_time_s']:.2f}s, "
                    f"{record['images_per_second']:.1f} img/s")

    return [log_epoch, lambda record: append_jsonl(folder.metrics, record),
            board.log_epoch]


def progress_hooks(cfg: TrainConfig, info: DistInfo, folder: RunFolder, steps_per_epoch: int,
                   wings: Wings) -> list:
    """Every rank's interval exchange, its contributors the straggler judge and the
    energy; rank 0's progress lines (--log-every) and steps.jsonl, its reader."""
    judge = StragglerJudge(wings.probe, info.world_size, info.device)
    exchange = IntervalExchange(wings.probe, cfg.logging.log_every, info.device, info.is_main,
                                [judge, wings.energy])
    if not info.is_main:
        return [exchange]
    return [exchange, ProgressLog(cfg.logging.log_every, planned_steps(cfg, steps_per_epoch),
                                  info.world_size, wings.probe, folder.steps,
                                  extra=exchange.latest_record)]


def data_ready(cfg: TrainConfig, data, data_dir: str) -> dict:
    """--prepare-data: the data is there and readable; no training."""
    logger.info(f"data ready: {cfg.data.dataset} in {data_dir}, {data.num_train_samples} "
                f"training images, {data.num_classes} classes; --prepare-data: not training")
    return dict(prepared=True, dataset=cfg.data.dataset, data_dir=data_dir,
                num_train_samples=data.num_train_samples, num_classes=data.num_classes)


def shards_written(cfg: TrainConfig, info: DistInfo) -> dict:
    """--prepare-data --shards: the image folder packed into shards; no training."""
    if info.world_size > 1:
        raise UsageError(f"--shards writes from one process, and this is one of "
                         f"{info.world_size}; run train without torchrun or srun's tasks")
    said = write_shards(Path(cfg.data.data_dir).expanduser().resolve(),
                        Path(cfg.data.shards).expanduser().resolve(), cfg.data.shard_size)
    logger.info(said)
    return dict(prepared=True, dataset="shards", data_dir=cfg.data.shards)


def log_start(cfg: TrainConfig, info: DistInfo, data, model, precision: str) -> None:
    m = cfg.model
    t = cfg.training
    if cfg.recipe:
        logger.info(f"recipe {cfg.recipe}: model {m.name} width {m.width} "
                    f"blocks {m.blocks_per_stage}, batch {t.batch_size}, "
                    f"{t.epochs} epochs, base lr {t.base_lr}")
    logger.info(f"{m.name} ({count_parameters(model) / 1e6:.2f} M parameters) on "
                f"{cfg.data.dataset} ({data.num_train_samples} training images, "
                f"{data.num_classes} classes), device {info.device}, precision {precision}, "
                f"world size {info.world_size} ({info.layout})")
    logger.info(describe_stem(cfg))
    logger.info(f"data backend {data.backend}: {data.reason}")
    logger.info("versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()))


def run_facts(cfg: TrainConfig, info: DistInfo, model, precision: str) -> dict:
    """The summary.json fields that describe the run rather than its training."""
    return dict(world_size=info.world_size, device=str(info.device), precision=precision,
                model=cfg.model.name, dataset=cfg.data.dataset,
                parameters=count_parameters(model), model_sha256=model_sha256(model),
                versions=versions(), **spread_facts(cfg, info))


def spread_facts(cfg: TrainConfig, info: DistInfo) -> dict:
    """The summary.json fields that say how the run was spread over processes."""
    d = cfg.distributed
    return dict(layout=info.layout, num_nodes=info.num_nodes, backend=info.backend,
                strategy=d.strategy if info.world_size > 1 else None, lr_scaling=d.lr_scaling,
                effective_base_lr=cfg.training.base_lr * lr_scale(d.lr_scaling, info.world_size),
                global_batch_size=cfg.training.batch_size * info.world_size,
                local_world_size=info.local_world_size)


def write_summary(folder: RunFolder, summary: dict) -> None:
    write_json(folder.summary, summary)
    kwh = summary.get("gpu_energy_kwh")
    energy = "" if kwh is None else f", GPU boards {kwh:.4g} kWh"
    logger.info(f"done: accuracy {summary['final_accuracy']:.4f} (best "
                f"{summary['best_accuracy']:.4f}), {summary['images_per_second']:.1f} img/s, "
                f"{summary['total_time_s']:.1f}s{energy}; summary in {folder.summary}")
