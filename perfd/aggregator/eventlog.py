"""The aggregator's event log and the routing of events by kind (perfd.events).

A state event goes to the handler its kind registered (the node view for process lists, the
serving view for serving reports, ...) and not into the log; a history event goes into the
bounded log and to every listener (the capture coordinator follows capture progress this way). A
new source registers a handler for its kind: no branch here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from perfd import events

log = logging.getLogger(__name__)

# (agent id, event) -> False when the payload was malformed (counted)
Handler = Callable[[str, Mapping[str, Any]], bool]
Listener = Callable[[Mapping[str, Any]], None]
MAX_EVENTS = 1000  # history kept for /api/events, newest last


class EventLog:
    def __init__(self, max_events: int = MAX_EVENTS) -> None:
        self._lock = threading.Lock()
        self.events: list[dict[str, Any]] = []
        self.handlers: dict[str, list[Handler]] = {}
        self.listeners: list[Listener] = []
        self.max_events = max_events
        self.ingested = 0
        self.malformed: dict[str, int] = {}  # kind -> events refused for a malformed payload

    def handle(self, kind: events.EventKind, handler: Handler) -> None:
        """Route events of ``kind`` to ``handler`` (state kinds are then kept out of the log)."""
        self.handlers.setdefault(kind.name, []).append(handler)

    def ingest(self, agent_id: str, evs: Sequence[Mapping[str, Any]]) -> None:
        history: list[dict[str, Any]] = []
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
            self.events.extend(history)
            del self.events[:-self.max_events]
        for listener in self.listeners:
            for ev in evs:
                listener(ev)

    def restore(self, evs: Sequence[Mapping[str, Any]]) -> None:
        """Events read back from a state store, merged in time order (no handler or listener runs:
        they did when the events first happened)."""
        with self._lock:
            self.events.extend(dict(e) for e in evs)
            self.events.sort(key=lambda e: float(e.get("time") or 0.0))
            del self.events[:-self.max_events]

    def recent(self, job: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
        with self._lock:
            evs = [e for e in self.events if job is None or e.get("job") in ("", None, job)
                   or (e.get("labels") or {}).get("job") == job]
        return evs[-limit:]
