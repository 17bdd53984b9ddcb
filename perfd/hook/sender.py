"""Non-blocking Unix datagram socket from the hook to the local agent, and back.

Why datagrams: one ``sendto`` per record, no connection state, no partial writes, and a full or
absent receiver is an immediate error instead of a stall. The training thread must never wait on
perfd: every failure is a counted drop, never an exception.

The socket is autobound (Linux abstract address), so the agent learns where to send profile
requests from the address of the records it receives; nothing is left on disk.
"""

from __future__ import annotations

import errno
import socket
import time

# errno -> drop reason. ENOENT/ECONNREFUSED: no agent (no socket file, or nobody bound to it).
_ABSENT = {errno.ENOENT, errno.ECONNREFUSED, errno.ENOTDIR}
_DENIED = {errno.EACCES, errno.EPERM}


class DatagramSender:
    """``send()`` never blocks or raises; ``drops`` counts what was lost, by reason.

    After "agent_absent" or "permission" the sender stops calling ``sendto`` for ``retry_s`` (each
    record in that window is a counted drop), so a missing agent costs the training loop no
    syscall per step.
    """

    def __init__(self, path: str, retry_s: float = 1.0) -> None:
        self.path = path
        self.retry_ns = int(retry_s * 1e9)
        self.sent = 0  # records
        self.datagrams = 0
        self.dropped = 0  # records
        self.drops: dict[str, int] = {}
        self.recv_errors = 0
        self._retry_at = 0
        self.can_receive = False
        self.sock: socket.socket | None
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.setblocking(False)
        except OSError:
            self.sock = None
            return
        try:
            sock.bind("")  # autobind: an abstract address the agent can reply to (Linux)
            self.can_receive = True
        except OSError:
            pass  # records still go out; profile requests cannot reach us
        self.sock = sock

    def _drop(self, reason: str, n: int) -> None:
        self.dropped += n
        self.drops[reason] = self.drops.get(reason, 0) + n

    def send(self, data: bytes, records: int = 1) -> bool:
        """Send one datagram carrying ``records`` records; drops are counted in records."""
        sock = self.sock
        if sock is None:
            self._drop("no_socket", records)
            return False
        if self._retry_at:
            if time.monotonic_ns() < self._retry_at:
                self._drop("agent_absent", records)
                return False
            self._retry_at = 0
        try:
            sock.sendto(data, self.path)
        except BlockingIOError:
            # EAGAIN: the agent's queue is full. Linux holds at most net.unix.max_dgram_qlen
            # (default 10) datagrams per receiver, whatever its buffer size: the agent drains it
            # from a dedicated thread, so this means the agent is stalled or overloaded.
            self._drop("agent_busy", records)
            return False
        except OSError as exc:
            code = exc.errno
            if code in _ABSENT:
                self._drop("agent_absent", records)
                self._retry_at = time.monotonic_ns() + self.retry_ns
            elif code in _DENIED:
                self._drop("permission", records)
                self._retry_at = time.monotonic_ns() + self.retry_ns
            elif code == errno.ENOBUFS:
                self._drop("no_buffers", records)
            elif code == errno.EMSGSIZE:
                self._drop("too_large", records)
            else:
                self._drop(f"errno_{code}", records)
            return False
        self.sent += records
        self.datagrams += 1
        return True

    def recv(self, bufsize: int = 256) -> bytes | None:
        """One datagram addressed to us, or None when there is none. Never blocks or raises."""
        sock = self.sock
        if sock is None:
            return None
        try:
            return sock.recv(bufsize)
        except BlockingIOError:
            return None
        except OSError:
            self.recv_errors += 1
            return None

    def address(self) -> str | bytes | None:
        if self.sock is None:
            return None
        try:
            addr: str | bytes = self.sock.getsockname()
        except OSError:
            return None
        return addr

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None
