"""The requests the agent sends to the step hooks (profile ranges, traces), and which answers it takes.

A status is taken only for a request this agent sent to that process: keyed by (rank, request id),
the process the request went to (its kernel-verified pid) must be the one answering. Any other status
(another process's, a request never sent, one already ended) is refused by the collector and counted
(``sender:unsolicited_status``): ids 1..5,000 pre-marked "rejected" by another sender once failed the
next real capture. Bounded: at most HOOK_MAX_OUTSTANDING requests are remembered,
the oldest forgotten first; a request is forgotten when its last answer arrives.
"""

from __future__ import annotations

import errno
import socket
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perfd.collectors.collector import Collector
from perfd.core.limits import HOOK_MAX_OUTSTANDING
from perfd.hook import wire

if TYPE_CHECKING:
    from perfd.collectors.hook.peers import HookPeer

# The answers after which a request has nothing more to say: a range ends stopped, a trace written.
_ENDS_RANGE = frozenset({wire.PROFILE_STOPPED, wire.PROFILE_REJECTED, wire.PROFILE_FAILED,
                         wire.PROFILE_CANCELLED})
_ENDS_TRACE = frozenset({wire.PROFILE_WRITTEN, wire.PROFILE_REJECTED, wire.PROFILE_FAILED,
                         wire.PROFILE_CANCELLED})


@dataclass(frozen=True)
class Sent:
    """A request sent to a rank's hook: the process it went to and whether it asked for a trace."""

    pid: int
    trace: bool


class Requests:
    """Request ids and the requests in flight (the capture threads send, the collector's thread takes
    the answers)."""

    def __init__(self, cap: int = HOOK_MAX_OUTSTANDING) -> None:
        self.cap = cap
        self._lock = threading.Lock()  # guards _next and _sent
        self._next = 1
        self._sent: OrderedDict[tuple[int, int], Sent] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sent)

    def new_id(self) -> int:
        with self._lock:
            rid = self._next
            self._next = (rid + 1) & 0xFFFFFFFF or 1
            return rid

    def sent(self, rank: int, request_id: int, pid: int, trace: bool) -> None:
        with self._lock:
            self._sent[(rank, request_id)] = Sent(pid, trace)
            while len(self._sent) > self.cap:
                self._sent.popitem(last=False)

    def unsent(self, rank: int, request_id: int) -> None:
        """The request could not be sent after all: no answer is due."""
        with self._lock:
            self._sent.pop((rank, request_id), None)

    def answer(self, rank: int, request_id: int, pid: int, state: int) -> Sent | None:
        """The request a status from ``pid`` answers, None when it answers none this agent sent it;
        forgotten once ``state`` ends it."""
        key = (rank, request_id)
        with self._lock:
            got = self._sent.get(key)
            if got is None or got.pid != pid:
                return None
            if state in (_ENDS_TRACE if got.trace else _ENDS_RANGE):
                self._sent.pop(key, None)
            return got


class RequestSender(Collector):
    """The hook collector's requests to its hooks (its base class): sent from the collector's own
    socket, the one each hook is connected to (perfd.hook.sender: no other socket reaches a hook)."""

    peers: dict[int, HookPeer]  # rank -> its latest sender (its pid and address)
    sock: socket.socket | None
    requests: Requests
    job_served: str | None  # the job this agent serves (its config's), said in a refusal notice
    told_refused: OrderedDict[int, None]  # pids told why their records are refused (tell_refused)

    def request_profile(self, rank: int, start_step: int, num_steps: int) -> tuple[int, int] | None:
        """Ask ``rank``'s hook to run cudaProfilerStart/Stop around steps [start, start+num).

        Returns (the pid it went to, the request id): its answers arrive as ``hook_profile`` events
        of that pid. None when the rank is unknown here or the send failed (counted). Pick
        ``start_step`` a few steps ahead of the rank's last reported step: the hook polls for requests
        at most every 50 ms and a start that has passed begins at the next step (the ``accepted``
        event says which).
        """
        return self._send_request(rank, wire.ProfileRequest(0, start_step, num_steps))

    def cancel_profile(self, rank: int) -> tuple[int, int] | None:
        return self._send_request(rank, wire.ProfileRequest(0, 0, 0, cancel=True))

    def request_trace(self, rank: int, start_step: int, num_steps: int,
                      stack: bool = False) -> tuple[int, int] | None:
        """Ask ``rank``'s hook to trace steps [start, start+num) with torch's Kineto profiler in its
        process (perfd.hook.trace; the same answers as request_profile, then ``written`` with the
        file the hook wrote in its own folder). None when the rank is unknown or the send failed."""
        return self._send_request(rank, wire.TraceRequest(0, start_step, num_steps, stack))

    def tell_refused(self, pid: int, addr: str | bytes, other_job: bool) -> None:
        """Tell a refused process's hook why, once per process: it says so on the job's stderr (a
        script run beside another job's agent would otherwise send into it in silence). Best effort: a
        full or gone socket is counted, never waited on. ``other_job``: the process declares another
        job; else no perfd launch names it and this agent serves a launch's job."""
        if pid in self.told_refused or self.sock is None or not addr:
            return
        self.told_refused[pid] = None
        while len(self.told_refused) > HOOK_MAX_OUTSTANDING:
            self.told_refused.popitem(last=False)
        code = wire.REFUSED_OTHER_JOB if other_job else wire.REFUSED_NOT_LAUNCHED
        try:
            self.sock.sendto(wire.pack_refused(wire.Refused(code, self.job_served or "")), addr)
        except OSError as exc:
            self.count_error("refusal_notice_failed", repr(exc))

    def _send_request(self, rank: int,
                      req: wire.ProfileRequest | wire.TraceRequest) -> tuple[int, int] | None:
        peer = self.peers.get(rank)
        if peer is None or self.sock is None:
            self.count_error("profile_request_unknown_rank", f"rank {rank}")
            return None
        req.request_id = self.requests.new_id()
        trace = isinstance(req, wire.TraceRequest)
        data = (wire.pack_trace_request(req) if isinstance(req, wire.TraceRequest)
                else wire.pack_profile_request(req))
        if not (isinstance(req, wire.ProfileRequest) and req.cancel):  # a cancel is answered for its range
            self.requests.sent(rank, req.request_id, peer.pid, trace)
        try:
            self.sock.sendto(data, peer.address)
        except OSError as exc:
            self.requests.unsent(rank, req.request_id)
            if isinstance(exc, BlockingIOError):
                self.count_error("profile_request_busy", f"rank {rank}")
            else:
                reason = "gone" if exc.errno in (errno.ECONNREFUSED, errno.ENOENT) else "failed"
                self.count_error(f"profile_request_{reason}", f"rank {rank}: {exc}")
            return None
        return peer.pid, req.request_id
