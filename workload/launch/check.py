"""Layout checks behind ``python -m workload.launch check``: each problem says the fix."""

from __future__ import annotations

from workload.launch.resolve import NO_ADDRESS, PER_TASK, TORCHRUN, Resolution


def _gpu_problems(res: Resolution, tasks_on_node: int) -> list[str]:
    visible = int(res.notes.get("visible_gpus", "0"))
    if visible <= 1 or tasks_on_node == visible:
        return []
    if tasks_on_node > visible:
        return [f"{tasks_on_node} processes on this node share {visible} visible GPUs: "
                f"start one per GPU (srun --ntasks-per-node={visible}) or give each task "
                f"its own GPU (srun --gpus-per-task=1)"]
    return [f"{visible} GPUs are visible but only {tasks_on_node} process(es) run on this "
            f"node, so GPUs sit idle: use srun --ntasks-per-node={visible} or torchrun "
            f"--nproc-per-node={visible}"]


def _torchrun_problems(res: Resolution) -> list[str]:
    tasks = int(res.notes.get("slurm_tasks_on_node", "1"))
    if tasks > 1:
        return [f"torchrun is started once per task (SLURM runs {tasks} tasks on this "
                f"node) instead of once per node: use srun --ntasks-per-node=1 "
                f"(inside a batch job also --ntasks=$SLURM_NNODES)"]
    return []


def _batch_problems(res: Resolution) -> list[str]:
    if res.notes.get("in_step") != "False":
        return []
    job_tasks = int(res.notes.get("job_tasks", "1"))
    if job_tasks > 1 and res.layout != TORCHRUN:
        return [f"this process runs in the batch script, outside any srun step, but the "
                f"job has {job_tasks} tasks: start it with srun (SLURM_STEP_ID is unset)"]
    return []


def _is_address_guess(warning: str) -> bool:
    return warning.startswith(NO_ADDRESS)


def problems(res: Resolution, outer_torchrun: bool = False) -> list[str]:
    """Layout mistakes for the resolved process; empty when the layout is sound."""
    # Ranks on several nodes meeting at a guessed 127.0.0.1 cannot work: a problem.
    found = [warning for warning in res.warnings if _is_address_guess(warning)]
    found += _batch_problems(res)
    if res.layout == TORCHRUN:
        found += _torchrun_problems(res)
        if not outer_torchrun:
            found += _gpu_problems(res, int(res.values["LOCAL_WORLD_SIZE"]))
    elif res.layout == PER_TASK:
        found += _gpu_problems(res, int(res.values["LOCAL_WORLD_SIZE"]))
    return found


def notes(res: Resolution) -> list[str]:
    """Things worth knowing that are not errors (printed by check)."""
    lines = [f"warning: {warning}" for warning in res.warnings
             if not _is_address_guess(warning)]
    pitfall = res.notes.get("local_rank_pitfall")
    if pitfall and pitfall not in res.warnings:
        lines.append(f"warning: {pitfall}")
    step, job = res.notes.get("step_tasks"), res.notes.get("job_tasks")
    if res.notes.get("in_step") == "True" and step and job and step != job:
        lines.append(f"note: this step runs {step} tasks of the job's {job} "
                     f"(SLURM_STEP_NUM_TASKS versus SLURM_NTASKS); WORLD_SIZE follows the step")
    return lines
