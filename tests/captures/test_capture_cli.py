"""`perfd capture` against a real aggregator HTTP endpoint."""

from __future__ import annotations

import argparse
import json

import pytest

from perfd.aggregator.captures import CaptureCoordinator
from perfd.aggregator.http import HttpServer
from perfd.aggregator.state import AggregatorState
from perfd.app.commands.capture import run_capture
from perfd.collectors.megatron import parse_file
from perfd.transport.codec import Command
from tests.captures.test_coordinator import LOG


def test_capture_cli_round_trip(capsys: pytest.CaptureFixture[str]) -> None:
    st = AggregatorState()
    st.hello("agent-1", ["j"])
    st.ingest_job_info("agent-1", "j", parse_file(LOG, job="j").job_info)
    sent: list[tuple[str, Command]] = []

    def send(agent: str, cmd: Command) -> bool:
        sent.append((agent, cmd))
        return True

    co = CaptureCoordinator(st, None, send)
    http = HttpServer(st, "127.0.0.1", 0, co)
    http.start()
    try:
        base = f"http://127.0.0.1:{http.port}"
        args = argparse.Namespace(aggregator=base, job="j", ranks="0,1", steps=2, tool="nsys", wait=0.0)
        assert run_capture(args) == 0
        rec = json.loads(capsys.readouterr().out)
        assert rec["status"] == "requested" and rec["ranks"] == [0, 1] and rec["tool"] == "nsys"
        assert sent[0][1].ranks == (0, 1) and sent[0][1].args["steps"] == "2"
        assert run_capture(args) == 1  # the same processes again while the first runs: refused
        assert json.loads(capsys.readouterr().out)["status"] == "refused"
        bad = argparse.Namespace(aggregator=base, job="j", ranks="x", steps=2, tool="nsys", wait=0.0)
        assert run_capture(bad) == 2
    finally:
        http.stop()
