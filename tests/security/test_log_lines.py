"""What a client sends never writes a log line of its own.

What was seen: an agent id holding a newline wrote a forged line into the aggregator's log. Here the
real aggregator (in the test's process, tests/inproc.py, its log written as every perfd command writes
it: perfd.app.cli.log_handler) and a real gRPC client whose agent id carries a newline, a carriage
return, an ANSI escape and a right-to-left override, and a line the aggregator's own would look like:
the client's step records for a job another agent hosts are refused, and the refusal names the agent.
Every line of the log is then one of the aggregator's own, the agent id in it escaped (perfd.core.logline).
"""

from __future__ import annotations

import io
import logging
import re
import time
from pathlib import Path

import pytest

from perfd.app.cli import log_handler
from perfd.core.logline import escaped
from perfd.core.model import StepRecord
from tests.inproc import pipeline
from tests.procs import get_json

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
FORGED = "2099-01-01 00:00:00,000 ERROR perfd.aggregator.daemon: FORGED"
EVIL = f"x\r\n{FORGED}\x1b[2K\u202e"


def test_an_agent_id_with_a_newline_writes_no_line_of_its_own(tmp_path: Path) -> None:
    log = io.StringIO()
    handler = log_handler(log)
    handler.setLevel(logging.WARNING)  # `perfd aggregator`'s level, without -v
    logging.getLogger().addHandler(handler)
    try:
        with pipeline(tmp_path, "--no-rules") as p:
            base = p.base
            t = time.time()
            for agent, it, jobs in (("host", 1, ["j"]), (EVIL, 2, [])):
                steps = [StepRecord(job="j", iteration=it, end_time=t)]
                p.send(agent, [{"steps": steps}], jobs)
            p.wait(lambda: get_json(f"{base}/api/stats")["transport"].get("refused_not_host"), 20,
                   "the refusal")
    finally:
        logging.getLogger().removeHandler(handler)
    out = log.getvalue()
    lines = out.splitlines()
    assert not any(line.startswith("2099") or "\x1b" in line or "\u202e" in line or "\r" in line
                   for line in lines), out
    refusal = next(line for line in lines if "refused (not_host)" in line)
    assert escaped(EVIL)[:40] in refusal and re.match(r"\d{4}-\d\d-\d\d ", refusal)
    assert escaped(EVIL).startswith("x\\r\\n2099") and escaped(EVIL).endswith("\\x1b[2K\\u202e")
