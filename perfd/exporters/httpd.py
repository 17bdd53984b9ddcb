"""perfd's HTTP server: the aggregator's API and /metrics, and the agent's /metrics.

One thread owns every socket (a selector): it accepts, reads each request whole (head and body)
under per-connection deadlines, and writes each response. Worker threads, in two lanes, only turn
a complete request into response bytes. Why not a thread per connection (http.server's
ThreadingHTTPServer, prometheus_client's start_http_server): a client that trickles its headers
holds its thread for as long as it likes. 64 such clients held every slot of the aggregator and
/metrics answered 503 for as long as they lasted; 2,000 idle connections gave the agent 1,503
threads. Here a connection costs a buffer, never a thread.

- deadlines (perfd.core.limits): the head within HTTP_HEADER_TIMEOUT_S of the accept, the whole request
  within HTTP_REQUEST_TIMEOUT_S, no silence longer than HTTP_IDLE_TIMEOUT_S while reading or
  writing, the response written within HTTP_WRITE_TIMEOUT_S; a head over MAX_HTTP_HEAD_BYTES is
  refused (431). Each is counted (reasons ``http_deadline``, ``http_head``);
- at most MAX_HTTP_CONNECTIONS open: at the cap, the connection that has waited longest for its
  request (or lingers after its answer) is closed to let the new one in — a real client sends its
  request at once, so a prober is never the oldest — counted as ``http_connections``;
- two lanes: the probe paths (/metrics, /healthz) have their own threads and queue, so API clients
  never starve Prometheus or a liveness probe; a full lane answers 503 (``http_connections``);
- one request per connection (HTTP/1.0: the server closes after its answer), and a listen backlog
  of HTTP_LISTEN_BACKLOG so that a burst of connects is not dropped by the kernel;
- output: an answer over MAX_HTTP_ANSWER_BYTES is not sent (503, ``http_answer``), and the answers
  waiting for their clients to read them hold at most MAX_HTTP_OUTPUT_BYTES together: a new answer
  that would pass it closes the connections that have read nothing for longest (``http_answer``),
  or, when no other answer is waiting, is answered 503 itself. 30 clients that asked for a 50 MB
  answer and never read it once held 2 GB.

Handlers are :class:`BufferedHandler` subclasses: http.server's own request parsing and response
writing, run on the buffered request.
"""

from __future__ import annotations

import errno
import gzip
import io
import logging
import queue
import selectors
import socket
import threading
import time
from collections.abc import Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from perfd.core import limits as L
from perfd.core.refusals import Refusals

log = logging.getLogger(__name__)

PROBE_PATHS = ("/metrics", "/healthz")  # the lane API clients cannot fill


class BufferedHandler(BaseHTTPRequestHandler):
    """A request handler run on one complete, buffered request; what it writes is collected in
    ``response``. ``app`` is what the server was given (the aggregator's state, the agent's
    registry); ``server`` is unused (no socketserver: the front owns the socket)."""

    app: Any
    response: bytes = b""
    # Answers to a request line that does not parse carry a status line too (the stdlib's default,
    # HTTP/0.9, writes the error page alone).
    default_request_version = "HTTP/1.0"

    def __init__(self, raw: bytes, client_address: tuple[str, int], app: Any) -> None:
        self.app = app
        self._raw = raw
        super().__init__(raw, client_address, None)  # type: ignore[arg-type]

    def setup(self) -> None:
        self.rfile = io.BytesIO(self._raw)
        self.wfile = self._out = io.BytesIO()

    def handle(self) -> None:
        self.handle_one_request()  # one request per connection

    def finish(self) -> None:
        self.response = self._out.getvalue()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        if code == HTTPStatus.NOT_IMPLEMENTED:  # no do_X for the method: the client's fault, a 4xx
            code, message = HTTPStatus.METHOD_NOT_ALLOWED, f"method {self.command[:16]!r} not allowed"
        super().send_error(code, message, explain)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s", format % args)


def metrics_response(registry: CollectorRegistry, accept: str | None,
                     accept_encoding: str | None) -> tuple[bytes, list[tuple[str, str]]]:
    """The exposition of ``registry`` in the format the scraper accepts (text or OpenMetrics),
    gzipped when it accepts gzip: what prometheus_client's own server answers."""
    encoder, ctype = choose_encoder(accept or "")
    body = encoder(registry)
    headers = [("Content-Type", ctype)]
    if accept_encoding and "gzip" in accept_encoding.lower():
        body = gzip.compress(body, compresslevel=6)
        headers.append(("Content-Encoding", "gzip"))
    return body, headers


def plain_response(code: int, text: str) -> bytes:
    body = (text + "\n").encode()
    return (f"HTTP/1.0 {code} {HTTPStatus(code).phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


_READING, _WORKING, _WRITING, _LINGERING = range(4)
_LISTEN, _WAKE = object(), object()
LINGER_S = 2.0  # after an answer, unread input is drained this long so the client gets the answer


class _Conn:
    __slots__ = ("addr", "buf", "deadline", "events", "last_io", "need", "opened", "out", "sent", "sock",
                 "state")

    def __init__(self, sock: socket.socket, addr: tuple[str, int], now: float) -> None:
        self.sock, self.addr = sock, addr
        self.opened = self.last_io = now
        self.buf = bytearray()
        self.need: int | None = None  # head plus body length, once the head is complete
        self.state = _READING
        self.events = 0
        self.out = b""
        self.sent = 0
        self.deadline = 0.0  # of the write, or of the linger


def _request_size(head: bytes) -> int | None:
    """Head plus body length from a complete head; None when the framing is ambiguous (several
    Content-Length headers). An invalid, oversized or chunked body is framed as none: the handler
    refuses it (perfd.aggregator.http._body_length) and the connection closes."""
    lengths, chunked = [], False
    for line in head.split(b"\n")[1:]:
        name, sep, value = line.partition(b":")
        name = name.strip().lower()
        if not sep:
            continue
        if name == b"content-length":
            lengths.append(value.strip())
        elif name == b"transfer-encoding":
            chunked = True
    if len(lengths) > 1:
        return None
    if lengths and not chunked and lengths[0].isdigit() and int(lengths[0]) <= L.MAX_HTTP_BODY_BYTES:
        return len(head) + int(lengths[0])
    return len(head)


def _path_of(head: bytes) -> str:
    parts = head.split(b"\n", 1)[0].split()
    target = parts[1].decode("latin-1") if len(parts) >= 2 else ""
    try:
        return urlsplit(target).path.rstrip("/") or "/"
    except ValueError:
        return "/"


def bind_error(exc: OSError, host: str, port: int, what: str, port_flag: str, host_flag: str) -> OSError:
    """A failure to listen on ``host:port`` as a person reads it: what could not listen where, why,
    and the flag to change (the kernel's "[Errno 98] Address already in use" names neither the port
    nor the way out). A port in use: choose another port; an address not local: another address."""
    if exc.errno == errno.EADDRINUSE:
        why = "the port is already in use (another program listens on it)"
        fix = f"another port with {port_flag}"
    else:
        why = exc.strerror or str(exc)
        fix = f"another address with {host_flag} or another port with {port_flag}"
    return OSError(f"cannot listen for {what} on {host}:{port}: {why}; choose {fix}")


class HttpServer:
    """Listens on ``host:port`` (0: any free port; OSError when it cannot bind) and serves
    ``handler`` (a :class:`BufferedHandler` subclass) with ``app``. :meth:`start`, :meth:`stop`."""

    def __init__(self, host: str, port: int, handler: type[BufferedHandler], app: Any, *,
                 refusals: Refusals | None = None, probe_threads: int = L.HTTP_PROBE_THREADS,
                 api_threads: int = L.HTTP_API_THREADS, probe_paths: Sequence[str] = PROBE_PATHS,
                 max_connections: int = L.MAX_HTTP_CONNECTIONS, name: str = "http") -> None:
        self._handler, self._app = handler, app
        self.refusals = refusals if refusals is not None else Refusals()
        self.max_connections = max_connections
        self.probe_paths = frozenset(probe_paths)
        self.name = name
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._lsock = socket.socket(family, socket.SOCK_STREAM)
        try:
            # SO_REUSEADDR only (no SO_REUSEPORT): a port another process listens on refuses to bind.
            self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._lsock.bind((host, port))
            self._lsock.listen(L.HTTP_LISTEN_BACKLOG)
        except OSError:
            self._lsock.close()
            raise
        self._lsock.setblocking(False)
        self.port = int(self._lsock.getsockname()[1])
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._done: queue.SimpleQueue[tuple[_Conn, bytes]] = queue.SimpleQueue()
        self._lanes: dict[str, queue.Queue[tuple[_Conn, bytes] | None]] = {
            "probe": queue.Queue(L.HTTP_LANE_QUEUE), "api": queue.Queue(L.HTTP_LANE_QUEUE)}
        self._threads = [threading.Thread(target=self._serve, name=f"{name}-front", daemon=True)]
        for lane, n in (("probe", probe_threads), ("api", api_threads)):
            self._threads += [threading.Thread(target=self._work, args=(self._lanes[lane],),
                                               name=f"{name}-{lane}-{i}", daemon=True) for i in range(n)]
        self._conns: dict[_Conn, None] = {}  # in accept order: the oldest first
        self.output_bytes = 0  # answer bytes written to no client yet, all connections together
        self.answers = 0  # answers begun (each request gets one)
        self.max_answer_bytes = L.MAX_HTTP_ANSWER_BYTES
        self.max_output_bytes = L.MAX_HTTP_OUTPUT_BYTES
        self._stopping = False
        self._accept_paused_until = 0.0
        self.server_address = self._lsock.getsockname()

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        for t in self._threads:
            t.start()

    def threads(self) -> tuple[threading.Thread, ...]:
        """The server's threads (the front, each lane's workers): what a caller that must see them end
        (a test's process, between tests) joins after :meth:`stop`."""
        return tuple(self._threads)

    def stop(self, timeout: float = 1.0) -> None:
        """Close the listener and every connection (the front thread ends within ``timeout``).
        Workers end once their current request is answered; they are daemon threads and are not
        waited for: a slow API call must not hold up a SIGTERM."""
        self._stopping = True
        self._wake()
        for lane, q in self._lanes.items():
            for t in self._threads:
                if t.name.startswith(f"{self.name}-{lane}-"):
                    try:
                        q.put_nowait(None)
                    except queue.Full:
                        pass
        front = self._threads[0]
        if front.is_alive() and front is not threading.current_thread():
            front.join(timeout)
        if not front.is_alive():
            self._close_all()

    def open_connections(self) -> int:
        return len(self._conns)

    # ---- workers --------------------------------------------------------------------------------
    def _work(self, lane: queue.Queue[tuple[_Conn, bytes] | None]) -> None:
        while True:
            job = lane.get()
            if job is None:
                return
            conn, raw = job
            try:
                out = self._handler(raw, conn.addr, self._app).response
            except Exception:  # a handler bug answers 500 and the server goes on
                log.exception("HTTP request from %s failed", conn.addr[0])
                out = plain_response(500, "internal error (logged)")
            self._done.put((conn, out))
            self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:  # full: a wake is pending anyway; closed: stopping
            pass

    # ---- the front ------------------------------------------------------------------------------
    def _serve(self) -> None:
        self._sel.register(self._lsock, selectors.EVENT_READ, _LISTEN)
        self._sel.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        next_sweep = 0.0
        try:
            while not self._stopping:
                for key, ev in self._sel.select(L.HTTP_TICK_S):
                    if key.data is _LISTEN:
                        self._accept()
                    elif key.data is _WAKE:
                        try:
                            while self._wake_r.recv(4096):
                                pass
                        except OSError:
                            pass
                    else:
                        self._io(key.data, ev)
                while True:
                    try:
                        conn, out = self._done.get_nowait()
                    except queue.Empty:
                        break
                    if conn in self._conns:
                        self._respond(conn, out)
                now = time.monotonic()
                if now >= next_sweep:
                    self._sweep(now)
                    next_sweep = now + L.HTTP_TICK_S
        except Exception:
            log.exception("the %s server's front thread failed; no more HTTP", self.name)
        finally:
            self._close_all()

    def _close_all(self) -> None:
        for conn in list(self._conns):
            self._close(conn)
        for s in (self._lsock, self._wake_r, self._wake_w):
            s.close()
        try:
            self._sel.close()
        except (OSError, RuntimeError):
            pass

    def _watch(self, conn: _Conn, events: int) -> None:
        if events == conn.events:
            return
        if conn.events == 0:
            self._sel.register(conn.sock, events, conn)
        elif events == 0:
            self._sel.unregister(conn.sock)
        else:
            self._sel.modify(conn.sock, events, conn)
        conn.events = events

    def _close(self, conn: _Conn) -> None:
        if self._conns.pop(conn, False) is None:
            self._watch(conn, 0)
        self._drop_output(conn)
        conn.sock.close()

    def _drop_output(self, conn: _Conn) -> None:
        self.output_bytes -= len(conn.out) - conn.sent
        conn.out, conn.sent = b"", 0

    def _output_room(self, conn: _Conn, need: int) -> bool:
        """Room for ``need`` more bytes of answers: the connections whose answer has waited longest
        without a byte read are closed to make it (a client reading its answer keeps moving ahead);
        False when no other answer is waiting."""
        if self.output_bytes + need <= self.max_output_bytes:
            return True
        stalled = sorted((c for c in self._conns if c is not conn and c.state == _WRITING),
                         key=lambda c: c.last_io)
        for c in stalled:
            self.refusals.refuse(L.REFUSED_HTTP_ANSWER, f"HTTP connection from {c.addr[0]} closed: its "
                                 f"answer ({c.sent} of {len(c.out)} bytes read) held room another needs")
            self._close(c)
            if self.output_bytes + need <= self.max_output_bytes:
                return True
        return False

    def _accept(self) -> None:
        now = time.monotonic()
        for _ in range(256):  # then serve the open connections: a connect flood cannot starve them
            try:
                sock, addr = self._lsock.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors: make room if a connection can go, else stop accepting
                    # for a tick (the listener stays readable; retrying at once would spin).
                    if not self._evict("out of file descriptors"):
                        self._sel.unregister(self._lsock)
                        self._accept_paused_until = now + L.HTTP_TICK_S
                return
            sock.setblocking(False)
            try:  # what the kernel holds of an unread answer is bounded too, not only our buffer
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, L.HTTP_SEND_BUFFER_BYTES)
            except OSError:
                pass
            if len(self._conns) >= self.max_connections and not self._evict(
                    f"{self.max_connections} connections open"):
                self.refusals.refuse(L.REFUSED_HTTP_CONNECTIONS, f"HTTP connection from {addr[0]}: "
                                     f"{self.max_connections} open, none waiting for its request")
                try:
                    sock.send(plain_response(503, "too many connections"))
                except OSError:
                    pass
                sock.close()
                continue
            conn = _Conn(sock, addr, now)
            self._conns[conn] = None
            self._watch(conn, selectors.EVENT_READ)

    def _evict(self, why: str) -> bool:
        """Close the connection that has waited longest for its request (or lingers after its
        answer); False when every one is being served."""
        for conn in self._conns:
            if conn.state in (_READING, _LINGERING):
                if conn.state == _READING:
                    self.refusals.refuse(L.REFUSED_HTTP_CONNECTIONS, f"HTTP connection from {conn.addr[0]} "
                                         f"closed before its request ended: {why}, it was the oldest")
                self._close(conn)
                return True
        return False

    def _io(self, conn: _Conn, ev: int) -> None:
        if conn.state in (_READING, _LINGERING) and ev & selectors.EVENT_READ:
            try:
                data = conn.sock.recv(65536)
            except BlockingIOError:
                return
            except OSError:
                self._close(conn)
                return
            if not data:
                self._close(conn)
            elif conn.state == _READING:
                conn.last_io = time.monotonic()
                conn.buf += data
                self._parse(conn)
        elif conn.state == _WRITING and ev & selectors.EVENT_WRITE:
            self._write(conn)

    def _parse(self, conn: _Conn) -> None:
        buf = conn.buf
        if conn.need is None:
            ends = [i + n for i, n in ((buf.find(b"\r\n\r\n"), 4), (buf.find(b"\n\n"), 2)) if i >= 0]
            if not ends:
                if len(buf) > L.MAX_HTTP_HEAD_BYTES:
                    self.refusals.refuse(L.REFUSED_HTTP_HEAD, f"HTTP request from {conn.addr[0]}: head "
                                         f"over {L.MAX_HTTP_HEAD_BYTES} bytes")
                    self._respond(conn, plain_response(431, "request head too large"))
                return
            head = bytes(buf[:min(ends)])
            if len(head) > L.MAX_HTTP_HEAD_BYTES:
                self.refusals.refuse(L.REFUSED_HTTP_HEAD, f"HTTP request from {conn.addr[0]}: head "
                                     f"over {L.MAX_HTTP_HEAD_BYTES} bytes")
                self._respond(conn, plain_response(431, "request head too large"))
                return
            need = _request_size(head)
            if need is None:
                self.refusals.refuse(L.REFUSED_HTTP_BODY, f"HTTP request from {conn.addr[0]}: several "
                                     "Content-Length headers")
                self._respond(conn, plain_response(400, "several Content-Length headers"))
                return
            conn.need = need
        if len(buf) >= conn.need:
            self._dispatch(conn, bytes(buf[:conn.need]))

    def _dispatch(self, conn: _Conn, raw: bytes) -> None:
        lane = "probe" if _path_of(raw) in self.probe_paths else "api"
        conn.state = _WORKING
        self._watch(conn, 0)  # one request per connection: nothing more is read
        try:
            self._lanes[lane].put_nowait((conn, raw))
        except queue.Full:
            self.refusals.refuse(L.REFUSED_HTTP_CONNECTIONS, f"HTTP request from {conn.addr[0]}: the "
                                 f"{lane} lane has {L.HTTP_LANE_QUEUE} requests waiting")
            self._respond(conn, plain_response(503, "busy; retry"))

    def _respond(self, conn: _Conn, out: bytes) -> None:
        if len(out) > self.max_answer_bytes:
            self.refusals.refuse(L.REFUSED_HTTP_ANSWER, f"HTTP answer of {len(out)} bytes to {conn.addr[0]} "
                                 f"not sent (over {self.max_answer_bytes})")
            out = plain_response(503, f"the answer is {len(out)} bytes, over this server's "
                                      f"{self.max_answer_bytes}: ask for less (e.g. /api/events?limit=)")
        elif not self._output_room(conn, len(out)):
            self.refusals.refuse(L.REFUSED_HTTP_ANSWER, f"HTTP answer of {len(out)} bytes to {conn.addr[0]} "
                                 f"not sent: {self.output_bytes} bytes of answers wait to be read")
            out = plain_response(503, "busy: too many answers wait to be read; retry")
        conn.state, conn.out, conn.sent = _WRITING, out, 0
        self.output_bytes += len(out)
        self.answers += 1
        conn.deadline = time.monotonic() + L.HTTP_WRITE_TIMEOUT_S
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        try:
            n = conn.sock.send(memoryview(conn.out)[conn.sent:conn.sent + (1 << 20)])
        except BlockingIOError:
            n = 0
        except OSError:
            self._close(conn)
            return
        if n:
            conn.sent += n
            self.output_bytes -= n
            conn.last_io = time.monotonic()
        if conn.sent < len(conn.out):
            self._watch(conn, selectors.EVENT_WRITE)
            return
        # Answered: half-close and drain what the client still sends (a refused body), so the
        # answer is not lost to a reset; then close.
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        self._drop_output(conn)
        conn.state, conn.deadline = _LINGERING, time.monotonic() + LINGER_S
        self._watch(conn, selectors.EVENT_READ)

    def _sweep(self, now: float) -> None:
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            self._sel.register(self._lsock, selectors.EVENT_READ, _LISTEN)
        for conn in list(self._conns):
            if conn.state == _READING:
                late = ("the head" if conn.need is None and now - conn.opened > L.HTTP_HEADER_TIMEOUT_S
                        else "the request" if now - conn.opened > L.HTTP_REQUEST_TIMEOUT_S
                        else "a byte" if now - conn.last_io > L.HTTP_IDLE_TIMEOUT_S else None)
                if late is None:
                    continue
                # What arrived while this thread was held is read before the client is judged: the sweep can
                # run seconds after the select it follows (a process the machine did not schedule, a lock
                # it waited for), and a request waiting in the kernel then is not the client's lateness
                self._io(conn, selectors.EVENT_READ)
                if conn not in self._conns or conn.state != _READING:
                    continue
                self.refusals.refuse(L.REFUSED_HTTP_DEADLINE, f"HTTP connection from {conn.addr[0]}: "
                                     f"{late} did not arrive in time ({len(conn.buf)} bytes in "
                                     f"{now - conn.opened:.1f} s); closed")
                if conn.buf:
                    self._respond(conn, plain_response(408, "request not received in time"))
                else:
                    self._close(conn)
            elif conn.state == _WRITING and (now > conn.deadline
                                             or now - conn.last_io > L.HTTP_IDLE_TIMEOUT_S):
                self.refusals.refuse(L.REFUSED_HTTP_DEADLINE, f"HTTP connection from {conn.addr[0]}: the "
                                     f"answer was not read in time ({conn.sent} of {len(conn.out)} bytes)")
                self._close(conn)
            elif conn.state == _LINGERING and now > conn.deadline:
                self._close(conn)
