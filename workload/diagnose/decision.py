"""The one decision after a job step ends (docs/failures.md): restart the step here, in the
same allocation; shrink it onto the healthy nodes left; requeue the job; or stop. A pure
function of what the batch shell saw (the step's exit status, whether train asked for a
requeue, the time-limit signal), what the run's files say (diagnose's verdict, the nodes
named bad, the newest checkpoint against the one the attempt started from) and the
allocation's nodes: the job scripts run what it says, and `diagnose RUN_DIR` prints it.

Why each rule is where it is:
- A usage error (status 2) fails the same way every time: stop at once.
- Before anything else, progress: an attempt that wrote no new checkpoint counts, one
  that did resets the count; at `max_without_progress` in a row the run stops, whatever
  ended it, so a run that dies at the same step never burns a queue wait per try. A run
  that checkpoints is never stopped by this.
- A checkpoint on a signal (train's requeue request, status 75) means the allocation is
  ending (a time limit, a preemption): only the queue can continue it.
- Any other failure continues in the allocation while it holds enough healthy nodes
  (restart costs a step launch, not a queue wait), on fewer where the user allowed a
  minimum (shrink), else through the queue, leaving the bad nodes behind.
"""

from __future__ import annotations

from dataclasses import dataclass

DONE = "done"
RESTART = "restart"
SHRINK = "shrink"
REQUEUE = "requeue"
STOP = "stop"
ACTIONS = (DONE, RESTART, SHRINK, REQUEUE, STOP)
USAGE_STATUS = 2  # workload.errors: a refusal before any work
REQUEUE_STATUS = 75  # workload.launch.preemption.REQUEUE_EXIT_STATUS: "requeue me"
DEFAULT_MAX_WITHOUT_PROGRESS = 3


@dataclass(frozen=True)
class Ending:
    """How the step ended, as the batch shell saw it: its exit status, train's requeue
    request (the line it wrote after its checkpoint on a signal), and whether the batch
    shell got the time-limit signal."""
    status: int
    asked: str = ""
    time_limit: bool = False

    @property
    def checkpointed_on_signal(self) -> bool:
        return bool(self.asked) or self.status == REQUEUE_STATUS

    def kind(self) -> str:
        """time-limit, preemption, finished or failure."""
        if self.checkpointed_on_signal:
            return "time-limit" if self.time_limit else "preemption"
        return "finished" if self.status == 0 else "failure"


@dataclass(frozen=True)
class Progress:
    """The newest checkpoint's step as the attempt started (None: none, or not known) and
    now, and the attempts in a row before this one that wrote no new checkpoint."""
    started_from: int | None
    checkpointed: int | None
    stalled_before: int = 0

    def moved(self) -> bool:
        """A new checkpoint: another step than the one the attempt started from (a rollback
        or a fresh run with --overwrite goes back, and still moves)."""
        return self.checkpointed is not None and self.checkpointed != self.started_from

    def without_progress(self) -> int:
        """Attempts in a row, this one included, that wrote no new checkpoint."""
        return 0 if self.moved() else self.stalled_before + 1


@dataclass(frozen=True)
class Nodes:
    """The step's nodes, the allocation's other nodes (spares), the nodes named bad, and
    the fewest nodes the run may shrink to (the step's own count: never shrink)."""
    step: tuple[str, ...]
    spares: tuple[str, ...] = ()
    bad: tuple[str, ...] = ()
    minimum: int = 0

    def healthy(self) -> tuple[str, ...]:
        """The step's good nodes first (a survivor keeps its node-local checkpoint), then
        the good spares."""
        return tuple(node for node in (*self.step, *self.spares) if node not in self.bad)


@dataclass(frozen=True)
class Decision:
    action: str
    reasons: tuple[str, ...]
    nodes: tuple[str, ...] = ()    # the next step's nodes (restart, shrink)
    exclude: tuple[str, ...] = ()  # the nodes left behind
    without_progress: int = 0      # attempts in a row with no new checkpoint

    def line(self) -> str:
        """The decision in one line, as the job log and diagnose print it."""
        where = f" on {','.join(self.nodes)}" if self.nodes else ""
        left = f", leaving {','.join(self.exclude)} behind" if self.exclude else ""
        return f"{self.action}{where}{left}: {'; '.join(self.reasons)}"


def decide(ending: Ending, verdict: str, progress: Progress, nodes: Nodes,
           max_without_progress: int = DEFAULT_MAX_WITHOUT_PROGRESS) -> Decision:
    """What the job does next (see the module's docstring for the rules)."""
    kind = ending.kind()
    if kind == "finished":
        return Decision(DONE, ("the step finished (status 0)",))
    failure = failure_text(ending, verdict)
    stalled = progress.without_progress()
    if ending.status == USAGE_STATUS and kind == "failure":
        return Decision(STOP, (f"{failure}: a usage error fails the same way every time",),
                        without_progress=stalled)
    if stalled >= max_without_progress:
        return Decision(STOP, (no_progress_line(progress, stalled, failure),),
                        without_progress=stalled)
    moved = progress_text(progress)
    exclude = tuple(sorted(set(nodes.bad)))
    if kind != "failure":
        return Decision(REQUEUE, (f"{kind}: {ending.asked or failure}", moved,
                                  "the allocation is ending"), exclude=exclude,
                        without_progress=stalled)
    return after_failure(failure, moved, nodes, exclude, stalled)


def after_failure(failure: str, moved: str, nodes: Nodes, exclude: tuple[str, ...],
                  stalled: int) -> Decision:
    """A failed step: here on as many healthy nodes as it had, else on fewer where the
    user allowed it, else through the queue."""
    healthy = nodes.healthy()
    wanted = len(nodes.step)
    count = f"{len(healthy)} healthy node(s) of the allocation"
    if len(healthy) >= wanted:
        return Decision(RESTART, (failure, moved, f"{count}, {wanted} needed"),
                        nodes=healthy[:wanted], exclude=exclude, without_progress=stalled)
    if nodes.minimum and len(healthy) >= nodes.minimum:
        return Decision(SHRINK, (failure, moved, f"{count}, {wanted} wanted, at least "
                                 f"{nodes.minimum} allowed"), nodes=healthy,
                        exclude=exclude, without_progress=stalled)
    return Decision(REQUEUE, (failure, moved, f"{count}, {wanted} needed"
                              + (f" (at least {nodes.minimum})" if nodes.minimum else "")),
                    exclude=exclude, without_progress=stalled)


def failure_text(ending: Ending, verdict: str) -> str:
    """The failure as the log and the stop line say it: the status, and what diagnose
    reads in the run's files."""
    text = f"status {ending.status}"
    return f"{text}; diagnose: {verdict}" if verdict else text


def progress_text(progress: Progress) -> str:
    if progress.moved():
        start = ("" if progress.started_from is None
                 else f" (started from step {progress.started_from})")
        return f"checkpointed step {progress.checkpointed}{start}"
    if progress.checkpointed is None:
        return "no checkpoint yet"
    return f"no new checkpoint (still step {progress.checkpointed})"


def no_progress_line(progress: Progress, attempts: int, failure: str) -> str:
    """The stop's one line: the last step, the attempts, the last failure."""
    last = "no checkpoint" if progress.checkpointed is None else f"step {progress.checkpointed}"
    return (f"no new checkpoint in {attempts} attempt(s) in a row (last checkpoint: {last}); "
            f"last failure: {failure}")
