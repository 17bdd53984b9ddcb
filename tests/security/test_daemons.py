"""The daemons themselves: loopback by default, a port in use refuses to start (non-zero exit, a
clear message), and the agent's spool-bytes metric reads the spool.

Each command runs in the test's process: a refusal through the CLI's main() (its return value the exit
status; what reaches the process's stderr, gRPC's C core included, capfd's, and its log lines of WARNING
and above, which the command's log handler writes there), the aggregator that warns at start on
``pipeline()`` (tests/inproc.py)."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import threading
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from perfd.agent.config import AgentConfig
from perfd.agent.node_agent import Agent
from perfd.app.cli import main
from perfd.collectors.collector import Capabilities, Collected, Collector, Registry
from perfd.core.model import Sample
from tests.inproc import pipeline
from tests.procs import free_port, wait_for


@dataclass
class _Ran:
    returncode: int
    stderr: str


@pytest.fixture
def perfd(capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> Callable[..., _Ran]:
    """``perfd ARGS`` by the CLI's main(): its exit status, and what the process would have written to
    stderr. Every thread it started is gone when it returns (a refusal leaves nothing running)."""

    def run(*args: str) -> _Ran:
        capfd.readouterr()
        caplog.clear()
        threads = set(threading.enumerate())
        with caplog.at_level(logging.WARNING, logger="perfd"):
            rc = main(list(args))
        # Not gRPC's poller: one thread for the process, started by its first grpc.aio server or channel.
        left = [t.name for t in threading.enumerate() if t not in threads and t.is_alive()
                and "_poll_wrapper" not in t.name]
        assert not left, f"perfd {' '.join(args)} left threads running: {left}"
        logged = "".join(f"{caplog.handler.format(r)}\n" for r in caplog.records
                         if r.levelno >= logging.WARNING)
        return _Ran(rc, capfd.readouterr().err + logged)

    return run


@pytest.mark.timeout(120)  # a daemon that took the port would run on, in process
def test_a_port_in_use_refuses_to_start(tmp_path: Path, perfd: Callable[..., _Ran]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # Each message names the address and the flag that moves it (before, the agent said only
        # "[Errno 98] Address already in use" when dcgm-exporter held its port).
        r = perfd("aggregator", "--grpc-port", str(port), "--http-port", str(free_port()), "--no-rules")
        assert r.returncode == 2, r.stderr
        assert f"cannot listen for gRPC on 127.0.0.1:{port}: the port is already in use" in r.stderr
        assert "another port with --grpc-port" in r.stderr
        # perfd's line alone (before, gRPC's C core printed "E1124 ... add_port.cc:83] Failed to add
        # port to server ..." before it, and its advice to set GRPC_VERBOSITY after it).
        assert r.stderr.splitlines() == [next(ln for ln in r.stderr.splitlines() if "gRPC" in ln)], r.stderr
        assert r.stderr.startswith("perfd aggregator: ") and "GRPC_VERBOSITY" not in r.stderr, r.stderr
        r = perfd("aggregator", "--grpc-port", str(free_port()), "--http-port", str(port), "--no-rules")
        assert r.returncode == 2, r.stderr
        assert f"cannot listen for HTTP on 127.0.0.1:{port}: the port is already in use" in r.stderr
        assert "another port with --http-port" in r.stderr
        r = perfd("agent", "--metrics-port", str(port), "--nvml", "off", "--host", "off")
        assert r.returncode == 2, r.stderr
        assert f"cannot listen for /metrics on 127.0.0.1:{port}: the port is already in use" in r.stderr
        assert "another port with --metrics-port N (metrics_port: in the config file)" in r.stderr
        assert "Traceback" not in r.stderr
        # The same when the port comes from the config file.
        cfg = tmp_path / "agent.yaml"
        cfg.write_text(f"metrics_port: {port}\n")
        r = perfd("agent", "--config", str(cfg), "--nvml", "off", "--host", "off")
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


def test_listen_all_without_a_token_warns_at_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """`perfd aggregator --listen-all` with no token started without a word on what it opened: it
    warns on stderr that both ports are open to whoever reaches the host, unauthenticated; with a
    token, no warning."""
    token = tmp_path / "token"
    token.write_text("s3cret-token-of-32-characters-at-least\n")
    token.chmod(0o600)
    for extra, warned in (((), True), (("--auth-token-file", str(token)), False)):
        caplog.clear()
        # The command's own hosts under --listen-all: an empty --grpc-host/--http-host is what none gives
        # (the harness's loopback ones set aside).
        args = ("--listen-all", "--grpc-host", "", "--http-host", "", "--no-rules", *extra)
        with caplog.at_level(logging.WARNING, logger="perfd"), pipeline(tmp_path, *args):
            pass
        said = "".join(f"{caplog.handler.format(r)}\n" for r in caplog.records)
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


SPOOL_BYTES = r'^perfd_agent_spool_bytes\{node="[^"]*"\} ([0-9.e+]+)$'


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

        def spooled() -> tuple[str, int] | None:  # batches in the spool, and the metric saying so
            if agent.metrics_port is None or agent.client is None:
                return None
            with urllib.request.urlopen(f"http://127.0.0.1:{agent.metrics_port}/metrics") as r:
                text: str = r.read().decode()
            held = agent.client.counters()["spool_bytes"]
            m = re.search(SPOOL_BYTES, text, re.M)
            return (text, held) if m is not None and float(m.group(1)) > 0 and held > 0 else None

        text, held = await asyncio.to_thread(wait_for, spooled, 60, "batches in the spool, on the metric")
        stop.set()
        await task
        return text, held

    text, held = asyncio.run(body())
    m = re.search(SPOOL_BYTES, text, re.M)
    assert m is not None and float(m.group(1)) > 0
    assert held > 0
    assert re.search(r"^perfd_agent_connected\{.*\} 0\.0$", text, re.M)  # never acknowledged
