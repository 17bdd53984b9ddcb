"""A stall seen only through the engine, with real processes: a real nats-server, ``perfd shard``,
``perfd aggregator --engine`` (the root) and ``perfd agent --engine`` with its hook and ranks
collectors, and a training loop timed by the step hook. The loop's rank is SIGSTOPped: the job's
steps stop reaching the root through the shard, and the rank's process state (a ``rank_processes``
event) reaches it through the records stream — the stall is opened, its cause the stopped process,
as on a stream to one aggregator (tests/host/test_host_live.py). The root asks the agent for the
rank's Python stack over the engine (a ``stacks`` command, request and reply); the agent takes it with
py-spy and it comes back as a ``rank_stacks`` event on the records stream, into the incident. The
stall closes when the rank resumes."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.engine.engine_driver import Rig
from tests.procs import get_json, start_aggregator, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")]

LOOP = Path(__file__).resolve().parents[1] / "host" / "hook_loop.py"
JOB = "enginejob"


def test_a_stopped_rank_is_a_stall_through_the_engine_its_cause_the_stopped_process(rig: Rig,
                                                                                    tmp_path: Path) -> None:
    rig.start_cluster()
    rig.start_shard("shard-a")
    _, _, base = start_aggregator(rig.procs, "--rules-interval", "1", *rig.engine_args(),
                                  "--engine-root-id", "root-a", ready=tmp_path / "root.ready", timeout=60)
    sock = str(tmp_path / "hook.sock")
    (tmp_path / "agent.yaml").write_text(
        "batch_interval_s: 0.5\ncollectors:\n"
        f"  hook: {{socket_path: {sock}}}\n  ranks: {{interval_s: 1.0}}\n")
    agent_engine = rig.engine_args()[:4]  # --engine, --engine-partitions: the streams are the root's
    rig.procs.perfd("agent", "agent", *agent_engine, "--job", JOB, "--host", "off", "--node", "node-a",
                    "--nvml", "off", "--metrics-port", "-1", "--config", str(tmp_path / "agent.yaml"),
                    role="agent")
    wait_for(lambda: os.path.exists(sock), 30, "the agent's hook socket")
    loop = rig.procs.start("loop", [sys.executable, str(LOOP), "--step-ms", "10", "--duration", "600"],
                           env={"PERFD_HOOK_SOCKET": sock})

    def job() -> dict[str, Any] | None:
        return next((j for j in get_json(f"{base}/api/jobs")["jobs"] if j and j.get("job") == JOB), None)

    def incidents() -> list[dict[str, Any]]:
        return list(get_json(f"{base}/api/jobs/{JOB}/incidents")["incidents"])

    def until(pred: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
        return wait_for(pred, timeout, what, interval=0.25)

    until(lambda: (j := job()) and (j.get("iterations_seen") or 0) >= 200
          and (get_json(f"{base}/api/jobs/{JOB}/summary").get("summary") or {}).get("medians", {})
          .get("step_time_ms"), "200 iterations through the engine, a steady median", 90)
    os.kill(loop.pid, signal.SIGSTOP)
    t_stop = time.monotonic()
    try:
        until(lambda: (j := job()) and j["state"] == "stalled", "the job stalled", 30)
        seen_after = time.monotonic() - t_stop
        stalled = until(lambda: (j := job()) and j["state"] == "stalled"
                        and j["stall"]["ranks"]["0"]["state"] == "stopped" and j,
                        "the rank read as stopped", 20)
        assert "stopped" in stalled["stall"]["reasons"]
        (inc,) = [i for i in incidents() if i["kinds"] == ["stall"]]
        assert inc["open"] and inc["ranks"] == [0]
        assert (inc.get("verdict") or {}).get("cause") == "process_stopped", inc.get("verdict")
        stacks = until(lambda: next(((i["evidence"]["stall"].get("stacks") or {}).get("0")
                                     for i in incidents() if "stall" in i["kinds"]), None),
                       "the stopped rank's stack, asked for over the engine", 20)
        assert "main (hook_loop.py:" in stacks.get("stack", ""), stacks  # where the loop was stopped
        print(f"FIGURES stall seen {seen_after:.1f} s after SIGSTOP, through the engine; its stack "
              f"{time.monotonic() - t_stop:.1f} s after")
        time.sleep(max(0.0, 12.0 - (time.monotonic() - t_stop)))
    finally:
        os.kill(loop.pid, signal.SIGCONT)
    until(lambda: (j := job()) and j["state"] == "running", "the job running again", 60)
    closed = until(lambda: next((i for i in incidents() if "stall" in i["kinds"] and not i["open"]), None),
                   "the stall's incident closed", 60)
    assert (closed.get("verdict") or {}).get("cause") == "process_stopped"
    assert closed["evidence"]["stall"]["ranks"]["0"]["state"] == "stopped"
    engine = get_json(f"{base}/api/stats")["engine"]
    assert engine["events"] > 0 and engine["undecodable"] == 0, engine
    assert engine["commands_sent"] >= 1 and engine["commands_undeliverable"] == 0, engine
