"""Non-blocking Unix datagram socket from the hook to the local agent, and back.

Why datagrams: one ``sendto`` per record, no connection state, no partial writes, and a full or
absent receiver is an immediate error instead of a stall. The training thread must never wait on
perfd: every failure is a counted drop, never an exception.

The socket is autobound (Linux abstract address), so the agent learns where to send profile
requests from the address of the records it receives; nothing is left on disk. That address is
world-listed in ``/proc/net/unix``, so who may send to it is decided here (docs/security.md, "The
hook's control channel"):

- The socket is *connected* to the agent's socket (``connect(2)`` on the path it sends to). The
  kernel then refuses, with EPERM at the sender, every datagram to it from any socket but that one
  (``unix_may_send``): another process, another socket of the agent's user, a socket whose path is
  later swapped for a link to the agent's all fail before anything is queued here, so they cannot
  fill this socket's queue either. The path is resolved once, at ``connect``: what the name points
  to later does not matter. While there is no agent to connect to, the socket is connected to
  itself, which no other socket may send to. Datagrams queued before a (re)connection are read and
  discarded (``stray``), unread.
- ``SO_PASSCRED``: every datagram carries its sender's uid as the kernel gives it
  (``SCM_CREDENTIALS``), and a control datagram is taken only from the uid that owns the agent's
  socket file (``agent_uid``, read right before ``connect``). That covers the moment between an
  agent's restart being noticed (the kernel drops the connection on the failed send) and this socket
  closing itself again.

Why not the sender's pid, or a secret: the hook is never told which process the agent is (it may
restart, and a containerised job sees a host agent's pid as 0), and a per-launch secret would have
to reach every job, including those started without ``perfd launch``, through an environment every
child inherits and a launcher may log. The socket the hook sends to is what it was told; the kernel
can say that a datagram came from exactly that socket.

Step records sent while the agent is absent or busy are kept (``keep=True``): a job started before
its agent listens, or an agent stalled for a moment, loses none of its first steps. The backlog is
bounded in records and bytes (perfd.core.limits.HOOK_BACKLOG_RECORDS, HOOK_BACKLOG_BYTES); past it the
oldest are dropped and counted, and whatever is still held when the hook closes is counted as
dropped too: at the close, while the agent is there but busy, it is tried again for up to
HOOK_CLOSE_DRAIN_S (an absent agent is not waited for). Held datagrams go out, oldest first, before
the next one kept (at most HOOK_BACKLOG_SENDS per call: the agent queues ~10).
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import time
from collections import deque

from perfd.core.limits import HOOK_BACKLOG_BYTES, HOOK_BACKLOG_RECORDS, HOOK_BACKLOG_SENDS

_DRAIN_POLL_S = 0.005  # a busy agent's queue tried again this often while a close drains it

# errno -> drop reason. ENOENT/ECONNREFUSED: no agent (no socket file, or nobody bound to it).
_ABSENT = {errno.ENOENT, errno.ECONNREFUSED, errno.ENOTDIR}
_DENIED = {errno.EACCES, errno.EPERM}
_UCRED = struct.Struct("iII")  # struct ucred: pid, uid, gid
_ANCILLARY = socket.CMSG_SPACE(_UCRED.size) if hasattr(socket, "CMSG_SPACE") else 64
_STRAY_MAX = 256  # datagrams read and discarded at one (re)connection (the kernel queues ~10)


def _sender_uid(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    kind = getattr(socket, "SCM_CREDENTIALS", None)
    for level, typ, data in ancdata:
        if level == socket.SOL_SOCKET and typ == kind and len(data) >= _UCRED.size:
            return int(_UCRED.unpack_from(data)[1])
    return None


class DatagramSender:
    """``send()`` never blocks or raises; ``drops`` counts what was lost, by reason.

    After "agent_absent" or "permission" the sender stops calling ``sendto`` for ``retry_s`` (each
    record in that window is a counted drop), so a missing agent costs the training loop no
    syscall per step.
    """

    def __init__(self, path: str, retry_s: float = 1.0, backlog_records: int = HOOK_BACKLOG_RECORDS,
                 backlog_bytes: int = HOOK_BACKLOG_BYTES) -> None:
        self.path = path
        self.backlog: deque[tuple[bytes, int, str]] = deque()  # (datagram, records, why held)
        self.backlog_records = 0
        self.backlog_bytes = 0
        self.backlog_max = max(0, backlog_records)
        self.backlog_bytes_max = max(0, backlog_bytes)
        self.held_total = 0  # records ever held (delivered late or dropped later)
        self.late = 0  # records delivered from the backlog
        self.retry_ns = int(retry_s * 1e9)
        self._refused: str | None = None  # why the agent did not take the last held datagram tried
        self.sent = 0  # records
        self.datagrams = 0
        self.dropped = 0  # records
        self.drops: dict[str, int] = {}
        self.recv_errors = 0
        self._retry_at = 0
        self.can_receive = False
        # Connected to the agent's socket: only it can send to us (see the module). Written by the
        # thread that sends, read by the one that polls for requests.
        self.connected = False
        self.agent_uid: int | None = None  # the owner of the agent's socket file at connect time
        self.stray = 0  # datagrams found queued at a (re)connection: read and discarded
        self._own: str | bytes | None = None
        self.sock: socket.socket | None
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.setblocking(False)
        except OSError:
            self.sock = None
            return
        self.sock = sock
        try:
            opt = getattr(socket, "SO_PASSCRED", None)
            if opt is not None:
                sock.setsockopt(socket.SOL_SOCKET, opt, 1)
            sock.bind("")  # autobind: an abstract address the agent can reply to (Linux)
            self._own = sock.getsockname()
            self.can_receive = opt is not None and self._close_to_all()
        except OSError:
            pass  # records still go out; profile requests cannot reach us
        if self._connect() is not None:  # the agent is not there yet: the first send tries again
            self._retry_at = 0

    def _close_to_all(self) -> bool:
        """Connect the socket to itself: no other socket may send to it (no agent to listen to)."""
        self.connected = False
        sock = self.sock
        if sock is None or self._own is None:
            return False
        try:
            sock.connect(self._own)
        except OSError:
            return False
        self._discard_queued()
        return True

    def _discard_queued(self) -> None:
        sock = self.sock
        if sock is None:
            return
        for _ in range(_STRAY_MAX):
            try:
                sock.recv(1)
            except OSError:  # BlockingIOError: none left
                return
            self.stray += 1

    def _connect(self) -> str | None:
        """Connect to the agent's socket (None), or say why not (the reason a send was not made)."""
        sock = self.sock
        if sock is None:
            return "no_socket"
        if self._retry_at:
            if time.monotonic_ns() < self._retry_at:
                return "agent_absent"
            self._retry_at = 0
        try:
            owner = os.stat(self.path).st_uid
            sock.connect(self.path)
        except BlockingIOError:
            return "agent_busy"
        except OSError as exc:
            code = exc.errno
            self._retry_at = time.monotonic_ns() + self.retry_ns
            if code in _DENIED:
                return "permission"
            return "agent_absent" if code in _ABSENT else f"errno_{code}"
        self.agent_uid = owner
        self._discard_queued()  # queued while nobody was filtered, or from the agent before: not read
        self.connected = True
        return None

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
        self.backlog_bytes += len(data)
        self.held_total += records
        while (self.backlog_records > self.backlog_max or self.backlog_bytes > self.backlog_bytes_max) \
                and self.backlog:
            old, n, why = self.backlog.popleft()  # the oldest go first: the newest say the most
            self.backlog_records -= n
            self.backlog_bytes -= len(old)
            self._drop(why, n)

    def _send_backlog(self) -> bool:
        """Send held datagrams, oldest first, at most HOOK_BACKLOG_SENDS: True once none is left."""
        for _ in range(HOOK_BACKLOG_SENDS):
            if not self.backlog:
                return True
            data, n, _ = self.backlog[0]
            reason = self._send(data, n)
            self._refused = reason  # why the agent did not take the last one tried (None: it did)
            if reason is not None:
                if reason not in ("agent_absent", "agent_busy"):  # never deliverable: give it up
                    self.backlog.popleft()
                    self.backlog_records -= n
                    self.backlog_bytes -= len(data)
                    self._drop(reason, n)
                return False
            self.backlog.popleft()
            self.backlog_records -= n
            self.backlog_bytes -= len(data)
            self.late += n
        return not self.backlog

    def flush_backlog(self, drain_s: float = 0.0) -> None:
        """Send every held datagram the agent takes now (at close: the last chance); while the agent is
        there but busy (its queue full), try again for up to ``drain_s``."""
        deadline = time.monotonic() + drain_s
        while self.backlog:
            before = len(self.backlog)
            self._send_backlog()
            if len(self.backlog) == before:
                if self._refused != "agent_busy" or time.monotonic() >= deadline:
                    return
                time.sleep(_DRAIN_POLL_S)

    def drop_backlog(self) -> None:
        """At close: what is still held will never be sent; counted as dropped, by its reason."""
        while self.backlog:
            _, n, why = self.backlog.popleft()
            self._drop(why, n)
        self.backlog_records = 0
        self.backlog_bytes = 0

    def _send(self, data: bytes, records: int) -> str | None:
        """One send: None when sent (counted), else the reason it was not (not counted here)."""
        if not self.connected:
            reason = self._connect()
            if reason is not None:
                return reason
        reason = self._send_connected(data)
        if reason == "reconnect":
            # The agent's socket closed (an agent restart: the kernel dropped our connection). Stop
            # listening to anyone, then one new connection now (a restarted agent is already there).
            self._close_to_all()
            reason = self._connect() or self._send_connected(data)
            if reason == "reconnect":
                self._close_to_all()
                reason = "agent_absent"
        if reason is None:
            self.sent += records
            self.datagrams += 1
        return reason

    def _send_connected(self, data: bytes) -> str | None:
        sock = self.sock
        if sock is None:
            return "no_socket"
        try:
            sock.send(data)
        except BlockingIOError:
            # EAGAIN: the agent's queue is full. Linux holds at most net.unix.max_dgram_qlen
            # (default 10) datagrams per receiver, whatever its buffer size: the agent drains it
            # from a dedicated thread, so this means the agent is stalled or overloaded.
            return "agent_busy"
        except OSError as exc:
            code = exc.errno
            if code in (errno.ECONNREFUSED, errno.ENOTCONN, errno.ECONNRESET):
                return "reconnect"
            if code in _DENIED:
                self._retry_at = time.monotonic_ns() + self.retry_ns
                return "permission"
            if code == errno.ENOBUFS:
                return "no_buffers"
            if code == errno.EMSGSIZE:
                return "too_large"
            return f"errno_{code}"
        return None

    def recv_control(self, bufsize: int = 256) -> tuple[bytes, int | None] | None:
        """One datagram from the agent's socket and its sender's uid (the kernel's), or None when
        there is none or no agent is connected. Never blocks or raises. A datagram cut short (longer
        than ``bufsize``) comes back cut: no request is that long, the caller refuses it."""
        sock = self.sock
        if sock is None or not self.connected:
            return None
        try:
            data, ancdata, _flags, _addr = sock.recvmsg(bufsize, _ANCILLARY)
        except BlockingIOError:
            return None
        except OSError:
            self.recv_errors += 1
            return None
        return data, _sender_uid(ancdata)

    def address(self) -> str | bytes | None:
        return self._own

    def close(self) -> None:
        self.connected = False
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None
