"""The aggregator's --state-dir disk fills up while agents stream: nothing acknowledged may be lost.

The fault is injected where a full disk hits SQLite in WAL mode: at COMMIT, when the transaction's
pages are written to the WAL file ("database or disk is full", SQLITE_FULL from ENOSPC). The rules
thread writes its documents into the same transaction as the ingest stream, so its failed commits
roll back ingest rows too. Real gRPC agents on loopback; what is on disk is read back as a restart
would. The figures printed are recorded in docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

from perfd.aggregator.main import Aggregator, AggregatorConfig
from perfd.aggregator.store import BATCH, StateStore
from perfd.model import StepRecord
from perfd.transport.client import AgentClient
from perfd.transport.gen import perfd_pb2 as pb

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
