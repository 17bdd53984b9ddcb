"""HTTP under attack, against real daemons on loopback (docs/reliability.md "HTTP under attack"), run in
the test's process (tests/inproc.py): the attackers' sockets and the daemons' both count in its
descriptors, and its threads are the daemons' plus the test's own.

Before perfd.exporters.httpd each connection held a thread: 64 clients trickling their headers held
every slot of the aggregator and /metrics answered 503 for as long as they lasted; its listen
backlog of 5 made 2,000 connects take minutes; the agent's /metrics (prometheus_client's server)
started a thread per idle connection (2,000 connections: 1,503 threads). Every loop here is
bounded, and the assertions count answers, not seconds.
"""

from __future__ import annotations

import logging
import re
import resource
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfd.core import limits as L
from tests.inproc import Pipeline, pipeline
from tests.procs import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SLOW_CLIENTS = 64
IDLE = 2000
THREAD_SLACK = 4


@pytest.fixture(autouse=True)
def _enough_descriptors() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2 * IDLE + 200:  # both ends of each connection are this process's
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4 * IDLE), hard))


def _tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the daemon's log would have shown as a traceback: perfd's records with one."""
    return [r.getMessage() for r in caplog.records if r.exc_info is not None and r.name.startswith("perfd")]


class _Backlogs:
    """The backlog each listening socket made meanwhile was given, by its port: what ``ss -ltn`` shows
    as a listening socket's Send-Q, the kernel's net.core.somaxconn bounding it."""

    def __init__(self) -> None:
        self.of: dict[int, int] = {}
        cap = Path("/proc/sys/net/core/somaxconn")
        self.somaxconn = int(cap.read_text()) if cap.exists() else None

    def socket_class(self) -> type[socket.socket]:
        backlogs = self

        class Recording(socket.socket):
            def listen(self, backlog: int = 128, /) -> None:
                super().listen(backlog)
                cap = backlogs.somaxconn
                backlogs.of[self.getsockname()[1]] = backlog if cap is None else min(backlog, cap)

        return Recording


@pytest.fixture
def aggregator(tmp_path: Path, caplog: pytest.LogCaptureFixture,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Pipeline, int, _Backlogs]]:
    caplog.set_level(logging.INFO, logger="perfd")  # the aggregator's log, as `perfd -v` writes it
    backlogs = _Backlogs()
    with monkeypatch.context() as m:  # only while the aggregator binds
        m.setattr(socket, "socket", backlogs.socket_class())
        agg = pipeline(tmp_path, "--no-rules")
        p = agg.__enter__()
    try:
        assert p.agg.http is not None
        yield p, p.agg.http.port, backlogs
    finally:
        agg.__exit__(None, None, None)
    assert not _tracebacks(caplog), _tracebacks(caplog)[:5]


def _get(url: str, timeout: float = 10.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            r.read()
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def _threads() -> int:
    """This process's threads, as the kernel counts them (the daemons' and the test's)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def _open_idle(port: int, n: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]


def test_slow_header_clients_do_not_starve_metrics(aggregator: tuple[Pipeline, int, Any]) -> None:
    """64 clients send a request line and then one header line a second (inside the idle
    deadline, so only the header deadline ends them) and reconnect as soon as they are closed;
    meanwhile every /metrics probe answers 200, over more than one header deadline."""
    _, port, _ = aggregator
    stop_ev = threading.Event()
    reconnects = [0]

    def attack() -> None:
        socks: list[socket.socket | None] = [None] * SLOW_CLIENTS
        n = 0
        while not stop_ev.is_set():
            for i, s in enumerate(socks):
                try:
                    if s is None:
                        s = socks[i] = socket.create_connection(("127.0.0.1", port), timeout=5)
                        s.sendall(b"GET / HTTP/1.1\r\n")
                        s.settimeout(0.001)
                        reconnects[0] += 1
                        continue
                    s.sendall(f"X-Slow-{n}: {n}\r\n".encode())
                    if s.recv(4096) == b"":
                        raise OSError("closed")
                except TimeoutError:
                    pass  # nothing from the server yet: still held open
                except OSError:
                    if s is not None:
                        s.close()
                    socks[i] = None
            n += 1
            stop_ev.wait(1.0)
        for s in socks:
            if s is not None:
                s.close()

    attacker = threading.Thread(target=attack, daemon=True)
    attacker.start()
    try:
        wait_for(lambda: reconnects[0] >= SLOW_CLIENTS, 30, "every slow client connected")
        codes = []
        for _ in range(16):  # ~8 s: past HTTP_HEADER_TIMEOUT_S, so the attackers reconnect meanwhile
            codes.append(_get(f"http://127.0.0.1:{port}/metrics"))
            stop_ev.wait(0.5)
    finally:
        stop_ev.set()
        attacker.join(10)
    assert codes == [200] * len(codes), codes
    assert reconnects[0] > SLOW_CLIENTS  # the header deadline closed them, and they came back
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert f'perfd_aggregator_refused_total{{reason="{L.REFUSED_HTTP_DEADLINE}"}}' in text
    assert f'perfd_aggregator_refused_total{{reason="{L.REFUSED_HTTP_DEADLINE}"}} 0.0' not in text


def test_two_thousand_idle_connections_open_and_metrics_still_answers(
        aggregator: tuple[Pipeline, int, _Backlogs]) -> None:
    _, port, backlogs = aggregator
    # the listen backlog (Send-Q of a listening socket); it was 5
    assert backlogs.of[port] >= min(L.HTTP_LISTEN_BACKLOG, 4096), backlogs.of
    threads = _threads()
    socks = _open_idle(port, IDLE)  # each connect within its 10 s timeout
    try:
        assert _get(f"http://127.0.0.1:{port}/metrics") == 200
        # A connection costs a buffer, never a thread (the slack: the daemon's executor may start
        # a worker meanwhile; a thread per connection would add hundreds).
        assert _threads() <= threads + THREAD_SLACK
    finally:
        for s in socks:
            s.close()


def test_agent_metrics_with_two_thousand_idle_connections(tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="perfd")  # the agent's log, as `perfd -v` writes it
    with pipeline(tmp_path, "--no-rules") as p:
        url = p.agent("--metrics-port", "0", "--nvml", "off", "--host", "off").metrics_url
        wait_for(lambda: _get(url) == 200, 60, "agent up")
        threads = _threads()
        m = int(url.rsplit(":", 1)[1].split("/")[0])
        socks = _open_idle(m, IDLE)
        try:
            assert _get(url) == 200
            assert _threads() <= threads + THREAD_SLACK, (threads, _threads())
        finally:
            for s in socks:
                s.close()
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        # The connections beyond the cap made room by closing the oldest idle ones, counted.
        row = rf'^perfd_agent_http_refused_total{{node="[^"]*",reason="{L.REFUSED_HTTP_CONNECTIONS}"}} [1-9]'
        assert re.search(row, text, re.M), text
    assert not _tracebacks(caplog), _tracebacks(caplog)[:5]
