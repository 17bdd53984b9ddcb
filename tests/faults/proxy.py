"""A small fault-injecting TCP proxy for loopback tests (no root, no tc/iptables).

Listens on 127.0.0.1, forwards every connection to ``upstream``, and can be switched at any time:

- ``pass``: bytes flow both ways.
- ``blackhole``: every open connection and every new one stays open but carries nothing: bytes
  are read and thrown away in both directions (a network that drops packets without RST).
- ``half_open``: the upstream side of every open connection is closed (the server sees the
  client go away), the client side stays open and silent, its bytes thrown away (a peer that
  rebooted, a NAT entry that expired); new connections pass.
- ``cut``: every open connection is reset on both sides (SO_LINGER 0); new connections pass.
- ``deaf``: what the client sends reaches the server, what the server sends is thrown away (a
  request that lands and whose answer is lost).

It runs its own event loop in a thread, so synchronous tests can drive it.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from dataclasses import dataclass, field

MODES = ("pass", "blackhole", "half_open", "cut", "deaf")


@dataclass(eq=False)  # kept in a set by identity
class _Link:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    upstream_open: bool = True
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


def _reset(w: asyncio.StreamWriter) -> None:
    sock = w.get_extra_info("socket")
    if sock is not None:
        try:  # close with RST, not FIN
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    w.close()


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.mode = "pass"
        self.port = 0
        self.connections = 0  # accepted, ever
        self.dropped_bytes = 0  # read and thrown away (blackhole, half_open)
        self._links: set[_Link] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)

    # ---- control (any thread) --------------------------------------------------------------------
    def start(self) -> FaultProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fault proxy did not start")
        return self

    def set_mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        asyncio.run_coroutine_threadsafe(self._set_mode(mode), self._loop).result(10)

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for link in list(self._links):
                _reset(link.client)
                _reset(link.upstream)
                for t in link.tasks:
                    t.cancel()
        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    # ---- the loop --------------------------------------------------------------------------------
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = int(self._server.sockets[0].getsockname()[1])
        self._ready.set()
        self._loop.run_forever()

    async def _set_mode(self, mode: str) -> None:
        self.mode = mode
        for link in list(self._links):
            if mode == "half_open" and link.upstream_open:
                link.upstream_open = False
                link.upstream.close()  # FIN to the server; the client hears nothing
            elif mode == "cut":
                _reset(link.client)
                _reset(link.upstream)
                self._links.discard(link)

    async def _accept(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            ur, uw = await asyncio.open_connection(*self.upstream)
        except OSError:
            _reset(cw)
            return
        link = _Link(cw, uw)
        self._links.add(link)
        link.tasks = [asyncio.create_task(self._pump(cr, uw, link, upstream_bound=True)),
                      asyncio.create_task(self._pump(ur, cw, link, upstream_bound=False))]

    async def _pump(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, link: _Link,
                    upstream_bound: bool) -> None:
        try:
            while True:
                data = await r.read(65536)
                if not data:
                    break
                # Blackhole drops both ways; half-open drops what the client sends (the server's
                # side is gone) and the server has nothing more to send.
                if (self.mode == "blackhole" or not link.upstream_open
                        or (self.mode == "deaf" and not upstream_bound)):
                    self.dropped_bytes += len(data)
                    continue
                w.write(data)
                await w.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            if not link.upstream_open or self.mode == "blackhole":
                # Half-open: the client's side stays open and silent. A black hole sends no FIN.
                return  # noqa: B012
            for side in (link.client, link.upstream):
                if not side.is_closing():
                    side.close()
            self._links.discard(link)
