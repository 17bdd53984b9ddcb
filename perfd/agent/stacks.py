"""The Python stacks of a job's rank processes, when the aggregator asks (a stall opened): py-spy.

``py-spy dump --pid PID --nonblocking`` reads the interpreter's memory without pausing the process,
so it never makes a hang worse, and it reads a stopped (SIGSTOP) process too (checked with py-spy
0.4.3). Each dump is bounded in time (perfd.core.limits.STACK_TIMEOUT_S) and output
(STACK_BYTES_PER_RANK; the rest is cut and said), at most MAX_STACK_RANKS ranks a request, in a
thread of its own: the agent's loop never waits for it. The answer goes back as one ``rank_stacks``
event (perfd.core.events) naming the command it answers.

py-spy's dump starts with the process's command line ("Process PID: ..."): that line goes through
perfd.core.redact's allow-list (only known-safe options keep their values), and the whole text through its
scan for token formats, so a password on it is not served with the stack (docs/security.md).
The pids come from the ranks collector, which re-checks each one when asked (still the process it
followed, still running as the user who vouched for it).

py-spy needs the rights to read the process's memory (process_vm_readv: the same user with
``kernel.yama.ptrace_scope`` 0, or CAP_SYS_PTRACE): where it has not, the rank's entry carries
py-spy's error instead of a stack. Where py-spy is not installed (``pip install perfd`` brings it),
every entry says so. Why a subprocess and not a library: py-spy is a Rust binary; its wheel ships
the executable only.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from perfd.core import limits as L
from perfd.core.events import RANK_STACKS, RankStack
from perfd.core.redact import redact_stack

if TYPE_CHECKING:
    from perfd.transport.codec import Command

log = logging.getLogger(__name__)

Emit = Callable[[dict[str, object]], None]
PidsOf = Callable[[str], Mapping[int, int]]  # job -> {rank: pid} of its rank processes on this node


class StackDump(RankStack, total=False):
    """One rank's answer as this agent gives it: a RankStack, and how long py-spy took."""

    took_s: float


def find_py_spy() -> str | None:
    """py-spy beside this interpreter (the venv perfd was installed into), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("py-spy")


def dump_stack(binary: str | None, pid: int, timeout_s: float = L.STACK_TIMEOUT_S,
               max_bytes: int = L.STACK_BYTES_PER_RANK) -> StackDump:
    """One process's Python stacks: {"pid", "stack"} or {"pid", "error"}, with how long it took.
    Never raises."""
    out: StackDump = {"pid": pid}
    if binary is None:
        out["error"] = "py-spy not found (pip install py-spy; perfd's agent depends on it)"
        return out
    t0 = time.monotonic()
    try:
        res = subprocess.run([binary, "dump", "--pid", str(pid), "--nonblocking"], capture_output=True,
                             timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        out["error"] = f"py-spy did not answer within {timeout_s:.0f} s"
        out["took_s"] = round(time.monotonic() - t0, 3)
        return out
    except OSError as exc:
        out["error"] = f"py-spy could not run: {exc}"
        return out
    out["took_s"] = round(time.monotonic() - t0, 3)
    text = res.stdout.decode("utf-8", "replace")
    if res.returncode != 0 or not text.strip():
        err = res.stderr.decode("utf-8", "replace").strip() or f"exit status {res.returncode}"
        out["error"] = err[-2000:]
        return out
    text = redact_stack(text)
    if len(text.encode()) > max_bytes:
        text = text.encode()[:max_bytes].decode("utf-8", "ignore") + "\n… (cut: more than " \
            f"{max_bytes} bytes)"
    out["stack"] = text
    return out


class StackDumper:
    """Answers ``stacks`` commands (perfd.transport.codec.COMMAND_STACKS) with a ``rank_stacks`` event."""

    def __init__(self, emit: Emit, pids_of: PidsOf, binary: str | None = None) -> None:
        self.emit = emit
        self.pids_of = pids_of
        self.binary = binary if binary is not None else find_py_spy()
        self._busy = threading.Lock()  # one request at a time: a second, while one runs, is answered busy
        self.requests = 0
        self.refused_busy = 0

    def handle(self, cmd: Command) -> None:
        """Start the dumps in a thread; returns at once."""
        self.requests += 1
        if not self._busy.acquire(blocking=False):
            self.refused_busy += 1
            self._answer(cmd, {}, "busy: the previous stacks request is still running")
            return
        t = threading.Thread(target=self._in_thread, args=(cmd,), name="perfd-stacks", daemon=True)
        try:
            t.start()
        except RuntimeError as exc:
            self._busy.release()
            self._answer(cmd, {}, f"no thread: {exc}")

    def _in_thread(self, cmd: Command) -> None:
        try:
            self.run(cmd)
        finally:
            self._busy.release()

    def run(self, cmd: Command) -> None:
        """Dump the stacks ``cmd`` asks for, now, and emit the answer (the thread's work)."""
        try:
            job = str(getattr(cmd, "job", "") or "")
            pids = dict(self.pids_of(job))
            wanted = [int(r) for r in getattr(cmd, "ranks", ()) or ()] or sorted(pids)
            ranks: dict[str, StackDump] = {}
            for r in wanted[:L.MAX_STACK_RANKS]:
                pid = pids.get(r)
                ranks[str(r)] = dump_stack(self.binary, pid) if pid is not None else {
                    "error": "no process of this rank is known on this node"}
            note = None if len(wanted) <= L.MAX_STACK_RANKS else \
                f"{len(wanted) - L.MAX_STACK_RANKS} rank(s) not dumped (perfd.core.limits.MAX_STACK_RANKS)"
            self._answer(cmd, ranks, note)
        except Exception as exc:  # a bug must not kill the agent's thread silently
            log.exception("stacks request failed")
            self._answer(cmd, {}, f"failed: {exc!r}")

    def _answer(self, cmd: Command, ranks: Mapping[str, StackDump], note: str | None) -> None:
        job = str(getattr(cmd, "job", "") or "")
        ok = sum(1 for v in ranks.values() if "stack" in v)
        self.emit({"kind": RANK_STACKS.name, "severity": "info", "time": time.time(), "job": job,
                   "text": f"Python stacks of {ok} of {len(ranks)} rank(s) of job {job}"
                           + (f" ({note})" if note else ""),
                   "labels": {"job": job}, "links": {"command_id": str(getattr(cmd, "id", ""))},
                   "payload": {"job": job, "command_id": str(getattr(cmd, "id", "")), "ranks": dict(ranks),
                               "note": note, "py_spy": self.binary}})
