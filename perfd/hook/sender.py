"""Non-blocking Unix datagram socket from the hook to the local agent, and back.

Why datagrams: one ``sendto`` per record, no connection state, no partial writes, and a full or
absent receiver is an immediate error instead of a stall. The training thread must never wait on
perfd: every failure is a counted drop, never an exception.

The socket is autobound (Linux abstract address), so the agent learns where to send profile
requests from the address of the records it receives; nothing is left on disk.

Step records sent while the agent is absent or busy are kept (``keep=True``): a job started before
its agent listens, or an agent stalled for a moment, loses none of its first steps. The backlog is
bounded (perfd.limits.HOOK_BACKLOG_RECORDS); past it the oldest are dropped and counted, and
whatever is still held when the hook closes is counted as dropped too. Held datagrams go out, oldest
first, before the next one kept (at most HOOK_BACKLOG_SENDS per call: the agent queues ~10).
"""

from __future__ import annotations

import errno
import socket
import time
from collections import deque

from perfd.limits import HOOK_BACKLOG_RECORDS, HOOK_BACKLOG_SENDS

# errno -> drop reason. ENOENT/ECONNREFUSED: no agent (no socket file, or nobody bound to it).
_ABSENT = {errno.ENOENT, errno.ECONNREFUSED, errno.ENOTDIR}
_DENIED = {errno.EACCES, errno.EPERM}


class DatagramSender:
    """``send()`` never blocks or raises; ``drops`` counts what was lost, by reason.

    After "agent_absent" or "permission" the sender stops calling ``sendto`` for ``retry_s`` (each
    record in that window is a counted drop), so a missing agent costs the training loop no
    syscall per step.
    """

    def __init__(self, path: str, retry_s: float = 1.0, backlog_records: int = HOOK_BACKLOG_RECORDS) -> None:
        self.path = path
        self.backlog: deque[tuple[bytes, int, str]] = deque()  # (datagram, records, why held)
        self.backlog_records = 0
        self.backlog_max = max(0, backlog_records)
        self.held_total = 0  # records ever held (delivered late or dropped later)
        self.late = 0  # records delivered from the backlog
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

    def send(self, data: bytes, records: int = 1, keep: bool = False) -> bool:
        """Send one datagram carrying ``records`` records; drops are counted in records. ``keep``:
        when the agent is absent or busy, hold it (bounded) and send it before the next kept one."""
        if keep and self.backlog and not self._send_backlog():
            self._hold(data, records, "agent_busy" if not self._retry_at else "agent_absent")
            return False
        reason = self._send(data, records)
        if reason is None:
            return True
        if keep and reason in ("agent_absent", "agent_busy") and self.backlog_max:
            self._hold(data, records, reason)
        else:
            self._drop(reason, records)
        return False

    def _hold(self, data: bytes, records: int, reason: str) -> None:
        self.backlog.append((data, records, reason))
        self.backlog_records += records
        self.held_total += records
        while self.backlog_records > self.backlog_max and self.backlog:
            _, n, why = self.backlog.popleft()  # the oldest go first: the newest say the most
            self.backlog_records -= n
            self._drop(why, n)

    def _send_backlog(self) -> bool:
        """Send held datagrams, oldest first, at most HOOK_BACKLOG_SENDS: True once none is left."""
        for _ in range(HOOK_BACKLOG_SENDS):
            if not self.backlog:
                return True
            data, n, _ = self.backlog[0]
            reason = self._send(data, n)
            if reason is not None:
                if reason not in ("agent_absent", "agent_busy"):  # never deliverable: give it up
                    self.backlog.popleft()
                    self.backlog_records -= n
                    self._drop(reason, n)
                return False
            self.backlog.popleft()
            self.backlog_records -= n
            self.late += n
        return not self.backlog

    def flush_backlog(self) -> None:
        """Send every held datagram the agent takes now (at close: the last chance)."""
        while self.backlog:
            before = len(self.backlog)
            self._send_backlog()
            if len(self.backlog) == before:
                return

    def drop_backlog(self) -> None:
        """At close: what is still held will never be sent; counted as dropped, by its reason."""
        while self.backlog:
            _, n, why = self.backlog.popleft()
            self._drop(why, n)
        self.backlog_records = 0

    def _send(self, data: bytes, records: int) -> str | None:
        """One sendto: None when sent (counted), else the reason it was not (not counted here)."""
        sock = self.sock
        if sock is None:
            return "no_socket"
        if self._retry_at:
            if time.monotonic_ns() < self._retry_at:
                return "agent_absent"
            self._retry_at = 0
        try:
            sock.sendto(data, self.path)
        except BlockingIOError:
            # EAGAIN: the agent's queue is full. Linux holds at most net.unix.max_dgram_qlen
            # (default 10) datagrams per receiver, whatever its buffer size: the agent drains it
            # from a dedicated thread, so this means the agent is stalled or overloaded.
            return "agent_busy"
        except OSError as exc:
            code = exc.errno
            if code in _ABSENT or code in _DENIED:
                self._retry_at = time.monotonic_ns() + self.retry_ns
                return "agent_absent" if code in _ABSENT else "permission"
            if code == errno.ENOBUFS:
                return "no_buffers"
            if code == errno.EMSGSIZE:
                return "too_large"
            return f"errno_{code}"
        self.sent += records
        self.datagrams += 1
        return None

    def recv(self, bufsize: int = 256) -> bytes | None:
        """One datagram addressed to us, or None when there is none. Never blocks or raises."""
        got = self.recv_from(bufsize)
        return got[0] if got is not None else None

    def recv_from(self, bufsize: int = 256) -> tuple[bytes, str | bytes | None] | None:
        """One datagram addressed to us and its sender's address (None: unbound), or None when there
        is none. Never blocks or raises."""
        sock = self.sock
        if sock is None:
            return None
        try:
            data, addr = sock.recvfrom(bufsize)
        except BlockingIOError:
            return None
        except OSError:
            self.recv_errors += 1
            return None
        return data, addr or None

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
