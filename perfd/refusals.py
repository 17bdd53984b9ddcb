"""Counted, rate-limited-logged refusals: what a cap or a credential check turned away.

One instance per aggregator, shared by the gRPC server, the HTTP server and the capture
coordinator; exported as ``perfd_aggregator_refused_total{reason}`` (reasons: perfd.limits).
"""

from __future__ import annotations

import logging
import threading
import time

from perfd.limits import REFUSAL_LOG_INTERVAL_S

log = logging.getLogger("perfd.refused")


class Refusals:
    def __init__(self, log_interval_s: float = REFUSAL_LOG_INTERVAL_S) -> None:
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self._logged_at: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self.log_interval_s = log_interval_s

    def refuse(self, reason: str, text: str, n: int = 1) -> None:
        """Count ``n`` refusals for ``reason``; log ``text`` unless this reason was logged less than
        ``log_interval_s`` ago (the next line says how many were not logged)."""
        now = time.monotonic()
        with self._lock:
            self.counts[reason] = self.counts.get(reason, 0) + n
            last = self._logged_at.get(reason)
            if last is not None and now - last < self.log_interval_s:
                self._suppressed[reason] = self._suppressed.get(reason, 0) + n
                return
            self._logged_at[reason] = now
            quiet = self._suppressed.pop(reason, 0)
        more = f" ({quiet} more of this reason since the last line)" if quiet else ""
        log.warning("refused (%s): %s%s", reason, text, more)

    def get(self, reason: str) -> int:
        with self._lock:
            return self.counts.get(reason, 0)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)
