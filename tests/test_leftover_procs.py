"""The leftover-process guard (tests/leftover_procs.py) fails a run that leaves a process behind, names
it with the test it was first seen at, and kills it; a run that leaves nothing passes. Each case is an
inner pytest run in a subprocess, with the guard loaded and its grace period cut short."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]

INNER = """
import os
import signal
import subprocess

import pytest


def test_leaves_a_sleep(tmp_path):
    p = subprocess.Popen(["sleep", "61"])
    with open(os.environ["LEFTOVER_PIDS"], "a") as fh:
        fh.write(f"{p.pid}\\n")


@pytest.fixture
def shell():
    # the shell is stopped at the end, its child is not: reparented away from pytest, still running
    sh = subprocess.Popen(["sh", "-c", "sleep 62 & echo $! >> \\"$LEFTOVER_PIDS\\"; wait"])
    yield sh
    sh.kill()
    sh.wait()


def test_orphans_a_grandchild(shell):
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(open(os.environ["LEFTOVER_PIDS"]).read().split()) < 2:
        time.sleep(0.05)


def test_cleans_up():
    p = subprocess.Popen(["sleep", "63"])
    p.kill()
    p.wait()
"""


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_inner=INNER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("LEFTOVER_PIDS", str(pytester.path / "pids"))
    # the installed plugins left out (hypothesis alone made a 1 s run 6 s on a loaded machine)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    (pytester.path / "pids").write_text("")
    return pytester.runpytest_subprocess("-p", "tests.leftover_procs", "-o", "leftover_grace_s=0.5",
                                         "-p", "no:cacheprovider", *args, timeout=120)


def _gone(pytester: pytest.Pytester) -> None:
    pids = [int(x) for x in (pytester.path / "pids").read_text().split()]
    assert len(pids) == 2
    for pid in pids:  # the guard killed what it named
        try:
            assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            pass


@pytest.mark.parametrize("xdist", [
    pytest.param([], id="one-process"),
    pytest.param(["-p", "xdist.plugin", "-n", "1"], id="xdist", marks=pytest.mark.slow),  # 1.5-3 s
])
def test_a_process_left_behind_fails_the_run_and_is_named(pytester: pytest.Pytester,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          xdist: list[str]) -> None:
    result = _run(pytester, monkeypatch, *xdist)
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    result.stdout.fnmatch_lines(["*leftover processes*", "*3 passed*",
                                 "*2 process(es) left running: the run fails*"])
    result.stdout.fnmatch_lines(["*pid *: sleep 61  (first seen at the end of the call of "
                                 "test_inner.py::test_leaves_a_sleep)"])
    result.stdout.fnmatch_lines(["*pid *: sleep 62  (first seen at the end of "
                                 "*test_inner.py::test_orphans_a_grandchild)"])
    assert "sleep 63" not in out
    if xdist:
        assert "[gw0] pid " in out
    _gone(pytester)


def test_a_run_that_leaves_nothing_passes(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run(pytester, monkeypatch, "-k", "cleans_up")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert "leftover processes" not in result.stdout.str()
