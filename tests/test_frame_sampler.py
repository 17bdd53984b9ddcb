"""benchmarks.frame_sampler: a process's threads' CPU (from /proc) and where their stacks were, from
inside the process, for the GPU machine where py-spy cannot attach. The sampled run is a process of its
own (the sampler samples the process it runs in, until it exits, and writes its file at exit); showing
a file and the usage are its main() in the test's process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import frame_sampler
from tests.procs import ROOT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread CPU from /proc")

BUSY = """
import threading, time

def spin_here(s):
    t = time.process_time()
    while time.process_time() - t < s:
        pass

th = threading.Thread(target=spin_here, args=(0.6,), name="spinner")
th.start()
th.join()
time.sleep(0.3)
"""


def test_the_sampler_names_the_busy_thread_its_cpu_and_the_function_it_spun_in(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "busy_mod.py").write_text(BUSY)
    out = tmp_path / "prof.json"
    got = subprocess.run([sys.executable, "-m", "benchmarks.frame_sampler", str(out), "busy_mod"], cwd=ROOT,
                         env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    doc = json.loads(out.read_text())
    threads = {t["thread"]: t for t in doc["threads"]}
    spinner = threads["spinner"]
    assert spinner["cpu_s"] is not None and spinner["cpu_s"] >= 0.3  # (of 0.6: read every 0.1 s)
    assert spinner["samples"] > 0 and any("spin_here" in fr for _, fr in spinner["within"])
    assert threads["main"]["samples"] > 0 and "frame-sampler" in threads
    capsys.readouterr()
    assert frame_sampler.main(["--show", str(out)]) == 0
    assert "== spinner" in capsys.readouterr().out


def test_the_sampler_without_a_module_says_how_to_run_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert frame_sampler.main([]) == 2
    assert "frame_sampler OUT.json MODULE" in capsys.readouterr().err
