"""`perfd ARGS` as a person runs it, by the CLI's own entry point in the test's process: what it prints
on stdout and stderr (pytest's capsys) and its exit status (main's return value, or the code of the
SystemExit argparse and the commands raise), without starting an interpreter for it.

``main()`` logs through ``logging.basicConfig(handlers=[log_handler()])`` as the real command does; under
pytest the root logger already holds pytest's handlers, which would make that a no-op and send the
command's log lines to caplog instead of stderr. So the root logger's handlers and level are emptied for
the call (the command's own handler then writes to capsys's stderr, as it writes to the process's) and
put back after it, whatever happened. So are the interpreter's settings the daemons tune for their own
process (perfd.aggregator.runtime: tune_gc's thresholds, freeze and timer callback, the switch interval)
and sys.argv (`perfd bench` hands a benchmark reading it its arguments there): nothing the command
installs outlives the call."""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from perfd.app.cli import main


@dataclass(frozen=True)
class Ran:
    """What a run of ``perfd ARGS`` gave, as subprocess.CompletedProcess's fields."""

    returncode: int
    stdout: str
    stderr: str


@contextmanager
def command_logging() -> Iterator[None]:
    """The root logger as a fresh process has it (no handler) for the command, restored after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers = []
    try:
        yield
    finally:
        for h in root.handlers:
            if h not in handlers:
                h.close()
        root.handlers = handlers
        root.setLevel(level)


@contextmanager
def process_settings() -> Iterator[None]:
    """The collector's and the interpreter's settings a command may tune for its process, restored."""
    threshold, callbacks, frozen = gc.get_threshold(), gc.callbacks[:], gc.get_freeze_count()
    interval, argv, argv_items = sys.getswitchinterval(), sys.argv, sys.argv[:]
    try:
        yield
    finally:
        # gc can only unfreeze everything: where something was frozen before the call (conftest.py
        # freezes what collection made), what the command froze stays frozen with it; else it is thawed
        if not frozen and gc.get_freeze_count():
            gc.unfreeze()
        gc.set_threshold(*threshold)
        gc.callbacks[:] = callbacks
        sys.setswitchinterval(interval)
        argv[:] = argv_items  # the same list, as it was
        sys.argv = argv


def exit_status(e: SystemExit) -> int:
    """The status a process ending by ``e`` exits with (None 0; a message 1, as the interpreter does)."""
    if e.code is None:
        return 0
    return e.code if isinstance(e.code, int) else 1


def perfd(capsys: pytest.CaptureFixture[str], *args: str | Path) -> Ran:
    """``perfd ARGS``: main() in this process, its output from ``capsys`` (anything printed before is
    read off first, so it is this run's only)."""
    capsys.readouterr()
    with command_logging(), process_settings():
        try:
            rc = main([str(a) for a in args])
        except SystemExit as e:
            rc = exit_status(e)
            if isinstance(e.code, str):  # the interpreter prints such a message on stderr
                print(e.code, file=sys.stderr)
    out = capsys.readouterr()
    return Ran(int(rc), out.out, out.err)
