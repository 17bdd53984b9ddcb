"""An agent that folds its ranks' collective windows (EngineClient's window_fold, ``perfd agent``'s
default): what it spools goes out whole. The figures one node message cannot hold beside its partials
go in messages of their own, which carry only figures: each is routed to the node's partition like
the rest (a message of figures alone once had no job to route it by: read back as unreadable, dropped)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from perfd.analytics.collectives.shardfold import ShardCollectives
from perfd.core.model import CollectiveRecord
from perfd.core.winfigures import WindowFigures
from perfd.engine import publisher
from perfd.engine import subjects as S
from perfd.engine.figures_codec import chunks
from perfd.engine.partial import decode
from perfd.engine.publisher import EngineClient
from tests.collectives.collective_helpers import MS, T0
from tests.collectives.test_collective_partial import PER_NODE, synthetic_job


class _Js:
    """What EngineClient._publish needs of a JetStream context: the subjects it published to."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, data: bytes, timeout: float = 0.0,
                      headers: dict[str, str] | None = None) -> Any:
        self.sent.append((subject, data))
        return None


def test_figures_past_one_message_go_in_their_own_routed_to_the_nodes_partition(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publisher, "figure_chunks", lambda figs: chunks(figs, 4))  # 4 rows a message
    recs, steps = synthetic_job()
    node = 1
    mine = [s for s in steps if isinstance(s.rank, int) and s.rank // PER_NODE == node]
    ops: dict[int, list[CollectiveRecord]] = {}
    for r in recs:  # the synthetic job's iteration N runs 100 ms from N x 100 ms
        if (r.rank or 0) // PER_NODE == node:
            ops.setdefault(((r.time_created_ns or T0) - T0) // (100 * MS), []).append(r)
    fold = ShardCollectives()
    client = EngineClient(S.EngineConfig(("nats://unused",), partitions=4), f"node-{node}/j",
                          node=f"node-{node}", window_fold=fold)
    for it in sorted({s.iteration for s in mine}):
        client.submit(steps=[s for s in mine if s.iteration == it], collectives=ops.get(it, []))
    st = client.stats()
    assert st["operations_folded"] == sum(len(v) for v in ops.values()) and st["figure_rows_sent"] > 8
    assert st["fold_jobs_forgotten"] == 0 and st["bad_job_info"] == 0

    js = _Js()
    for _, data in client.spool.pending():
        assert asyncio.run(client._publish(js, data)) is False  # type: ignore[arg-type]
    assert client.stats()["unreadable"] == 0
    want = S.node_subject("j", S.partition_of("j", f"node-{node}", 4))
    sent = [decode(data) for subject, data in js.sent if subject == want]
    alone = [d for d in sent if d.figures and not d.partials]
    assert alone, "every message's figures fitted beside its partials: the case is not made"
    # every row the agent's fold made went out, whatever message it went in
    got = WindowFigures("j")
    for d in sent:
        for f in d.figures:
            got.absorb(f)
    assert len(got) > 0 and {r for _, r in got.rows} <= set(range(node * PER_NODE, (node + 1) * PER_NODE))
    assert sum(len(f) for d in sent for f in d.figures) == st["figure_rows_sent"]
