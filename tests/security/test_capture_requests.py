"""Capture requests with hostile ranks, against a real aggregator's HTTP API and gRPC on loopback, a real
agent stream (the transport's own AgentClient) hosting the job.

The issue's probe: ``POST /api/captures`` with ranks [0, 2147483648] was answered 202, its command
raised in the sender, the record stayed ``requested`` and rank 0 was held for 600 s (a real capture
then got 409); an Alertmanager alert labelled ``perfd_ranks="0,2147483648"`` did the same; 500,000
ranks in one request made a 7.5 MB record.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.core import limits as L
from perfd.transport.client import AgentClient
from perfd.transport.codec import Command

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
JOB = "llama"


def _post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return int(r.status), json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), json.loads(exc.read())


def _alert(ranks: str) -> dict[str, Any]:
    return {"version": "4", "status": "firing", "alerts": [{"status": "firing", "labels": {
        "alertname": "Probe", "job_name": JOB, "perfd_capture": "true", "perfd_ranks": ranks}}]}


def test_hostile_ranks_are_refused_at_the_api_and_the_webhook_and_hold_no_rank() -> None:
    async def body() -> dict[str, Any]:
        agg = Aggregator(AggregatorConfig(grpc_host="127.0.0.1", grpc_port=0, http_host="127.0.0.1",
                                          http_port=0, rules_files=[]))
        await agg.start()
        assert agg.http is not None
        base = f"http://127.0.0.1:{agg.http.port}"
        got: list[Command] = []
        arrived = asyncio.Event()

        def on_command(cmd: Command) -> None:
            got.append(cmd)
            arrived.set()

        client = AgentClient(f"127.0.0.1:{agg.grpc_port}", "node-1", node="node-1", jobs=[JOB],
                             on_command=on_command)
        task = asyncio.create_task(client.run())
        out: dict[str, Any] = {}
        try:
            while not agg.server.connected_agents():  # the stream's Hello (the test's timeout bounds it)
                await asyncio.sleep(0.05)
            out["int32"] = await asyncio.to_thread(_post, f"{base}/api/captures",
                                                   {"job": JOB, "ranks": [0, 2147483648], "steps": 3})
            out["minus"] = await asyncio.to_thread(_post, f"{base}/api/captures", {"job": JOB, "ranks": [-1]})
            out["many"] = await asyncio.to_thread(_post, f"{base}/api/captures",
                                                  {"job": JOB, "ranks": list(range(100_000))})  # ~0.6 MB
            out["webhook"] = await asyncio.to_thread(_post, f"{base}/api/alertmanager",
                                                     _alert("0,2147483648"))
            out["refused"] = agg.refusals.get(L.REFUSED_CAPTURE_RANKS)
            out["records"] = [r["ranks"] for r in agg.captures.list()]
            # rank 0 is free: a real capture of it is taken and its command reaches the agent
            out["real"] = await asyncio.to_thread(_post, f"{base}/api/captures", {"job": JOB, "ranks": [0]})
            await asyncio.wait_for(arrived.wait(), 30)
            out["got"] = list(got)
            # A command that cannot be encoded raises to its sender, from any thread (it was taken as
            # sent and raised on the event loop, where no one heard it).
            try:
                await asyncio.to_thread(agg.server.send_command, "node-1",
                                        Command(kind="capture", job=JOB, ranks=(2147483648,)))
                out["unencodable"] = "sent"
            except ValueError:
                out["unencodable"] = "raised"
        finally:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            client.close()
            await agg.stop()
        return out

    out = asyncio.run(body())
    code, answer = out["int32"]
    assert code == 400 and "rank 2147483648 is out of range" in answer["error"], out["int32"]
    code, answer = out["minus"]
    assert code == 400 and "rank -1 is out of range" in answer["error"], out["minus"]
    code, answer = out["many"]
    assert code == 400 and f"at most {L.MAX_CAPTURE_RANKS} distinct ranks" in answer["error"]
    code, answer = out["webhook"]
    assert code == 200 and answer["captures"] == [], answer
    assert "rank 2147483648 is out of range" in answer["refused"][0]["error"]
    assert out["refused"] == 4 and out["records"] == []  # each counted, none kept
    code, answer = out["real"]
    assert code == 202 and answer["status"] == "requested", out["real"]
    assert [(c.kind, c.ranks) for c in out["got"]] == [("capture", (0,))]
    assert out["unencodable"] == "raised"
