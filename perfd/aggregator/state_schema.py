"""What a state file of ``perfd aggregator --state-dir`` is: its tables, its schema number and the
checks on it, the upgrade of a file an older build wrote, and the errors a state directory is
refused with (StoreError, StateTooNew).

Apart from the store (perfd/aggregator/state_store.py: the journal, its transactions, the size budget
and the pruning) because this is what must hold across builds: the one place to change, and to raise
SCHEMA_VERSION in, when what a file holds changes; and it runs before the store writes anything.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from perfd import __version__

HELLO, BATCH = "hello", "batch"  # the kinds of journal rows (a Hello is one row per agent: its own table)

# journal.job: the one job a batch's step records, job info, collectives and events name (NULL:
# several, or none), so that a pruned job's rows can be deleted.
TABLES = """
CREATE TABLE IF NOT EXISTS journal (id INTEGER PRIMARY KEY AUTOINCREMENT, t REAL NOT NULL,
                                    kind TEXT NOT NULL, agent TEXT NOT NULL, body BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS hello (agent TEXT PRIMARY KEY, t REAL NOT NULL, body BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS job_info (job TEXT PRIMARY KEY, agent TEXT NOT NULL, json TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS seq (agent TEXT PRIMARY KEY, epoch TEXT NOT NULL, seq INTEGER NOT NULL,
                                t REAL NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS doc (name TEXT PRIMARY KEY, json TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pruned (job TEXT PRIMARY KEY, t REAL NOT NULL);
"""


# What a state file holds and how (its tables, and the protobuf batches and JSON documents in them),
# as a number kept in the file (SQLite's user_version). Raise it with every change an older build
# would read lossy. A newer build upgrades an older file at open (:func:`migrate`,
# :func:`settle_version`); an older build refuses a newer file (:class:`StateTooNew`) and leaves it as
# it is. 0: the files of the builds before the number (perfd 0.1.0), which wrote none.
SCHEMA_VERSION = 1


class StoreError(Exception):
    """The state directory cannot be used or written (a clear message for a person)."""


class StateTooNew(StoreError):
    """The state file was written by a newer perfd than this one (its schema is higher): reading it
    would lose what this build does not know, so start-up stops and the file stays untouched."""


_SQLITE_MAGIC = b"SQLite format 3\x00"
_USER_VERSION_AT = 60  # the file header's user_version: 4 bytes, big-endian (sqlite.org/fileformat.html)


def schema_of(path: Path) -> int:
    """The schema number of an existing state file, read without writing anything: from the file's
    header while no write-ahead log holds newer pages (a clean stop), else through a read-only
    connection (which neither creates tables nor checkpoints the log into the file). 0 for a file
    that is not SQLite's: the open's own checks name the damage."""
    with path.open("rb") as fh:
        header = fh.read(100)
    if len(header) < 100 or not header.startswith(_SQLITE_MAGIC):
        return 0
    wal = path.with_name(path.name + "-wal")
    if not wal.exists() or wal.stat().st_size == 0:
        return int.from_bytes(header[_USER_VERSION_AT:_USER_VERSION_AT + 4], "big")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return int(db.execute("PRAGMA user_version").fetchone()[0])
    finally:
        db.close()


def refuse_newer(path: Path) -> None:
    """StateTooNew when ``path`` holds state of a schema above this build's (nothing is written)."""
    if not path.exists():
        return
    found = schema_of(path)
    if found > SCHEMA_VERSION:
        raise StateTooNew(
            f"{path} holds state of schema {found}, written by a newer perfd; this perfd {__version__} "
            f"reads schema {SCHEMA_VERSION} and older. Refusing to start rather than read it lossy; the "
            "file is left as it is. Run the perfd that wrote it (or a newer one), or move the state "
            "directory away to start with an empty state.")


def migrate(db: sqlite3.Connection) -> int | None:
    """A state file of an older build: Hellos were journal rows (one per Hello, never pruned), and
    the journal had no job column. Keep each agent's latest Hello, add the column. Returns the Hello
    rows folded into one per agent, None when the file held none."""
    cols = {r[1] for r in db.execute("PRAGMA table_info(journal)")}
    if "job" not in cols:
        db.execute("ALTER TABLE journal ADD COLUMN job TEXT")
    if "t" not in {r[1] for r in db.execute("PRAGMA table_info(seq)")}:
        db.execute("ALTER TABLE seq ADD COLUMN t REAL NOT NULL DEFAULT 0")
    db.execute("CREATE INDEX IF NOT EXISTS journal_job ON journal (job)")
    if db.execute("SELECT 1 FROM journal WHERE kind = ? LIMIT 1", (HELLO,)).fetchone() is None:
        return None
    db.execute("BEGIN")  # one transaction: the Hellos move whole or not at all
    try:
        db.execute("INSERT OR REPLACE INTO hello (agent, t, body) SELECT agent, t, body "
                   "FROM journal WHERE id IN (SELECT MAX(id) FROM journal WHERE kind = ? "
                   "GROUP BY agent)", (HELLO,))
        n = db.execute("DELETE FROM journal WHERE kind = ?", (HELLO,)).rowcount
        db.execute("COMMIT")
    except sqlite3.Error:
        db.execute("ROLLBACK")
        raise
    return n


def settle_version(db: sqlite3.Connection, path: Path) -> int:
    """After :func:`migrate`: StateTooNew when the file's schema is above this build's (written
    between :func:`refuse_newer` and this connection), else the file's number raised to
    SCHEMA_VERSION. Returns the number the file had."""
    found = int(db.execute("PRAGMA user_version").fetchone()[0])
    if found > SCHEMA_VERSION:
        raise StateTooNew(f"{path}: schema {found} is newer than this perfd's {SCHEMA_VERSION}")
    if found < SCHEMA_VERSION:
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    return found


def cut_back(db: sqlite3.Connection) -> None:
    """Give back what a kill -9 left in the files: its write-ahead log (recovered at open, not yet
    checkpointed) and the free pages of a pruning it did not vacuum, so that a restart starts at its
    data's size (seen: 5.1 MB of files for 3 MB of data under a 4 MB cap, read on /metrics until the
    next checkpoint). Raises sqlite3.OperationalError where the disk is full."""
    if int(db.execute("PRAGMA freelist_count").fetchone()[0]):
        # One executescript steps the pragma to its end (through execute() it frees one page a call).
        db.executescript("PRAGMA incremental_vacuum;")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
