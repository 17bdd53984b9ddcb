"""perfd.exporters.httpd on a real socket, in process: the probe lane is never starved by the API
lane, and at the connection cap the oldest idle connection makes room for a prober. Counts only,
no timings."""

from __future__ import annotations

import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from perfd import limits as L
from perfd.exporters import httpd
from perfd.refusals import Refusals


class _App:
    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)


class _Handler(httpd.BufferedHandler):
    app: _App

    def do_GET(self) -> None:
        if self.path.startswith("/api/slow"):
            self.app.entered.release()
            self.app.release.wait(30)
        body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server() -> Iterator[tuple[httpd.HttpServer, _App]]:
    app = _App()
    srv = httpd.HttpServer("127.0.0.1", 0, _Handler, app, refusals=Refusals(), max_connections=16)
    srv.start()
    try:
        yield srv, app
    finally:
        app.release.set()
        srv.stop()


def _get(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=20) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_a_busy_api_lane_never_starves_metrics(server: tuple[httpd.HttpServer, _App]) -> None:
    srv, app = server
    holders = [threading.Thread(target=_get, args=(srv.port, f"/api/slow/{i}"), daemon=True)
               for i in range(L.HTTP_API_THREADS)]
    for t in holders:
        t.start()
    for _ in holders:  # every API worker is inside a request that does not end
        assert app.entered.acquire(timeout=20)
    assert [_get(srv.port, p) for p in ("/metrics", "/healthz", "/metrics")] == [200, 200, 200]
    app.release.set()
    for t in holders:
        t.join(20)


def test_at_the_cap_the_oldest_idle_connection_makes_room(server: tuple[httpd.HttpServer, _App]) -> None:
    srv, _ = server
    idle = [socket.create_connection(("127.0.0.1", srv.port), timeout=10) for _ in range(40)]
    try:
        assert _get(srv.port, "/healthz") == 200
        assert srv.open_connections() <= 16
        assert srv.refusals.get(L.REFUSED_HTTP_CONNECTIONS) >= 40 - 16
        idle[0].settimeout(10)
        assert idle[0].recv(10) == b""  # the oldest was closed
    finally:
        for s in idle:
            s.close()


def test_a_head_over_the_cap_is_refused(server: tuple[httpd.HttpServer, _App]) -> None:
    srv, _ = server
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nX-Big: " + b"a" * (L.MAX_HTTP_HEAD_BYTES + 10))
        got = b""
        while chunk := s.recv(4096):
            got += chunk
    assert got.startswith(b"HTTP/1.0 431 ")
    assert srv.refusals.get(L.REFUSED_HTTP_HEAD) == 1
