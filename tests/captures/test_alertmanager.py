"""A real Alertmanager delivers an alert to the aggregator's webhook; a capture command results and
reaches the agent that runs the job (real gRPC stream on loopback)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.transport.client import AgentClient
from perfd.transport.codec import Command
from tests.procs import free_port

AM = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
pytestmark = pytest.mark.skipif(AM is None, reason="alertmanager not installed "
                                "(Debian prometheus-alertmanager; ci/install-system-deps.sh installs it)")


def test_alertmanager_alert_becomes_a_capture_command(tmp_path: Path) -> None:
    async def body() -> tuple[list[Command], list[dict[str, Any]]]:
        agg = Aggregator(AggregatorConfig(grpc_host="127.0.0.1", grpc_port=0, http_host="127.0.0.1",
                                          http_port=0, rules_files=[]))
        await agg.start()
        assert agg.http is not None
        got: list[Command] = []
        client = AgentClient(f"127.0.0.1:{agg.grpc_port}", "node-1", node="node-1", jobs=["llama"],
                             on_command=got.append)
        task = asyncio.create_task(client.run())
        am_port = free_port()
        cfg = tmp_path / "am.yml"
        cfg.write_text(json.dumps({  # JSON is YAML
            "route": {"receiver": "perfd", "group_wait": "0s", "group_interval": "1s",
                      "repeat_interval": "1h", "group_by": ["alertname"]},
            "receivers": [{"name": "perfd", "webhook_configs": [
                {"url": f"http://127.0.0.1:{agg.http.port}/api/alertmanager", "send_resolved": False}]}]}))
        am = subprocess.Popen([str(AM), f"--config.file={cfg}", f"--storage.path={tmp_path / 'data'}",
                               f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
                              stdout=(tmp_path / "am.out").open("w"), stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:  # wait for Alertmanager and the agent's stream
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{am_port}/-/ready", timeout=1)
                    if agg.server.connected_agents():
                        break
                except OSError:
                    pass
                await asyncio.sleep(0.2)
            alert = [{"labels": {"alertname": "PerfdMfuLow", "job_name": "llama", "perfd_tool": "kineto",
                                 "perfd_ranks": "0", "perfd_steps": "3", "perfd_capture": "true"},
                      "startsAt": datetime.now(timezone.utc).isoformat()}]
            req = urllib.request.Request(f"http://127.0.0.1:{am_port}/api/v2/alerts",
                                         data=json.dumps(alert).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=5)
            deadline = time.monotonic() + 20
            while not got and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            with urllib.request.urlopen(f"http://127.0.0.1:{agg.http.port}/api/captures") as r:
                captures = json.loads(r.read())["captures"]
            return got, captures
        finally:
            am.terminate()
            am.wait(timeout=10)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            client.close()
            await agg.stop()

    got, captures = asyncio.run(body())
    assert len(got) == 1, (tmp_path / "am.out").read_text()[-2000:]
    cmd = got[0]
    assert cmd.kind == "capture" and cmd.job == "llama" and cmd.ranks == (0,)
    assert cmd.args["tool"] == "kineto" and cmd.args["steps"] == "3"
    assert captures[0]["origin"] == "alertmanager:PerfdMfuLow" and captures[0]["agents"] == ["node-1"]
