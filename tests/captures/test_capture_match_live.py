"""Live, the check that a capture is of the job, on the captures the aggregator attaches: a real aggregator
(gRPC and HTTP on loopback) holds the PP=2 Megatron-LM job's records (perfd/app/demo/data, 2×H200) sent by a
real gRPC agent client; a capture is asked for through the HTTP API and its agent answers with the
breakdown perfd.capture computes of a trace of another job (the one-GPU H100 run of tests/data/captures).
The capture record says it is not of the job, with its numbers, and the job's budget and class never read
it; the same exchange with the job's own trace (tests/captures/test_capture_budget_live.py) does inform the
job."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.capture.bookkeeping import device_summary
from perfd.collectors.megatron import parse_file
from perfd.core import events
from perfd.core.jobinfo_json import job_info_to_json
from perfd.transport.client import AgentClient
from perfd.transport.codec import Command
from tests.captures.test_capture_budget_live import _get, _post, _until
from tests.trace_cache import analyze_chrome_trace

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"
OTHER = ROOT / "tests" / "data" / "captures" / "kineto_h100_megatron" / "big2048_rank0.json.gz"
JOB = "pp2"


def test_a_capture_of_another_job_is_never_attached_and_says_why() -> None:
    parsed = parse_file(LOG, job=JOB)
    payload = {"status": "ok", "ranks": {"0": {"devices": device_summary(analyze_chrome_trace(OTHER))}}}

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        agg = Aggregator(AggregatorConfig(grpc_port=0, http_port=0, rules_files=[], rules_interval_s=0.5,
                                          gpu="NVIDIA H200"))
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
            await _until(lambda: _get(f"{base}/api/jobs/{JOB}/summary")["summary"])
            got = await asyncio.to_thread(_post, f"{base}/api/captures",
                                          {"job": JOB, "ranks": [0], "tool": "kineto", "steps": 3})
            cmd = await _until(lambda: commands[0] if commands else None)
            assert cmd.id == got["id"]
            links = {"command_id": cmd.id}
            client.submit(events=[{"kind": events.CAPTURE_STARTED.name, "links": links, "text": "started"},
                                  {"kind": events.CAPTURE_FINISHED.name, "links": links, "text": "done",
                                   "payload": payload}])
            assert await client.flush(30)
            rec = await _until(lambda: next((c for c in agg.captures.list() if c["status"] == "finished"),
                                            None))
            t0 = agg.ticks
            await _until(lambda: agg.ticks >= t0 + 2)
            return rec, _get(f"{base}/api/jobs/{JOB}/summary")
        finally:
            task.cancel()
            await agg.stop()

    rec, after = asyncio.run(main())
    match = rec["match"]
    assert match["refused"] is True
    ev = {e["check"]: e for e in match["evidence"]}
    assert (ev["tokens"]["capture"], ev["tokens"]["job"]) == (8192, 4096)
    assert ev["pipeline"]["matches"] is False and ev["collectives"]["matches"] is False
    said = next(f for f in rec["findings"] if f["id"] == "capture-mismatch")
    assert "not of this job" in said["title"] and "not used" in said["title"]
    s = after["summary"]
    assert s["step_budget"]["basis"] == "steady-state timers"  # the job's budget never read it
    assert s["bottleneck_evidence"]["winner"] != "capture"
