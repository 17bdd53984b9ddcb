"""The aggregator's event log and the routing of events by kind (perfd.events).

A state event goes to the handler its kind registered (the node view for process lists, the
serving view for serving reports, ...) and not into the log; a history event goes into the
bounded log and to every listener (the capture coordinator follows capture progress this way). A
new source registers a handler for its kind: no branch here. Listeners get each event with the agent
that sent it (``agent``): the capture coordinator takes a capture's progress only from the agents
the capture was sent to.

Bounded by count (``max_events``) and by bytes (perfd.limits.MAX_EVENT_LOG_BYTES): the oldest go
first. What the log keeps of one event is at most MAX_KEPT_EVENT_BYTES of text and payload
(perfd.events.cut; handlers and listeners got it whole), counted in ``cut`` and ``cut_bytes``. Each
event kept gets a sequence number (``seq``, increasing), which /api/events pages by.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from perfd import events
from perfd import limits as L
from perfd.typed import obj

log = logging.getLogger(__name__)

# (agent id, event) -> False when the payload was malformed (counted)
Handler = Callable[[str, Mapping[str, object]], bool]
Listener = Callable[[Mapping[str, object]], None]
MAX_EVENTS = 1000  # history kept for /api/events, newest last


def kept(ev: Mapping[str, object]) -> tuple[dict[str, object], int, int]:
    """(what the log keeps of ``ev``, the bytes cut, its size as kept): text and payload within
    MAX_KEPT_EVENT_BYTES (perfd.events.cut). The payload is kept as it came, or replaced by
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


class EventLog:
    def __init__(self, max_events: int = MAX_EVENTS, max_bytes: int = L.MAX_EVENT_LOG_BYTES) -> None:
        self._lock = threading.Lock()
        self.events: deque[dict[str, object]] = deque()
        self._sizes: deque[int] = deque()  # each event's size as kept, in the order of ``events``
        self._seqs: deque[int] = deque()  # ... and its sequence number (its ``seq``)
        self.bytes = 0
        self.handlers: dict[str, list[Handler]] = {}
        self.listeners: list[Listener] = []
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.ingested = 0
        self.seq = 0  # the last event's sequence number
        self.cut = 0  # events kept cut
        self.cut_bytes = 0
        self.malformed: dict[str, int] = {}  # kind -> events refused for a malformed payload

    def handle(self, kind: events.EventKind, handler: Handler) -> None:
        """Route events of ``kind`` to ``handler`` (state kinds are then kept out of the log)."""
        self.handlers.setdefault(kind.name, []).append(handler)

    def ingest(self, agent_id: str, evs: Sequence[Mapping[str, object]]) -> None:
        history: list[dict[str, object]] = []
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
            history.append({**ev, "agent": agent_id})
        with self._lock:
            self.ingested += len(evs)
            self._keep(history)
        if self.listeners:
            heard = [{**ev, "agent": agent_id} for ev in evs]
            for listener in self.listeners:
                for ev in heard:
                    listener(ev)

    def _keep(self, evs: Sequence[Mapping[str, object]]) -> None:
        """Append (lock held), each cut to what is kept and numbered; the oldest leave past the caps."""
        for ev in evs:
            out, n, size = kept(ev)
            if n:
                self.cut += 1
                self.cut_bytes += n
            self.seq += 1
            out["seq"] = self.seq
            self.events.append(out)
            self._sizes.append(size)
            self._seqs.append(self.seq)
            self.bytes += size
        while self.events and (len(self.events) > self.max_events or self.bytes > self.max_bytes):
            self.events.popleft()
            self._seqs.popleft()
            self.bytes -= self._sizes.popleft()

    def restore(self, evs: Sequence[Mapping[str, object]]) -> None:
        """Events read back from a state store, merged in time order (no handler or listener runs:
        they did when the events first happened); numbered anew."""
        with self._lock:
            merged = sorted([*self.events, *(dict(e) for e in evs)],
                            key=lambda e: t if isinstance(t := e.get("time"), (int, float)) else 0.0)
            self.events.clear()
            self._sizes.clear()
            self._seqs.clear()
            self.bytes = 0
            self._keep(merged)

    def recent(self, job: str | None = None, limit: int = 200) -> list[dict[str, object]]:
        return self.page(job, limit)[0]

    def api_page(self, q: Mapping[str, Sequence[str]]) -> tuple[int, dict[str, object]]:
        """GET /api/events[?limit=N][&cursor=SEQ][&job=JOB] (``q``: its parsed query): without a
        cursor the newest events, with one those after it; at most MAX_EVENTS_PAGE and about
        MAX_EVENTS_PAGE_BYTES a page, oldest first. ``next_cursor``: pass it as ``cursor`` for what
        came after; ``more``: the page left events out (after it with a cursor, before it without).
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
        events past the page's end (with ``after``) or before its start (without) were left out."""
        with self._lock:
            rows = [(e, size) for e, size, seq in zip(self.events, self._sizes, self._seqs, strict=True)
                    if (after is None or seq > after) and _of_job(e, job)]
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
            return {"held": len(self.events), "bytes": self.bytes, "last_seq": self.seq, "cut": self.cut,
                    "cut_bytes": self.cut_bytes}


def _of_job(e: Mapping[str, object], job: str | None) -> bool:
    return job is None or e.get("job") in ("", None, job) or obj(e.get("labels")).get("job") == job
