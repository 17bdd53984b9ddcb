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
# The WAL is checkpointed into the database every this many pages (SQLite's default is 1,000, 4 MB)
# and its file cut back to WAL_LIMIT_BYTES after: a commit rewrites the journal's last page and the
# seq page, so the WAL grows ~3x faster than the data, and on a 3 MB disk it filled the disk before
# reaching 4 MB — after which not even a checkpoint had room to run (measured: tests/faults).
WAL_CHECKPOINT_PAGES = 256
WAL_LIMIT_BYTES = 1 << 20
FAILURE_LOG_INTERVAL_S = 60.0  # a full disk fails every commit: one log line per interval

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
    ingest event loop's thread; documents (:meth:`put_doc`) and :meth:`prune` come from the rules
    thread: a lock keeps one transaction at a time, so both threads' writes share it.

    What is on disk is known per agent. A transaction that fails (at a write or at its COMMIT,
    whichever thread ran it: ENOSPC shows up at COMMIT, when WAL pages are written) is rolled
    back whole, and every agent that had written into it is marked *lost*
    (:meth:`lost`): its rows since its last durable commit are gone. Nothing more of a lost agent is
    written until the ingest server has taken note (:meth:`recover`, which gives the agent's durable
    dedupe state) — a later seq row committed over a hole would make the agent's resend of the lost
    batches look like duplicates."""

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
            self._db.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
            self._db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
            self._db.execute("PRAGMA busy_timeout=5000")
            # A damaged file must stop start-up with one clear line, not fail half-way through the
            # replay (random bytes inside a page pass the header checks of the PRAGMAs above).
            check = [" ".join(str(r[0]).split()) for r in self._db.execute("PRAGMA quick_check(3)")]
            if check != ["ok"]:
                raise StoreError(f"{self.path} is damaged ({'; '.join(check)[:300]}): move it away to "
                                 "start with an empty state, or put back a good copy")
            self._db.executescript(_SCHEMA)
            self._durable_seqs = self._read_seqs()
            self._batch_rows = int(self._db.execute("SELECT COUNT(*) FROM journal WHERE kind = ?",
                                                    (BATCH,)).fetchone()[0])
            probe = self.dir / ".perfd-write-probe"
            probe.write_bytes(b"x")
            probe.unlink()
        except StoreError:
            raise
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"--state-dir {self.dir}: cannot use it: {exc}") from exc
        self._lock = threading.RLock()
        self._open_txn = False
        # Per-agent bookkeeping of the open transaction (see the class docstring).
        self._pending: set[str] = set()  # agents with writes in it
        self._pending_seqs: dict[str, tuple[str, int]] = {}
        self._pending_batches = 0  # batch rows it adds (prune: removes)
        self._lost: set[str] = set()
        self.writes = 0
        self.commits = 0
        self.commit_failures = 0
        self.commit_seconds = 0.0
        self.rollbacks = 0  # transactions lost whole
        self.agents_lost = 0  # agents whose unacknowledged writes a rollback took
        self.pruned = 0
        self.last_error: str | None = None
        self._logged_at = -FAILURE_LOG_INTERVAL_S
        self._unlogged = 0

    # ---- the journal (ingest thread) ---------------------------------------------------------
    def _begin(self) -> None:
        if not self._open_txn:
            self._db.execute("BEGIN")
            self._open_txn = True

    def _write(self, agent: str, sql: str, params: tuple[Any, ...]) -> bool:
        """One write of ``agent`` into the open transaction (lock held); False when the agent is
        lost or the write failed (then the whole transaction is rolled back)."""
        if agent in self._lost:
            return False
        try:
            self._begin()
            self._db.execute(sql, params)
        except sqlite3.Error as exc:
            self._pending.add(agent)
            self._fail(f"write failed ({exc})")
            return False
        self._pending.add(agent)
        return True

    def _fail(self, why: str) -> None:
        """Roll the open transaction back; every agent that wrote into it is lost (lock held)."""
        self.last_error = why
        try:
            self._db.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # SQLite may have rolled it back itself (SQLITE_FULL, SQLITE_IOERR)
        self._open_txn = False
        try:
            # Give the WAL's space back: on a small disk the WAL itself fills it before it reaches
            # the auto-checkpoint size, and then no commit could ever succeed again.
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error:
            pass
        self.rollbacks += 1
        self.agents_lost += len(self._pending - self._lost)
        self._lost |= self._pending
        now = time.monotonic()
        if now - self._logged_at >= FAILURE_LOG_INTERVAL_S:
            more = f"; {self._unlogged} more failure(s) since the last line" if self._unlogged else ""
            log.error("state store: %s: rolled back, nothing of it acknowledged (%d agent(s) resend from "
                      "their spools)%s", why, len(self._pending), more)
            self._logged_at, self._unlogged = now, 0
        else:
            self._unlogged += 1
        self._pending.clear()
        self._pending_seqs.clear()
        self._pending_batches = 0

    def journal(self, kind: str, agent: str, body: bytes) -> bool:
        with self._lock:
            if not self._write(agent, "INSERT INTO journal (t, kind, agent, body) VALUES (?, ?, ?, ?)",
                               (time.time(), kind, agent, body)):
                return False
            self.writes += 1
            self._pending_batches += kind == BATCH
            return True

    def put_job_info(self, job: str, agent: str, text: str) -> bool:
        with self._lock:
            return self._write(agent, "INSERT OR REPLACE INTO job_info (job, agent, json) VALUES (?, ?, ?)",
                               (job, agent, text))

    def put_seq(self, agent: str, epoch: str, seq: int) -> bool:
        with self._lock:
            if not self._write(agent, "INSERT OR REPLACE INTO seq (agent, epoch, seq) VALUES (?, ?, ?)",
                               (agent, epoch, seq)):
                return False
            self._pending_seqs[agent] = (epoch, seq)
            return True

    def lost(self, agent: str) -> bool:
        """Whether a rollback took writes of ``agent`` (until :meth:`recover`). No lock: a set
        lookup, called for every batch."""
        return agent in self._lost

    def recover(self, agent: str) -> tuple[str, int] | None:
        """Forget that ``agent`` was lost (its writes are taken again); returns its durable dedupe
        state (spool epoch, highest seq on disk), None when nothing of it is."""
        with self._lock:
            self._lost.discard(agent)
            return self._durable_seqs.get(agent)

    def commit(self) -> bool:
        """Make everything written so far durable; False (logged, counted) when it could not be:
        then every agent that had written since the last commit is lost (:meth:`lost`)."""
        with self._lock:
            if not self._open_txn:
                return True
            t0 = time.perf_counter()
            try:
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                self.commit_failures += 1
                self._fail(f"commit failed ({exc})")
                return False
            self._open_txn = False
            self._durable_seqs.update(self._pending_seqs)
            self._batch_rows += self._pending_batches
            self._pending.clear()
            self._pending_seqs.clear()
            self._pending_batches = 0
            self.commits += 1
            self.commit_seconds += time.perf_counter() - t0
            return True

    def prune(self) -> int:
        """Drop the oldest journalled batches past ``max_batches`` (Hellos are kept), inside the
        open transaction if there is one (the ingest's next commit makes it durable): a busy
        aggregator nearly always has one open. Called by the rules loop."""
        with self._lock:
            excess = self._batch_rows + self._pending_batches - self.max_batches
            if excess <= 0:
                return 0
            try:
                self._begin()
                cur = self._db.execute("DELETE FROM journal WHERE id IN (SELECT id FROM journal "
                                       "WHERE kind = ? ORDER BY id LIMIT ?)", (BATCH, excess))
            except sqlite3.Error as exc:
                self._fail(f"prune failed ({exc})")
                return 0
            n = max(0, cur.rowcount)
            self._pending_batches -= n
            self.pruned += n
            return n

    # ---- documents (rules thread) ---------------------------------------------------------------
    def put_doc(self, name: str, obj: Any) -> bool:
        text = json.dumps(obj, allow_nan=False, default=str)
        with self._lock:
            try:
                self._begin()
                self._db.execute("INSERT OR REPLACE INTO doc (name, json) VALUES (?, ?)", (name, text))
            except sqlite3.Error as exc:
                self._fail(f"document {name} could not be written ({exc})")
                return False
            return self.commit()

    def get_doc(self, name: str) -> Any:
        row = self._db.execute("SELECT json FROM doc WHERE name = ?", (name,)).fetchone()
        return json.loads(row[0]) if row else None

    # ---- reading back at start ----------------------------------------------------------------
    def _read_seqs(self) -> dict[str, tuple[str, int]]:
        return {a: (e, int(s)) for a, e, s in self._db.execute("SELECT agent, epoch, seq FROM seq")}

    def seqs(self) -> dict[str, tuple[str, int]]:
        """The dedupe state on disk (committed)."""
        with self._lock:
            return dict(self._durable_seqs)

    def job_infos(self) -> list[tuple[str, str, str]]:
        return list(self._db.execute("SELECT job, agent, json FROM job_info ORDER BY job"))

    def replay(self) -> Iterator[tuple[str, str, bytes]]:
        """(kind, agent, body) in arrival order."""
        yield from self._db.execute("SELECT kind, agent, body FROM journal ORDER BY id")

    def replay_timed(self) -> Iterator[tuple[float, str, str, bytes]]:
        """(arrival time, kind, agent, body) in arrival order."""
        yield from self._db.execute("SELECT t, kind, agent, body FROM journal ORDER BY id")

    def stats(self) -> dict[str, Any]:
        return {"writes": self.writes, "commits": self.commits, "commit_failures": self.commit_failures,
                "rollbacks": self.rollbacks, "agents_lost": self.agents_lost,
                "journal_batches": self._batch_rows, "pruned": self.pruned,
                "commit_ms_mean": (round(1e3 * self.commit_seconds / self.commits, 3)
                                   if self.commits else None),
                "last_error": self.last_error, "path": str(self.path)}

    def close(self) -> None:
        with self._lock:
            if self._open_txn:
                self.commit()
            self._db.close()
