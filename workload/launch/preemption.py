"""Preemption for any training loop: a signal sets a flag, the loop saves and exits 75.

Torch-free, so a user's own script can use it as well as ``train``::

    from workload.launch.preemption import PreemptionFlag, exit_for_requeue

    flag = PreemptionFlag().install(("USR2", "TERM"))
    for step in range(start, steps):
        ...                                   # one training step
        if any_rank(flag.is_set()):           # your all-reduce: every rank stops together
            save_checkpoint(step)             # once (rank 0), then a barrier
            exit_for_requeue(step, flag.signal_name)   # exit status 75

The handler only records the signal (nothing else is safe inside a signal handler, least
of all a collective or a file write). jobs/lib/requeue.sh sees status 75, or the file
named by TRAIN_REQUEUE_FILE that every preempted rank writes, and requeues the job.

Without that job script, SLURM itself requeues a preempted job, but only one still
running when its grace time ends: SLURM sends SIGTERM to the job's steps when it picks
the job for preemption and requeues it (PreemptMode=REQUEUE, a --requeue job) when it
kills it GraceTime seconds later, while a job that ends by itself before that simply
ends (FAILED, never requeued). So after SIGTERM inside a SLURM job, with no job script
to requeue it, exit_for_requeue does not exit: the checkpoint is written and the process
waits for SLURM to end the step. submitit and Lightning do the same ("bypassing
SIGTERM"); NERSC's preemption notes ask jobs to "sleep 600 or similar".
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from workload.files import replace_file
from workload.logs import say

# "Requeue me": 75 is EX_TEMPFAIL in sysexits.h ("temporary failure, the user is invited to
# retry"). Python uses 1 (uncaught exception) and 2 (usage), shells 126, 127 and 128+N for
# a death by signal N, torchrun and srun pass a task's status through, and SLURM reports
# statuses as they are: none of them gives 75 another meaning.
REQUEUE_EXIT_STATUS = 75

# Set by jobs/lib/requeue.sh: a file every preempted rank writes after the checkpoint. The
# batch shell cannot always see status 75: `srun --kill-on-bad-exit=1` kills the ranks that
# exit a moment later than the first, and torchrun reports any failed worker as 1.
REQUEUE_FILE_ENV = "TRAIN_REQUEUE_FILE"

# The signals SLURM sends before a time limit or preemption (sbatch --signal=B:USR2@300
# through jobs/lib/requeue.sh; TERM when the job is cancelled or preempted).
DEFAULT_SIGNALS = ("USR2", "TERM")

# The signals only the training loop acts on: preemption's, the time limit's and scancel's
# (TERM, or --preempt-signal's USR2, USR1, INT or HUP), Ctrl-C's, the stack dump's (USR1).
# SLURM sends them to every process of a job step, and a terminal's Ctrl-C reaches its
# whole process group: a helper process of the loop (a DataLoader worker) that one of them
# ended would take the loop down with it before its checkpoint.
LOOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2,
                          signal.SIGHUP})


class PreemptionFlag:
    """Set by the signal handlers; read by the training loop at step boundaries."""

    def __init__(self):
        self.signal_name: str | None = None
        self._previous: dict[int, object] = {}
        self._handling: set[int] = set()  # the signals this flag's handler answers now

    def install(self, names: tuple[str, ...] = DEFAULT_SIGNALS) -> PreemptionFlag:
        for name in dict.fromkeys(names):  # dict: unique, in order
            number = getattr(signal, "SIG" + name)
            self._previous[number] = signal.signal(number, self._handle)
            self._handling.add(number)
        return self

    def handles(self, signal_name: str) -> bool:
        """Whether this flag answers `signal_name` (SIGTERM, ...): installed, not ignored
        or uninstalled since."""
        return getattr(signal, signal_name) in self._handling

    def ignore(self, name: str) -> PreemptionFlag:
        """Ignore SIG<name> until uninstall(): the stack-dump signal until its handler is
        set (docs/hangs.md), so that a dump asked for during start-up kills nothing."""
        number = getattr(signal, "SIG" + name)
        self._previous.setdefault(number, signal.signal(number, signal.SIG_IGN))
        self._handling.discard(number)
        return self

    def uninstall(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()
        self._handling.clear()

    def _handle(self, number: int, frame) -> None:
        if number == signal.SIGINT and self.signal_name == "SIGINT":
            raise KeyboardInterrupt  # Ctrl-C twice: stop now, without the checkpoint
        self.signal_name = signal.Signals(number).name

    def is_set(self) -> bool:
        return self.signal_name is not None


class StartUpFlag(PreemptionFlag):
    """A command's handlers from its first line (workload.commands.run_command), before
    anything is imported or parsed: torch's import alone takes seconds, tens on a shared
    file system, and SLURM signals every process of a step at any moment. Nothing can be
    saved yet, so a signal of `ending` ends the process with one line and the requeue
    status at the next bytecode (a Python handler runs in the main thread, between two),
    writing the requeue file first; after SLURM's SIGTERM with no job script to requeue
    the job it is only recorded (slurm_will_requeue: the process must outlive it, and
    train's loop saves and waits). The stack dump's USR1 (which may also be train's
    --preempt-signal) is only recorded: take_over() hands what was recorded to train's
    own flag, so nothing received in between is lost."""

    def __init__(self, prog: str, ending: frozenset[int]):
        super().__init__()
        self.prog = prog
        self.ending = ending
        self.recorded: list[str] = []

    def install_all(self) -> StartUpFlag:
        """Handlers for `ending` and for the stack dump's USR1 (whose default kills)."""
        return self.install(tuple(signal.Signals(number).name.removeprefix("SIG")
                                  for number in sorted(self.ending | {signal.SIGUSR1})))

    def _handle(self, number: int, frame) -> None:
        name = signal.Signals(number).name
        if number in self.ending and not slurm_will_requeue(name):
            end_before_work(self.prog, name)
        self.recorded.append(name)
        if number in self.ending:
            self.signal_name = name

    def take_over(self, flag: PreemptionFlag) -> None:
        """`flag`, just installed, holds the first recorded signal it handles."""
        taken = [name for name in self.recorded if flag.handles(name)]
        if taken and not flag.is_set():
            flag.signal_name = taken[0]
        # From here a checkpoint may exist: a signal `flag` does not take is recorded only.
        self.ending = frozenset()


def end_before_work(prog: str, signal_name: str) -> None:
    """Exit at once with the requeue status and one line: nothing is saved before the
    work began. os.write and os._exit only: this runs in a signal handler, perhaps inside
    a write to stdout or stderr (a buffered stream re-entered raises), and the
    interpreter's finalization would wait for whatever the start-up had begun."""
    request_requeue(None, signal_name)
    os.write(2, f"{prog}: {signal_name} during start-up: nothing to save; exiting with "
                f"status {REQUEUE_EXIT_STATUS} so that the job is requeued\n".encode())
    os._exit(REQUEUE_EXIT_STATUS)


@contextmanager
def signals_from_the_start(prog: str, ending: frozenset[int], keep: bool) -> Iterator[
        StartUpFlag]:
    """A command's signals answered from here (StartUpFlag); the handlers that were there
    put back at the end unless `keep` (a console script: a signal while the process ends
    finds the handler still there, not the default that kills it with 128+N)."""
    flag = StartUpFlag(prog, ending).install_all()
    try:
        yield flag
    finally:
        if not keep:
            flag.uninstall()


@contextmanager
def loop_signals_held() -> Iterator[None]:
    """LOOP_SIGNALS held back from this thread while it starts helper processes: a child
    starts with the mask of the thread that started it (through fork and exec alike), so
    a signal to the whole step waits in the child until leave_signals_to_parent() decides
    what it does there, instead of ending it on the way. This process gets it when the
    block ends (or at once, in another of its threads)."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, LOOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def leave_signals_to_parent(*_) -> None:
    """In a helper process (a DataLoader's worker_init_fn; its arguments are ignored):
    LOOP_SIGNALS are ignored, the parent decides when to stop, except a SIGTERM sent by
    the parent itself, which ends the process at once: that is how a parent ends its
    helpers (multiprocessing ends its daemonic children so at exit, and waits for them),
    and PyTorch's own worker handler exits quietly on it too. Others' SIGTERM (SLURM's)
    is taken by a thread that waits for it, so it needs the signal blocked from the start
    (loop_signals_held)."""
    parent = multiprocessing.parent_process()  # the process that asked for this one
    parent_pid = parent.pid if parent is not None else os.getppid()
    signal.pthread_sigmask(signal.SIG_BLOCK, LOOP_SIGNALS)  # started without the block
    for number in LOOP_SIGNALS - {signal.SIGTERM}:
        signal.signal(number, signal.SIG_IGN)  # one already pending is dropped
    threading.Thread(target=_end_when_parent_asks, args=(parent_pid,),
                     name="sigterm-from-parent", daemon=True).start()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, LOOP_SIGNALS - {signal.SIGTERM})


def _end_when_parent_asks(parent_pid: int) -> None:
    while True:
        if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent_pid:
            os._exit(0)


def request_requeue(step: int | None, signal_name: str | None, stderr_fd: int = 2) -> None:
    """Tell the batch shell (jobs/lib/requeue.sh) that this job wants a requeue (`step`
    None: during start-up, nothing saved). A file that cannot be written (its folder
    missing or read-only) is one warning: the checkpoint is committed and the exit status
    75 asks for the requeue all the same. Written with os.write to `stderr_fd` (the real
    stderr while the rendezvous holds descriptor 2), so that it is safe from a signal
    handler (StartUpFlag) and from a thread (_end_on_signal)."""
    path = os.environ.get(REQUEUE_FILE_ENV)
    if not path:
        return
    when = "at start-up" if step is None else f"at step {step}"
    try:
        replace_file(Path(path),  # atomic: several ranks may write it
                     f"preempted by {signal_name or 'a signal to another rank'} {when}\n"
                     .encode())
    except OSError as error:
        os.write(stderr_fd, f"warning: {REQUEUE_FILE_ENV} {path}: cannot write it "
                            f"({error.strerror}); the job script sees only the exit status "
                            f"{REQUEUE_EXIT_STATUS} (point {REQUEUE_FILE_ENV} into a writable "
                            "folder)\n".encode())


def slurm_will_requeue(signal_name: str | None, env: Mapping[str, str] = os.environ) -> bool:
    """SIGTERM inside a SLURM job that no job script requeues: SLURM's preemption (or its
    time limit, or scancel, which kill the step shortly after as well)."""
    return (signal_name == "SIGTERM" and bool(env.get("SLURM_JOB_ID"))
            and not env.get(REQUEUE_FILE_ENV))


def wait_for_slurm() -> None:
    """Stay alive until SLURM ends the step: a preempted job still running at the end of
    its grace time is requeued by SLURM, one that exited is not. Every signal but
    SIGKILL finds the preemption handlers still installed and changes nothing."""
    if os.environ.get("RANK", "0") == "0":
        say(f"SIGTERM inside SLURM job {os.environ.get('SLURM_JOB_ID')}, checkpoint written: "
            "waiting for SLURM to end the step (a preempted job submitted with --requeue is "
            "requeued then; after a time limit or scancel the job ends, and the next job "
            "resumes from the checkpoint)")
    while True:
        signal.pause()


def exit_for_requeue(step: int, signal_name: str | None = None) -> None:
    """After the checkpoint: ask for the requeue and exit with REQUEUE_EXIT_STATUS, or,
    after SLURM's SIGTERM with no job script to requeue the job, wait for SLURM."""
    request_requeue(step, signal_name)
    if slurm_will_requeue(signal_name):
        wait_for_slurm()
    raise SystemExit(REQUEUE_EXIT_STATUS)


@contextmanager
def signals_end_the_wait(what: str, stderr_fd: int, flag: PreemptionFlag | None) -> Iterator[
        None]:
    """While the main thread waits in C++ for `what` (the ranks meeting at start-up, for up
    to --dist-start-timeout), a Python signal handler cannot run: CPython only notes the
    signal, and writes its number to the wakeup fd. A thread reading that fd acts on it
    at once, as `flag` (the command's, None where none answers signals) would: a signal
    it ends on ends the process with the requeue status, as nothing has been trained
    since the last checkpoint (after SLURM's SIGTERM it waits, like a running job: see
    wait_for_slurm); Python's own Ctrl-C with 130, as a shell reports it. Others wait."""
    try:
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:  # not the main thread: no handler of this process runs here
        yield
        return
    watcher = threading.Thread(target=_end_on_signal, args=(read_fd, what, stderr_fd, flag),
                               name="signals-while-waiting", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        os.close(write_fd)  # the watcher reads the end of the pipe and returns
        watcher.join()
        os.close(read_fd)


def _end_on_signal(read_fd: int, what: str, stderr_fd: int,
                   flag: PreemptionFlag | None) -> None:
    while number := os.read(read_fd, 1):
        name = signal.Signals(number[0]).name
        status = status_while_waiting(flag, name, stderr_fd)
        if status is None:
            continue
        action = ("nothing to save; exiting with status 75 so that the job is requeued"
                  if status == REQUEUE_EXIT_STATUS else f"exiting with status {status}")
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os.write(stderr_fd, f"{name} while waiting for {what}: {action}\n".encode())
        os._exit(status)


def status_while_waiting(flag: PreemptionFlag | None, signal_name: str,
                         stderr_fd: int = 2) -> int | None:
    """The exit status `signal_name` means before anything trained, as `flag` (the
    command's) would act on it (None: keep waiting). A signal the flag does not answer
    is not ours to guess (a handler of the user's own), except Python's own Ctrl-C: its
    default handler, which raises KeyboardInterrupt, would end the command with 130."""
    if flag is None or not flag.handles(signal_name):
        return (128 + signal.SIGINT if signal_name == "SIGINT"
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler else None)
    if isinstance(flag, StartUpFlag) and getattr(signal, signal_name) not in flag.ending:
        return None  # recorded only (the stack dump's USR1)
    if slurm_will_requeue(signal_name):
        return None
    request_requeue(None, signal_name, stderr_fd)
    return REQUEUE_EXIT_STATUS
