"""`perfd demo` as a first-time user runs it (`make demo` runs the same command): every iteration
shown in order with the warm-up marked, the GPU panel said to be a recording of another run, the
report followed by notes that quote only what the report prints and set the MFU grade against what
was measured, each iteration's exposed communication and pipeline wait named as the step budget names them,
where the 790 TFLOP/s ceiling comes from, a next-step line, and no folder left behind, also when
--keep-running is ended by a signal."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.procs import wait_for

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.mark.e2e
def test_demo_plain_output_a_first_user_can_read(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    r = subprocess.run([sys.executable, "-m", "perfd.app.cli", "demo", "--plain", "--speed", "20"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=180)
    out = r.stdout
    assert r.returncode == 0, out[-3000:] + r.stderr[-3000:]
    shown = [int(m.group(1)) for m in re.finditer(r"^iteration (\d+): ", out, re.M)]
    assert shown == list(range(1, 41))  # every iteration, once, in order: none skipped
    first = next(ln for ln in out.splitlines() if ln.startswith("iteration 1: "))
    assert "step 5868.0 ms" in first and "warm-up" in first and "left out of the steady-state" in first
    assert "warm-up" not in next(ln for ln in out.splitlines() if ln.startswith("iteration 5: "))
    assert "a RECORDING of another run (h100_phases.jsonl" in out and "it is not this job's GPUs" in out
    notes = out[out.index("Reading this report:"):]
    assert "data wait at 4.0%" in notes and "exposed communication at 0.3%" in notes
    assert "neither explains it here" in notes and "pipeline-bound" in notes
    assert "usually communication or data loading" not in out  # a hint the report no longer prints
    tenth = next(ln for ln in out.splitlines() if ln.startswith("iteration 10: "))
    assert "exposed communication 0.3%" in tenth and "pipeline wait 24.5%" in tenth
    assert "NVML: a recording of another run (h100_phases.jsonl)" in out
    assert "790 TFLOP/s matmul ceiling is measured" in notes and "8192³ bf16" in notes
    assert "their URLs above are closed" in out and "Next step" in out
    assert not list(tmp_path.iterdir()), list(tmp_path.iterdir())  # no /tmp/perfd-demo-* behind


@pytest.mark.e2e
def test_demo_runs_from_a_folder_holding_the_clone_as_perfd(tmp_path: Path) -> None:
    """The installed `perfd` run where ``perfd/`` is the clone's root (the folder above a clone named
    perfd): its daemons must still import the package, not that folder (before, `python -m
    perfd.app.cli` from there failed with an ImportError traceback and the demo never started)."""
    script = Path(sys.executable).parent / "perfd"  # the console script pip made (make test's venv)
    assert script.is_file(), script
    here = tmp_path / "src"
    here.mkdir()
    (here / "perfd").symlink_to(ROOT, target_is_directory=True)
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONPATH", None)
    r = subprocess.run([str(script), "demo", "--plain", "--speed", "40"], cwd=here, env=env,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Traceback" not in r.stdout + r.stderr and "Next step" in r.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # the run's folder removed


@pytest.mark.e2e
def test_demo_keep_files_keeps_them(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    r = subprocess.run([sys.executable, "-m", "perfd.app.cli", "demo", "--plain", "--speed", "40",
                        "--keep-files"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout[-3000:]
    (kept,) = tmp_path.glob("perfd-demo-*")
    assert (kept / "train.log").is_file() and f"(files kept in {kept})" in r.stdout


@contextlib.contextmanager
def _sigint_not_ignored() -> Iterator[None]:
    """While a child starts: this process's SIGINT not ignored, so that the child inherits its default.

    A disposition set to SIG_IGN survives exec, a handler does not (the child gets SIG_DFL). Set here,
    in the parent, rather than in the child by a ``preexec_fn``: that makes subprocess fork this test
    process and run Python's fork handlers in the child, and gRPC's, whose threads earlier in-process
    tests left running in this worker, aborted such a child now and then (SIGABRT, "epoll_wait error:
    Bad file descriptor": 2-5 of 60 forks in a process with busy gRPC threads, 0 of 60 without it)."""
    held = signal.getsignal(signal.SIGINT)
    if held == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if held == signal.SIG_IGN:
            signal.signal(signal.SIGINT, held)


# The demo stops its agent and aggregator (10 s each, then SIGKILL) and removes its folder: on a loaded
# 2-CPU machine (two test suites at once) that took over 60 s once.
STOP_WAIT_S = 150


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_keep_running_stops_everything_on_a_signal(tmp_path: Path, sig: signal.Signals) -> None:
    """`perfd demo --keep-running`, then SIGTERM (a supervisor, `kill`) or SIGINT (Ctrl-C): its
    aggregator and agent stop and its folder goes (before, SIGTERM left both running and the
    /tmp/perfd-demo-* folder behind)."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    out = tmp_path / "demo.out"
    # SIGINT as a terminal's Ctrl-C delivers it: to a process that did not inherit it ignored. A test
    # process can hold it ignored (a library's shutdown path sets SIG_IGN for SIGINT), and Python then
    # installs no KeyboardInterrupt: the demo would be right to ignore the signal.
    worker_sigint = signal.getsignal(signal.SIGINT)
    with _sigint_not_ignored():
        p = subprocess.Popen([sys.executable, "-m", "perfd.app.cli", "demo", "--plain", "--speed", "40",
                              "--keep-running"], cwd=ROOT, env=env, stdout=out.open("wb"),
                             stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "keep running" in out.read_text() or p.poll() is not None, 180,
                 "the demo to keep its daemons running")
        assert p.poll() is None, out.read_text()[-3000:]
        children = psutil.Process(p.pid).children(recursive=True)
        assert len(children) >= 2  # the aggregator and the agent
        (work,) = tmp_path.glob("perfd-demo-*")
        t0 = time.monotonic()
        p.send_signal(sig)
        try:
            rc = p.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"no exit {STOP_WAIT_S} s after {sig.name} (this test process's SIGINT: "
                                 f"{worker_sigint!r}); demo output:\n{out.read_text()[-3000:]}") from None
        print(f"demo --keep-running stopped {time.monotonic() - t0:.1f} s after {sig.name}")
        assert rc == 0, out.read_text()[-3000:]  # asked to stop: it did, cleanly
        _gone, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, alive
        assert not work.exists() and not list(tmp_path.glob("perfd-demo-*"))
        assert "Traceback" not in out.read_text()
    finally:
        if p.poll() is None:
            p.kill()


@pytest.mark.e2e
def test_a_sigterm_while_replaying_stops_everything_too(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    out = tmp_path / "demo.out"
    p = subprocess.Popen([sys.executable, "-m", "perfd.app.cli", "demo", "--plain", "--speed", "1"], cwd=ROOT,
                         env=env, stdout=out.open("wb"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "iteration 1:" in out.read_text() or p.poll() is not None, 120,
                 "the demo's first iteration")
        children = psutil.Process(p.pid).children(recursive=True)
        assert p.poll() is None and len(children) >= 2, out.read_text()[-3000:]
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=STOP_WAIT_S) == 128 + signal.SIGTERM, out.read_text()[-3000:]
        _gone, alive = psutil.wait_procs(children, timeout=30)
        assert not alive and not list(tmp_path.glob("perfd-demo-*"))
        assert "perfd demo: stopped (SIGTERM)" in out.read_text()
    finally:
        if p.poll() is None:
            p.kill()
