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
from perfd.core import limits as L
from perfd.core.winfigures import RankWindow
from perfd.engine import comm_codec, figures_codec
from perfd.engine import subjects as S
from perfd.engine.root import Root, RootSink
from perfd.engine.root_comm import RootComm
from perfd.engine.shard_comm import NO_RUN, ShardComm, comm_messages
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


@pytest.mark.parametrize("spoil", ["version", "top", "class twice", "iteration twice",
                                   "key past the mapping's", "too many iterations", "accuracy"])
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
    elif spoil == "key past the mapping's":
        m.share.min_key = 40_000  # read back as a value, no float: OverflowError wherever it was read
    elif spoil == "too many iterations":
        for k in range(comm_codec.MAX_ITERATIONS):
            m.iterations.add(iteration=10_000 + k)
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


def test_a_shard_summarises_its_partitions_rows_one_a_take_and_then_at_the_jobs_cadence() -> None:
    rows = _job(60, 12, seed=2)
    part = {r for r in range(60) if r % 2}
    comm = ShardComm(summarize, RECENT, OUT, cpu=_Cpu())
    # each message twice, the second a provisional row of each window over a settled one: no change
    provisional = {it: [w._replace(settled=False, comm_ns=w.comm_ns + 1) for w in ws]
                   for it, ws in rows.items()}
    comm.fold_in(_pb(rows, part) + _pb(provisional, part), partition=3, now=90.0)
    comm.fold_in(_pb(rows, {0}), partition=1, now=90.0)
    first, second = comm.take(now=100.0)[JOB], comm.take(now=100.0)[JOB]  # one a take, partitions in order
    assert [(s.partition, s.seq) for s in (*first, *second)] == [(1, 1), (3, 2)]
    want = summarize(JOB, _joins(rows, part), RECENT, OUT, partition=3, epoch=comm.epoch, seq=2)
    assert second[0] == want and first[0].ranks == 1
    assert comm.stats.summaries == 2 and comm.stats.summary_cpu_s == pytest.approx(0.5)
    assert comm.take(now=100.0) == {}  # nothing came since
    newer = next(w for w in rows[11] if w.rank in part)
    comm.fold_in(_pb({11: [newer._replace(basis=newer.basis + 1)]}, part), partition=3, now=100.0)
    due = 100.0 + max(L.ANALYSIS_MIN_EVERY_S, L.ANALYSIS_COST_FACTOR * 0.5)
    assert comm.take(now=due - 0.01) == {}  # the round took 0.5 s together: the next not before 5 s
    assert [(s.partition, s.seq) for s in comm.take(now=due)[JOB]] == [(3, 3)]


def test_a_shard_keeps_the_newest_iterations_and_sends_again_what_it_could_not() -> None:
    rows = _job(8, 30, seed=4)
    comm = ShardComm(summarize, 5, 10)  # keeps max(5, 10) iterations, as the root's fold would
    comm.fold_in(_pb(rows), partition=0, now=0.0)
    assert comm.stats.rows_evicted == sum(len(rows[it]) for it in range(20))
    sent = comm.take(now=0.0)
    assert sorted(sent[JOB][0].iterations) == list(range(20, 30))
    comm.again(sent)  # its publishing failed: the same summary goes at the next take, not made again
    ids = iter(["b1", "b2"])
    out = list(comm_messages(comm.take(now=0.0), lambda: next(ids), "shard-x"))
    assert [(job, bid) for job, bid, _ in out] == [(JOB, "b1")] and comm.stats.summaries == 1
    b = pb.EngineBatch.FromString(out[0][2])
    assert b.sender == "shard-x" and comm_codec.from_pb(b.comm_summaries[0]) == sent[JOB][0]
    comm.take(now=IDLE_FORGET_S + 0.01)  # no rows of it since: let go of
    assert comm.held == {}


def test_a_shard_refuses_rows_of_no_length_and_survives_a_summary_that_fails() -> None:
    rows = _job(6, 5, seed=6)
    w = rows[4][0]
    rows[4][0] = w._replace(end_ns=w.start_ns)  # garbage: a window of no length
    comm = ShardComm(summarize, RECENT, OUT)
    comm.fold_in(_pb(rows), partition=0, now=0.0)
    assert comm.stats.rows_refused == 1 and len(comm.take(now=0.0)[JOB]) == 1

    def fails(*args: object) -> cs.CommSummary:
        raise ZeroDivisionError("a row it cannot read")

    broken = ShardComm(fails, RECENT, OUT)
    broken.fold_in(_pb(rows), partition=0, now=0.0)
    assert broken.take(now=0.0) == {} and broken.stats.summary_errors == 1
    # tried again at the job's next round, no new rows needed
    assert broken.take(now=L.ANALYSIS_MIN_EVERY_S + 0.01) == {} and broken.stats.summary_errors == 2
    broken.fold_in(_pb(rows), partition=2, now=0.0)
    broken.drop_partition(2)  # its lease is gone: its rows are its next holder's
    assert [p for _, p in broken.held] == [0]


def test_the_root_keeps_each_partitions_newest_and_a_new_holder_replaces_the_former() -> None:
    root = RootComm(partitions=4, iterations_out=OUT)
    a1, a2 = _summary(seed=5, partition=0, seq=1), _summary(seed=6, partition=0, seq=2)
    b = dataclasses.replace(_summary(seed=7, partition=1, seq=1), epoch=11)
    root.add([a1, a2, a1, b], admit=lambda job: True)
    assert (root.counts.replaced, root.counts.stale) == (1, 1)
    merged = cs.merge([a2, b])
    assert merged is not None and root.answer(JOB) == cs.answer(merged, OUT)
    shown = root.to_json()["jobs"]
    assert isinstance(shown, dict) and shown[JOB]["partitions"] == 2 and len(shown[JOB]["iterations"]) == 4
    whole = dataclasses.asdict(cs.answer(merged, OUT))  # what it shows is the whole merge's, its newest four
    assert shown[JOB] == {**whole, "iterations": whole["iterations"][-4:], "partitions": 2}
    # partition 1's lease moves: the new holder's summary, once it holds a newer iteration, replaces the
    # former's (added, its ranks would count twice); the former's delivered again does not take it back
    nxt = max(b.iterations) + 1
    moved = dataclasses.replace(b, epoch=12, seq=1,
                                iterations={**b.iterations, nxt: next(iter(b.iterations.values()))})
    partial = dataclasses.replace(moved, ranks=b.ranks - 1)  # its first: of the few nodes it had then
    root.add([partial, moved, b], admit=lambda job: True)
    assert root.counts.partial_holder == 1 and root.held[JOB][1] is moved
    assert root.counts.holders_replaced == 1 and root.counts.stale == 2
    merged = cs.merge([a2, moved])
    assert merged is not None and root.answer(JOB) == cs.answer(merged, OUT)
    # a holder of fewer ranks takes the partition once its former's newest is RECENT windows behind
    later = dataclasses.replace(moved, epoch=13, ranks=moved.ranks - 5, iterations={
        nxt + L.COMM_RECENT_WINDOWS - 1: moved.iterations[nxt]})
    gone = dataclasses.replace(later, iterations={nxt + L.COMM_RECENT_WINDOWS: moved.iterations[nxt]})
    root.add([later, gone], admit=lambda job: True)
    assert root.counts.partial_holder == 2 and root.held[JOB][1] is gone and root.counts.holders_replaced == 2
    root.held[JOB][1] = moved
    root.add([_summary(partition=4, seq=9)], admit=lambda job: True)  # no such partition
    root.add([cs.CommSummary("other", 0, 1, 1)], admit=lambda job: False)
    assert root.counts.refused == 2 and "other" not in root.held
    root.forget(JOB)
    assert root.answer(JOB) is None and root.to_json()["jobs"] == {}


def test_a_new_run_lets_go_of_the_last_runs_rows_once() -> None:
    """A job restarted from iteration 0 after its iterations 100-129: the new run's rows, of lower numbers,
    are summarised (not evicted as older than the window while the last run's stayed); a second node's
    partial flagging the same run's beginning lets go of nothing more."""
    last = {it + 100: ws for it, ws in _job(12, 30, seed=9).items()}
    comm = ShardComm(summarize, RECENT, OUT)
    comm.fold_in(_pb(last), partition=1, now=0.0)
    comm.take(now=0.0)
    new = _job(12, 10, seed=10)
    comm.new_run(JOB, 1, 0, now=1.0)
    comm.fold_in(_pb(new, set(range(6))), partition=1, now=1.0)
    comm.new_run(JOB, 1, 0, now=1.0)  # another node of the partition: the same run
    comm.fold_in(_pb(new, set(range(6, 12))), partition=1, now=1.0)
    assert sorted(comm.held[(JOB, 1)].joins) == list(range(10)) and comm.stats.runs_begun == 1
    (s,) = comm.take(now=10.0)[JOB]
    assert max(s.iterations) < 10 and s.ranks == 11  # the last rank's windows all excluded
    comm.new_run(JOB, 2, 0, now=10.0)  # a partition with no rows yet: nothing to let go of
    assert comm.stats.runs_begun == 1 and comm.held[(JOB, 2)].rows == 0


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
    root = Root(S.EngineConfig(("nats://127.0.0.1:1",), partitions=4), cast(RootSink, _Sink()), "root-t")
    b = pb.EngineBatch(id="s:1:1", sender="s")
    comm_codec.to_pb(_summary(seed=9), b.comm_summaries.add())
    bad = b.comm_summaries.add()
    bad.CopyFrom(b.comm_summaries[0])
    bad.version = 99
    comm_codec.to_pb(cs.CommSummary("not-taken", 0, 1, 1), b.comm_summaries.add())
    root.handle_summaries([b"\xff\x00 not an EngineBatch", b.SerializeToString()])
    assert root.stats.undecodable == 2 and root.comm.counts.refused == 1
    assert root.comm.answer(JOB) == cs.answer(_summary(seed=9), root.comm.iterations_out)


class _Wall:
    def __init__(self) -> None:
        self.ns = 1_000

    def __call__(self) -> int:
        self.ns += 1_000
        return self.ns


def test_a_shard_keeps_what_it_took_to_save_and_what_it_let_go_of_to_purge() -> None:
    """The rows are the partition's (perfd.engine.comm_rows): each agent message whose rows went in is kept
    to be saved under the newest iteration that went in (one of rows held already is not), tagged with the
    job's run the holder knows; each iteration evicted is to be purged; a flush that failed gives its saves
    back before what came since; a lease lost keeps the saves but drops the purges (the next holder's); a
    job forgotten is purged whole, its saves dropped."""
    rows = _job(8, 14, seed=11)
    comm = ShardComm(summarize, 5, 10, wall_ns=_Wall())  # keeps 10 iterations
    first = _pb({it: rows[it] for it in range(12)})
    comm.fold_in(first, partition=2, now=0.0)
    comm.fold_in(first[:3], partition=2, now=0.0)  # delivered again: nothing went in, nothing to save
    saves = comm.take_saves()
    assert {k: len(v) for k, v in saves.items()} == {(JOB, 2, it, NO_RUN): 1 for it in range(12)}
    assert comm.take_purges() == [(JOB, 2, 0), (JOB, 2, 1)]  # the two past the ten kept
    comm.fold_in(_pb({12: rows[12]}), partition=2, now=1.0)
    comm.saves_again(saves)  # the flush failed: saved at the next, before what came since
    again = comm.take_saves()
    assert [k[2] for k in again] == [*range(12), 12]
    assert again[(JOB, 2, 0, NO_RUN)] == saves[(JOB, 2, 0, NO_RUN)]
    assert comm.take_purges() == [(JOB, 2, 2)]
    comm.fold_in(_pb({13: rows[13]}), partition=2, now=1.0)
    comm.drop_partition(2)  # the lease lost
    assert comm.take_purges() == [] and list(comm.take_saves()) == [(JOB, 2, 13, NO_RUN)]
    assert comm.held == {}
    comm.fold_in(_pb({13: rows[13]}), partition=1, now=2.0)
    comm.new_run(JOB, 1, 0, now=2.0)  # the rows of the new run tagged with it; the last run's as they were
    comm.fold_in(_pb({0: rows[0]}), partition=1, now=2.0)
    comm.new_run(JOB, 1, 0, now=2.0)  # another node of the same run: nothing more
    run = comm.held[(JOB, 1)].run
    assert run == (2_000, 0) and list(comm.take_saves()) == [(JOB, 1, 13, NO_RUN), (JOB, 1, 0, run)]
    assert sorted(comm.held[(JOB, 1)].joins) == [0] and comm.stats.runs_begun == 1
    comm.forget(JOB)
    assert comm.take_saves() == {} and comm.take_purges() == [(JOB, 1, None)]


def test_rows_read_back_take_the_later_run_and_skip_an_earlier_ones() -> None:
    """Read back (tagged with their run), rows of a later run than the one held let go of those held; an
    earlier run's are skipped, counted; a run's beginning flagged again by a node (a message delivered
    again) once its rows were read back lets go of nothing."""
    old, new = _job(8, 6, seed=13), _job(8, 3, seed=14)
    comm = ShardComm(summarize, RECENT, OUT)
    comm.fold_in(_pb({it + 50: ws for it, ws in old.items()}), partition=0, now=0.0, replayed=NO_RUN)
    comm.fold_in(_pb(new), partition=0, now=0.0, replayed=(5_000, 0))
    comm.fold_in(_pb({it + 50: ws for it, ws in old.items()}), partition=0, now=0.0, replayed=NO_RUN)
    h = comm.held[(JOB, 0)]
    assert sorted(h.joins) == [0, 1, 2] and h.run == (5_000, 0)
    assert comm.stats.rows_past_run == sum(map(len, old.values())) and comm.stats.runs_begun == 1
    comm.new_run(JOB, 0, 0, now=1.0)
    assert sorted(h.joins) == [0, 1, 2] and h.run == (5_000, 0)
    # the same run as another shard saw it begin (another time, the same iteration): folded, not skipped
    more = _job(16, 3, seed=15)
    comm.fold_in(_pb(more, set(range(8, 16))), partition=0, now=0.0, replayed=(3_000, 0))
    comm.fold_in(_pb(more, set(range(8, 16))), partition=0, now=0.0, replayed=(9_000, 0))
    assert sorted({r for j in h.joins.values() for _, r in j.rows}) == list(range(16))
    assert h.run == (5_000, 0) and comm.stats.runs_begun == 1


def test_a_new_run_is_later_than_the_one_held_and_drops_the_last_runs_purges() -> None:
    """A restart seen by a shard whose clock is behind the one that saw the run held is still the later run;
    the purges of the last run's iterations, pending, go (the new run's rows may be saved under the same
    subjects); the job's whole, where forgotten, stays."""
    rows = _job(8, 14, seed=16)
    comm = ShardComm(summarize, 5, 10, wall_ns=lambda: 1_000)
    comm.fold_in(_pb({it: rows[it] for it in range(12)}), partition=0, now=0.0, replayed=(9_000, 50))
    comm.fold_in(_pb({12: rows[12]}), partition=0, now=0.0)  # live: iterations 0-2 evicted, to purge
    comm.fold_in(_pb({13: rows[13]}), partition=1, now=0.0)
    comm.forget(JOB)  # (its partitions' whole, to purge)
    comm.fold_in(_pb({it: rows[it] for it in range(13)}), partition=0, now=0.0, replayed=(9_000, 50))
    pending = set(comm._purges)
    assert {(JOB, 0, 0), (JOB, 0, None), (JOB, 1, None)} <= pending
    comm.new_run(JOB, 0, 0, now=1.0)
    assert comm.held[(JOB, 0)].run == (9_001, 0)
    assert comm.take_purges(whole=False) == []  # the last run's iterations': gone
    assert comm.take_purges(whole=True) == [(JOB, 0, None), (JOB, 1, None)]  # before the next saves


@pytest.mark.parametrize("value", ["-5:", " 7 : 3 ", "1_0:+2", "5", "1:2:3", "99999999999999999999:", "x:1"])
def test_a_run_tag_not_as_written_is_refused(value: str) -> None:
    from perfd.engine.comm_rows import read_run, run_header

    with pytest.raises(ValueError):
        read_run(value)
    assert read_run(run_header((12, 3))) == (12, 3) and read_run(run_header(NO_RUN)) == NO_RUN
    assert read_run(None) == NO_RUN


def test_rows_read_back_are_counted_apart_not_saved_and_summarised_once_read() -> None:
    rows = _job(10, 6, seed=12)
    comm = ShardComm(summarize, RECENT, OUT)
    comm.replaying[0] = 1
    comm.fold_in(_pb(rows), partition=0, now=0.0, replayed=NO_RUN)
    comm.fold_in(_pb(rows), partition=0, now=0.0, replayed=NO_RUN)  # read back twice: one row each
    assert comm.stats.rows_replayed == sum(map(len, rows.values())) and comm.stats.rows_in == 0
    assert comm.take_saves() == {}
    assert comm.take(now=0.0) == {}  # being read back: not summarised yet
    del comm.replaying[0]
    (s,) = comm.take(now=100.0)[JOB]
    assert s == summarize(JOB, _joins(rows), RECENT, OUT, partition=0, epoch=comm.epoch, seq=1)
