"""The aggregator's --state-dir disk fills up while agents stream: nothing acknowledged may be lost.

The fault is injected where a full disk hits SQLite in WAL mode: at COMMIT, when the transaction's
pages are written to the WAL file ("database or disk is full", SQLITE_FULL from ENOSPC). The rules
thread writes its documents into the same transaction as the ingest stream, so its failed commits
roll back ingest rows too. Real gRPC agents on loopback; what is on disk is read back as a restart
would. The figures printed are recorded in docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.aggregator.state_schema import BATCH
from perfd.aggregator.state_store import StateStore
from perfd.core.model import StepRecord
from perfd.transport.client import AgentClient
from perfd.transport.gen import perfd_pb2 as pb
from tests.procs import free_port, http_get, stop, wait_for

ROOT = Path(__file__).resolve().parents[2]

ENOSPC = "database or disk is full"


class FullDisk:
    """A sqlite3 connection whose COMMIT fails with SQLite's ENOSPC error while ``full`` is set."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.full = False
        self.failed = 0

    def execute(self, sql: str, *args: Any) -> Any:
        if self.full and sql.strip().upper() == "COMMIT":
            self.failed += 1
            raise sqlite3.OperationalError(ENOSPC)
        return self.conn.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


def _threads_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (state T in /proc/<pid>/task/<tid>/stat)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            continue  # the thread ended
        if state not in ("T", "t"):
            return False
    return True


def _frozen_copy(pid: int, src: Path, dst: Path) -> None:
    """The database and its WAL as a kill -9 of ``pid`` would leave them, which is what a restart reads:
    copied with every thread of the process stopped (SIGSTOP, each thread seen stopped), then continued.
    Copied live, the two files were not one state: the rules thread checkpoints the WAL into the
    database and cuts it to nothing, and a copy spanning that holds pages of two states. A check that
    the WAL's salts were the same before and after caught a new WAL, not one empty both times: a fresh
    clone's CI read the last 5 iterations of each agent as missing; the same check, with the copy slowed
    and the aggregator niced under two busy loops, read 13 missing in 1 of 60 copies (a frozen copy: 0
    of 72). Straight copies of the two files had read 66 and 73 missing."""
    db, wal = src / "state.sqlite3", src / "state.sqlite3-wal"
    dst.mkdir(exist_ok=True)
    # the aggregator itself (unshare and sh exec into it): a wrapper stopped would leave it copying live
    assert b"perfd.app.cli\0aggregator" in Path(f"/proc/{pid}/cmdline").read_bytes(), pid
    os.kill(pid, signal.SIGSTOP)
    try:
        # SIGSTOP is delivered to each thread as it next runs: a thread inside a write finishes it first
        wait_for(lambda: _threads_stopped(pid), 30, f"every thread of process {pid} stopped")
        shutil.copyfile(db, dst / db.name)
        if wal.exists():
            shutil.copyfile(wal, dst / wal.name)
    finally:
        os.kill(pid, signal.SIGCONT)


def on_disk(state_dir: Path) -> dict[str, set[int]]:
    """job -> iterations whose step records the journal holds (what a restart would replay)."""
    s = StateStore(state_dir)
    out: dict[str, set[int]] = {}
    for kind, _agent, body in s.replay():
        if kind == BATCH:
            for st in pb.Batch.FromString(body).steps:
                out.setdefault(st.job, set()).add(st.iteration)
    s.close()
    return out


def test_a_failed_document_commit_loses_the_ingests_rows_and_the_store_says_so(tmp_path: Path) -> None:
    """The issue's reproduction: ingest rows pending, the rules thread's put_doc fails at COMMIT."""
    s = StateStore(tmp_path)
    s.journal(BATCH, "a2", b"kept")
    s.put_seq("a2", "e", 1)
    assert s.commit()
    s.journal(BATCH, "a1", b"B" * 2000)
    s.put_seq("a1", "e", 1)
    disk = FullDisk(s._db)
    s._db = disk  # type: ignore[assignment]
    disk.full = True
    assert s.put_doc("rules", {"x": 1}) is False
    disk.full = False
    assert s.commit()  # nothing open any more: True, but ...
    assert [b for _, a, b in s.replay() if a == "a1"] == []  # ... a1's row is gone, and
    assert s.lost("a1") and not s.lost("a2")  # the store says whose
    assert s.journal(BATCH, "a1", b"later") is False  # nothing of a1 over the hole until recovered
    assert s.put_seq("a1", "e", 2) is False
    assert s.recover("a1") is None and s.recover("a2") == ("e", 1)
    assert s.journal(BATCH, "a1", b"resent") and s.put_seq("a1", "e", 1) and s.commit()
    assert s.seqs() == {"a1": ("e", 1), "a2": ("e", 1)}
    assert s.rollbacks == 1 and s.agents_lost == 1


@pytest.mark.slow
def test_disk_full_while_two_agents_stream_loses_no_acknowledged_iteration(tmp_path: Path) -> None:
    n = 150
    state = tmp_path / "state"

    async def main() -> tuple[dict[str, int], dict[str, Any]]:
        agg = Aggregator(AggregatorConfig(grpc_port=0, http_port=0, rules_files=[], state_dir=str(state),
                                          rules_interval_s=0.05))
        assert agg.store is not None
        disk = FullDisk(agg.store._db)
        agg.store._db = disk  # type: ignore[assignment]
        agg.server.ack_interval_s = 0.1
        await agg.start()
        clients = [AgentClient(f"127.0.0.1:{agg.grpc_port}", f"node-{j}", jobs=[j], backoff_initial_s=0.05,
                               backoff_max_s=0.2) for j in ("a", "b")]
        tasks = [asyncio.create_task(c.run()) for c in clients]
        acked_while_full = {}
        try:
            for i in range(1, n + 1):
                for c, j in zip(clients, ("a", "b"), strict=True):
                    c.submit(steps=[StepRecord(job=j, iteration=i, step_time_ms=100.0)])
                if i == n // 3:
                    # Every batch so far acknowledged first (an event, not a pause): an ack of a batch
                    # committed before the disk filled may otherwise arrive after, and count as one
                    # "acknowledged while full" on a loaded machine (5 were seen once).
                    for c in clients:
                        assert await c.flush(60)
                    disk.full = True  # the disk fills: every commit fails, whoever makes it
                    acked = {c.agent_id: c.batches_acked for c in clients}
                if i == 2 * n // 3:
                    acked_while_full = {c.agent_id: c.batches_acked - acked[c.agent_id] for c in clients}
                    disk.full = False  # space freed
                await asyncio.sleep(0.02)
            for c in clients:
                assert await c.flush(60)
            return acked_while_full, {"commit_failures": disk.failed, **agg.server.counters()}
        finally:
            for t in tasks:
                t.cancel()
            await agg.stop()

    acked_while_full, counters = asyncio.run(main())
    held = on_disk(state)
    lost = {j: sorted(set(range(1, n + 1)) - held.get(j, set())) for j in ("a", "b")}
    print(f"FIGURES disk full: {counters['commit_failures']} failed commits, "
          f"{counters['store_failures']} streams closed for lost writes, batches acknowledged while "
          f"full {acked_while_full}; iterations missing on disk after space was freed: "
          f"a {len(lost['a'])}, b {len(lost['b'])} of {n} each")
    assert counters["commit_failures"] > 0
    assert acked_while_full == {"node-a": 0, "node-b": 0}  # nothing acknowledged that is not on disk
    assert lost == {"a": [], "b": []}


def _tmpfs_namespaces() -> bool:
    """Whether this machine lets an unprivileged user namespace mount a tmpfs (``unshare -rm``)."""
    if shutil.which("unshare") is None:
        return False
    try:
        p = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
                           capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.returncode == 0


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.skipif(not _tmpfs_namespaces(), reason="needs `unshare -rm` to mount a tmpfs")
def test_a_real_full_tmpfs_loses_no_acknowledged_iteration(tmp_path: Path) -> None:
    """A real aggregator process whose --state-dir is a 3 MB tmpfs of its own (a mount namespace),
    filled up by a file while two agents stream, then freed."""
    n = 300
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    grpc_port, http_port = free_port(), free_port()
    agg_cmd = (f"mount -t tmpfs -o size=3m tmpfs {mnt} && exec {sys.executable} -m perfd.app.cli aggregator "
               f"--grpc-port {grpc_port} --http-port {http_port} --no-rules --rules-interval 0.2 "
               f"--state-dir {mnt}/state")
    p = subprocess.Popen(["unshare", "-rm", "sh", "-c", agg_cmd], cwd=ROOT,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"},
                         stdout=(tmp_path / "agg.out").open("wb"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{http_port}"
    inside = Path(f"/proc/{p.pid}/root") / str(mnt).lstrip("/")  # the tmpfs, seen from here
    filler = inside / "filler"
    bulk = "x" * 1500  # a Megatron line with its timers is about this long

    def fill() -> None:
        try:  # closing the file flushes too, and may be where ENOSPC comes
            with open(filler, "wb") as f:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
        except OSError:  # ENOSPC: the disk is full
            pass

    async def stream() -> None:
        clients = [AgentClient(f"127.0.0.1:{grpc_port}", f"node-{j}", jobs=[j], backoff_initial_s=0.1,
                               backoff_max_s=0.5) for j in ("a", "b")]
        tasks = [asyncio.create_task(c.run()) for c in clients]
        try:
            for i in range(1, n + 1):
                for c, j in zip(clients, ("a", "b"), strict=True):
                    c.submit(steps=[StepRecord(job=j, iteration=i, step_time_ms=100.0,
                                               fields={"line": bulk})])
                if i == n // 3:
                    await asyncio.to_thread(fill)
                if i == 2 * n // 3:
                    filler.unlink()
                await asyncio.sleep(0.03)
            for c in clients:
                assert await c.flush(120)
        finally:
            for t in tasks:
                t.cancel()

    try:
        wait_for(lambda: http_get(f"{base}/healthz"), 30, "aggregator up")
        asyncio.run(stream())
        stats = json.loads(http_get(f"{base}/api/stats"))["transport"]
        copy = tmp_path / "copy"  # what a restart would read
        _frozen_copy(p.pid, inside / "state", copy)
    finally:
        stop(p)
    held = on_disk(copy)
    missing = {j: sorted(set(range(1, n + 1)) - held.get(j, set())) for j in ("a", "b")}
    print(f"FIGURES real tmpfs: {stats['state_store_commit_failures']} failed commits, "
          f"{stats['store_failures']} streams closed for lost writes; iterations missing on disk after "
          f"space was freed: a {len(missing['a'])}, b {len(missing['b'])} of {n} each")
    assert stats["state_store_commit_failures"] > 0  # the disk did fill
    assert missing == {"a": [], "b": []}, (stats, (tmp_path / "agg.out").read_text()[-3000:])
