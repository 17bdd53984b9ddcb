"""The communication-share summaries between a shard and its job's root: their wire form
(perfd.engine.comm_codec: the same bytes back, a malformed or other-version summary refused), what a
shard holds of its partitions' figure rows and when it summarises them (perfd.engine.shard_comm), and
what the root keeps of the summaries (perfd.engine.root_comm: a holder's newest, holders merged)."""

from __future__ import annotations

import dataclasses
import random
from typing import cast

import pytest

from perfd.analytics.collectives.comm_summary import summarize
from perfd.core import commsummary as cs
from perfd.core.winfigures import RankWindow
from perfd.engine import comm_codec, figures_codec
from perfd.engine import subjects as S
from perfd.engine.root import Root, RootSink
from perfd.engine.root_comm import RootComm
from perfd.engine.shard_comm import COST_FACTOR, MIN_EVERY_S, ShardComm, comm_messages
from perfd.engine.shard_summaries import IDLE_FORGET_S
from perfd.transport.gen import perfd_pb2 as pb
from tests.engine.test_comm_summary import JOB, _job, _joins

RECENT, OUT = 50, 20


def _summary(seed: int = 1, partition: int = 0, seq: int = 1) -> cs.CommSummary:
    return summarize(JOB, _joins(_job(40, 30, seed)), RECENT, OUT, partition=partition, epoch=9, seq=seq)


def test_a_summary_reads_back_as_it_was_written() -> None:
    s = _summary()
    assert s.iterations and s.by and s.top
    m = pb.CommSummary()
    comm_codec.to_pb(s, m)
    data = m.SerializeToString(deterministic=True)
    back = comm_codec.from_pb(pb.CommSummary.FromString(data))
    again = pb.CommSummary()
    comm_codec.to_pb(back, again)
    assert back == s and again.SerializeToString(deterministic=True) == data
    assert cs.answer(back, OUT) == cs.answer(s, OUT)


@pytest.mark.parametrize("spoil", ["version", "top", "class twice", "iteration twice", "accuracy"])
def test_a_malformed_summary_is_refused(spoil: str) -> None:
    m = pb.CommSummary()
    comm_codec.to_pb(_summary(), m)
    if spoil == "version":
        m.version = 2
    elif spoil == "top":
        m.top_rank.append(1)
    elif spoil == "class twice":
        m.by.add().CopyFrom(m.by[0])
    elif spoil == "iteration twice":
        m.iterations.add().CopyFrom(m.iterations[0])
    else:
        m.share.relative_accuracy = 0.05
    with pytest.raises(ValueError):
        comm_codec.from_pb(m)


def _pb(rows: dict[int, list[RankWindow]], ranks: set[int] | None = None) -> list[pb.WindowFigures]:
    out = []
    for join in _joins(rows, ranks).values():
        m = pb.WindowFigures()
        figures_codec.to_pb(join, m)
        out.append(m)
    return out


class _Cpu:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.25  # each summary takes 0.25 s of CPU, read twice
        return self.t


def test_a_shard_summarises_its_partitions_rows_as_they_are_and_then_at_its_cadence() -> None:
    rows = _job(60, 12, seed=2)
    part = {r for r in range(60) if r % 2}
    comm = ShardComm(summarize, RECENT, OUT, cpu=_Cpu())
    # each message twice, the second a provisional row of each window over a settled one: no change
    provisional = {it: [w._replace(settled=False, comm_ns=w.comm_ns + 1) for w in ws]
                   for it, ws in rows.items()}
    comm.fold_in(_pb(rows, part) + _pb(provisional, part), partition=3, now=90.0)
    comm.fold_in(_pb(rows, {0}), partition=1, now=90.0)
    got = comm.take(now=100.0)
    mine = {s.partition: s for s in got[JOB]}
    want = summarize(JOB, _joins(rows, part), RECENT, OUT, partition=3, epoch=comm.epoch, seq=1)
    assert mine[3] == want and mine[1].ranks == 1
    assert comm.stats.summaries == 2 and comm.stats.summary_cpu_s == pytest.approx(0.5)
    assert comm.take(now=100.0) == {}  # nothing came since
    newer = next(w for w in rows[11] if w.rank in part)
    comm.fold_in(_pb({11: [newer._replace(basis=newer.basis + 1)]}, part), partition=3, now=100.0)  # newer
    due = 100.0 + max(MIN_EVERY_S, COST_FACTOR * 0.5)
    assert comm.take(now=due - 0.01) == {}  # the job's two took 0.5 s together: not again before 5 s
    again = comm.take(now=due)
    assert [s.seq for s in again[JOB]] == [2]


def test_a_shard_keeps_the_newest_iterations_and_summarises_again_what_it_could_not_send() -> None:
    rows = _job(8, 30, seed=4)
    comm = ShardComm(summarize, 5, 10)  # keeps max(5, 10) iterations, as the root's fold would
    comm.fold_in(_pb(rows), partition=0, now=0.0)
    assert comm.stats.rows_evicted == sum(len(rows[it]) for it in range(20))
    sent = comm.take(now=0.0)
    assert sorted(sent[JOB][0].iterations) == list(range(20, 30))
    comm.again(sent)  # its publishing failed
    ids = iter(["b1", "b2"])
    out = list(comm_messages(comm.take(now=0.0), lambda: next(ids), "shard-x"))
    assert [(job, bid) for job, bid, _ in out] == [(JOB, "b1")]
    b = pb.EngineBatch.FromString(out[0][2])
    assert b.sender == "shard-x" and comm_codec.from_pb(b.comm_summaries[0]).seq == 2
    comm.take(now=IDLE_FORGET_S + 0.01)  # no rows of it since: let go of
    assert comm.held == {}


def test_the_root_keeps_each_holders_newest_and_merges_holders() -> None:
    root = RootComm(iterations_out=OUT)
    a1, a2 = _summary(seed=5, partition=0, seq=1), _summary(seed=6, partition=0, seq=2)
    b = dataclasses.replace(_summary(seed=7, partition=1, seq=1), epoch=11)
    root.add([a1, a2, a1, b], admit=lambda job: True)
    assert (root.counts.replaced, root.counts.stale) == (1, 1)
    merged = cs.merge([a2, b])
    assert merged is not None and root.answer(JOB) == cs.answer(merged, OUT)
    shown = root.to_json()["jobs"]
    assert isinstance(shown, dict) and shown[JOB]["partitions"] == 2 and len(shown[JOB]["iterations"]) == 4
    root.add([_summary(partition=0, seq=1)], admit=lambda job: False)  # known job: kept
    other = cs.CommSummary("other", 0, 1, 1)
    root.add([other], admit=lambda job: False)
    assert root.counts.refused == 1 and "other" not in root.held
    root.forget(JOB)
    assert root.answer(JOB) is None


def test_rows_in_any_order_and_pieces_summarise_alike() -> None:
    """A shard fed the same rows in any order, in any pieces, summarises them alike (the rows' join)."""
    rows = _job(30, 15, seed=8)
    flat = [(it, w) for it, ws in rows.items() for w in ws]
    got = []
    for seed in range(3):
        random.Random(seed).shuffle(flat)
        comm = ShardComm(summarize, RECENT, OUT)
        for k in range(0, len(flat), 37):
            piece: dict[int, list[RankWindow]] = {}
            for it, w in flat[k:k + 37]:
                piece.setdefault(it, []).append(w)
            comm.fold_in(_pb(piece), partition=0, now=0.0)
        (s,) = comm.take(now=0.0)[JOB]
        got.append(dataclasses.replace(s, epoch=0))
    assert got[0] == got[1] == got[2] and got[0].ranks == 29  # the last rank's windows all excluded


class _Sink:
    """What the root asks of its sink when it reads summaries: whether it takes a job."""

    def admit_job(self, job: str) -> bool:
        return job == JOB


def test_the_root_reads_what_reads_and_counts_what_does_not() -> None:
    """A summaries message that does not decode, a communication summary of another version beside a
    good one, and one of a job the root does not take: the good one held, the bad ones counted."""
    root = Root(S.EngineConfig(("nats://127.0.0.1:1",)), cast(RootSink, _Sink()), "root-t")
    b = pb.EngineBatch(id="s:1:1", sender="s")
    comm_codec.to_pb(_summary(seed=9), b.comm_summaries.add())
    bad = b.comm_summaries.add()
    bad.CopyFrom(b.comm_summaries[0])
    bad.version = 99
    comm_codec.to_pb(cs.CommSummary("not-taken", 0, 1, 1), b.comm_summaries.add())
    root.handle_summaries([b"\xff\x00 not an EngineBatch", b.SerializeToString()])
    assert root.stats.undecodable == 2 and root.comm.counts.refused == 1
    assert root.comm.answer(JOB) == cs.answer(_summary(seed=9), root.comm.iterations_out)
