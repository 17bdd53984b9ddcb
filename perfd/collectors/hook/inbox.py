"""The hook collector's receive queue: who may take room in it is decided before a datagram is queued.

The socket may be writable by other users (mode 0666 for a job of another user). Checking a sender
only when ``collect()`` decodes its datagrams let another uid's flood fill the queue first: the job's
own records were then dropped as ``queue_full`` (122 of 300 in one attack). So the receiver
thread checks the kernel's credentials (``SCM_CREDENTIALS``, :mod:`perfd.collectors.hook.peers`) right off
``recvmsg``, with no ``/proc`` read: a datagram without credentials, from a pid this namespace does not
see, or from a uid that is not the job's is counted and dropped there, taking no room.

Among the job's own senders, each process (the kernel's pid) may hold at most ``1/HOOK_QUEUE_SHARES``
of the queue's datagrams and bytes: past its share its new datagrams are dropped and counted
(``queue_share_full``), never another process's. Only when more than ``HOOK_QUEUE_SHARES`` processes
hold their full share does the whole queue fill: then the oldest datagram goes (``queue_full``), as
before. Which pid a record may *name* is still decided later, in ``collect()`` (it needs ``/proc``).

Two threads use it: the receiver puts, ``collect()`` pops; every change is made under one lock (a
few dict and deque operations per datagram).
"""

from __future__ import annotations

import socket
import threading
from collections import deque

from perfd.collectors.hook import peers as P
from perfd.core.limits import HOOK_QUEUE_ITEM_OVERHEAD, HOOK_QUEUE_SHARES

Item = tuple[bytes, str | bytes, P.Sender]  # (datagram, the address it came from, its sender)


class Inbox:
    """Datagrams received and not yet collected, bounded in all (``max_items``, ``max_bytes``) and per
    sender (a ``1/HOOK_QUEUE_SHARES`` share of each)."""

    def __init__(self, max_items: int, max_bytes: int, job_uid: int) -> None:
        self.max_items, self.max_bytes, self.job_uid = max_items, max_bytes, job_uid
        self.share_items = max(1, max_items // HOOK_QUEUE_SHARES)
        self.share_bytes = max(1, max_bytes // HOOK_QUEUE_SHARES)
        self.items: deque[Item] = deque()
        self.bytes = 0  # what the queued datagrams cost (payload + HOOK_QUEUE_ITEM_OVERHEAD each)
        self._held: dict[int, list[int]] = {}  # sender pid -> [datagrams, bytes] it holds queued
        self._lock = threading.Lock()
        # Written under the lock by the receiver; collect() reads them and reports what is new.
        self.dropped = 0  # the oldest of the whole queue, for room (queue_full)
        self.over_share = 0  # a sender's new datagram past its share (queue_share_full)
        self.over_share_last = ""  # the latest such sender, for the log line
        self.refused: dict[str, int] = {}  # P.<reason> -> datagrams refused before queueing
        self.refused_last: dict[str, str] = {}  # P.<reason> -> the latest sender refused for it

    def put(self, data: bytes, addr: str | bytes, sender: P.Sender | None) -> None:
        """Receiver thread: queue a datagram, or count and drop it (see the module docstring)."""
        reason = self._refusal(sender)
        if sender is None or reason is not None:
            reason = reason or P.NO_CREDENTIALS
            who = f"pid {sender.pid} uid {sender.uid}" if sender is not None else "no credentials"
            with self._lock:
                self.refused[reason] = self.refused.get(reason, 0) + 1
                self.refused_last[reason] = who
            return
        cost = len(data) + HOOK_QUEUE_ITEM_OVERHEAD
        with self._lock:
            held = self._held.get(sender.pid)
            if held is not None and (held[0] >= self.share_items or held[1] + cost > self.share_bytes):
                self.over_share += 1
                self.over_share_last = f"pid {sender.pid} uid {sender.uid}"
                return
            while self.items and (len(self.items) >= self.max_items or self.bytes + cost > self.max_bytes):
                self._forget(self.items.popleft())
                self.dropped += 1
            self.items.append((data, addr, sender))
            self.bytes += cost
            if held is None:
                held = self._held[sender.pid] = [0, 0]
            held[0] += 1
            held[1] += cost

    def take_pending(self, sock: socket.socket) -> int:
        """At a stop, with the receiver thread ended: queue what ``sock`` still holds (non-blocking: the
        buffer holds what it holds). Returns the receive errors met (0 or 1: the read ends at one)."""
        sock.setblocking(False)
        while True:
            try:
                data, ancdata, _flags, addr = sock.recvmsg(65536, P.ANCILLARY_BYTES)
            except BlockingIOError:
                return 0
            except OSError:
                return 1
            self.put(data, addr, P.credentials(ancdata))

    def pop(self) -> Item | None:
        """``collect()``: the oldest queued datagram, None when there is none."""
        with self._lock:
            if not self.items:
                return None
            item = self.items.popleft()
            self._forget(item)
            return item

    def counters(self) -> tuple[dict[str, int], dict[str, str], int, int, str]:
        """``collect()``: a consistent copy of (refused, refused_last, dropped, over_share,
        over_share_last), the receiver thread may be changing them."""
        with self._lock:
            return (dict(self.refused), dict(self.refused_last), self.dropped, self.over_share,
                    self.over_share_last)

    def _refusal(self, sender: P.Sender | None) -> str | None:
        """Why a sender may take no room, from its credentials alone (no /proc read)."""
        if sender is None:
            return P.NO_CREDENTIALS
        if sender.pid <= 0:
            return P.UNKNOWN_SENDER
        if sender.uid != self.job_uid:
            return P.NOT_JOB_USER
        return None

    def _forget(self, item: Item) -> None:
        """An item left the queue: its cost leaves the totals and its sender's share (lock held)."""
        cost = len(item[0]) + HOOK_QUEUE_ITEM_OVERHEAD
        self.bytes -= cost
        held = self._held.get(item[2].pid)
        if held is not None:
            held[0] -= 1
            held[1] -= cost
            if held[0] <= 0:
                del self._held[item[2].pid]
