"""tests/procs.py's ``Procs`` on CPU, the plumbing the live GPU scripts (tests/gpu/) share: a real
aggregator, a ``perfd launch`` of a small Python job and an agent on its manifest, the API asked,
then everything stopped: each process gone, the agent before the aggregator, no stream cut under
an agent (its log would say the stream ended, INTERNAL or UNAVAILABLE)."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from tests.procs import Procs, get_json, run_env, start_agent, start_aggregator, wait_for, wait_manifest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

JOB = "harness"
TINY = """
import time
for i in range(1, 6):
    print(f"step {i}", flush=True)
    time.sleep(0.2)
time.sleep(60)
"""


@pytest.mark.e2e  # tests/procs.py's helpers themselves: they start the daemons' processes
def test_procs_start_query_and_stop_in_order(tmp_path: Path) -> None:
    (tmp_path / "tiny.py").write_text(TINY)
    with Procs(tmp_path, run_env()) as procs:
        grpc_port, _, base = start_aggregator(procs, "--no-rules")
        run_dir = tmp_path / "run"
        launch = procs.perfd(
            "launch",
            "launch",
            "--job",
            JOB,
            "--run-dir",
            str(run_dir),
            "--",
            sys.executable,
            str(tmp_path / "tiny.py"),
        )
        manifest = wait_manifest(run_dir / "launch.json", launch)
        start_agent(procs, grpc_port, "--host", "off", manifest=manifest, nvml="off")
        jobs = wait_for(
            lambda: [j for j in get_json(f"{base}/api/jobs")["jobs"] if j["job"] == JOB],
            30,
            "the job in /api/jobs",
        )
        assert jobs[0]["job"] == JOB
        # Wait for the line itself (the log exists, then grows): a loaded machine may take a while
        # to start the job and write it (a 10 s wait once returned at the first line).
        wait_for(lambda: "step 5" in (run_dir / "output.log").read_text(), 60, "step 5 in the job's log")
        assert launch.poll() is None  # still running: stop() ends it
    gone = {name: p.poll() for name, _, p in procs.procs}
    assert all(rc is not None for rc in gone.values()), gone
    assert set(procs.exited) == {"aggregator", "launch", "agent"}
    assert procs.exited["agent"] < procs.exited["launch"] < procs.exited["aggregator"]
    logs = procs.tails(n=100_000)
    assert set(logs) == {"aggregator", "agent", "launch"}
    assert not [n for n, text in logs.items() if "INTERNAL" in text], logs
    # An aggregator stopped under the agent: "stream to ... ended (UNAVAILABLE: the aggregator is
    # shutting down ...)" or, mid-write, INTERNAL.
    assert "ended (" not in logs["agent"], logs["agent"]


@pytest.mark.e2e
def test_start_aggregator_fails_fast_when_it_exits(tmp_path: Path) -> None:
    with Procs(tmp_path, run_env()) as procs, pytest.raises(RuntimeError, match="exited"):
        start_aggregator(procs, "--rules", str(tmp_path / "missing.yaml"), timeout=30)


def test_free_ports_come_from_the_workers_slice_below_the_ephemeral_range(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A port handed to a child is one no bind(0) or outgoing connection elsewhere can take first: from
    this worker's slice below the kernel's ephemeral range, each free when handed out, none twice."""
    from tests import procs

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw2")
    lo = procs.PORTS_FROM + 2 * procs.PORTS_PER_WORKER
    if lo + procs.PORTS_PER_WORKER > procs._ephemeral_low():
        pytest.skip("this machine's ephemeral range starts below the slices")
    ports = [procs.free_port() for _ in range(20)]
    assert len(set(ports)) == 20 and all(lo <= p < lo + procs.PORTS_PER_WORKER for p in ports)
    # a port some process holds is passed over: the walk's next one (its offset and place made known)
    monkeypatch.setattr(os, "getpid", lambda: 0)
    monkeypatch.setattr(procs, "_ports", iter(range(10**9)))
    with socket.socket() as held:
        held.bind(("127.0.0.1", lo))
        held.listen()
        assert procs.free_port() == lo + 1
