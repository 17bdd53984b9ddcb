"""`perfd top` in real terminals of 80 and 120 columns (tmux), where its rows were found cut: a job started
by `perfd launch` (a real rank process, printing a real Megatron-LM log), its agent on this machine
with the NVML collector as shipped (`--nvml real`: no NVIDIA driver here, so unavailable), then a
node agent whose replayed NVML recording places a GPU in the job. Before any GPU row the GPU panel
says why (the agent's NVML unavailable, and its reason); then the GPU row and the rank process row
are each one line, every value whole, at both widths. The aggregator and both agents run in the test's
process (tests/inproc.py); `perfd launch`, its rank and `perfd top` in its terminal are processes. And
the live view against the e2e conftest's pair, redrawn in place as the job's log grows, read by its keys."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import JOB as LIVE_JOB
from tests.e2e.conftest import LOG as LIVE_LOG
from tests.e2e.conftest import Live
from tests.inproc import Pipeline, pipeline
from tests.procs import PERFD, Procs, get_json, placed_recording, wait_for, wait_manifest

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "tests" / "data" / "megatron" / "dp2_all_timers.log"
NVML = ROOT / "perfd" / "collectors" / "nvml" / "data" / "h100_phases.jsonl"
JOB, NODE = "top-widths", "gpu-node-017"
pytestmark = pytest.mark.slow

# The rank: prints the log (as a Megatron-LM rank would, a line at a time), then waits to be stopped.
RANK = ("import sys, time\n"
        "for line in open(sys.argv[1]):\n"
        "    sys.stdout.write(line); sys.stdout.flush(); time.sleep(0.005)\n"
        "time.sleep(600)\n")


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    with Procs(tmp_path) as p:
        yield p


@pytest.fixture
def pipe(tmp_path: Path, procs: Procs) -> Iterator[Pipeline]:
    """The aggregator; stopped (its agents first) before the processes."""
    with pipeline(tmp_path, "--gpu", "NVIDIA H200") as p:
        yield p


class Terminal:
    """``perfd top`` in a tmux pane of the given size."""

    def __init__(self, base: str, columns: int, rows: int = 70) -> None:
        self.name = f"perfd-top-{os.getpid()}-{columns}"
        cmd = f"{' '.join(PERFD)} top --aggregator {base} --job {JOB} --interval 0.5"
        # The pane decides the size: COLUMNS/LINES of the runner (pytest-xdist sets 80x24) must not.
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")} | {"TMUX": ""}
        subprocess.run(["tmux", "-L", self.name, "new-session", "-d", "-s", self.name, "-x", str(columns),
                        "-y", str(rows), "-c", str(ROOT), cmd], check=True, env=env, timeout=20)

    def screen(self) -> str:
        return subprocess.run(["tmux", "-L", self.name, "capture-pane", "-p", "-t", self.name],
                              capture_output=True, text=True, timeout=10).stdout

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.name, "kill-server"], capture_output=True, timeout=10)


def _showing(term: Terminal, *marks: str) -> str | None:
    """The terminal's screen once it shows every mark."""
    screen = term.screen()
    return screen if all(m in screen for m in marks) else None


def _rows(screen: str, *marks: str) -> list[str]:
    """The table rows of ``screen`` (a line that starts with the node's name, ruled or not) holding
    every mark: not the incidents' lines below, which may cite a GPU's temperature."""
    return [ln for ln in screen.splitlines() if ln.lstrip("│┃ ").startswith((NODE, "0 ", "   0 "))
            and all(m in ln for m in marks)]


@pytest.mark.e2e
def test_top_at_80_and_120_columns_whole_and_says_why_no_gpu(tmp_path: Path, procs: Procs,
                                                             pipe: Pipeline) -> None:
    if shutil.which("tmux") is None:
        if os.environ.get("PERFD_REQUIRE_SYSTEM_DEPS"):
            pytest.fail("tmux missing: ci/install-system-deps.sh installs it")
        pytest.skip("tmux not installed (ci/install-system-deps.sh)")
    base = pipe.base
    run = tmp_path / "run"
    rank = tmp_path / "rank.py"
    rank.write_text(RANK)
    launch = procs.perfd("launch", "launch", "--job", JOB, "--run-dir", str(run), "--log",
                         str(run / "train.log"), "--", sys.executable, str(rank), str(LOG))
    manifest = wait_manifest(run / "launch.json", launch)
    pipe.agent("--launch-manifest", manifest, "--nvml", "real", "--metrics-port", "0", "--node", NODE)

    def placed() -> dict[str, Any] | None:
        got: dict[str, Any] = get_json(f"{base}/api/jobs/{JOB}/gpus")
        return got if got["rank_hosts"] and got["gpu_sources"] else None

    gpus = wait_for(placed, 90, "the job's rank process and its agent's Hello at the aggregator")
    assert gpus["gpus"] == [] and [s["agent"] for s in gpus["gpu_sources"]] == [f"{NODE}/{JOB}"]
    nvml = gpus["gpu_sources"][0]["nvml"]
    terminals = {w: Terminal(base, w) for w in (80, 120)}
    try:
        for width, term in terminals.items():
            screen = wait_for(partial(_showing, term, "rank processes", "GPUs"), 60,
                              f"perfd top's screen at {width} columns")
            joined = " ".join(screen.split())
            if nvml is not None and nvml.startswith("unavailable"):  # no driver here: its reason, on screen
                assert f"agent {NODE}/{JOB}: NVML {nvml}" in joined, screen
            else:  # a machine with a GPU: NVML works, and no GPU of it runs the job's rank
                assert "reads NVML, and none of its GPUs runs this job's processes" in joined, screen
            pid = str(gpus["rank_hosts"][0]["pid"])
            (row,) = _rows(screen, f" {pid} ")
            # Its state whole (whichever it is now: the rank prints its log, then sleeps).
            states = ("running", "sleeping", "disk_sleep", "stopped", "zombie", "gone", "other")
            assert NODE in row and any(f" {st} " in row for st in states) and "…" not in row, screen

        # A node agent's GPU joins the job (its recorded process declares it): one line a GPU.
        recording = placed_recording(NVML, tmp_path / "node.jsonl", JOB, "00000000:18:00.0")
        node_cfg = tmp_path / "node-agent.yaml"
        nvml_cfg = {"source": f"replay:{recording}", "loop": True}
        node_cfg.write_text(json.dumps({"collectors": {"nvml": nvml_cfg}}))
        pipe.agent("--nvml", f"replay:{recording}", "--config", node_cfg, "--node", NODE, "--host", "off",
                   name="node-agent")
        for width, term in terminals.items():
            screen = wait_for(partial(_showing, term, "°C"), 60, f"the GPU row at {width} columns")
            (gpu_row,) = _rows(screen, "°C")
            cells = gpu_row.replace("│", " ").split()
            assert cells[:2] == [NODE, "0"] and "…" not in gpu_row, screen
            assert "H100 80GB HBM3 (replay)" in screen  # the model: in the row (120) or the title (80)
            assert all(len(ln) <= width for ln in screen.splitlines()), screen
            table = screen[screen.index("GPUs"):screen.index("\nprocesses")]
            assert not [ln for ln in table.splitlines() if ln.strip("│ ┃") and NODE not in ln
                        and "°C" not in ln and not set(ln) & set("━─┏┡└") and "gpu" not in ln
                        and not ln.startswith("GPUs")], table  # no continuation line of a wrapped row
    finally:
        for term in terminals.values():
            term.close()


@pytest.mark.e2e
def test_top_refreshes_in_a_real_terminal(live: Live, tmp_path: Path) -> None:
    """The live view (the e2e conftest's ``live`` pair: the demo's log growing, its NVML replayed)
    refreshing in place in a 160-column pane."""
    if shutil.which("tmux") is None:
        if os.environ.get("PERFD_REQUIRE_SYSTEM_DEPS"):
            pytest.fail("tmux missing: ci/install-system-deps.sh installs it")
        pytest.skip("tmux not installed (ci/install-system-deps.sh)")
    name = f"perfd-top-{os.getpid()}"
    cmd = f"{sys.executable} -m perfd.app.cli top --aggregator {live.base} --job {LIVE_JOB} --interval 0.5"
    # The terminal decides the size: COLUMNS/LINES inherited from the runner (pytest-xdist's workers
    # set 80x24) would make rich draw for them, not for the 160-column pane.
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")} | {"TMUX": ""}
    subprocess.run(["tmux", "-L", name, "new-session", "-d", "-s", name, "-x", "160", "-y", "60", "-c",
                    str(ROOT), cmd], check=True, env=env, timeout=20)
    try:
        def pane() -> str:
            return subprocess.run(["tmux", "-L", name, "capture-pane", "-p", "-t", name], capture_output=True,
                                  text=True, timeout=10).stdout

        # The first screen with every part drawn (a loaded machine may draw one refresh without the
        # straggler line: the aggregator's analysis comes a refresh later).
        first = wait_for(lambda: (p := pane()) and "GPUs" in p and LIVE_JOB in p and "slowest: r" in p
                         and "(replay)" in p and p, 60, "first screen")
        final = _final_iteration()
        assert f" {final} " not in first  # the log's last iteration is not written yet
        live.write_rest()
        wait_for(lambda: get_json(f"{live.base}/api/jobs")["jobs"][0]["last_iteration"] == final, 60,
                 "the rest of the log at the aggregator")
        # The same pane, redrawn in place: the new last iteration shows, and the screen holds one
        # copy of the header (a refresh that printed below the old screen would hold two).
        refreshed = wait_for(lambda: (p := pane()) and f" {final} " in p and p, 30, "refreshed screen")
        assert refreshed.count("perfd top —") == 1
        assert refreshed.count("GPUs") == 1
        assert "processes" in refreshed and "hosts" in refreshed
        # Keys are read in the terminal: n with one job keeps the focus, q quits (the terminal's
        # mode restored; the session closes with the process).
        subprocess.run(["tmux", "-L", name, "send-keys", "-t", name, "n"], check=True, timeout=10)
        subprocess.run(["tmux", "-L", name, "send-keys", "-t", name, "q"], check=True, timeout=10)
        wait_for(lambda: subprocess.run(["tmux", "-L", name, "has-session", "-t", name],
                                        capture_output=True, timeout=10).returncode != 0, 20,
                 "perfd top to exit on q (the session closes with it)")
    finally:
        subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True, timeout=10)


def _final_iteration() -> int:
    from perfd.collectors.megatron import parse_file

    return max(r.iteration for r in parse_file(LIVE_LOG).records)
