"""Who may open an ingest stream and what a stream may bring: authentication, the binding of an
agent id to one identity, and the caps (open streams, event-loop lag, series, event size, silence).

Apart from the server (perfd.transport.server) so that the checks that refuse a stream or part of
a message read in one place. The server calls each where it always did, in the same order.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, MutableMapping

import grpc

from perfd.core import events
from perfd.core import limits as L
from perfd.core.refusals import Refusals
from perfd.transport.codec import sample_count
from perfd.transport.gen import perfd_pb2 as pb
from perfd.transport.grpc_api import ServicerContext
from perfd.transport.security import (
    AUTH_HEADER,
    UNAUTHENTICATED_PREFIX,
    IdentityPolicy,
    TokenFile,
    peer_identity,
)
from perfd.transport.stream import AgentStream


class StreamRefused(Exception):
    """``retry_after_s``: when the client may come back (L.RETRY_AFTER_KEY, sent as initial and as
    trailing metadata: perfd.transport.client.retry_after says why both)."""

    def __init__(self, code: grpc.StatusCode, reason: str, text: str,
                 retry_after_s: float | None = None) -> None:
        super().__init__(text)
        self.code, self.reason, self.retry_after_s = code, reason, retry_after_s

    def hint_metadata(self) -> tuple[tuple[str, str], ...]:
        if self.retry_after_s is None:
            return ()
        return ((L.RETRY_AFTER_KEY, str(round(self.retry_after_s * 1000))),)


async def refuse_stream(context: ServicerContext, request_iterator: AsyncIterator[pb.AgentMessage],
                        exc: StreamRefused) -> None:
    """End a stream refused before it began. The hint of when to come back goes as initial metadata first,
    then with the status: an agent's grpcio may lose the status's trailers (perfd.transport.client.
    retry_after says when), never the initial metadata."""
    if exc.code == grpc.StatusCode.UNAUTHENTICATED:
        await _drain_refused(request_iterator)
    if hint := exc.hint_metadata():
        await context.send_initial_metadata(hint)
    await context.abort(exc.code, str(exc), hint)


async def _drain_refused(request_iterator: AsyncIterator[pb.AgentMessage]) -> None:
    """Take what an unauthenticated agent is already writing (its Hello, then the batches a reconnect
    resends at once) before its stream is ended: ended under one of those writes, the agent's call
    finishes "INTERNAL: Internal error from Core" (gRPC core loses the status in the race) and the
    agent never learns why. Bounded in time and count (perfd.core.limits); nothing read is used."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + L.REFUSAL_DRAIN_S
    wait = L.REFUSAL_DRAIN_S
    try:
        for _ in range(L.REFUSAL_DRAIN_MESSAGES):
            wait = min(wait, deadline - loop.time())
            if wait <= 0:
                return
            await asyncio.wait_for(anext(request_iterator), wait)
            wait = L.REFUSAL_QUIET_S  # after the first, what follows it at once
    except (Exception, asyncio.CancelledError):
        return  # the agent went quiet (the wait's timeout), hung up, or the stream ended


def authenticate(context: ServicerContext, token: TokenFile | None) -> tuple[str, int | None]:
    """(the identity of the stream behind ``context``, the generation of the token it carried);
    with ``token`` it must carry the bearer token."""
    gen = None
    if token is not None:
        md = dict(context.invocation_metadata() or ())
        gen = token.check_generation(md.get(AUTH_HEADER))
        if gen is None:
            raise StreamRefused(grpc.StatusCode.UNAUTHENTICATED, L.REFUSED_UNAUTHENTICATED,
                                f"stream from {context.peer()} without a valid bearer token")
    return peer_identity(context, gen is not None), gen


# Admission reads the first Acks of this long ago, and counts a stream that has not said Hello as
# waiting for this long after it opened (an agent writes its Hello at once).
FIRST_ACK_WINDOW_S = 10.0
HELLO_GRACE_S = 2.0


def _thread_demand_s() -> float:
    """Seconds the calling thread has run or waited to run (Linux schedstat: on a CPU, then in the run
    queue), so that a loop with no time left reads busy on a crowded host too; elsewhere its CPU time."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            run_ns, wait_ns = f.read().split()[:2]
        return (int(run_ns) + int(wait_ns)) / 1e9
    except (OSError, ValueError):
        return time.thread_time()


class Backlog:
    """How far behind the server runs, as admission reads it (the event loop's thread only): the
    streams opened within HELLO_GRACE_S whose Hello is not read yet (in a connect storm they wait in
    gRPC for the loop), those whose Hello was read and not answered (no first Ack), each oldest first,
    how long the latest answered ones waited from their open and how fast they come, and the loop's
    business. A stream that
    says nothing counts only for HELLO_GRACE_S: a client that opens streams and stays silent cannot
    hold admission shut for the Hello timeout (it has to open MAX_OPENING_STREAMS every grace)."""

    def __init__(self, demand: Callable[[], float] = _thread_demand_s) -> None:
        # ``demand``: the seconds the loop's thread has run or waited to run so far (a test gives its
        # own, to drive the loop's business on its clock).
        self._thread_demand = demand
        self._unheard: OrderedDict[AgentStream, None] = OrderedDict()
        self._opening: dict[AgentStream, None] = {}
        self._first_acks: deque[tuple[float, float]] = deque(maxlen=4096)  # (answered at, waited)
        # The share of the last ticks the loop's thread was on a CPU or waiting for one (an average over
        # ~2 ticks; /api/stats transport.loop_busy_pct): near 1, the loop has no time left; and since
        # when it has been so (None: it is not).
        self.busy = 0.0
        self.busy_since: float | None = None
        self._demand = demand()
        self._tick_at: float | None = None

    def opened(self, conn: AgentStream) -> None:
        self._unheard[conn] = None

    def heard(self, conn: AgentStream) -> None:
        """Its Hello was read: it waits for its first Ack."""
        self._unheard.pop(conn, None)
        self._opening[conn] = None

    def answered(self, conn: AgentStream, now: float) -> None:
        if self._opening.pop(conn, 0) is None:  # its first Ack: how long it waited
            self._first_acks.append((now, now - conn.opened_at))

    def closed(self, conn: AgentStream) -> None:
        self._unheard.pop(conn, None)
        self._opening.pop(conn, None)

    def tick(self, now: float) -> None:
        """Called on the loop's thread every liveness tick: how busy the loop was since the last."""
        demand = self._thread_demand()
        if self._tick_at is not None:
            busy = min(1.0, (demand - self._demand) / max(1e-6, now - self._tick_at))
            self.busy = (self.busy + busy) / 2
            if self.busy < L.MAX_LOOP_BUSY:
                self.busy_since = None
            elif self.busy_since is None:
                self.busy_since = now
        self._demand, self._tick_at = demand, now

    def opening(self, now: float | None = None) -> int:
        """Streams opened and not answered: Hello read and no Ack yet, or no Hello yet within its grace."""
        if now is not None:
            while self._unheard:
                first = next(iter(self._unheard))
                if first.opened_at >= now - HELLO_GRACE_S:
                    break
                self._unheard.popitem(last=False)  # silent past its grace: no longer counted
        return len(self._unheard) + len(self._opening)

    def first_ack_wait(self, now: float) -> float:
        """How long streams wait for their first Ack now: the longest of the one waiting longest (its
        Hello read) and the median of those answered within the last FIRST_ACK_WINDOW_S."""
        oldest = next(iter(self._opening), None)
        waiting = now - oldest.opened_at if oldest is not None else 0.0
        recent = sorted(w for t, w in self._first_acks if now - t <= FIRST_ACK_WINDOW_S)
        return max(waiting, recent[len(recent) // 2] if recent else 0.0)

    def answer_rate(self, now: float) -> float:
        """First Acks a second over the last FIRST_ACK_WINDOW_S (0.0: too few to say)."""
        recent = [t for t, _w in self._first_acks if now - t <= FIRST_ACK_WINDOW_S]
        if len(recent) < 8:
            return 0.0
        return len(recent) / max(1.0, now - recent[0])

    def now(self, now: float) -> tuple[int, float, float, float, float]:
        """(opening streams, first-Ack wait, answers a second, business, busy for): admit_stream's last
        five."""
        busy_for = now - self.busy_since if self.busy_since is not None else 0.0
        return self.opening(now), self.first_ack_wait(now), self.answer_rate(now), self.busy, busy_for


def admit_stream(open_streams: int, loop_lag_s: float, limits: L.Limits, opening: int = 0,
                 first_ack_wait_s: float = 0.0, answer_rate: float = 0.0, busy: float = 0.0,
                 busy_for_s: float = 0.0) -> None:
    """Refuse a new stream past the stream cap, or while the aggregator is saturated: its event loop
    runs too late, or is busy all the time (``busy``, for ``busy_for_s`` so far), streams wait too long
    for their first Ack (``first_ack_wait_s``), or more streams wait for it (``opening``) than it
    answers in half that time at the rate it answers them now (``answer_rate``, per second; at least
    ``max_opening_streams``). Before the Hello is read: a
    refusal costs a stream open, an accepted agent its whole series table; open streams keep being
    served. An overload refusal says when to come back: about as long as the backlog takes to clear."""
    if open_streams >= limits.max_streams:
        raise StreamRefused(grpc.StatusCode.RESOURCE_EXHAUSTED, L.REFUSED_STREAMS,
                            f"{open_streams} streams open (cap {limits.max_streams})",
                            L.MAX_RETRY_AFTER_S)
    room = max(limits.max_opening_streams, int(answer_rate * limits.max_first_ack_wait_s / 2))
    why = None
    if loop_lag_s > limits.max_loop_lag_s:
        why = f"the event loop runs {loop_lag_s:.1f} s late (limit {limits.max_loop_lag_s:g} s)"
    elif busy >= limits.max_loop_busy and busy_for_s >= limits.max_loop_busy_s:
        why = (f"the event loop has been busy {100 * busy:.0f}% of the time for {busy_for_s:.0f} s (limit "
               f"{100 * limits.max_loop_busy:.0f}% for {limits.max_loop_busy_s:g} s)")
    elif first_ack_wait_s > limits.max_first_ack_wait_s:
        why = (f"streams wait {first_ack_wait_s:.1f} s for their first Ack (limit "
               f"{limits.max_first_ack_wait_s:g} s)")
    elif opening >= room:
        why = f"{opening} streams wait for their first Ack (room for {room} at {answer_rate:.0f}/s)"
    if why is not None:
        clear_s = opening / answer_rate if answer_rate > 0 else opening / max(1, limits.max_opening_streams)
        retry = min(L.MAX_RETRY_AFTER_S, max(L.MIN_RETRY_AFTER_S, loop_lag_s, first_ack_wait_s, clear_s,
                                             busy_for_s if busy_for_s >= limits.max_loop_busy_s else 0.0))
        raise StreamRefused(grpc.StatusCode.UNAVAILABLE, L.REFUSED_OVERLOADED,
                            f"overloaded: {why}; retry in {retry:.0f} s", retry)


def check_agent_id(policy: IdentityPolicy | None, conn: AgentStream, agent_id: str, bound: str | None,
                   live: AgentStream | None) -> None:
    """Refuse ``conn`` the use of ``agent_id`` when the identity policy forbids it, or when the id
    is ``bound`` to another identity (see IngestServer's docstring); ``live`` is the id's stream."""
    if policy is not None and not policy.may_use_agent_id(conn.identity, agent_id):
        raise StreamRefused(grpc.StatusCode.PERMISSION_DENIED, L.REFUSED_POLICY,
                            f"the identity policy does not let {conn.identity} ({conn.peer}) use agent "
                            f"id {agent_id[:64]!r}")
    if bound is not None and bound != conn.identity:
        unauthenticated = (bound.startswith(UNAUTHENTICATED_PREFIX)
                           and conn.identity.startswith(UNAUTHENTICATED_PREFIX))
        if not unauthenticated or (live is not None and not live.closed):
            raise StreamRefused(grpc.StatusCode.PERMISSION_DENIED, L.REFUSED_IDENTITY,
                                f"agent id {agent_id!r} is bound to other credentials; "
                                f"refused the stream from {conn.peer}")


def trim_batch(agent: str, conn: AgentStream, b: pb.Batch, limits: L.Limits,
               refusals: Refusals) -> int | None:
    """Apply the per-message caps; None when the whole batch is refused (it is acknowledged all the
    same: resending it would be refused again), else the bytes cut from its events. An event over
    the wire cap is refused whole; one of a kind only the event log reads is cut to what the log
    keeps (perfd.core.events.cut), before it is journalled or delivered."""
    if b.series and len(conn.series) + len(b.series) > limits.max_series_per_agent:
        refusals.refuse(L.REFUSED_SERIES, f"batch {b.seq} of agent {agent} would define "
                        f"{len(conn.series) + len(b.series)} series (cap "
                        f"{limits.max_series_per_agent}); batch refused",
                        max(1, sample_count(b)), agent=agent)
        return None
    if not b.events:
        return 0
    big = [i for i, e in enumerate(b.events) if e.ByteSize() > limits.max_event_bytes]
    for i in reversed(big):
        del b.events[i]
    if big:
        refusals.refuse(L.REFUSED_EVENT_BYTES, f"{len(big)} event(s) of agent {agent} larger "
                        f"than {limits.max_event_bytes} bytes", len(big), agent=agent)
    cut_n = cut_bytes = 0
    for e in b.events:
        if e.ByteSize() <= L.MAX_KEPT_EVENT_BYTES or events.kept_whole(e.kind):
            continue
        e.text, e.payload_json, n = events.cut(e.text, e.payload_json, L.MAX_KEPT_EVENT_BYTES)
        n += _cut_map(e.labels) + _cut_map(e.links)
        cut_n, cut_bytes = cut_n + 1, cut_bytes + n
    if cut_n:
        refusals.refuse(L.REFUSED_EVENT_CUT, f"{cut_n} event(s) of agent {agent} over "
                        f"{L.MAX_KEPT_EVENT_BYTES} bytes kept cut ({cut_bytes} bytes cut)", cut_n,
                        agent=agent)
    return cut_bytes


def _cut_map(m: MutableMapping[str, str]) -> int:
    """An event's labels or links within the caps of a series' labels; returns the bytes cut."""
    cut = 0
    for i, k in enumerate(sorted(m)):
        v = m[k]
        if i >= L.MAX_LABELS_PER_SERIES or len(k) > L.MAX_LABEL_VALUE_BYTES:
            cut += len(k) + len(v)
            del m[k]
        elif len(v.encode()) > L.MAX_LABEL_VALUE_BYTES:
            m[k] = v.encode()[:L.MAX_LABEL_VALUE_BYTES].decode("utf-8", "ignore")
            cut += len(v.encode()) - len(m[k].encode())
    return cut


def check_liveness(conn: AgentStream, now: float, limits: L.Limits, refusals: Refusals) -> None:
    """Close ``conn`` when it sent no Hello in time, or has been silent too long."""
    if conn.agent_id is None and now - conn.opened_at > limits.hello_timeout_s:
        refusals.refuse(L.REFUSED_HELLO_TIMEOUT, f"stream from {conn.peer} sent no Hello "
                        f"within {limits.hello_timeout_s:g} s; closed")
        conn.close(grpc.StatusCode.DEADLINE_EXCEEDED, "no Hello")
    elif conn.agent_id is not None and now - conn.last_msg_at > limits.agent_silence_s:
        refusals.refuse(L.REFUSED_SILENT, f"agent {conn.agent_id} ({conn.peer}) sent nothing "
                        f"for {limits.agent_silence_s:g} s; stream closed", agent=conn.agent_id)
        conn.close(grpc.StatusCode.UNAVAILABLE, "silent stream")


def check_token(conn: AgentStream, generation: int | None, refusals: Refusals) -> bool:
    """Close ``conn`` when the bearer token changed since it authenticated (``generation``: the
    current one, None without a token): the agent reconnects with the token its file holds now, or
    is refused. True when closed."""
    if generation is None or conn.token_generation == generation or conn.closed:
        return False
    refusals.refuse(L.REFUSED_TOKEN_ROTATED, f"stream of agent {str(conn.agent_id)[:64]} ({conn.peer}) "
                    "authenticated with a bearer token since rotated; closed", agent=conn.agent_id)
    conn.close(grpc.StatusCode.UNAUTHENTICATED, "the bearer token was rotated: reconnect with the new one")
    return True
