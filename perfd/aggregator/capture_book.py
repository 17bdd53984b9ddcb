"""The aggregator's capture records, by id: what the capture coordinator (perfd/aggregator/captures.py)
requests and updates as the agents report, and what the state's analyses read of them (each job's
records, the latest Nsight Compute capture of a job).

Made by the state (perfd/aggregator/state.py) before its analyses, which read it from their
constructor, so that the wiring goes one way: the coordinator knows the state, and this book through
it; the state knows this book, never the coordinator. Holds no analysis: what a record says of its
job is measured where the job's steps are (perfd.aggregator.capture_records.arming_of).

The analyses read without the lock: they read copies published when a change ends (:meth:`writing`).
The coordinator holds the lock while it has the state analyse a job (a rule's targets, a capture's
diagnosis), and an analysis reads the job's records while it holds the state's incident lock: a reader
waiting on this lock there closed a cycle (an aggregator hung for good in a full suite: the rules tick
holding this lock and waiting for the incident lock, the refresh holding that one and waiting here,
every /captures request and the stop behind them). The lock is now taken only by the coordinator's
own entry points, which hold no other lock when they take it.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from perfd.aggregator.capture_records import CaptureRecord


class CaptureBook:
    def __init__(self) -> None:
        # The coordinator's, around every change of its records (re-entrant: its entry points nest).
        self.lock = threading.RLock()
        self.records: dict[str, CaptureRecord] = {}
        self._depth = 0  # how deep in writing() the thread holding the lock is
        # Copies of the records as of the last change's end, in the records' order: what readers get.
        # Replaced whole, never changed, so a reader needs no lock (one reference read).
        self._published: tuple[CaptureRecord, ...] = ()

    @contextmanager
    def writing(self) -> Iterator[None]:
        """The lock, held while the records change; they are published when the outermost ends."""
        with self.lock:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self._published = tuple(copy.copy(r) for r in self.records.values())

    def published(self) -> tuple[CaptureRecord, ...]:
        """Every record as of the last change's end (shared copies: read, never change them)."""
        return self._published

    def of_job(self, job: str) -> list[CaptureRecord]:
        """The job's capture records as of the last change's end, each a copy of its own."""
        return [copy.copy(r) for r in self._published if r.job == job]

    def latest_ncu(self, job: str) -> list[CaptureRecord]:
        """The job's latest Nsight Compute capture request (none: an empty list), a copy."""
        recs = sorted((r for r in self._published if r.job == job and r.tool == "ncu"),
                      key=lambda r: r.requested_at, reverse=True)
        return [copy.copy(r) for r in recs[:1]]

    def restore(self, records: Iterable[CaptureRecord]) -> None:
        """Records the state store kept (perfd.aggregator.durable), back at start."""
        with self.writing():
            for rec in records:
                self.records[rec.id] = rec
