"""End to end on loopback: `perfd launch` (in the test's process: tests/inlaunch.py) runs a stand-in
training process that sends
step-hook records and writes Flight Recorder dumps (the recorded H200 ones) where the launch told it
to; the agent (`perfd agent --launch-manifest`, in the test's process: tests/inproc.py) picks up the
nccl and hook collectors from the manifest; the aggregator (in the test's process too) serves the
collective analysis. What it serves must equal the analysis of the same records computed here."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from perfd.analytics.collectives.collective_analysis import analyze_collectives
from perfd.app.launcher import LaunchOptions
from perfd.core.model import StepRecord
from tests.collectives.collective_helpers import FIXTURES, MS, load_fixture_records
from tests.inlaunch import InLaunch
from tests.inproc import pipeline

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

CHILD = r"""
import json, os, shutil, sys, time
sys.path.insert(0, {root!r})
from perfd.hook import wire
from perfd.hook.sender import DatagramSender
plan = json.load(open({plan!r}))
sock, dump = os.environ["PERFD_HOOK_SOCKET"], os.environ["TORCH_FR_DUMP_TEMP_FILE"]
deadline = time.time() + 30
while not os.path.exists(sock) and time.time() < deadline:
    time.sleep(0.05)
sender = DatagramSender(sock, retry_s=0.05)
for rank, step, end_ns in plan["steps"]:
    msg = wire.pack_step(wire.StepMsg(rank=rank, pid=os.getpid(), step=step, end_time_ns=end_ns,
                                      step_ns=200_000_000))
    # The real hook drops when the agent is slow; this stand-in must deliver every record, so it
    # retries: the socket queue holds few datagrams (net.unix.max_dgram_qlen, 10 on some hosts) and
    # a loaded machine can leave the agent behind.
    until = time.time() + 10
    while not sender.send(msg) and time.time() < until:
        time.sleep(0.01)
    time.sleep(0.002)
for i in range(4):  # what the ranks' monitor threads write when the agent asks
    for rank in (0, 1):
        shutil.copy(os.path.join(plan["fixtures"], f"dump{{i:02d}}_rank{{rank}}"), dump + str(rank))
    time.sleep(1.6)
print("stand-in training done", flush=True)
"""


def _steps() -> list[tuple[int, int, int]]:
    recs = load_fixture_records("timing", job="ddp")
    out = []
    for rank in (0, 1):
        ts = sorted(r.time_created_ns for r in recs if r.rank == rank and r.time_created_ns)
        ends = [a + 50 * MS for a, b in itertools.pairwise(ts) if b - a > 100 * MS]
        out += [(rank, i, t) for i, t in enumerate(ends)]
    return out


def test_launch_agent_aggregator_collectives(tmp_path: Path) -> None:
    steps = _steps()
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"steps": steps, "fixtures": str(FIXTURES / "timing")}))
    child = tmp_path / "child.py"
    child.write_text(CHILD.format(root=str(ROOT), plan=str(plan)))
    launch = InLaunch(LaunchOptions([sys.executable, str(child)], job="ddp", run_dir=str(tmp_path / "run"),
                                    flight_recorder=str(tmp_path / "fr"),
                                    agent_socket=str(tmp_path / "hook.sock"), env={"PYTHONUNBUFFERED": "1"}),
                      tmp_path / "launch.out")
    try:
        with pipeline(tmp_path, "--no-rules") as p:
            manifest = launch.start().manifest_written()
            cfg = tmp_path / "agent.yaml"  # tuning from the file, paths from the manifest
            cfg.write_text("batch_interval_s: 0.2\ncollectors:\n  nccl:\n    flight_recorder:\n"
                           "      interval_s: 0.5\n      read_existing: true\n")
            p.agent("--config", cfg, "--launch-manifest", manifest, "--nvml", "off", "--host", "off",
                    "--metrics-port", "-1", "--node", "n1")
            assert launch.wait(60) == 0, launch.output()[-2000:]
            want = _expected(steps)

            def caught_up() -> dict[str, Any] | None:
                got: dict[str, Any] = p.json("/api/jobs/ddp/summary").get("collectives") or {}
                return got if got.get("records", 0) >= want["records"] and len(
                    got.get("iterations", [])) >= len(want["iterations"]) else None

            got = p.wait(caught_up, 30, "the aggregator's collective analysis caught up with "
                         f"{want['records']} records, {len(want['iterations'])} iterations")
            assert got["method"]["name"] == "step_windows"
            assert got["summary"]["comm_total_share"] == pytest.approx(want["summary"]["comm_total_share"])
            shares = {it["iteration"]: it["share_by_rank"] for it in got["iterations"]}
            assert shares == {it["iteration"]: pytest.approx(it["share_by_rank"])
                              for it in want["iterations"]}
            metrics = p.get("/metrics").decode()
            assert 'perfd_job_comm_total_ratio{job_name="ddp"}' in metrics
    finally:
        launch.stop()


def _expected(steps: list[tuple[int, int, int]]) -> dict[str, Any]:
    recs = load_fixture_records("timing", job="ddp")
    records = [StepRecord(job="ddp", iteration=i, rank=rank, end_time=t / 1e9, step_time_ms=200.0)
               for rank, i, t in steps]
    a = analyze_collectives("ddp", recs, records)
    out = a.to_json()
    out["records"] = len([r for r in recs if r.duration_ms is not None])
    return out
