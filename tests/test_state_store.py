"""perfd.aggregator.state_store: the aggregator's --state-dir (SQLite, WAL)."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from perfd.aggregator.state_schema import BATCH, HELLO, SCHEMA_VERSION, StateTooNew, StoreError, schema_of
from perfd.aggregator.state_store import StateStore
from tests.cli_main import Ran, perfd


def _aggregator(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, state_dir: Path) -> Ran:
    """`perfd aggregator ... --state-dir DIR` by the CLI's main() in this process, for a state dir it
    must refuse: the store is opened (and refused) as the Aggregator is made, before it starts, listens
    or takes a signal. Were it not refused, the start raises here instead of serving in the test."""
    from perfd.aggregator.daemon import Aggregator

    async def no_start(self: Aggregator) -> None:
        raise AssertionError(f"the aggregator started on {state_dir}: no refusal")

    monkeypatch.setattr(Aggregator, "start", no_start)
    return perfd(capsys, "aggregator", "--grpc-port", "0", "--http-port", "0", "--no-rules",
                 "--state-dir", state_dir)


def test_journal_job_info_seqs_and_documents_come_back_after_reopening(tmp_path: Path) -> None:
    s = StateStore(tmp_path / "st")
    assert s._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    s.journal(HELLO, "a1", b'["job"]')
    s.journal(BATCH, "a1", b"\x01\x02")
    s.put_job_info("job", "a1", '{"arguments": {}}')
    s.put_seq("a1", "epoch-1", 7)
    uncommitted = StateStore(tmp_path / "st")  # a second reader sees only committed data
    assert list(uncommitted.replay()) == [] and uncommitted.seqs() == {}
    assert s.commit() and s.put_doc("rules", {"states": [1, 2]})
    s.close()
    r = StateStore(tmp_path / "st")
    assert list(r.replay()) == [(HELLO, "a1", b'["job"]'), (BATCH, "a1", b"\x01\x02")]
    assert r.job_infos() == [("job", "a1", '{"arguments": {}}')] and r.seqs() == {"a1": ("epoch-1", 7)}
    assert r.get_doc("rules") == {"states": [1, 2]} and r.get_doc("missing") is None


def test_prune_drops_the_oldest_batches_and_keeps_hellos_and_job_info(tmp_path: Path) -> None:
    s = StateStore(tmp_path, max_batches=3)
    s.journal(HELLO, "a", b"[]")
    for i in range(6):
        s.journal(BATCH, "a", bytes([i]))
    s.put_job_info("j", "a", "{}")
    assert s.commit()
    assert s.prune() == 3
    assert [b for k, _, b in s.replay()] == [b"[]", b"\x03", b"\x04", b"\x05"]
    assert s.job_infos() == [("j", "a", "{}")]


def test_a_failed_commit_is_reported_not_raised_and_nothing_of_it_is_kept(tmp_path: Path) -> None:
    s = StateStore(tmp_path)
    s.journal(BATCH, "a", b"x")
    s._db.close()  # the disk went away under it
    s._db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    s._open_txn = True  # COMMIT now fails: no transaction open on this connection
    assert s.commit() is False and s.commit_failures == 1 and s.last_error


@pytest.mark.slow
def test_an_unusable_state_dir_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "a-file"
    f.write_text("")
    with pytest.raises(StoreError, match="--state-dir"):
        StateStore(f)
    proc = _aggregator(capsys, monkeypatch, f / "sub")
    assert proc.returncode == 2 and "--state-dir" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_damaged_state_file_stops_start_up_with_one_clear_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """4 KB of random bytes in the middle of the file (the issue's build died in the replay with an
    uncaught sqlite3.DatabaseError traceback)."""
    s = StateStore(tmp_path)
    s.journal(HELLO, "a", b'["j"]')
    for _ in range(500):
        s.journal(BATCH, "a", random.Random(0).randbytes(2000))
    assert s.commit()
    s.close()
    f = tmp_path / "state.sqlite3"
    with open(f, "r+b") as fh:
        fh.seek(f.stat().st_size // 2)
        fh.write(random.Random(1).randbytes(4096))
    with pytest.raises(StoreError, match="is damaged"):
        StateStore(tmp_path)
    proc = _aggregator(capsys, monkeypatch, tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "is damaged" in lines[0] and "move it away" in lines[0], proc.stderr


def test_the_rules_loop_prunes_the_journal_even_while_ingest_holds_a_transaction(tmp_path: Path) -> None:
    from perfd.aggregator.daemon import Aggregator, AggregatorConfig

    agg = Aggregator(AggregatorConfig(grpc_port=0, http_port=0, rules_files=[], state_dir=str(tmp_path)))
    store = agg.store
    assert store is not None
    store.max_batches = 3
    for i in range(10):
        store.journal(BATCH, "a", bytes([i]))
    assert store.commit()
    store.journal(BATCH, "a", b"\x0a")  # ingest's next transaction is open (the usual case when busy)
    agg.tick()  # what the rules loop runs every interval
    assert store.commit()
    assert [b for _, _, b in store.replay()] == [b"\x08", b"\x09", b"\x0a"]
    assert store.stats()["journal_batches"] == 3 and store.pruned == 8
    store.close()


def test_a_state_file_of_an_older_build_keeps_one_hello_per_agent(tmp_path: Path) -> None:
    """Before, every Hello was a journal row, never pruned and replayed at each start."""
    tmp_path.chmod(0o700)
    db = sqlite3.connect(str(tmp_path / "state.sqlite3"))
    db.executescript("""CREATE TABLE journal (id INTEGER PRIMARY KEY AUTOINCREMENT, t REAL NOT NULL,
                        kind TEXT NOT NULL, agent TEXT NOT NULL, body BLOB NOT NULL);""")
    rows = [(float(i), HELLO, f"a{i % 3}", f'["j{i}"]'.encode()) for i in range(30)]
    rows.insert(10, (10.5, BATCH, "a0", b"\x01"))
    db.executemany("INSERT INTO journal (t, kind, agent, body) VALUES (?, ?, ?, ?)", rows)
    db.commit()
    db.close()
    assert schema_of(tmp_path / "state.sqlite3") == 0  # the builds before the number wrote none
    s = StateStore(tmp_path)
    assert list(s.replay()) == [(HELLO, "a0", b'["j27"]'), (HELLO, "a1", b'["j28"]'),
                                (HELLO, "a2", b'["j29"]'), (BATCH, "a0", b"\x01")]
    assert s.stats()["hellos"] == 3 and s.stats()["journal_batches"] == 1
    s.close()
    assert schema_of(tmp_path / "state.sqlite3") == SCHEMA_VERSION  # upgraded once, at open


def test_a_newer_schema_is_refused_also_while_its_writer_holds_it_in_the_log(tmp_path: Path) -> None:
    """A newer build killed before its write-ahead log reached the file: the header still says the old
    schema, the log the new one; the read-only look through SQLite finds it (the header alone would not)."""
    newer = StateStore(tmp_path)
    newer._db.execute("PRAGMA wal_autocheckpoint=0")
    newer._db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    path = tmp_path / "state.sqlite3"
    assert (tmp_path / "state.sqlite3-wal").stat().st_size > 0
    main = path.read_bytes()
    with pytest.raises(StateTooNew, match=f"schema {SCHEMA_VERSION + 1}, written by a newer perfd"):
        StateStore(tmp_path)
    assert path.read_bytes() == main
    assert schema_of(path) == SCHEMA_VERSION + 1


def test_the_state_is_pruned_by_bytes_oldest_batches_first(tmp_path: Path) -> None:
    s = StateStore(tmp_path, max_bytes=10_000)
    # The cap is the files': a quarter of a small cap is left to the write-ahead log (WAL_ROOM_BYTES).
    assert s.budget() == 7_500
    s.put_hello("a", b"[]")
    for i in range(20):
        s.journal(BATCH, "a", bytes([i]) * 1000)
    assert s.commit()
    assert s.prune() == 13 and s.held_bytes() <= s.budget()
    assert [b[0] for k, _, b in s.replay() if k == BATCH] == list(range(13, 20))
    assert s.stats()["pruned_for_bytes"] == 13


def test_a_pruned_job_leaves_the_state_and_a_tombstone_hides_it_in_batches_of_several_jobs(
        tmp_path: Path) -> None:
    from perfd.aggregator.daemon import Aggregator, AggregatorConfig
    from perfd.core.model import StepRecord
    from perfd.transport.codec import encode_batch
    from perfd.transport.series import SeriesTable

    def cfg() -> AggregatorConfig:
        return AggregatorConfig(grpc_port=0, http_port=0, rules_files=[], state_dir=str(tmp_path))

    agg = Aggregator(cfg())
    j = agg.server.journal
    assert j is not None and agg.store is not None

    def batch(seq: int, *jobs: str) -> None:
        steps = [StepRecord(job=job, iteration=seq, rank="last", end_time=1e9 + seq, step_time_ms=100.0)
                 for job in jobs]
        j.batch("a", encode_batch("a", seq, (), steps, (), SeriesTable()))

    batch(1, "old")
    batch(2, "old", "other")
    batch(3, "other")
    assert agg.store.commit()
    assert agg.store.forget_job("old") == 1  # its own row; the mixed one stays, behind a tombstone
    assert agg.store.commit()
    assert set(agg.store.tombstones()) == {"old"}
    agg.store.close()
    again = Aggregator(cfg())
    assert again.store is not None
    from perfd.aggregator.durable import restore

    got = restore(again, again.store)
    assert got["batches"] == 2 and again.state.job_names() == ["other"]
    assert sorted(r.iteration for r in again.state.step_records("other")) == [2, 3]
    again.store.close()


def test_what_the_aggregator_refused_is_never_journalled(tmp_path: Path) -> None:
    """The journal stores what the aggregator kept of a batch and the jobs a Hello
    was given — not a stranger's step records or events for a job it does not host, nor Hello names
    the guard refused."""
    from perfd.aggregator.daemon import Aggregator, AggregatorConfig
    from perfd.core.model import StepRecord
    from perfd.transport.codec import HelloInfo, decode_batch, encode_batch
    from perfd.transport.gen import perfd_pb2 as pb
    from perfd.transport.series import SeriesTable

    agg = Aggregator(AggregatorConfig(grpc_port=0, http_port=0, rules_files=[], state_dir=str(tmp_path)))
    j, store = agg.server.journal, agg.store
    assert j is not None and store is not None
    admitted = agg._on_hello(HelloInfo(agent_id="host", node="n", version="", jobs=("mine", "x" * 300),
                                       capabilities={}, spool_epoch="e", n_series=0))
    j.hello("host", admitted)
    assert admitted == ["mine"]  # the 300-byte name refused
    agg._on_hello(HelloInfo(agent_id="stranger", node="n", version="", jobs=(), capabilities={},
                            spool_epoch="e", n_series=0))

    def send(agent: str, seq: int, jobs: list[str], job_info: dict[str, str] | None = None) -> None:
        steps = [StepRecord(job=job, iteration=seq, rank="last", end_time=1e9 + seq, step_time_ms=1.0)
                 for job in jobs]
        evs = [{"kind": "job_phase", "job": job, "time": 1e9, "text": "pause",
                "payload": {"job": job, "phase": "checkpoint", "state": "begin"}} for job in jobs]
        b = encode_batch(agent, seq, (), steps, evs, SeriesTable(), job_info_json=job_info)
        kept = agg.on_batch(agent, decode_batch(pb.Batch.FromString(b.SerializeToString()), {}))
        j.batch(agent, b, kept)

    send("host", 1, ["mine"], {"mine": '{"framework": "megatron"}'})
    send("stranger", 1, ["mine"], {"mine": '{"framework": "pytorch"}'})  # not a host of "mine": refused
    assert store.commit()
    rows = list(store.replay())
    assert [(k, a) for k, a, _ in rows] == [("hello", "host"), ("batch", "host")]  # nothing of the stranger
    assert rows[0][2] == b'["mine"]' and store.job_infos() == [("mine", "host", '{"framework": "megatron"}')]
    assert agg.refusals.get("not_host") >= 2  # the stranger's steps and event, counted
    store.close()


def test_hello_and_dedupe_rows_are_pruned_past_the_budget(tmp_path: Path) -> None:
    s = StateStore(tmp_path, max_bytes=40_000)
    for i in range(100):
        s.put_hello(f"agent-{i:03d}", b"x" * 400)
        s.put_seq(f"agent-{i:03d}", "epoch", i)
    assert s.commit()
    s.prune()
    assert s.commit() and s.held_bytes() <= s.budget()
    st = s.stats()
    assert st["pruned_hellos"] > 0 and st["hellos"] < 100
    # the oldest went first
    kept = [a for k, a, _ in s.replay() if k == HELLO]
    assert kept == sorted(kept) and kept[-1] == "agent-099"


def test_a_restart_cuts_back_the_log_and_free_pages_a_kill_left(tmp_path: Path) -> None:
    """A kill -9 after a pruning's commit and before its vacuum and checkpoint leaves the files at their
    size then; the next start gives that back, and the data is all there (a CI run read 5.1 MB of files
    for 3 MB of data under a 4 MB cap on the restarted aggregator's /metrics)."""
    live = tmp_path / "live"
    s = StateStore(live)
    s._db.execute("PRAGMA wal_autocheckpoint=0")  # as if killed before any checkpoint ran
    for i in range(200):
        s.journal(BATCH, "a", bytes([i % 256]) * 20_000)
    assert s.commit()
    s._db.execute("BEGIN")
    s._db.execute("DELETE FROM journal WHERE id <= 150")  # a pruning, committed, never vacuumed
    s._db.execute("COMMIT")
    # The files as the kill left them, copied while the writer still holds them.
    dead = tmp_path / "dead"
    dead.mkdir(mode=0o700)
    for suffix in ("", "-wal"):
        (dead / f"state.sqlite3{suffix}").write_bytes((live / f"state.sqlite3{suffix}").read_bytes())
    left = sum(f.stat().st_size for f in dead.iterdir())
    assert (dead / "state.sqlite3-wal").stat().st_size > 4e6  # the 4 MB written, never checkpointed
    again = StateStore(dead)
    assert [b[0] for k, _, b in again.replay() if k == BATCH] == [i % 256 for i in range(150, 200)]
    assert (dead / "state.sqlite3-wal").stat().st_size == 0
    # 50 rows of 20 KB: ~1 MB of pages, where the files had ~4.2 MB.
    assert again.disk_bytes() < 1.3e6 < left / 3, (again.disk_bytes(), left)


def test_the_write_ahead_log_stays_in_the_room_a_small_cap_leaves_it(tmp_path: Path) -> None:
    """The budget leaves the log a quarter of a 4 MiB cap (1 MiB, not WAL_ROOM_BYTES); its checkpoint
    interval and size limit scale with it. Before, the log grew to its default 256 pages between
    checkpoints: 1.10 MB with its index, past that room, so a store at its budget went past its cap."""
    s = StateStore(tmp_path, max_bytes=4 << 20)
    assert s.wal_room == 1 << 20
    for i in range(150):  # at its budget: pruned and shrunk as the rules loop does
        s.put_hello(f"node-{i}", b'["' + b"g" * 25_000 + b'"]')
        assert s.commit()
        s.prune()
        assert s.shrink()
    log = 0
    for i in range(900):  # agents' batches, a commit each, no tick between: the log checkpoints alone
        s.journal(BATCH, f"node-{i % 50}", b"x" * 3_000)
        assert s.commit()
        log = max(log, sum((tmp_path / f"state.sqlite3{x}").stat().st_size for x in ("-wal", "-shm")))
    assert 3 * s.wal_room // 4 < log <= s.wal_room
    s.close()
