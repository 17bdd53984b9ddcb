"""The aggregator's durable state (``perfd aggregator --state-dir DIR``): SQLite in WAL mode.

What is kept, and how it comes back after a restart (kill -9 included):
  - a journal of what agents sent that the analysis needs — each batch *without its samples* (step
    records, events, collectives, job info: the protobuf bytes as they arrived, so a replay goes
    through the same decode, guard and ingest as the live path), and each agent's latest Hello (its
    jobs): one row per agent, replaced by the next Hello and deleted when the agent is forgotten;
  - the job info of each job (kept apart from the journal, so pruning old batches never loses it);
  - the dedupe state (highest batch seq per agent and spool epoch);
  - rule state (pending / firing since, capture budgets), capture records, the event history and each
    job's GPU model (only the samples name it), written by the rules loop as JSON documents.
Node samples (NVML, host) are not kept: they are for Prometheus, and the next batches refresh them.

Durability: the ingest server acknowledges a batch only after :meth:`StateStore.commit` returned
(one transaction per acknowledgement, which coalesces many batches; ``synchronous=FULL``, so a
commit survives a power cut, not only a killed process). A failed write is never acknowledged:
the server closes the stream, the agent keeps the batches in its spool and resends them.

Bounded on disk: what is stored is only what the aggregator took (the jobs a Hello was given, the
parts of a batch it kept: perfd.transport.delivery.Kept); the journal keeps its newest ``max_batches``
batches and the files — the database and its write-ahead log — are brought under ``max_bytes``
(``--state-max-mib``) every rules tick: the oldest batches go first, then the oldest Hellos and dedupe
rows, and the file gives its free pages back (``auto_vacuum=INCREMENTAL``, :meth:`StateStore.shrink`).
The pruning aims at the cap less the log's room, divided by SQLite's measured overhead, so that the
files, not an estimate, stay under it. A job the lifecycle prunes loses its rows here too, so it stays
pruned across a restart; a batch that also held other jobs' data stays, and a tombstone (job, when
pruned) keeps the pruned job's part of it from being replayed until no older journal row is left.

Versioned (``SCHEMA_VERSION`` in the file's user_version; tables, checks and upgrade: state_schema.py):
a newer build reads older files (upgraded once, at open); an older build stops at start-up on a newer
schema with one line and exit 2 and leaves the file untouched, rather than read it lossy.

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

from perfd.aggregator.state_schema import (
    HELLO,
    SCHEMA_VERSION,
    TABLES,
    StoreError,
    cut_back,
    migrate,
    refuse_newer,
    settle_version,
)
from perfd.core.privdir import private_dir

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCHES = 200_000  # journal rows kept; the oldest batches go first (job info is kept apart)
# Bytes of the whole state (--state-max-mib): the oldest batches go first. A restart's replay too.
DEFAULT_MAX_BYTES = 1 << 30
MAX_TOMBSTONES = 10_000  # pruned jobs remembered (the oldest are forgotten first)
# The WAL is checkpointed every this many pages (SQLite's default 1,000 pages, 4 MB, filled a 3 MB disk:
# a commit rewrites the journal's last page and the seq page, the WAL grows ~3x faster than the data;
# then not even a checkpoint had room to run) and its file cut back to WAL_LIMIT_BYTES after.
WAL_CHECKPOINT_PAGES = 256
WAL_LIMIT_BYTES = 1 << 20
FAILURE_LOG_INTERVAL_S = 60.0  # a full disk fails every commit: one log line per interval
# Room the cap leaves to the write-ahead log: it grows to WAL_CHECKPOINT_PAGES pages between
# checkpoints and is cut back to WAL_LIMIT_BYTES, plus the shared-memory index beside it; a small cap
# leaves it a quarter, both scaled to it (256 pages made the log and its index 1.10 MB, past 1 MiB).
WAL_ROOM_BYTES = WAL_LIMIT_BYTES + (256 << 10)
_ROW_BYTES = 48  # a dedupe row's agent, epoch and numbers, amortised

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

    def __init__(self, directory: str | Path, max_batches: int = DEFAULT_MAX_BATCHES,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.dir = Path(directory)
        self.max_batches = max_batches
        self.max_bytes = max_bytes
        try:
            private_dir(self.dir)  # ours, 0700, no link: another user's folder is refused
            self.path = self.dir / "state.sqlite3"
            refuse_newer(self.path)  # before the connection below, which would write to it
            self._db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
            # Before any table exists (a new file): freed pages can be given back to the file system.
            # (Only then: on a file in use the pragma would wait for its writer.)
            if self._db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] == 0:
                self._db.execute("PRAGMA auto_vacuum=INCREMENTAL")
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{self.path}: SQLite refused WAL mode ({mode})")
            self._db.execute("PRAGMA synchronous=FULL")
            # Freed pages not zeroed (Debian's SQLite zeroes them: a 1 MB pruning wrote 1 MB more of log,
            # a 4 MiB cap's files at 4.8 MB until the checkpoint); shrink() gives them back each tick.
            self._db.execute("PRAGMA secure_delete=FAST")
            self.wal_room = min(WAL_ROOM_BYTES, max_bytes // 4)
            self.wal_limit = self.wal_room * WAL_LIMIT_BYTES // WAL_ROOM_BYTES
            page = int(self._db.execute("PRAGMA page_size").fetchone()[0])
            pages = max(1, min(WAL_CHECKPOINT_PAGES, self.wal_limit // page))
            self._db.execute(f"PRAGMA wal_autocheckpoint={pages}")
            self._db.execute(f"PRAGMA journal_size_limit={self.wal_limit}")
            self._db.execute("PRAGMA busy_timeout=5000")
            # A damaged file must stop start-up with one clear line, not fail half-way through the
            # replay (random bytes inside a page pass the header checks of the PRAGMAs above).
            check = [" ".join(str(r[0]).split()) for r in self._db.execute("PRAGMA quick_check(3)")]
            if check != ["ok"]:
                raise StoreError(f"{self.path} is damaged ({'; '.join(check)[:300]}): move it away to "
                                 "start with an empty state, or put back a good copy")
            self._db.executescript(TABLES)
            folded = migrate(self._db)
            if folded is not None:
                log.info("state store: %d Hello row(s) of an older build folded into one per agent", folded)
            found = settle_version(self._db, self.path)
            if found < SCHEMA_VERSION:
                log.info("state store: %s upgraded from schema %d to %d", self.path, found, SCHEMA_VERSION)
            if int(self._db.execute("PRAGMA auto_vacuum").fetchone()[0]) != 2:
                # A file of an older build: rebuilt once so its free pages can go back (bounded by the
                # cap it was kept under).
                self._db.execute("VACUUM")
                log.info("state store: %s converted to incremental vacuum", self.path)
            try:
                cut_back(self._db)
            except sqlite3.OperationalError as exc:  # a full disk: the state is whole, only larger
                log.warning("state store: %s: its files could not be cut back at start (%s)", self.path, exc)
            self._durable_seqs = self._read_seqs()
            rows, size = self._db.execute("SELECT COUNT(*), TOTAL(length(body)) FROM journal").fetchone()
            self._batch_rows, self._batch_bytes = int(rows), int(size)
            # Sizes of the rows replaced by key (a replacement gives back the old row's bytes).
            self._hello_bytes = {str(a): int(n) for a, n in
                                 self._db.execute("SELECT agent, length(body) FROM hello")}
            self._info_bytes = {str(j): int(n) for j, n in
                                self._db.execute("SELECT job, length(json) FROM job_info")}
            self._doc_bytes = {str(d): int(n) for d, n in
                               self._db.execute("SELECT name, length(json) FROM doc")}
            self._seq_bytes = {str(a): _ROW_BYTES + len(str(a)) + len(str(e)) for a, e in
                               self._db.execute("SELECT agent, epoch FROM seq")}
            probe = self.dir / ".perfd-write-probe"
            probe.write_bytes(b"x")
            probe.unlink()
        except StoreError:
            raise
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError):  # locked, unreadable, a disk error: not damage
                raise StoreError(f"--state-dir {self.dir}: cannot use it: {exc}") from exc
            # Damage quick_check's first pages did not show: the sizes read at open found it.
            raise StoreError(f"{self.path} is damaged ({exc}): move it away to start with an empty "
                             "state, or put back a good copy") from exc
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"--state-dir {self.dir}: cannot use it: {exc}") from exc
        self._lock = threading.RLock()
        self.closed = False  # close() ran: writes of a late caller (a tick past the stop) do nothing
        self._open_txn = False
        # Per-agent bookkeeping of the open transaction (see the class docstring).
        self._pending: set[str] = set()  # agents with writes in it
        self._pending_seqs: dict[str, tuple[str, int]] = {}
        self._pending_batches = 0  # batch rows it adds (prune: removes)
        self._pending_bytes = 0  # ... and their bytes
        self._lost: set[str] = set()
        self.writes = 0
        self.commits = 0
        self.commit_failures = 0
        self.commit_seconds = 0.0
        self.rollbacks = 0  # transactions lost whole
        self.agents_lost = 0  # agents whose unacknowledged writes a rollback took
        self.pruned = 0
        self.pruned_bytes = 0  # of those, what the byte cap took ...
        self.pruned_for_bytes = 0  # ... in rows
        self.jobs_deleted = 0  # pruned jobs whose rows were deleted
        self.rows_of_pruned_jobs = 0
        self.last_error: str | None = None
        self._logged_at = -FAILURE_LOG_INTERVAL_S
        self._unlogged = 0
        self.pruned_hellos = 0  # Hello rows pruned for bytes
        self.pruned_seqs = 0  # dedupe rows pruned for bytes
        self.shrinks = 0  # times the file gave pages back
        self.overhead = 1.0  # the files' bytes per logical byte, as last measured (shrink)
        # The files' and the logical bytes as the last shrink ended (at open: cut back): where the cap
        # holds. Between two ticks what arrived, inside one the pruning's own log, can pass it a moment.
        self.settled_bytes, self.settled_logical_bytes = self.disk_bytes(), self.held_bytes()

    # ---- the journal (ingest thread) ---------------------------------------------------------
    def _begin(self) -> None:
        if not self._open_txn:
            self._db.execute("BEGIN")
            self._open_txn = True

    def _write(self, agent: str, sql: str, params: tuple[object, ...]) -> bool:
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
        self._pending_bytes = 0
        try:  # replaced rows' sizes are read back: the rollback may have undone some of them
            self._hello_bytes = {str(a): int(n) for a, n in
                                 self._db.execute("SELECT agent, length(body) FROM hello")}
            self._info_bytes = {str(j): int(n) for j, n in
                                self._db.execute("SELECT job, length(json) FROM job_info")}
            self._seq_bytes = {str(a): _ROW_BYTES + len(str(a)) + len(str(e)) for a, e in
                               self._db.execute("SELECT agent, epoch FROM seq")}
        except sqlite3.Error:
            pass  # the disk is failing: the last known sizes stand

    def journal(self, kind: str, agent: str, body: bytes, job: str | None = None) -> bool:
        """A batch (``job``: the one job its data names, if one), or a Hello (:meth:`put_hello`)."""
        if kind == HELLO:
            return self.put_hello(agent, body)
        with self._lock:
            if not self._write(agent, "INSERT INTO journal (t, kind, agent, body, job) "
                                      "VALUES (?, ?, ?, ?, ?)", (time.time(), kind, agent, body, job)):
                return False
            self.writes += 1
            self._pending_batches += 1
            self._pending_bytes += len(body)
            return True

    def put_hello(self, agent: str, body: bytes) -> bool:
        """The agent's latest Hello (its jobs) replaces the one kept: one row per agent."""
        with self._lock:
            if not self._write(agent, "INSERT OR REPLACE INTO hello (agent, t, body) VALUES (?, ?, ?)",
                               (agent, time.time(), body)):
                return False
            self.writes += 1
            self._hello_bytes[agent] = len(body)
            return True

    def put_job_info(self, job: str, agent: str, text: str) -> bool:
        with self._lock:
            if not self._write(agent, "INSERT OR REPLACE INTO job_info (job, agent, json) VALUES (?, ?, ?)",
                               (job, agent, text)):
                return False
            self._info_bytes[job] = len(text.encode())
            return True

    def put_seq(self, agent: str, epoch: str, seq: int) -> bool:
        with self._lock:
            if not self._write(agent, "INSERT OR REPLACE INTO seq (agent, epoch, seq, t) VALUES (?, ?, ?, ?)",
                               (agent, epoch, seq, time.time())):
                return False
            self._pending_seqs[agent] = (epoch, seq)
            self._seq_bytes[agent] = _ROW_BYTES + len(agent) + len(epoch)
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
            if self.closed:  # a late caller after close(): nothing to write to
                return False
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
            self._batch_bytes += self._pending_bytes
            self._pending.clear()
            self._pending_seqs.clear()
            self._pending_batches = 0
            self._pending_bytes = 0
            self.commits += 1
            self.commit_seconds += time.perf_counter() - t0
            return True

    def held_bytes(self) -> int:
        """Logical bytes of the state: journal batches (written so far), Hellos, job info, documents,
        dedupe rows (what the pruning counts; :meth:`disk_bytes` is what the files take)."""
        with self._lock:
            return (self._batch_bytes + self._pending_bytes + sum(self._hello_bytes.values())
                    + sum(self._info_bytes.values()) + sum(self._doc_bytes.values())
                    + sum(self._seq_bytes.values()))

    def _file_bytes(self, suffix: str) -> int:
        try:
            return (self.dir / f"{self.path.name}{suffix}").stat().st_size
        except OSError:
            return 0

    def disk_bytes(self) -> int:
        """What the state's files take on disk now: the database, its write-ahead log and index."""
        return sum(self._file_bytes(suffix) for suffix in ("", "-wal", "-shm"))

    def budget(self) -> int:
        """The logical bytes the pruning keeps the state under: the cap less the write-ahead log's
        room, over SQLite's measured overhead, so that the files stay under the cap."""
        return max(0, int((self.max_bytes - self.wal_room) / self.overhead))

    def prune(self) -> int:
        """Drop the oldest journalled batches past ``max_batches`` and past ``max_bytes`` of the whole
        state, and the tombstones no journal row needs any more; inside the open transaction if there
        is one (the ingest's next commit makes it durable): a busy aggregator nearly always has one
        open. Called by the rules loop."""
        with self._lock:
            if self.closed:  # a late caller after close(): nothing to write to
                return 0
            excess = self._batch_rows + self._pending_batches - self.max_batches
            over = self.held_bytes() - self.budget()
            if excess <= 0 and over <= 0:
                return self._drop_tombstones()
            try:
                self._begin()
                last, n, size = 0, 0, 0
                if over > 0:  # the oldest rows whose bytes cover the excess
                    for rid, length in self._db.execute("SELECT id, length(body) FROM journal ORDER BY id"):
                        if size >= over and n >= excess:
                            break
                        last, n, size = int(rid), n + 1, size + int(length)
                    self.pruned_for_bytes += max(0, n - max(excess, 0))
                else:
                    row = self._db.execute("SELECT id FROM journal ORDER BY id LIMIT 1 OFFSET ?",
                                           (excess - 1,)).fetchone()
                    last = int(row[0]) if row is not None else 0
                if last:
                    size = int(self._db.execute("SELECT TOTAL(length(body)) FROM journal WHERE id <= ?",
                                                (last,)).fetchone()[0])
                    n = max(0, self._db.execute("DELETE FROM journal WHERE id <= ?", (last,)).rowcount)
                else:
                    n, size = 0, 0
            except sqlite3.Error as exc:
                self._fail(f"prune failed ({exc})")
                return 0
            self._pending_batches -= n
            self._pending_bytes -= size
            self.pruned += n
            self.pruned_bytes += size
            try:
                self._prune_rows()
            except sqlite3.Error as exc:
                self._fail(f"Hello and dedupe rows could not be pruned ({exc})")
                return n
            return n + self._drop_tombstones()

    def _prune_rows(self) -> None:
        """Past the budget with the journal pruned: the oldest Hellos, then the oldest dedupe rows
        (lock held, inside the open transaction). A pruned Hello only means a restart does not
        replay that agent's jobs; a pruned dedupe row, that its resend of batches is taken again
        (idempotent: a re-sent record replaces itself)."""
        over = self.held_bytes() - self.budget()
        for table, sizes, counter in (("hello", self._hello_bytes, "pruned_hellos"),
                                      ("seq", self._seq_bytes, "pruned_seqs")):
            if over <= 0:
                return
            gone: list[str] = []
            freed = 0
            for (agent,) in self._db.execute(f"SELECT agent FROM {table} ORDER BY t"):
                if freed >= over:
                    break
                gone.append(str(agent))
                freed += sizes.get(str(agent), 0)
            for i in range(0, len(gone), 500):
                chunk = gone[i:i + 500]
                marks = ",".join("?" * len(chunk))
                self._db.execute(f"DELETE FROM {table} WHERE agent IN ({marks})", chunk)
            for agent in gone:
                sizes.pop(agent, None)
                if table == "seq":
                    self._durable_seqs.pop(agent, None)
            setattr(self, counter, getattr(self, counter) + len(gone))
            over -= freed

    def shrink(self) -> bool:
        """Commit, give the file's free pages back (incremental vacuum) and cut the write-ahead log,
        then measure SQLite's overhead for :meth:`budget`. Called by the rules loop after pruning;
        False when a write failed (counted as a rollback)."""
        with self._lock:
            if self.closed:  # a late caller after close(): nothing to write to
                return False
            if not self.commit():
                return False
            try:
                free = int(self._db.execute("PRAGMA freelist_count").fetchone()[0])
                if free:
                    # Stepped to its end by sqlite3_exec: through execute() the pragma gives back one page
                    # a call (measured: 6,589 calls for 26 MB; one executescript, 90 ms).
                    self._db.executescript("PRAGMA incremental_vacuum;")
                    self.shrinks += 1
                # The log is cut back to its limit only when it starts over, after a checkpoint;
                # the ingest's large transactions grow it past that (1.7 MB seen under a 4 MB cap).
                if free or self._file_bytes("-wal") > self.wal_limit:
                    self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                pages = int(self._db.execute("PRAGMA page_count").fetchone()[0]) - int(
                    self._db.execute("PRAGMA freelist_count").fetchone()[0])
                page = int(self._db.execute("PRAGMA page_size").fetchone()[0])
            except sqlite3.Error as exc:
                self.last_error = f"shrink failed ({exc})"
                log.warning("state store: %s", self.last_error)
                return False
            logical = self.held_bytes()
            self.settled_bytes, self.settled_logical_bytes = self.disk_bytes(), logical
            if logical >= (256 << 10):  # too little data to say what a byte costs
                self.overhead = max(1.0, min(4.0, pages * page / logical))
            return True

    def _drop_tombstones(self) -> int:
        """Tombstones older than every journal row (nothing left they could hide), and the oldest past
        MAX_TOMBSTONES (lock held). Returns 0: they are not journal rows."""
        try:
            if self._db.execute("SELECT 1 FROM pruned LIMIT 1").fetchone() is None:
                return 0
            self._begin()
            self._db.execute("DELETE FROM pruned WHERE t < COALESCE((SELECT MIN(t) FROM journal), 1e300)")
            self._db.execute("DELETE FROM pruned WHERE job IN (SELECT job FROM pruned ORDER BY t DESC "
                             "LIMIT -1 OFFSET ?)", (MAX_TOMBSTONES,))
        except sqlite3.Error as exc:
            self._fail(f"tombstones could not be pruned ({exc})")
        return 0

    def forget_job(self, job: str, now: float | None = None) -> int:
        """The lifecycle pruned ``job``: its batches and job info go, and a tombstone keeps its part of
        batches that named other jobs too from coming back at a restart. Inside the open transaction
        (made durable by the next commit). Returns the journal rows deleted."""
        t = time.time() if now is None else now
        with self._lock:
            if self.closed:  # a late caller after close(): nothing to write to
                return 0
            try:
                self._begin()
                size = int(self._db.execute("SELECT TOTAL(length(body)) FROM journal WHERE job = ?",
                                            (job,)).fetchone()[0])
                n = max(0, self._db.execute("DELETE FROM journal WHERE job = ?", (job,)).rowcount)
                self._db.execute("DELETE FROM job_info WHERE job = ?", (job,))
                if self._db.execute("SELECT 1 FROM journal WHERE job IS NULL AND t <= ? LIMIT 1",
                                    (t,)).fetchone() is not None:
                    self._db.execute("INSERT OR REPLACE INTO pruned (job, t) VALUES (?, ?)", (job, t))
            except sqlite3.Error as exc:
                self._fail(f"pruned job {job[:64]} could not be deleted ({exc})")
                return 0
            self._info_bytes.pop(job, None)
            self._pending_batches -= n
            self._pending_bytes -= size
            self.jobs_deleted += 1
            self.rows_of_pruned_jobs += n
            return n

    def forget_agent(self, agent: str) -> None:
        """The lifecycle forgot the agent (gone long enough): its Hello goes (its dedupe seq stays: it
        may come back with batches to resend)."""
        with self._lock:
            if self.closed:  # a late caller after close(): nothing to write to
                return
            try:
                self._begin()
                self._db.execute("DELETE FROM hello WHERE agent = ?", (agent,))
            except sqlite3.Error as exc:
                self._fail(f"agent {agent[:64]}'s Hello could not be deleted ({exc})")
                return
            self._hello_bytes.pop(agent, None)

    # ---- documents (rules thread) ---------------------------------------------------------------
    def put_doc(self, name: str, obj: object) -> bool:
        text = json.dumps(obj, allow_nan=False, default=str)
        with self._lock:
            if self.closed:  # a late caller after close(): nothing to write to
                return False
            try:
                self._begin()
                self._db.execute("INSERT OR REPLACE INTO doc (name, json) VALUES (?, ?)", (name, text))
            except sqlite3.Error as exc:
                self._fail(f"document {name} could not be written ({exc})")
                return False
            self._doc_bytes[name] = len(text.encode())
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

    def journal_jobs(self) -> set[str]:
        """The jobs the state holds data of: named by a batch alone, or with job info."""
        return {str(j) for (j,) in self._db.execute(
            "SELECT DISTINCT job FROM journal WHERE job IS NOT NULL UNION SELECT job FROM job_info")}

    def tombstones(self) -> dict[str, float]:
        """Pruned job -> when: rows that arrived by then hold nothing of that job any more."""
        return {str(j): float(t) for j, t in self._db.execute("SELECT job, t FROM pruned")}

    def replay(self) -> Iterator[tuple[str, str, bytes]]:
        """(kind, agent, body): every agent's latest Hello, then the batches in arrival order."""
        for _t, kind, agent, body in self.replay_timed():
            yield kind, agent, body

    def replay_timed(self) -> Iterator[tuple[float, str, str, bytes]]:
        """(arrival time, kind, agent, body): every agent's latest Hello (in arrival order), then the
        batches in arrival order."""
        for t, agent, body in self._db.execute("SELECT t, agent, body FROM hello ORDER BY t"):
            yield t, HELLO, agent, body
        yield from self._db.execute("SELECT t, kind, agent, body FROM journal ORDER BY id")

    def stats(self) -> dict[str, Any]:
        with self._lock:
            sizes = {"journal": self._batch_bytes + self._pending_bytes,
                     "hellos": sum(self._hello_bytes.values()), "job_info": sum(self._info_bytes.values()),
                     "documents": sum(self._doc_bytes.values()), "dedupe": sum(self._seq_bytes.values())}
            hellos = len(self._hello_bytes)
        disk = self.disk_bytes()
        return {"writes": self.writes, "commits": self.commits, "commit_failures": self.commit_failures,
                "rollbacks": self.rollbacks, "agents_lost": self.agents_lost,
                "journal_batches": self._batch_rows, "pruned": self.pruned, "pruned_bytes": self.pruned_bytes,
                "pruned_for_bytes": self.pruned_for_bytes, "hellos": hellos, "bytes": sizes,
                "logical_bytes": sum(sizes.values()), "held_bytes": disk, "disk_bytes": disk,
                "settled_bytes": self.settled_bytes, "settled_logical_bytes": self.settled_logical_bytes,
                "max_bytes": self.max_bytes, "budget_bytes": self.budget(),
                "overhead": round(self.overhead, 3),
                "pruned_hellos": self.pruned_hellos, "pruned_seqs": self.pruned_seqs, "shrinks": self.shrinks,
                "jobs_deleted": self.jobs_deleted, "rows_of_pruned_jobs": self.rows_of_pruned_jobs,
                "commit_ms_mean": (round(1e3 * self.commit_seconds / self.commits, 3)
                                   if self.commits else None),
                "last_error": self.last_error, "path": str(self.path)}

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            if self._open_txn:
                self.commit()
            self._db.close()
            self.closed = True
