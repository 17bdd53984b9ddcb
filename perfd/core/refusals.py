"""Counted, rate-limited-logged refusals: what a cap or a credential check turned away.

One instance per aggregator, shared by the gRPC server, the HTTP server and the capture
coordinator; exported as ``perfd_aggregator_refused_total{reason}`` (reasons: perfd.core.limits). A
refusal that names the agent it turned away is also counted per agent (``by_agent``, in
/api/stats): agent ids come from the network, so that table keeps the MAX_AGENTS agents refused
most, and not a label on /metrics.
"""

from __future__ import annotations

import logging
import threading
import time

from perfd.core.limits import REFUSAL_LOG_INTERVAL_S

log = logging.getLogger("perfd.refused")


MAX_AGENTS = 1_000  # agents counted apart; past it the one refused least makes room


class Refusals:
    def __init__(self, log_interval_s: float = REFUSAL_LOG_INTERVAL_S) -> None:
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self._by_agent: dict[str, dict[str, int]] = {}  # agent -> reason -> count
        self._logged_at: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self.log_interval_s = log_interval_s

    def refuse(self, reason: str, text: str, n: int = 1, agent: str | None = None) -> None:
        """Count ``n`` refusals for ``reason`` (and ``agent``, when named); log ``text`` unless this
        reason was logged less than ``log_interval_s`` ago (the next line says how many were not
        logged)."""
        now = time.monotonic()
        with self._lock:
            self.counts[reason] = self.counts.get(reason, 0) + n
            if agent is not None:
                self._count_agent(agent[:256], reason, n)
            last = self._logged_at.get(reason)
            if last is not None and now - last < self.log_interval_s:
                self._suppressed[reason] = self._suppressed.get(reason, 0) + n
                return
            self._logged_at[reason] = now
            quiet = self._suppressed.pop(reason, 0)
        more = f" ({quiet} more of this reason since the last line)" if quiet else ""
        log.warning("refused (%s): %s%s", reason, text, more)

    def _count_agent(self, agent: str, reason: str, n: int) -> None:
        mine = self._by_agent.get(agent)
        if mine is None:
            if len(self._by_agent) >= MAX_AGENTS:
                least = min(self._by_agent, key=lambda a: sum(self._by_agent[a].values()))
                del self._by_agent[least]
            mine = self._by_agent[agent] = {}
        mine[reason] = mine.get(reason, 0) + n

    def by_agent(self, top: int = 50) -> dict[str, dict[str, int]]:
        """The ``top`` agents refused most: agent -> reason -> count."""
        with self._lock:
            ranked = sorted(self._by_agent.items(), key=lambda kv: -sum(kv[1].values()))[:top]
            return {a: dict(r) for a, r in ranked}

    def get(self, reason: str) -> int:
        with self._lock:
            return self.counts.get(reason, 0)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)
