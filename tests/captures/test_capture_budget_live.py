"""A steady capture informs the job within one rules tick: class, findings, report
and API. A real aggregator (gRPC and HTTP on loopback) holds the recorded H100 Megatron job's step
records (tests/data/captures/kineto_h100_megatron/big2048_megatron.log) sent by a real gRPC agent
client; a capture is asked for through the HTTP API; the agent answers the command the way perfd's
agent does, with the breakdown perfd.capture computes of the recorded trace of that job. Before: the
capture record had no findings and no class, and the job kept GPM's class "with no capture to say more".
The same trace read offline (`perfd analyze megatron --capture`) gives the same class and R1."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.analytics.run.run_analysis import analyze_run
from perfd.capture.bookkeeping import device_summary
from perfd.collectors.megatron import parse_file
from perfd.core import events
from perfd.core.jobinfo_json import job_info_to_json
from perfd.report.remedy_text import worded_plan, worded_remedy
from perfd.transport.client import AgentClient
from perfd.transport.codec import Command
from tests.trace_cache import analyze_chrome_trace, timeline_class

pytestmark = pytest.mark.slow
DATA = Path(__file__).resolve().parents[1] / "data" / "captures" / "kineto_h100_megatron"
TRACE, LOG = DATA / "big2048_rank0.json.gz", DATA / "big2048_megatron.log"
JOB, H100 = "big2048", "NVIDIA H100 80GB HBM3"


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


async def _until(pred: Any, timeout: float = 30.0) -> Any:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        got = pred()
        if got:
            return got
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {timeout} s")


def test_a_finished_capture_informs_the_job_within_one_rules_tick() -> None:
    parsed = parse_file(LOG, job=JOB)
    payload = {"status": "ok", "ranks": {"0": {"devices": device_summary(analyze_chrome_trace(TRACE))}}}

    async def main() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        agg = Aggregator(AggregatorConfig(grpc_port=0, http_port=0, rules_files=[], rules_interval_s=0.5,
                                          gpu=H100))
        await agg.start()
        assert agg.http is not None
        base = f"http://127.0.0.1:{agg.http.port}"
        client = AgentClient(f"127.0.0.1:{agg.grpc_port}", "node-0", jobs=[JOB])
        commands: list[Command] = []
        client.on_command = commands.append
        task = asyncio.create_task(client.run())
        try:
            client.submit(steps=parsed.records, job_info_json={JOB: job_info_to_json(parsed.job_info)})
            assert await client.flush(30)
            before = await _until(lambda: _get(f"{base}/api/jobs/{JOB}/summary")["summary"])
            got = await asyncio.to_thread(_post, f"{base}/api/captures",
                                          {"job": JOB, "ranks": [0], "tool": "kineto", "steps": 3})
            cmd = await _until(lambda: commands[0] if commands else None)
            assert cmd.id == got["id"] and got["status"] == "requested"
            links = {"command_id": cmd.id}
            client.submit(events=[{"kind": events.CAPTURE_STARTED.name, "links": links, "text": "started"},
                                  {"kind": events.CAPTURE_FINISHED.name, "links": links, "text": "done",
                                   "payload": payload}])
            assert await client.flush(30)
            rec = await _until(lambda: next((c for c in agg.captures.list() if c["status"] == "finished"),
                                            None))
            t0 = agg.ticks
            # One whole rules tick after the capture's result arrived (the tick under way may have
            # analysed before it): class, findings and report come from it.
            await _until(lambda: agg.ticks >= t0 + 2)
            after = _get(f"{base}/api/jobs/{JOB}/summary")
            return before, rec, after
        finally:
            task.cancel()
            await agg.stop()

    before, rec, after = asyncio.run(main())
    assert before["bottleneck"] != "memory-bound" and before["step_budget"]["basis"] == "steady-state timers"
    # The capture record: the class with its shares, the budget, findings and remedies.
    assert rec["bottleneck"] == "memory-bound" and rec["decided"] == {"rank": "0", "device": 0}
    assert {f["id"] for f in rec["findings"]} >= {"budget-attention-0", "budget-memcpy-0", "budget-gemm-0"}
    assert rec["budget"]["iterations"] == 3
    # The job, one tick later: the capture decides its class, and its budget, findings and R1 show.
    s = after["summary"]
    assert s["bottleneck"] == "memory-bound" and s["bottleneck_evidence"]["winner"] == "capture"
    assert s["step_budget"]["basis"].startswith(f"capture {rec['id']}")
    report = after["report"]
    assert report["step_budget"]["parts"] == s["step_budget"]["parts"]
    r1 = report["recommendations"][0]
    assert r1["finding_id"] == "budget-attention" and "--transformer-impl transformer_engine" in r1["action"]
    plan = report["plan"]  # the remedies as a plan, live: options first, then the TE install
    assert plan["stages"][0]["effort"] == "flag" and plan["stages"][1]["install"] == ["transformer_engine"]
    # Offline, the same log and trace: the same class and the same first recommendation.
    off = analyze_run(parsed.job_info, parsed.records, gpu_name=H100, job_name=JOB,
                      timeline=timeline_class(str(TRACE), 3))
    assert off.summary.bottleneck.cls.value == s["bottleneck"]
    assert worded_remedy(off.recommendations[0]).action == r1["action"]  # as the report words it
    # the same plan offline (the capture record keeps 4 decimal places)
    shown = worded_plan(off.plan)
    assert shown is not None and _rounded(shown.to_json()) == _rounded(plan)


def _rounded(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, 1)
    if isinstance(v, dict):
        return {k: _rounded(x) for k, x in v.items()}
    return [_rounded(x) for x in v] if isinstance(v, list) else v
