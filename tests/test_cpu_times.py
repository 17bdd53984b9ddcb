"""tests.cpu_times, the per-test CPU plugin, in an inner pytest: a test that burns CPU in the pytest
process shows it as its own (``self_s``), one whose child burns it shows it in ``cpu_s`` only, and the
summary adds them up per file."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.cpu_times import _summary
from tests.procs import ROOT

pytestmark = pytest.mark.slow  # an inner pytest and a child: ~4 s

INNER = """
import subprocess, sys, time

def _burn(s):
    t = time.process_time()
    while time.process_time() - t < s:
        pass

def test_in_process():
    _burn(0.3)

def test_in_a_child():
    subprocess.run([sys.executable, "-c", "import time\\nt = time.process_time()\\n"
                    "while time.process_time() - t < 0.3: pass"], check=True)
"""


def test_a_tests_own_cpu_is_told_apart_from_its_childrens(pytester: pytest.Pytester,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_inner=INNER)
    folder = pytester.path / "cpu"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("PERFD_TEST_CPU", str(folder))
    # the inner session is no xdist worker (the outer one's name, inherited, would name its file)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    result = pytester.runpytest_subprocess("-p", "tests.cpu_times", "-p", "no:cacheprovider", timeout=60)
    result.assert_outcomes(passed=2)
    rows = json.loads((folder / "main.json").read_text())["tests"]
    calls = {r["nodeid"].split("::")[1]: r for r in rows if r["phase"] == "call"}
    own, child = calls["test_in_process"], calls["test_in_a_child"]
    assert own["self_s"] >= 0.25 and own["cpu_s"] >= own["self_s"]
    assert child["cpu_s"] >= 0.25 and child["self_s"] < 0.2  # the child's burn is not the test's own
    assert {r["phase"] for r in rows} == {"setup", "call", "teardown"}
    text = _summary(folder, 5)
    (line,) = [ln for ln in text.splitlines() if ln.endswith("test_inner.py")]
    _wall, cpu, self_s, _ratio = (float(x) for x in line.split()[:4])
    assert cpu >= 0.5 and 0.25 <= self_s < cpu
    # ... and the command prints it
    out = subprocess.run([sys.executable, "-m", "tests.cpu_times", str(folder), "1"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith(text.splitlines()[0]) and "test_inner.py::test_in_a_child" in out
