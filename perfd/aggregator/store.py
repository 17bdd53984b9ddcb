"""The aggregator's durable state (``perfd aggregator --state-dir DIR``): SQLite in WAL mode.

What is kept, and how it comes back after a restart (kill -9 included):
  - a journal of what agents sent that the analysis needs — each Hello (agent, jobs) and each
    batch *without its samples* (step records, events, collectives, job info: the protobuf bytes
    as they arrived, so a replay goes through the same decode, guard and ingest as the live path);
  - the job info of each job (kept apart from the journal, so pruning old batches never loses it);
  - the dedupe state (highest batch seq per agent and spool epoch);
  - rule state (pending / firing since, capture budgets), capture records and the event history,
    written by the rules loop as JSON documents.
Node samples (NVML, host) are not kept: they are for Prometheus, and the next batches refresh them.

Durability: the ingest server acknowledges a batch only after :meth:`StateStore.commit` returned
(one transaction per acknowledgement, which coalesces many batches; ``synchronous=FULL``, so a
commit survives a power cut, not only a killed process). A failed write is never acknowledged:
the server closes the stream, the agent keeps the batches in its spool and resends them.

Why SQLite and not a file of our own: the stdlib has it, WAL gives one writer with readers beside
it, and its transactions are what "acknowledged means durable" needs.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from perfd.privdir import private_dir

log = logging.getLogger(__name__)

HELLO, BATCH = "hello", "batch"
DEFAULT_MAX_BATCHES = 200_000  # journal rows kept; the oldest batches go first (job info is kept apart)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS journal (id INTEGER PRIMARY KEY AUTOINCREMENT, t REAL NOT NULL,
                                    kind TEXT NOT NULL, agent TEXT NOT NULL, body BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS job_info (job TEXT PRIMARY KEY, agent TEXT NOT NULL, json TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS seq (agent TEXT PRIMARY KEY, epoch TEXT NOT NULL, seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS doc (name TEXT PRIMARY KEY, json TEXT NOT NULL);
"""


class StoreError(Exception):
    """The state directory cannot be used or written (a clear message for a person)."""


class StateStore:
    """One SQLite database under the state directory. Journal writes and :meth:`commit` run on the
    ingest event loop's thread; documents (:meth:`put_doc`) may come from the rules thread: a lock
    keeps one transaction at a time."""

    def __init__(self, directory: str | Path, max_batches: int = DEFAULT_MAX_BATCHES) -> None:
        self.dir = Path(directory)
        self.max_batches = max_batches
        try:
            private_dir(self.dir)  # ours, 0700, no link: another user's folder is refused
            self.path = self.dir / "state.sqlite3"
            self._db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{self.path}: SQLite refused WAL mode ({mode})")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA busy_timeout=5000")
            self._db.executescript(_SCHEMA)
            probe = self.dir / ".perfd-write-probe"
            probe.write_bytes(b"x")
            probe.unlink()
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"--state-dir {self.dir}: cannot use it: {exc}") from exc
        self._lock = threading.RLock()
        self._open_txn = False
        self.writes = 0
        self.commits = 0
        self.commit_failures = 0
        self.commit_seconds = 0.0
        self.last_error: str | None = None

    # ---- the journal (ingest thread) ---------------------------------------------------------
    def _begin(self) -> None:
        if not self._open_txn:
            self._db.execute("BEGIN")
            self._open_txn = True

    def journal(self, kind: str, agent: str, body: bytes) -> None:
        with self._lock:
            self._begin()
            self._db.execute("INSERT INTO journal (t, kind, agent, body) VALUES (?, ?, ?, ?)",
                             (time.time(), kind, agent, body))
            self.writes += 1

    def put_job_info(self, job: str, agent: str, text: str) -> None:
        with self._lock:
            self._begin()
            self._db.execute("INSERT OR REPLACE INTO job_info (job, agent, json) VALUES (?, ?, ?)",
                             (job, agent, text))

    def put_seq(self, agent: str, epoch: str, seq: int) -> None:
        with self._lock:
            self._begin()
            self._db.execute("INSERT OR REPLACE INTO seq (agent, epoch, seq) VALUES (?, ?, ?)",
                             (agent, epoch, seq))

    def commit(self) -> bool:
        """Make everything written so far durable; False (logged, counted) when it could not be."""
        with self._lock:
            if not self._open_txn:
                return True
            t0 = time.perf_counter()
            try:
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                self.commit_failures += 1
                self.last_error = str(exc)
                log.error("state store: commit failed (%s): nothing of it is acknowledged", exc)
                try:
                    self._db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                self._open_txn = False
                return False
            self._open_txn = False
            self.commits += 1
            self.commit_seconds += time.perf_counter() - t0
            return True

    def prune(self) -> int:
        """Drop the oldest journalled batches past ``max_batches`` (Hellos are kept)."""
        with self._lock:
            if self._open_txn:
                return 0
            try:
                n = self._db.execute("SELECT COUNT(*) FROM journal WHERE kind = ?", (BATCH,)).fetchone()[0]
                excess = int(n) - self.max_batches
                if excess <= 0:
                    return 0
                self._db.execute("DELETE FROM journal WHERE id IN (SELECT id FROM journal WHERE kind = ? "
                                 "ORDER BY id LIMIT ?)", (BATCH, excess))
                return excess
            except sqlite3.Error as exc:
                log.warning("state store: prune failed: %s", exc)
                return 0

    # ---- documents (rules thread) ---------------------------------------------------------------
    def put_doc(self, name: str, obj: Any) -> bool:
        text = json.dumps(obj, allow_nan=False, default=str)
        with self._lock:
            try:
                self._begin()
                self._db.execute("INSERT OR REPLACE INTO doc (name, json) VALUES (?, ?)", (name, text))
            except sqlite3.Error as exc:
                log.warning("state store: could not write %s: %s", name, exc)
                return False
        return self.commit()

    def get_doc(self, name: str) -> Any:
        row = self._db.execute("SELECT json FROM doc WHERE name = ?", (name,)).fetchone()
        return json.loads(row[0]) if row else None

    # ---- reading back at start ----------------------------------------------------------------
    def seqs(self) -> dict[str, tuple[str, int]]:
        return {a: (e, int(s)) for a, e, s in self._db.execute("SELECT agent, epoch, seq FROM seq")}

    def job_infos(self) -> list[tuple[str, str, str]]:
        return list(self._db.execute("SELECT job, agent, json FROM job_info ORDER BY job"))

    def replay(self) -> Iterator[tuple[str, str, bytes]]:
        """(kind, agent, body) in arrival order."""
        yield from self._db.execute("SELECT kind, agent, body FROM journal ORDER BY id")

    def stats(self) -> dict[str, Any]:
        return {"writes": self.writes, "commits": self.commits, "commit_failures": self.commit_failures,
                "commit_ms_mean": (round(1e3 * self.commit_seconds / self.commits, 3)
                                   if self.commits else None),
                "last_error": self.last_error, "path": str(self.path)}

    def close(self) -> None:
        with self._lock:
            if self._open_txn:
                self.commit()
            self._db.close()
