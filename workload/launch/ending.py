"""`end_process(main)`: a script's last line, for one that used torch.distributed.

Torch's DDP and FSDP keep their process group alive after destroy_process_group
(pytorch/pytorch#107298): constructing DDP alone leaves the gloo group's threads running
to the end of the process. A gloo thread that drops the last reference to a finished
collective's tensors (a work it was still holding, or one a barrier held) needs the GIL
for their Python objects; asking for it while the interpreter finalizes, it is ended by
pthread_exit, whose unwinding through a C++ destructor aborts the whole process:
"terminate called without an active exception", SIGABRT, after a finished run, and
`srun --kill-on-bad-exit` fails the job (a core dump shows `ProcessGroupGloo::runLoop`
in `~AsyncAllgatherWork` and `~AsyncBarrierWork`, the main thread in Py_FinalizeEx). On a
loaded 2-core machine it hit 3 of about 108 runs of the straggler test and 4 ranks in
three full runs of the suite, `train` and a plain DDP script alike.

`end_process` runs `main`, then ends the process with the status Python would give:
after torch.distributed was imported, without the interpreter's finalization, once the
atexit handlers have run and stdout and stderr are flushed. Files the script left open
are not closed for it then: write them in `with` blocks. Standard library only.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable
from typing import NoReturn


def end_process(main: Callable[[], object]) -> NoReturn:
    """Run `main()` and end the process with the status `sys.exit(main())` would give:
    what main returns (None: 0) or a SystemExit's (`exit_for_requeue`'s 75), and 1 after
    an exception, printed as Python prints it."""
    try:
        status = system_exit_status(main())
    except SystemExit as stop:
        status = system_exit_status(stop.code)
    except BaseException as error:  # noqa: BLE001 - printed as Python would, then the status
        sys.excepthook(type(error), error, error.__traceback__)
        status = 130 if isinstance(error, KeyboardInterrupt) else 1
    if "torch.distributed" not in sys.modules:
        sys.exit(status)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more to say
            pass
    os._exit(status)


def system_exit_status(code: object) -> int:
    """The status Python gives `sys.exit(code)`: None 0, a whole number itself, anything
    else printed to stderr and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1
