"""The aggregator's event log and the routing of events by kind (perfd.core.events).

A state event goes to the handler its kind registered (the node view for process lists, the
serving view for serving reports, ...) and not into the log; a history event goes into the
bounded log and to every listener (the capture coordinator follows capture progress this way). A
new source registers a handler for its kind: no branch here. Listeners get each event with the agent
that sent it (``agent``): the capture coordinator takes a capture's progress only from the agents
the capture was sent to.

Whose an event is, the aggregator says, never the sender: an event's ``job`` is the job it names (the
guard let its sender speak for that job: perfd.aggregator.guard) or, for a job-less event, the one job
its sender hosts (``hosted``, what the aggregator knows of that agent); a sender hosting none or several
leaves it job-less. A label the sender wrote (``labels.job``) attributes nothing: ``?job=X`` lists
only the events attributed to X (a stranger's job-less events, some labelled with a
job, were listed as that job's).

Bounded by count (``max_events``) and by bytes (perfd.core.limits.MAX_EVENT_LOG_BYTES), and divided into
pools so that no sender's flood evicts another's events: a job's events are one pool (its hosts and
node agents write it), each sender's job-less events another. A pool holds at most one share of the
log's count and bytes (perfd.core.limits.EVENT_LOG_SHARES); past it the pool's own oldest go, each counted
(``event_share``, perfd.core.refusals: logged at most once a REFUSAL_LOG_INTERVAL_S). Its own oldest rather
than the newcomer: the newest events are what an operator reads, and a refused newcomer would freeze
a pool at its first burst; the journal and the replay see every event as before, so a restart rebuilds
the same pools. When the log as a whole is full, the pool holding the most events gives its oldest
(ties: the pool with the oldest event), so a pool never loses an event while a larger one exists.

What the log keeps of one event is at most MAX_KEPT_EVENT_BYTES of text and payload
(perfd.core.events.cut; handlers and listeners got it whole), counted in ``cut`` and ``cut_bytes``. Each
event kept gets a sequence number (``seq``, increasing), which /api/events pages by.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from perfd.core import events
from perfd.core import limits as L
from perfd.core.refusals import Refusals
from perfd.core.typed import obj

log = logging.getLogger(__name__)

# (agent id, event) -> False when the payload was malformed (counted)
Handler = Callable[[str, Mapping[str, object]], bool]
Listener = Callable[[Mapping[str, object]], None]
MAX_EVENTS = 1000  # history kept for /api/events, newest last
PoolKey = tuple[str, str]  # ("job", the job) or ("agent", the sender of job-less events)


def kept(ev: Mapping[str, object]) -> tuple[dict[str, object], int, int]:
    """(what the log keeps of ``ev``, the bytes cut, its size as kept): text and payload within
    MAX_KEPT_EVENT_BYTES (perfd.core.events.cut). The payload is kept as it came, or replaced by
    ``{"cut_bytes": N}`` when it does not fit; its JSON text is only its measure (the cap counts the
    bytes it takes as JSON) and is never decoded."""
    out = dict(ev)
    text = str(out.get("text") or "")
    payload = out.get("payload")
    payload_json = json.dumps(payload, default=str) if payload is not None else ""
    t, p, n = events.cut(text, payload_json, L.MAX_KEPT_EVENT_BYTES)
    if n:
        out["text"] = t
        if p != payload_json:  # the payload did not fit: what it was is its size
            out["payload"] = {"cut_bytes": len(payload_json.encode())}
    size = len(t) + len(p) + 256 + sum(len(str(k)) + len(str(v)) for key in ("labels", "links")
                                       for k, v in obj(out.get(key)).items())
    return out, n, size


@dataclass
class _Pool:
    seqs: deque[int] = field(default_factory=deque)  # its events' sequence numbers, oldest first
    bytes: int = 0


class EventLog:
    def __init__(self, max_events: int = MAX_EVENTS, max_bytes: int = L.MAX_EVENT_LOG_BYTES) -> None:
        self._lock = threading.Lock()
        # seq -> (the event as kept, its size as kept, its pool), oldest first (seq order)
        self._rows: dict[int, tuple[dict[str, object], int, PoolKey]] = {}
        self._pools: dict[PoolKey, _Pool] = {}
        self.bytes = 0
        self.handlers: dict[str, list[Handler]] = {}
        self.listeners: list[Listener] = []
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.share_events = max(1, max_events // L.EVENT_LOG_SHARES)  # what one pool may hold
        self.share_bytes = max(1, max_bytes // L.EVENT_LOG_SHARES)
        # agent -> the jobs it hosts (set by the aggregator from its guard): a job-less event of an
        # agent hosting one job is that job's.
        self.hosted: Callable[[str], Collection[str]] = lambda agent: ()
        self.refusals: Refusals | None = None  # where ``event_share`` is counted (set by the aggregator)
        self.ingested = 0
        self.seq = 0  # the last event's sequence number
        self.cut = 0  # events kept cut
        self.cut_bytes = 0
        self.share_evicted = 0  # events let go for their pool's share
        self.malformed: dict[str, int] = {}  # kind -> events refused for a malformed payload

    def handle(self, kind: events.EventKind, handler: Handler) -> None:
        """Route events of ``kind`` to ``handler`` (state kinds are then kept out of the log)."""
        self.handlers.setdefault(kind.name, []).append(handler)

    def ingest(self, agent_id: str, evs: Sequence[Mapping[str, object]]) -> None:
        history: list[dict[str, object]] = []
        hosted: list[str] | None = None  # asked once a batch, for its first job-less event
        for ev in evs:
            kind_name = str(ev.get("kind", ""))
            kind = events.get(kind_name)
            ok = all([h(agent_id, ev) for h in self.handlers.get(kind_name, ())])
            if not ok:
                with self._lock:
                    self.malformed[kind_name] = self.malformed.get(kind_name, 0) + 1
                log.debug("event %s from %s: malformed payload, refused", kind_name, agent_id)
                continue
            if kind is not None and kind.state:
                continue  # state, not history: kept by its handler
            out = {**ev, "agent": agent_id}
            if not ev.get("job"):
                if hosted is None:
                    hosted = list(self.hosted(agent_id))
                if len(hosted) == 1:  # several: the aggregator cannot tell which, it stays job-less
                    out["job"] = hosted[0]
            history.append(out)
        with self._lock:
            self.ingested += len(evs)
            over = self._keep(history)
        for (what, name), (n, sender) in over.items():
            self._refuse(what, name, n, sender)
        if self.listeners:
            heard = [{**ev, "agent": agent_id} for ev in evs]
            for listener in self.listeners:
                for ev in heard:
                    listener(ev)

    def _refuse(self, what: str, name: str, n: int, sender: str) -> None:
        whose = f"job {name[:64]!r}" if what == "job" else f"agent {name[:64]} (its job-less events)"
        text = (f"{n} event(s) of {whose} let go, the oldest first: past its share of the event log "
                f"({self.share_events} events, {self.share_bytes >> 10} KiB; "
                "perfd.core.limits.EVENT_LOG_SHARES), "
                f"the newest from agent {sender[:64]}")
        if self.refusals is not None:
            self.refusals.refuse(L.REFUSED_EVENT_SHARE, text, n, agent=sender)
        else:
            log.debug("%s", text)

    def _keep(self, evs: Sequence[Mapping[str, object]]) -> dict[PoolKey, tuple[int, str]]:
        """Append (lock held), each cut to what is kept, numbered and in its pool; a pool past its
        share lets its own oldest go, and past the log's caps the largest pool does. Returns, for
        each pool that passed its share, (events it let go, the sender of its newest)."""
        over: dict[PoolKey, tuple[int, str]] = {}
        for ev in evs:
            out, n, size = kept(ev)
            if n:
                self.cut += 1
                self.cut_bytes += n
            self.seq += 1
            out["seq"] = self.seq
            key = _pool_of(out)
            pool = self._pools.get(key)
            if pool is None:
                pool = self._pools[key] = _Pool()
            pool.seqs.append(self.seq)
            pool.bytes += size
            self._rows[self.seq] = (out, size, key)
            self.bytes += size
            gone = 0
            while len(pool.seqs) > 1 and (len(pool.seqs) > self.share_events
                                          or pool.bytes > self.share_bytes):
                self._drop(key, pool)
                gone += 1
            if gone:
                self.share_evicted += gone
                over[key] = (over.get(key, (0, ""))[0] + gone, str(out.get("agent") or ""))
        while self._rows and (len(self._rows) > self.max_events or self.bytes > self.max_bytes):
            key = max(self._pools, key=lambda k: (len(self._pools[k].seqs), -self._pools[k].seqs[0]))
            self._drop(key, self._pools[key])
        return over

    def _drop(self, key: PoolKey, pool: _Pool) -> None:
        """The pool's oldest event leaves the log (lock held)."""
        _ev, size, _key = self._rows.pop(pool.seqs.popleft())
        pool.bytes -= size
        self.bytes -= size
        if not pool.seqs:
            del self._pools[key]

    def restore(self, evs: Sequence[Mapping[str, object]]) -> None:
        """Events read back from a state store, merged in time order (no handler or listener runs:
        they did when the events first happened); numbered anew, each in the pool its ``job`` (the
        aggregator's attribution, as kept) and ``agent`` say. What passes a share here was counted
        when it first came."""
        with self._lock:
            merged = sorted([*(row[0] for row in self._rows.values()), *(dict(e) for e in evs)],
                            key=lambda e: t if isinstance(t := e.get("time"), (int, float)) else 0.0)
            self._rows.clear()
            self._pools.clear()
            self.bytes = 0
            self._keep(merged)

    def recent(self, job: str | None = None, limit: int = 200) -> list[dict[str, object]]:
        return self.page(job, limit)[0]

    def api_page(self, q: Mapping[str, Sequence[str]]) -> tuple[int, dict[str, object]]:
        """GET /api/events[?limit=N][&cursor=SEQ][&job=JOB] (``q``: its parsed query): without a
        cursor the newest events, with one those after it; at most MAX_EVENTS_PAGE and about
        MAX_EVENTS_PAGE_BYTES a page, oldest first. ``job``: only the events the aggregator attributes
        to JOB (the module's docstring). ``next_cursor``: pass it as ``cursor`` for what came after;
        ``more``: the page left events out (after it with a cursor, before it without).
        Returns (HTTP status, answer)."""
        try:
            limit = int(q.get("limit", [L.EVENTS_PAGE])[0])
            cursor = int(q["cursor"][0]) if "cursor" in q else None
        except ValueError:
            return 400, {"error": "limit and cursor are integers"}
        if not 1 <= limit <= L.MAX_EVENTS_PAGE or (cursor is not None and cursor < 0):
            return 400, {"error": f"limit is 1..{L.MAX_EVENTS_PAGE}, cursor >= 0"}
        evs, more = self.page(q.get("job", [None])[0], limit, cursor, L.MAX_EVENTS_PAGE_BYTES)
        last = evs[-1]["seq"] if evs else (cursor if cursor is not None else self.seq)
        return 200, {"events": evs, "next_cursor": last, "more": more}

    def page(self, job: str | None = None, limit: int = 200, after: int | None = None,
             max_bytes: int | None = None) -> tuple[list[dict[str, object]], bool]:
        """(events, more): with ``after`` (a ``seq``) the oldest events after it, else the newest —
        at most ``limit`` and about ``max_bytes`` (at least one), oldest first either way; ``more``:
        events past the page's end (with ``after``) or before its start (without) were left out.
        ``job``: only the events attributed to it (its pool)."""
        pool = ("job", job) if job else None
        with self._lock:
            rows = [(e, size) for seq, (e, size, key) in self._rows.items()
                    if (after is None or seq > after) and (pool is None or key == pool)]
        order = rows if after is not None else rows[::-1]
        out: list[dict[str, object]] = []
        total = 0
        for e, size in order:
            if len(out) >= limit or (max_bytes is not None and out and total + size > max_bytes):
                break
            out.append(e)
            total += size
        more = len(out) < len(rows)
        return (out if after is not None else out[::-1]), more

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"held": len(self._rows), "bytes": self.bytes, "last_seq": self.seq, "cut": self.cut,
                    "cut_bytes": self.cut_bytes, "pools": len(self._pools),
                    "share_evicted": self.share_evicted}


def _pool_of(e: Mapping[str, object]) -> PoolKey:
    """A kept event's pool: its job's (the aggregator's attribution), else its sender's job-less one."""
    job = e.get("job")
    return ("job", str(job)) if job else ("agent", str(e.get("agent") or ""))
