"""perfd.exporters.httpd on a real socket, in process: the probe lane is never starved by the API
lane, and at the connection cap the oldest idle connection makes room for a prober. Counts only,
no timings."""

from __future__ import annotations

import selectors
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from perfd.core import limits as L
from perfd.core.refusals import Refusals
from perfd.exporters import httpd


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
        if self.path.startswith("/api/mb/"):  # an answer of that many MB
            body = b"x" * int(float(self.path.rsplit("/", 1)[1]) * 1e6)
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


def _read_all(s: socket.socket) -> bytes:
    got = b""
    while chunk := s.recv(1 << 16):
        got += chunk
    return got


def test_answers_waiting_to_be_read_are_bounded_per_connection_and_in_all(
        server: tuple[httpd.HttpServer, _App]) -> None:
    """Clients that ask for a large answer and never read it hold at most the server's output bound:
    those that have read nothing for longest are closed when a new answer needs room; an answer over
    the per-connection bound is not sent at all (30 such clients once held 2 GB)."""
    srv, _ = server
    srv.max_answer_bytes, srv.max_output_bytes = 4_000_000, 8_000_000
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(b"GET /api/mb/5 HTTP/1.0\r\n\r\n")
        assert _read_all(s).startswith(b"HTTP/1.0 503 ")
    assert srv.refusals.get(L.REFUSED_HTTP_ANSWER) == 1
    stalled = []
    for _ in range(10):  # 3 MB each, never read: 30 MB asked for
        c = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        c.sendall(b"GET /api/mb/3 HTTP/1.0\r\n\r\n")
        stalled.append(c)
    try:
        deadline = time.monotonic() + 30
        while srv.answers < 1 + 10 and time.monotonic() < deadline:
            time.sleep(0.05)  # every answer begun (each made room, or was refused)
        assert srv.answers == 11 and srv.output_bytes <= srv.max_output_bytes
        # ~3 of 10 fit (the kernel holds ~0.5 MB of each): the others made room or were refused
        assert srv.refusals.get(L.REFUSED_HTTP_ANSWER) >= 1 + 5
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as reader:
            reader.sendall(b"GET /api/mb/3 HTTP/1.0\r\n\r\n")
            got = _read_all(reader)  # room is made for a client that reads
        assert got.startswith(b"HTTP/1.0 200 ") and len(got) > 3_000_000
        assert srv.output_bytes <= srv.max_output_bytes
    finally:
        for c in stalled:
            c.close()


def test_a_request_that_arrived_while_the_front_thread_was_held_is_served_not_cut() -> None:
    """The deadline sweep can run seconds after the select it follows (the process not scheduled, the
    interpreter's lock held elsewhere: a loaded run's aggregator cut a scraper whose whole request was
    waiting, "0 bytes in 5.8 s", the client then reset): what the kernel holds is read before a client
    is judged late. One that sent nothing is still cut at the deadline. Driven without the front thread,
    the sweep given a time past the head's deadline."""
    refusals = Refusals()
    srv = httpd.HttpServer("127.0.0.1", 0, _Handler, _App(), refusals=refusals, max_connections=16)
    try:
        sent, silent = (socket.create_connection(("127.0.0.1", srv.port), timeout=5) for _ in range(2))
        with sent, silent:
            srv._accept()  # both (connected: in the listen backlog already)
            assert srv.open_connections() == 2
            sent.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            # in the kernel's buffer, unread: what the held thread has not seen
            assert _kernel_holds(srv), "the request never reached the server's socket"
            srv._sweep(time.monotonic() + L.HTTP_HEADER_TIMEOUT_S + 1.0)
            assert refusals.counts.get(L.REFUSED_HTTP_DEADLINE) == 1, refusals.counts  # the silent one only
            assert srv.open_connections() == 1
    finally:
        srv.stop()


def _kernel_holds(srv: httpd.HttpServer) -> bool:
    """Whether a connection of ``srv`` has bytes waiting to be read, within 5 s (nothing taken)."""
    with selectors.DefaultSelector() as sel:
        for conn in list(srv._conns):
            sel.register(conn.sock, selectors.EVENT_READ)
        return bool(sel.select(5.0))
