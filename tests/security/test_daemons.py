"""The daemons themselves: loopback by default, a port in use refuses to start (non-zero exit, a
clear message), and the agent's spool-bytes metric reads the spool."""

from __future__ import annotations

import asyncio
import functools
import os
import re
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from perfd.agent.config import AgentConfig
from perfd.agent.node_agent import Agent
from perfd.collector import Capabilities, Collected, Collector, Registry
from perfd.model import Sample
from tests.procs import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]


def _perfd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "perfd.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.mark.e2e
@pytest.mark.slow
def test_a_port_in_use_refuses_to_start(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # Each message names the address and the flag that moves it (issue 37: the agent said only
        # "[Errno 98] Address already in use" when dcgm-exporter held its port).
        r = _perfd("aggregator", "--grpc-port", str(port), "--http-port", str(free_port()), "--no-rules")
        assert r.returncode == 2, r.stderr
        assert f"cannot listen for gRPC on 127.0.0.1:{port}: the port is already in use" in r.stderr
        assert "another port with --grpc-port" in r.stderr
        # perfd's line alone (issue 46: gRPC's C core printed "E1124 ... add_port.cc:83] Failed to add
        # port to server ..." before it, and its advice to set GRPC_VERBOSITY after it).
        assert r.stderr.splitlines() == [next(ln for ln in r.stderr.splitlines() if "gRPC" in ln)], r.stderr
        assert r.stderr.startswith("perfd aggregator: ") and "GRPC_VERBOSITY" not in r.stderr, r.stderr
        r = _perfd("aggregator", "--grpc-port", str(free_port()), "--http-port", str(port), "--no-rules")
        assert r.returncode == 2, r.stderr
        assert f"cannot listen for HTTP on 127.0.0.1:{port}: the port is already in use" in r.stderr
        assert "another port with --http-port" in r.stderr
        r = _perfd("agent", "--metrics-port", str(port), "--nvml", "off", "--host", "off")
        assert r.returncode == 2, r.stderr
        assert f"cannot listen for /metrics on 127.0.0.1:{port}: the port is already in use" in r.stderr
        assert "another port with --metrics-port N (metrics_port: in the config file)" in r.stderr
        assert "Traceback" not in r.stderr
        # The same when the port comes from the config file.
        cfg = tmp_path / "agent.yaml"
        cfg.write_text(f"metrics_port: {port}\n")
        r = _perfd("agent", "--config", str(cfg), "--nvml", "off", "--host", "off")
        assert r.returncode == 2 and f"127.0.0.1:{port}: the port is already in use" in r.stderr, r.stderr


def test_defaults_listen_on_loopback_only() -> None:
    from perfd.aggregator.daemon import AggregatorConfig

    assert AggregatorConfig().grpc_host == "127.0.0.1" and AggregatorConfig().http_host == "127.0.0.1"
    assert AgentConfig().metrics_host == "127.0.0.1"


def test_what_listens_beyond_loopback_unauthenticated() -> None:
    from perfd.aggregator.exposure import Endpoint, unauthenticated

    assert unauthenticated("127.0.0.1", "::1", token=False, client_ca=False) == ()
    assert unauthenticated("0.0.0.0", "0.0.0.0", token=False, client_ca=False) == (Endpoint.GRPC,
                                                                                     Endpoint.HTTP_API)
    assert unauthenticated("0.0.0.0", "0.0.0.0", token=True, client_ca=False) == ()
    # mutual TLS authenticates the agents, not the HTTP API's readers
    assert unauthenticated("10.0.0.5", "gpu-head", token=False, client_ca=True) == (Endpoint.HTTP_API,)
    assert unauthenticated("localhost", "0.0.0.0", token=False, client_ca=False) == (Endpoint.HTTP_API,)


@pytest.mark.e2e
@pytest.mark.slow
def _ready_or_gone(ready: Path, p: subprocess.Popen[bytes]) -> bool:
    return bool(ready.exists() and ready.read_text().strip()) or p.poll() is not None


def test_listen_all_without_a_token_warns_at_start(tmp_path: Path) -> None:
    """`perfd aggregator --listen-all` with no token started without a word on what it opened: it
    warns on stderr that both ports are open to whoever reaches the host, unauthenticated; with a
    token, no warning."""
    token = tmp_path / "token"
    token.write_text("s3cret-token-of-32-characters-at-least\n")
    token.chmod(0o600)
    for extra, warned in (((), True), (("--auth-token-file", str(token)), False)):
        ready = tmp_path / "agg.ready"
        ready.unlink(missing_ok=True)
        err = tmp_path / "agg.err"
        with err.open("wb") as f:
            argv = [sys.executable, "-m", "perfd.cli", "aggregator", "--listen-all", "--grpc-port", "0",
                    "--http-port", "0", "--no-rules", "--ready-file", str(ready), *extra]
            p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=f,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"})
            try:
                wait_for(functools.partial(_ready_or_gone, ready, p), 30.0,
                         "the aggregator's ready file or its exit", interval=0.1)
                assert p.poll() is None, err.read_text()
            finally:
                p.terminate()
                p.wait(timeout=30)
        said = err.read_text()
        warning = ("WARNING" in said and "listening beyond this host with no authentication" in said
                   and "the HTTP API on 0.0.0.0:" in said and "the gRPC ingest on 0.0.0.0:" in said)
        assert warning == warned, said


class _Ticker(Collector):
    name = "ticker"
    default_interval_s = 0.05

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()

    def probe(self) -> Capabilities:
        return Capabilities(True)

    def collect(self, now: float) -> Collected:
        return Collected(samples=[Sample("perfd_host_load1", 1.0, now)])


@pytest.mark.slow
def test_spool_bytes_metric_reads_the_spool(tmp_path: Path) -> None:
    reg = Registry()
    reg.register("ticker", _Ticker)
    dead = free_port()  # nobody listens: every batch stays in the spool
    cfg = AgentConfig(job="j", metrics_port=0, aggregator=f"127.0.0.1:{dead}",
                      spool_dir=str(tmp_path / "spool"),
                      batch_interval_s=0.1, captures=False, collectors={"ticker": {}}).finish()
    agent = Agent(cfg, reg)

    async def body() -> tuple[str, int]:
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        await asyncio.sleep(1.5)
        with urllib.request.urlopen(f"http://127.0.0.1:{agent.metrics_port}/metrics") as r:
            text: str = r.read().decode()
        held = agent.client.counters()["spool_bytes"]
        stop.set()
        await task
        return text, held

    text, held = asyncio.run(body())
    m = re.search(r'^perfd_agent_spool_bytes\{node="[^"]*"\} ([0-9.e+]+)$', text, re.M)
    assert m is not None and float(m.group(1)) > 0
    assert held > 0
    assert re.search(r"^perfd_agent_connected\{.*\} 0\.0$", text, re.M)  # never acknowledged
