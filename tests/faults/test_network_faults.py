"""Network faults between a real `perfd agent` and a real `perfd aggregator` (their commands'
configurations, run in the test's process: tests/inproc.py), on loopback, through tests/faults/proxy.py.
Each run writes a Megatron-LM log iteration by iteration while the fault is on, then compares what the
agent read with `/api/jobs/<job>/iterations`: every iteration there once (nothing lost), and the
aggregator's step-record count equal to the iterations written (nothing delivered twice; resends after a
reconnect are deduplicated and counted as duplicates).

The detection times printed here are recorded in docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from perfd.core import limits as L
from tests.faults.proxy import FaultProxy
from tests.inproc import AgentHandle, Pipeline, pipeline
from tests.procs import http_get, wait_for

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"
pytestmark = pytest.mark.slow
JOB = "faults"


def _megatron_lines(n: int) -> tuple[str, list[str]]:
    """The fixture's start-up block, and ``n`` iteration lines made from its second iteration line
    (renumbered; the parser reads each as one step record)."""
    text = FIXTURE.read_text()
    lines = text.splitlines(keepends=True)
    first = next(i for i, ln in enumerate(lines) if re.search(r"\] iteration\s+1/", ln))
    template = next(ln for ln in lines if re.search(r"\] iteration\s+2/", ln))
    its = []
    for i in range(1, n + 1):
        ln = re.sub(r"iteration\s+2/\s+40", f"iteration {i:8d}/{n:8d}", template)
        ln = re.sub(r"consumed samples:\s+\d+", f"consumed samples: {64 * i:12d}", ln)
        its.append(ln)
    return "".join(lines[:first]), its


def _metric(text: str, name: str) -> float | None:
    m = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


@dataclass
class Rig:
    tmp: Path
    proxy: FaultProxy
    base: str  # aggregator HTTP
    agent_metrics: str
    log: Path
    p: Pipeline
    agent: AgentHandle

    def stats(self) -> dict[str, int]:
        return dict(json.loads(http_get(f"{self.base}/api/stats"))["transport"])

    def agent_value(self, name: str) -> float | None:
        return _metric(http_get(self.agent_metrics).decode(), name)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with pipeline(tmp_path, "--no-rules") as p:
        proxy = FaultProxy("127.0.0.1", p.agg.grpc_port).start()
        try:
            log = tmp_path / "train.log"
            head, _ = _megatron_lines(1)
            log.write_text(head)
            # The agent streams through the proxy: the last --aggregator given is the one it takes.
            agent = p.agent("--aggregator", f"127.0.0.1:{proxy.port}", "--job", JOB, "--megatron-log", log,
                            "--nvml", "off", "--host", "off", "--metrics-port", "0",
                            "--spool-dir", tmp_path / "spool")
            r = Rig(tmp_path, proxy, p.base, agent.metrics_url, log, p, agent)
            p.wait(lambda: r.agent_value("perfd_agent_connected") == 1.0, 30, "agent connected")
            yield r
            p.stop_agent()  # as SIGTERM stops it, while the proxy still carries its last words
        finally:
            proxy.close()


class Writer(threading.Thread):
    """Appends iteration lines at a steady pace, the way a training job logs."""

    def __init__(self, log: Path, lines: list[str], interval_s: float) -> None:
        super().__init__(daemon=True)
        self.log, self.lines, self.interval_s = log, lines, interval_s
        self.written = 0

    def run(self) -> None:
        for ln in self.lines:
            with self.log.open("a") as f:
                f.write(ln)
            self.written += 1
            time.sleep(self.interval_s)


def _assert_nothing_lost_nothing_doubled(r: Rig, n: int) -> dict[str, int]:
    def all_there() -> list[int] | None:
        its = json.loads(http_get(f"{r.base}/api/jobs/{JOB}/iterations?sources=0"))["iterations"]
        got = [int(it["iteration"]) for it in its]
        return got if len(got) >= n else None

    got = wait_for(all_there, 90, f"{n} iterations at the aggregator", interval=0.5)
    assert got == list(range(1, n + 1)), "an iteration is missing or repeated"
    stats = json.loads(http_get(f"{r.base}/api/stats"))
    # Each step record delivered once: a batch resent after the fault was deduplicated.
    assert stats["step_records_ingested"] == n
    return dict(stats["transport"])


def _detect(what: str, pred: object, budget_s: float) -> float:
    t0 = time.monotonic()
    wait_for(pred, budget_s, what, interval=0.1)  # type: ignore[arg-type]
    return time.monotonic() - t0


# The black hole's length: longer than the agent's ack timeout and the aggregator's silence limit
# (20 s each), so both must notice it, with a margin; every check below holds for any such length.
# `make test` runs 25 s; docs/reliability.md's figure is the 60 s run the issue asked for:
# PERFD_FAULT_BLACKHOLE_S=60 pytest -s tests/faults/test_network_faults.py
BLACKHOLE_S = float(os.environ.get("PERFD_FAULT_BLACKHOLE_S", 25.0))


@pytest.mark.parametrize("blackhole_s", [BLACKHOLE_S])
def test_blackhole_loses_nothing_and_doubles_nothing(rig: Rig, blackhole_s: float) -> None:
    """A black hole of ``blackhole_s`` (> both timeouts). Both "connected" gauges must drop within
    the liveness budget, though no socket closed, and every iteration must arrive once after the
    network returns."""
    assert blackhole_s > max(L.ACK_TIMEOUT_S, L.AGENT_SILENCE_S), "too short to test detection"
    n = 120
    _, lines = _megatron_lines(n)
    w = Writer(rig.log, lines, (blackhole_s + 10) / n)  # writing before, during and after it
    w.start()
    wait_for(lambda: w.written >= 10, 30, "writer")
    before = rig.stats()
    rig.proxy.set_mode("blackhole")
    t_fault = time.monotonic()
    agent_s = _detect("agent gauge to drop", lambda: rig.agent_value("perfd_agent_connected") == 0.0,
                      L.LIVENESS_BUDGET_S + 5)
    agg_s = time.monotonic() - t_fault + _detect(
        "aggregator gauge to drop", lambda: rig.stats()["agents_connected"] == 0, L.LIVENESS_BUDGET_S + 5)
    remaining = blackhole_s - (time.monotonic() - t_fault)
    if remaining > 0:
        time.sleep(remaining)
    rig.proxy.set_mode("pass")
    w.join(blackhole_s + 60)
    transport = _assert_nothing_lost_nothing_doubled(rig, n)
    print(f"FIGURES blackhole {blackhole_s:.0f} s: agent gauge 0 after {agent_s:.1f} s, aggregator gauge 0 "
          f"after {agg_s:.1f} s; {n} iterations written, {n} at the aggregator, 0 lost, 0 doubled; "
          f"streams opened {transport['streams_opened'] - before['streams_opened']}, "
          f"duplicate batches deduplicated {transport['duplicates'] - before['duplicates']}")
    assert agent_s <= L.LIVENESS_BUDGET_S and agg_s <= L.LIVENESS_BUDGET_S


def test_half_open_link_is_detected_and_nothing_lost(rig: Rig) -> None:
    """The aggregator's side of the connection goes away while the agent's stays open and silent
    (no FIN, no RST reaches it). The agent must notice within the liveness budget (ack timeout /
    keepalive), reconnect, resend what was not acknowledged, and lose or double nothing."""
    n = 60
    _, lines = _megatron_lines(n)
    w = Writer(rig.log, lines, 0.5)
    w.start()
    wait_for(lambda: w.written >= 10, 30, "writer")
    opened = rig.stats()["streams_opened"]
    rig.proxy.set_mode("half_open")
    t_fault = time.monotonic()
    gauge_s = _detect("agent gauge to drop", lambda: rig.agent_value("perfd_agent_connected") == 0.0,
                      L.LIVENESS_BUDGET_S + 10)
    reconnect_s = time.monotonic() - t_fault + _detect(
        "agent to reconnect", lambda: rig.stats()["streams_opened"] > opened, L.LIVENESS_BUDGET_S + 10)
    w.join(60)
    _assert_nothing_lost_nothing_doubled(rig, n)
    timeouts = rig.agent_value("perfd_agent_ack_timeouts_total")
    print(f"FIGURES half-open: agent gauge 0 after {gauge_s:.1f} s, new stream at the aggregator after "
          f"{reconnect_s:.1f} s (ack timeouts counted: {timeouts}); {n} iterations, 0 lost, 0 doubled")
    assert gauge_s <= L.LIVENESS_BUDGET_S
