"""A pytest plugin (the root conftest.py loads it), off unless PERFD_TEST_CPU names a folder: each
test's wall time and CPU time, phase by phase, so a test that burns the CPU (parsing the same trace
again, analysis repeated) is told apart from one that waits (a real server, a timeout). On a 2-core
machine the first kind is what more xdist workers cannot overlap.

CPU is the pytest process's own (threads included) plus that of its children it has waited for
(``resource.getrusage`` SELF + CHILDREN, user + system): a subprocess counts once reaped, one still
running at a phase's end counts where it is reaped, and a process not descending from pytest never.
A module or session fixture counts at the setup or teardown of the test that builds or ends it, as
in ``--durations``.

Each pytest process (each xdist worker) writes ``<folder>/<worker>.json`` after each test's teardown
(so that a run stopped by a timeout keeps the tests it finished) and at the session's end:
``{"tests": [{"nodeid", "phase", "wall_s", "cpu_s", "self_s", "raised"}, ...]}`` (``self_s``: the pytest
process's own CPU alone, a test's work in it apart from its subprocesses'; ``raised``: the
exception's type where the phase raised one, pytest's Skipped too; "" where none).
``python -m tests.cpu_times <folder>`` prints the sums per file, what raised, and the tests of most CPU
and of most wall.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path

import pytest
from pluggy import Result

ENV = "PERFD_TEST_CPU"
_ROWS: list[dict[str, str | float]] = []


def _cpu_s() -> tuple[float, float]:
    """(the pytest process's own CPU, that and its reaped children's)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = me.ru_utime + me.ru_stime
    return own, own + kids.ru_utime + kids.ru_stime


def _timed(item: pytest.Item, phase: str) -> Generator[None, Result[None], None]:
    if not os.environ.get(ENV):
        yield
        return
    wall0, (own0, cpu0) = time.perf_counter(), _cpu_s()
    outcome = yield
    own1, cpu1 = _cpu_s()
    wall, cpu, own = time.perf_counter() - wall0, cpu1 - cpu0, own1 - own0
    raised = outcome.excinfo[0].__name__ if outcome.excinfo else ""
    _ROWS.append({"nodeid": item.nodeid, "phase": phase, "wall_s": round(wall, 4), "cpu_s": round(cpu, 4),
                  "self_s": round(own, 4), "raised": raised})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Result[None], None]:
    yield from _timed(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Result[None], None]:
    yield from _timed(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, Result[None], None]:
    yield from _timed(item, "teardown")
    _write()


def _write() -> None:
    folder = os.environ.get(ENV)
    if not folder or not _ROWS:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    Path(folder).mkdir(parents=True, exist_ok=True)
    part = Path(folder) / f"{worker}.json.part"
    part.write_text(json.dumps({"tests": _ROWS}))
    os.replace(part, part.with_suffix(""))  # whole or not there: read by the summary at any time


def pytest_sessionfinish(session: pytest.Session) -> None:
    _write()


def _summary(folder: Path, top: int) -> str:
    files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    tests: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    raised: dict[str, str] = {}
    for path in sorted(folder.glob("*.json")):
        for row in json.loads(path.read_text())["tests"]:
            nodeid = str(row["nodeid"])
            if row.get("raised"):
                raised[f"{nodeid} ({row['phase']})"] = str(row["raised"])
            for acc in (files[nodeid.split("::")[0]], tests[nodeid]):
                acc[0] += float(row["wall_s"])
                acc[1] += float(row["cpu_s"])
                acc[2] += float(row.get("self_s", 0.0))  # (a folder written before it was recorded: 0)
    lines = [f"{'wall s':>8} {'cpu s':>8} {'self s':>8} {'cpu/wall':>8}  file"]
    for name, (wall, cpu, own) in sorted(files.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"{wall:8.1f} {cpu:8.1f} {own:8.1f} {cpu / max(wall, 1e-9):8.2f}  {name}")
    wall_all, cpu_all, own_all = (sum(acc[i] for acc in files.values()) for i in range(3))
    lines.append(f"{wall_all:8.1f} {cpu_all:8.1f} {own_all:8.1f} {cpu_all / max(wall_all, 1e-9):8.2f}  all "
                 f"({len(tests)} tests)")
    lines += [f"raised {kind}: {name}" for name, kind in sorted(raised.items())]
    for label, key in (("cpu", 1), ("cpu in the pytest process itself", 2), ("wall", 0)):
        lines.append(f"-- the {top} tests of most {label}")
        for name, acc in sorted(tests.items(), key=lambda kv: -kv[1][key])[:top]:
            lines.append(f"{acc[0]:8.1f} {acc[1]:8.1f} {acc[2]:8.1f}  {name}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(_summary(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 25))
