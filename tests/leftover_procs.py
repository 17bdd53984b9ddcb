"""A pytest plugin (the root conftest.py loads it): a run that leaves a process behind fails.

Each pytest process (the only one, or each pytest-xdist worker and the controller) looks at the
processes descending from it at the end of every test's setup, call and teardown, and remembers each
one it saw, with the test and phase it was first seen at. At the end of the session, once every
fixture is torn down, a process it saw that is still running (whoever its parent is by then: a
process whose parent was killed is reparented away from pytest), or one still descending from it, is
given a grace period to exit (``leftover_grace_s``, 5 s). Those still running then are named with
their command line and the test they were first seen at, killed, and the run fails (exit status 1
where it would have been 0).
An xdist worker hands its list to the controller, which prints it with its own.

A process both started and orphaned within one phase (a daemon that double-forks) is never seen: only
what descends from pytest at a phase's end, or still does at the session's end, is. Where
``/proc/<pid>/task/<tid>/children`` exists (Linux), a snapshot of a test with no processes reads
a few small files (1,012 snapshots took 0.1 s in all, a loaded 2-core machine); elsewhere it is
psutil's walk of every process. multiprocessing's resource tracker and forkserver, which live as long
as the pytest process that started them, are not counted. ``-p no:tests.leftover_procs`` turns the
guard off.
"""

from __future__ import annotations

import os
import time
from collections.abc import Generator
from dataclasses import dataclass

import psutil
import pytest

GRACE_INI = "leftover_grace_s"
WORKER_KEY = "perfd_leftover_procs"  # in an xdist worker's workeroutput: its list, for the controller
CMDLINE_CHARS = 240
# The standard library's helpers of the pytest process itself, started on the first use of a "spawn"
# or "forkserver" context and gone with it (each reads its pipe from pytest until EOF): not a test's.
PROCESS_HELPERS = ("from multiprocessing.resource_tracker import main",
                   "from multiprocessing.forkserver import main")


@dataclass
class _Seen:
    proc: psutil.Process
    cmdline: str
    where: str  # the test and phase at whose end it was first seen


def _cmdline(p: psutil.Process) -> str:
    try:
        line = " ".join(p.cmdline()) or f"[{p.name()}]"  # no arguments: a zombie, or just exec'd
    except (psutil.Error, OSError):
        line = "?"
    line = line.replace("\n", "\\n")  # a `python -c` program on one line
    return line if len(line) <= CMDLINE_CHARS else line[:CMDLINE_CHARS] + "..."


def _proc_children(pid: int) -> list[int] | None:
    """The children of every thread of ``pid`` from /proc (None where the kernel does not list them)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    out: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out.extend(int(c) for c in fh.read().split())
        except FileNotFoundError:
            if os.path.exists(f"/proc/{pid}/task/{tid}"):
                return None  # a kernel without CONFIG_PROC_CHILDREN
            continue  # the thread ended between the two reads
        except (OSError, ValueError):
            continue
    return out


def descendants(root: int) -> set[int]:
    """The pids descending from ``root`` now (not ``root`` itself)."""
    found: set[int] = set()
    todo = [root]
    while todo:
        pid = todo.pop()
        kids = _proc_children(pid)
        if kids is None:  # no /proc children files: psutil's walk (all processes' parents)
            try:
                return found | {c.pid for c in psutil.Process(root).children(recursive=True)}
            except psutil.Error:
                return found
        for k in kids:
            if k not in found:
                found.add(k)
                todo.append(k)
    return found


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class LeftoverGuard:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.me = os.getpid()
        self.seen: dict[int, _Seen] = {}
        self.from_workers: list[str] = []
        self.found: list[str] = []  # this session's leftovers, for the terminal summary

    def snapshot(self, where: str) -> None:
        for pid in descendants(self.me):
            old = self.seen.get(pid)
            if old is not None and _running(old.proc):
                continue
            try:
                p = psutil.Process(pid)
            except psutil.Error:
                continue
            self.seen[pid] = _Seen(p, _cmdline(p), where)

    def leftovers(self, grace_s: float) -> list[_Seen]:
        """What is still running at the end, after waiting up to ``grace_s`` for it to exit."""
        self.snapshot("the end of the session (not seen at the end of any test's phase)")
        deadline = time.monotonic() + grace_s
        while True:
            alive = [s for s in self.seen.values()
                     if _running(s.proc) and not any(h in _cmdline(s.proc) for h in PROCESS_HELPERS)]
            if not alive or time.monotonic() >= deadline:
                return alive
            time.sleep(0.1)
            self.snapshot("the end of the session (not seen at the end of any test's phase)")

    def finish(self) -> list[str]:
        grace = float(self.config.getini(GRACE_INI))
        left = self.leftovers(grace)
        # read again: one read just after its exec may find no arguments yet
        lines = [f"pid {s.proc.pid}: {_cmdline(s.proc) if _running(s.proc) else s.cmdline}  "
                 f"(first seen at {s.where})" for s in left]
        for s in left:
            try:
                s.proc.kill()
            except psutil.Error:
                pass
        # gone or a zombie (not psutil.wait_procs: an orphan's zombie waits on init to reap it)
        deadline = time.monotonic() + 5
        while any(_running(s.proc) for s in left) and time.monotonic() < deadline:
            time.sleep(0.05)
        return lines


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(GRACE_INI, "seconds a process left at the session's end gets to exit before the run "
                  "fails naming it (tests/leftover_procs.py)", default="5")


_KEY = pytest.StashKey[LeftoverGuard]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_KEY] = LeftoverGuard(config)


def _snap(item: pytest.Item, phase: str) -> None:
    guard = item.config.stash.get(_KEY, None)
    if guard is not None:
        guard.snapshot(f"the end of {phase} of {item.nodeid}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    try:
        return (yield)
    finally:
        _snap(item, "setup")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    try:
        return (yield)
    finally:
        _snap(item, "the call")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    try:
        return (yield)
    finally:
        _snap(item, "teardown")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """xdist's controller: a worker finished; its leftovers come in its workeroutput."""
    config: pytest.Config = node.config  # type: ignore[attr-defined]
    guard = config.stash.get(_KEY, None)
    out = getattr(node, "workeroutput", None) or {}
    if guard is not None:
        name = getattr(getattr(node, "gateway", None), "id", "worker")
        guard.from_workers.extend(f"[{name}] {line}" for line in out.get(WORKER_KEY, []))


# trylast: after xdist's controller has stopped its workers (its own pytest_sessionfinish), and
# after every fixture is torn down (the last test's teardown ends the session's scope)
@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    guard = session.config.stash.get(_KEY, None)
    if guard is None:
        return
    mine = guard.finish()
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller reports and fails the run
        workeroutput[WORKER_KEY] = mine
        return
    guard.found = guard.from_workers + mine
    if not guard.found:
        return
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    guard = terminalreporter.config.stash.get(_KEY, None)
    if guard is None or not guard.found:
        return
    terminalreporter.section("leftover processes", sep="=", red=True, bold=True)
    terminalreporter.line(f"{len(guard.found)} process(es) still running at the end of the session "
                          "(killed now); the run fails:", red=True)
    for line in guard.found:
        terminalreporter.line(f"  {line}")


def pytest_unconfigure(config: pytest.Config) -> None:
    """The last line says it too, below pytest's "N passed" (which counts tests only)."""
    guard = config.stash.get(_KEY, None)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if guard is not None and guard.found and reporter is not None:
        reporter.write_sep("=", f"{len(guard.found)} process(es) left running: the run fails", red=True,
                           bold=True)
