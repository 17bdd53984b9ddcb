"""How a rank armed for a capture is known, from its first step.

A rank under ``ncu --profile-from-start off`` pays on every kernel launch for the life of its process
(perfd.capture.ncu_exec): its steps are the profiler's, never the job's steady state. ``perfd
ncu-exec`` arms a rank; before it becomes ncu it leaves two marks, one for each way its steps reach
perfd:

- ``ARMED_ENV`` in the environment ncu passes to the rank's process: the step hook reads it and flags
  every step record (perfd.hook.wire.FLAG_ARMED -> ``StepRecord.armed``);
- one line on the job's standard error (:func:`armed_line`), which the launcher tees into the job's
  log with the rest of its output: the Megatron-LM log parser (live tail and ``perfd analyze
  megatron`` alike) reads it, so every record of the run that follows is armed. Nsight Compute's own
  banner (``==PROF== Connected to process``), printed when the rank's process starts under it, is
  read the same way for a rank someone armed by hand.

Both are written before the rank's first step, so its first record is already armed. A plain module
below the hook, the collectors and the commands: none imports another for it.
"""

from __future__ import annotations

import re

ARMED_ENV = "PERFD_ARMED"  # its value: the tool the rank runs under ("ncu")
# The line is read from the job's log, live or a log a user hands ``perfd analyze megatron`` that an
# earlier perfd wrote: a declared format, not prose. Its head, with the rank after it, is declared
# here once: :func:`armed_line` writes it, :func:`armed_rank` reads it (a change to it is a change to
# what the logs already written are read as). ``ARMED_MARK`` and ``BANNER_MARK``: what a line must hold
# to be perfd's line or ncu's banner, the log parser's cheap test before it calls :func:`armed_rank`.
ARMED_MARK = "armed rank"
ARMED_HEAD = f"perfd ncu-exec: {ARMED_MARK} "
BANNER_MARK = "==PROF=="
NCU_BANNER = f"{BANNER_MARK} Connected to process"
# perfd's line (rank and job named) and ncu's own banner, wherever a launcher's prefix put them.
_LINE = re.compile(re.escape(ARMED_HEAD) + r"(\d+)")


def armed_line(rank: int, job: str, tool: str = "ncu") -> str:
    """The line ``perfd ncu-exec`` prints before the rank's process becomes ``tool``."""
    return (f"{ARMED_HEAD}{int(rank)} of job {job} runs under {tool} (profiling off until a "
            "capture; every kernel launch costs it more for the life of the process: its steps are "
            "the profiler's, not the job's)")


def armed_rank(line: str) -> int | None:
    """The rank a log line says was armed: perfd's line names it; ncu's banner names none (-1)."""
    if ARMED_MARK in line:
        m = _LINE.search(line)
        if m is not None:
            return int(m.group(1))
    if NCU_BANNER in line:
        return -1
    return None
