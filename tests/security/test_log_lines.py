"""What a client sends never writes a log line of its own (issue 54 item 8).

The issue's finding: an agent id holding a newline wrote a forged line into the aggregator's log. Here a
real ``perfd aggregator`` process and a real gRPC client whose agent id carries a newline, a carriage
return, an ANSI escape and a right-to-left override, and a line the aggregator's own would look like:
the client's step records for a job another agent hosts are refused, and the refusal names the agent.
Every line of the log is then one of the aggregator's own, the agent id in it escaped (perfd.logline).
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest

from perfd.logline import escaped
from perfd.model import StepRecord
from tests.faults.streams import send_batches
from tests.procs import Procs, get_json, run_env, start_aggregator, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
FORGED = "2099-01-01 00:00:00,000 ERROR perfd.aggregator.daemon: FORGED"
EVIL = f"x\r\n{FORGED}\x1b[2K\u202e"


def test_an_agent_id_with_a_newline_writes_no_line_of_its_own(tmp_path: Path) -> None:
    with Procs(tmp_path, run_env()) as procs:
        grpc_port, _http, base = start_aggregator(procs, "--no-rules")
        target = f"127.0.0.1:{grpc_port}"
        t = time.time()
        for agent, it, jobs in (("host", 1, ["j"]), (EVIL, 2, [])):
            steps = [StepRecord(job="j", iteration=it, end_time=t)]
            asyncio.run(send_batches(target, agent, [{"steps": steps}], jobs))
        wait_for(lambda: get_json(f"{base}/api/stats")["transport"].get("refused_not_host"), 20,
                 "the refusal")
        procs.end("aggregator")
        out = (tmp_path / "aggregator.out").read_text()
    lines = out.splitlines()
    assert not any(line.startswith("2099") or "\x1b" in line or "\u202e" in line or "\r" in line
                   for line in lines), out
    refusal = next(line for line in lines if "refused (not_host)" in line)
    assert escaped(EVIL)[:40] in refusal and re.match(r"\d{4}-\d\d-\d\d ", refusal)
    assert escaped(EVIL).startswith("x\\r\\n2099") and escaped(EVIL).endswith("\\x1b[2K\\u202e")
