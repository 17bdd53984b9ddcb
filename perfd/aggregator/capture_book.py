"""The aggregator's capture records, by id: what the capture coordinator (perfd/aggregator/captures.py)
requests and updates as the agents report, and what the state's analyses read of them (each job's
records, the latest Nsight Compute capture of a job).

Made by the state (perfd/aggregator/state.py) before its analyses, which read it from their
constructor, so that the wiring goes one way: the coordinator knows the state, and this book through
it; the state knows this book, never the coordinator. Holds no analysis: what a record says of its
job is measured where the job's steps are (perfd.aggregator.capture_records.arming_of).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterable

from perfd.aggregator.capture_records import CaptureRecord


class CaptureBook:
    def __init__(self) -> None:
        # Re-entrant: the coordinator writes under it and, diagnosing a capture under it, has the
        # job analysed, whose analysis reads the job's records here on the same thread.
        self.lock = threading.RLock()
        self.records: dict[str, CaptureRecord] = {}

    def of_job(self, job: str) -> list[CaptureRecord]:
        """The job's capture records, each a copy as of now (the coordinator goes on changing its own)."""
        with self.lock:
            return [copy.copy(r) for r in self.records.values() if r.job == job]

    def latest_ncu(self, job: str) -> list[CaptureRecord]:
        """The job's latest Nsight Compute capture request (none: an empty list), a copy."""
        with self.lock:
            recs = sorted((r for r in self.records.values() if r.job == job and r.tool == "ncu"),
                          key=lambda r: r.requested_at, reverse=True)
            return [copy.copy(r) for r in recs[:1]]

    def restore(self, records: Iterable[CaptureRecord]) -> None:
        """Records the state store kept (perfd.aggregator.durable), back at start."""
        with self.lock:
            for rec in records:
                self.records[rec.id] = rec
