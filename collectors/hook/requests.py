"""The requests the agent sends to the step hooks (profile ranges, traces), and which answers it takes.

A status is taken only for a request this agent sent to that process: keyed by (rank, request id),
the process the request went to (its kernel-verified pid) must be the one answering. Any other status
(another process's, a request never sent, one already ended) is refused by the collector and counted
(``sender:unsolicited_status``): ids 1..5,000 pre-marked "rejected" by another sender once failed the
next real capture (issue 54 item 4). Bounded: at most HOOK_MAX_OUTSTANDING requests are remembered,
the oldest forgotten first; a request is forgotten when its last answer arrives.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from perfd.hook import wire
from perfd.limits import HOOK_MAX_OUTSTANDING

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
    """Request ids and the requests in flight (collector thread and capture threads: the ids and the
    table are changed under the GIL by single dict operations; a race costs at most one answer)."""

    def __init__(self, cap: int = HOOK_MAX_OUTSTANDING) -> None:
        self.cap = cap
        self._next = 1
        self._sent: OrderedDict[tuple[int, int], Sent] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sent)

    def new_id(self) -> int:
        rid = self._next
        self._next = (rid + 1) & 0xFFFFFFFF or 1
        return rid

    def sent(self, rank: int, request_id: int, pid: int, trace: bool) -> None:
        self._sent[(rank, request_id)] = Sent(pid, trace)
        while len(self._sent) > self.cap:
            self._sent.popitem(last=False)

    def answer(self, rank: int, request_id: int, pid: int, state: int) -> Sent | None:
        """The request a status from ``pid`` answers, None when it answers none this agent sent it;
        forgotten once ``state`` ends it."""
        key = (rank, request_id)
        got = self._sent.get(key)
        if got is None or got.pid != pid:
            return None
        if state in (_ENDS_TRACE if got.trace else _ENDS_RANGE):
            self._sent.pop(key, None)
        return got
