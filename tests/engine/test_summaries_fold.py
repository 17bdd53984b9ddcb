"""What a shard keeps and sends of its partitions' step summaries (perfd.engine.shard_summaries) and
what the root holds and answers of them (perfd.engine.root_summaries), without an engine: a summary
of an iteration let go is counted and dropped, a failed send is sent again, a resumed job's iterations
are not the last run's, an iteration made whole before its summaries came is answered when they do."""

from __future__ import annotations

from perfd.aggregator.engine_sink import EngineSink
from perfd.aggregator.guard import Guard
from perfd.aggregator.state import AggregatorState
from perfd.core.limits import Limits
from perfd.core.refusals import Refusals
from perfd.core.sketch import rank_hash
from perfd.engine import stepsummary as ss
from perfd.engine import subjects as S
from perfd.engine import summary_codec as codec
from perfd.engine.partial import Partial
from perfd.engine.root import Root
from perfd.engine.root_summaries import ANSWERS_KEPT, RootSummaries, SummaryFold
from perfd.engine.rootfold import RootStats
from perfd.engine.shard_summaries import IDLE_FORGET_S, SUMMARY_ITERATIONS, ShardSummaries, batches
from perfd.transport.gen import perfd_pb2 as pb
from tests.engine.records import job_records

JOB = "fold-job"


def _partial(node: int, it: int, new_run: bool = False) -> Partial:
    recs = job_records(JOB, node + 1, it)[node][it - 1]
    p = Partial(JOB, it, new_run=new_run)
    p.add_records(recs)
    return p


def test_a_shard_sends_each_touched_partition_again_after_a_failed_send_and_lets_old_ones_go() -> None:
    held = ShardSummaries()
    assert held.fold_in({}, [_partial(0, 1), _partial(1, 1)], 3) == 0
    by_job, keys = held.take()
    assert keys == [(JOB, 1, 3)] and [m.ranks_in for m in by_job[JOB]] == [16]
    assert by_job[JOB][0].seq == held.seq == 1 and by_job[JOB][0].epoch == held.epoch
    held.give_back(keys)  # the send failed: the next take sends it again, a newer flush
    again, _ = held.take()
    assert again[JOB][0].seq == 2 and again[JOB][0].ranks_in == 16
    assert held.take() == ({}, [])
    # One message per job's summaries while they fit the engine's largest message, more past it
    ms = by_job[JOB] * 3
    ids = iter(range(100))
    assert len(list(batches(ms, lambda: str(next(ids)), "s", 1 << 20))) == 1
    assert len(list(batches(ms, lambda: str(next(ids)), "s", ms[0].ByteSize() + 600))) == 3
    # Past SUMMARY_ITERATIONS newer ones, an iteration is let go: a node message of it is not summarised
    last = 1 + SUMMARY_ITERATIONS
    held.fold_in({}, [_partial(0, last)], 3)
    held.take()
    assert held.fold_in({}, [_partial(1, 1)], 3) == 1 and not held.touched


def test_a_job_idle_long_enough_is_let_go() -> None:
    held = ShardSummaries()
    held.fold_in({}, [_partial(0, 1)], 0, now=0.0)
    held.take(now=1.0)
    assert held.held.held
    held.take(now=1.0 + IDLE_FORGET_S)
    assert held.held.held == {}


def test_a_resumed_job_is_summarised_afresh() -> None:
    held = ShardSummaries()
    held.fold_in({}, [_partial(0, 2)], 0)
    held.take()
    # A redelivered node message changes nothing; the same ranks from a new run (a resume that numbers
    # iterations again) are its own
    held.fold_in({}, [_partial(0, 2)], 0)
    assert not held.touched
    held.fold_in({}, [_partial(0, 2, new_run=True)], 0)
    by_job, _ = held.take()
    (m,) = by_job[JOB]
    assert m.ranks_in == 8 and m.new_run


def _summary(it: int, partition: int, seq: int = 1) -> ss.StepSummary:
    p = _partial(partition, it)
    assert p.fold is not None
    return ss.summarize(JOB, it, p.fold, None, partition=partition, epoch=1, seq=seq)


def test_the_root_answers_whole_iterations_keeps_the_newest_and_counts_the_late() -> None:
    stats = RootStats()
    rs = RootSummaries(stats, keep=4)
    rs.whole(JOB, 1)  # whole by the partials before any summary of it: answered when one comes
    assert rs.to_json() == {}
    rs.add([_summary(1, 0), _summary(1, 1)], lambda job: True)
    (row,) = rs.to_json()[JOB]
    assert row["iteration"] == 1 and row["ranks_in"] == 16
    rs.add([_summary(1, 1)], lambda job: True)  # delivered again
    rs.add([_summary(1, 1, seq=2)], lambda job: True)  # a newer flush of the same partition
    assert (stats.summaries, stats.summaries_stale, stats.summaries_replaced) == (4, 1, 1)
    assert rs.to_json()[JOB][0]["ranks_in"] == 16
    for it in range(2, 9):
        rs.add([_summary(it, 0)], lambda job: True)
        rs.whole(JOB, it)
    assert [r["iteration"] for r in rs.to_json()[JOB]] == list(range(9 - ANSWERS_KEPT, 9))
    rs.add([_summary(2, 0)], lambda job: True)  # older than the 4 iterations held
    assert stats.summaries_late == 1
    rs.add([ss.summarize("other", 1, [], None)], lambda job: False)
    assert stats.refused == 1 and "other" not in rs.fold_jobs()
    rs.forget(JOB)
    assert rs.to_json() == {} and rs.fold.held == {}


def test_the_root_counts_a_summary_it_cannot_read() -> None:
    sink = EngineSink(AggregatorState(), Guard(Limits(), Refusals()))
    root = Root(S.EngineConfig(("nats://127.0.0.1:1",)), sink, "r")
    b = pb.EngineBatch(id="x")
    codec.to_pb(_summary(1, 0), b.step_summaries.add())
    b.step_summaries[0].version = codec.VERSION + 1
    root.handle_summaries([b"\xff\xff", b.SerializeToString()])
    assert root.stats.undecodable == 2 and root.stats.summaries == 0
    assert root.stats_json()["summary_answers"] == {}


def test_a_partition_whose_lease_moved_mid_iteration_keeps_both_holders_ranks() -> None:
    """A partition's lease moves while its iteration is folded (a rebalance, a lost lease): the former
    holder summarised the nodes it folded, the new one (its own epoch) those after. The root merges the
    two: the answer is the one summary of all the nodes would give (the new holder's once replaced the
    former's, and the iteration's answer lacked those ranks for good)."""
    former, new = ShardSummaries(), ShardSummaries()
    new.epoch = former.epoch + 1
    former.fold_in({}, [_partial(0, 1), _partial(1, 1)], 2)
    new.fold_in({}, [_partial(2, 1)], 2)
    other = ShardSummaries()
    other.fold_in({}, [_partial(3, 1)], 5)
    stats = RootStats()
    rs = RootSummaries(stats, world=lambda job: 32, ranks=lambda job, it: set(range(32)))
    for shard in (former, other, new):
        rs.add([codec.from_pb(m) for m in shard.take()[0][JOB]], lambda job: True)
    rs.whole(JOB, 1)
    parts = [_partial(n, 1) for n in range(4)]
    folds = [p.fold for p in parts if p.fold is not None]
    want = ss.answer(ss.merge([ss.summarize(JOB, 1, folds[:3], None, partition=2),
                               ss.summarize(JOB, 1, folds[3:], None, partition=5)]))
    (row,) = rs.to_json()[JOB]
    assert row == {"iteration": 1, **ss.answer_json(want)} and row["ranks_in"] == 32
    assert (stats.summaries_replaced, stats.summaries_stale, stats.summaries_overcounted) == (0, 0, 0)
    # The former holder's newer flush (nothing new folded) replaces its own, not the new holder's
    former.give_back([(JOB, 1, 2)])
    rs.add([codec.from_pb(m) for m in former.take()[0][JOB]], lambda job: True)
    assert stats.summaries_replaced == 1 and rs.to_json()[JOB][0]["ranks_in"] == 32


def test_a_node_message_in_two_holders_summaries_is_not_shown_and_holders_are_bounded() -> None:
    """The former holder's summary went out with a node message its ack did not cover; the message went
    to the new holder again: 8 ranks counted twice, which a sketch cannot take out. An iteration with
    two holders of a partition is shown only once its ranks are exactly the job's: not with 40 ranks of
    a 32-rank job (counted once), nor with a duplicate and a missing rank that add up to fewer. And past
    MAX_HOLDERS holders of one partition's iteration the one heard from first is let go of, counted."""
    former, new = ShardSummaries(), ShardSummaries()
    former.fold_in({}, [_partial(0, 1), _partial(1, 1)], 2)
    new.fold_in({}, [_partial(1, 1), _partial(2, 1)], 2)
    stats = RootStats()
    rs = RootSummaries(stats, world=lambda job: 32, ranks=lambda job, it: set(range(32)))
    rs.whole(JOB, 1)
    rs.add([codec.from_pb(m) for m in former.take()[0][JOB]], lambda job: True)
    assert rs.to_json()[JOB][0]["ranks_in"] == 16  # one holder so far: shown, as many ranks as are in
    # 32 ranks in, node 1's twice and node 3's missing: the count is the world's, the ranks are not
    rs.add([codec.from_pb(m) for m in new.take()[0][JOB]], lambda job: True)
    assert rs.to_json() == {JOB: []} and stats.summaries_overcounted == 1
    new.fold_in({}, [_partial(3, 1)], 2)
    for _ in range(2):  # the new holder's next flush (40 of 32), and one more: counted once
        rs.add([codec.from_pb(m) for m in new.take()[0][JOB]], lambda job: True)
        new.give_back([(JOB, 1, 2)])
    assert rs.to_json() == {JOB: []} and stats.summaries_overcounted == 1

    fold = SummaryFold()
    p = _partial(0, 2)
    assert p.fold is not None
    for epoch in (5, 6, 7, 8, 9, 10):
        fold.add(ss.summarize(JOB, 2, p.fold, None, partition=0, epoch=epoch, seq=1))
    assert [e for _, e in fold.held[(JOB, 2)]] == [7, 8, 9, 10] and fold.holders(JOB, 2) == 4
    # a shard running long (the oldest epoch) that takes the partition back is its newest holder
    assert fold.add(ss.summarize(JOB, 2, p.fold, None, partition=0, epoch=1, seq=2))
    assert [e for _, e in fold.held[(JOB, 2)]] == [8, 9, 10, 1] and fold.holders_dropped == 3


def test_a_summarys_rank_hash_adds_under_a_disjoint_union_and_tells_a_rank_twice_from_the_set() -> None:
    mask = (1 << 64) - 1
    assert rank_hash(range(100_000)) == (rank_hash(range(0, 60_000, 2)) + rank_hash(
        range(1, 60_000, 2)) + rank_hash(range(60_000, 100_000))) & mask
    # rank 7 twice, rank 9 missing, or two ranks swapped for two others of the same sum: not the set's
    assert rank_hash([*range(9), 7, *range(10, 16)]) != rank_hash(range(16))
    assert rank_hash([0, 1, 2, 3, 4, 4, 7]) != rank_hash([0, 1, 2, 3, 5, 6, 4])
    # the summaries carry it through the wire and their merge
    p = _partial(0, 1)
    assert p.fold is not None
    one = ss.summarize(JOB, 1, p.fold, None)
    assert one.ranks_hash == rank_hash(p.ranks) == codec.from_pb(_pb(one)).ranks_hash


def _pb(s: ss.StepSummary) -> pb.StepSummary:
    m = pb.StepSummary()
    codec.to_pb(s, m)
    return m


def test_a_shard_that_never_read_a_jobs_info_groups_no_rank_by_stage_until_it_does() -> None:
    """The job's info names its pipeline (4 stages); a shard that took the partition over mid-run read no
    node message carrying it: its ranks' stages are unknown (no per-stage figures at the root), not left
    out of the stages. Once a message brings the info (the agent sends it again on the engine), grouped,
    those folded before it too (their summary sent again)."""
    from perfd.core.jobinfo_json import job_info_to_json
    from perfd.core.model import HOOK_FRAMEWORK, JobInfo, ModelSpec, ParallelLayout
    from tests.engine.test_same_answer_summary import JOB as MJOB
    from tests.engine.test_same_answer_summary import PP, megatron

    by_node = megatron(4, 2)
    info = job_info_to_json(JobInfo(framework=HOOK_FRAMEWORK, spec=ModelSpec(dtype="bf16"),
                                    layout=ParallelLayout(world_size=32, tp=1, pp=PP, dp=32 // PP, cp=1)))

    def part(node: int, it: int) -> Partial:
        p = Partial(MJOB, it)
        p.add_records(by_node[node][it - 1])
        return p

    taker = ShardSummaries()
    taker.expect(MJOB)  # a get of the engine's job-info bucket out (perfd.engine.shard_jobinfo)
    taker.fold_in({}, [part(2, 1), part(3, 1)], 1)
    (m,) = taker.take()[0][MJOB]
    got = codec.from_pb(m)
    assert got.stage_unknown and set(got.stages) == {ss.UNKNOWN_STAGE} and got.stages[-1].count == 16
    assert ss.answer(got).top_ratios == [] and ss.answer(got).ratio_buckets is None
    taker.fold_in({MJOB: info}, [part(2, 2), part(3, 2)], 1)
    sent = [codec.from_pb(m) for m in taker.take()[0][MJOB]]
    assert [g.iteration for g in sent] == [1, 2] and taker.restaged == 1
    for got in sent:
        assert not got.stage_unknown and ss.UNKNOWN_STAGE not in got.stages
        assert sum(g.count for g in got.stages.values()) == 16

    # No info on its way (no get out, or the bucket answered it had none): nothing kept to group the
    # ranks by stage later; the iteration folded before the info stays as it was, not sent again
    for expected in (False, True):
        other = ShardSummaries()
        if expected:
            other.expect(MJOB)
        other.fold_in({}, [part(2, 1), part(3, 1)], 1)
        if expected:
            assert other.held.unstaged_rows == 16
            other.not_expected(MJOB)
        assert other.held.unstaged_rows == 0 and other.held.unstaged == {}
        other.take()
        other.fold_in({MJOB: info}, [part(2, 2), part(3, 2)], 1)
        assert [codec.from_pb(m).iteration for m in other.take()[0][MJOB]] == [2] and other.restaged == 0


def test_the_root_takes_a_jobs_info_in_once_while_it_stays_the_same() -> None:
    """Every node sends its job's info, and on the engine again once a minute: the root passes the same
    text by (counted) once the job is held, and takes a changed one in."""
    from perfd.core.jobinfo_json import job_info_to_json
    from perfd.core.model import HOOK_FRAMEWORK, JobInfo, ModelSpec, ParallelLayout
    from perfd.engine.partial import encode

    sink = EngineSink(AggregatorState(), Guard(Limits(), Refusals()))
    root = Root(S.EngineConfig(("nats://127.0.0.1:1",)), sink, "r")
    took: list[JobInfo] = []
    ingest = sink.ingest_job_info

    def counting(agent_id: str, job: str, info: JobInfo, now: float | None = None) -> None:
        took.append(info)
        ingest(agent_id, job, info, now)
    sink.ingest_job_info = counting  # type: ignore[method-assign]

    def info(world: int) -> str:
        return job_info_to_json(JobInfo(framework=HOOK_FRAMEWORK, spec=ModelSpec(dtype="bf16"),
                                        layout=ParallelLayout(world_size=world, tp=1, pp=1, dp=world, cp=1)))

    for k, (text, node) in enumerate([(info(32), 0), (info(32), 1), (info(32), 2), (info(64), 3),
                                      (info(64), 0)]):
        root.handle([encode(f"b{k}", "shard", 0, [_partial(node, 1)], {JOB: text})])
    assert [i.layout.world_size for i in took] == [32, 64]
    assert root.stats.job_info_same == 3 and root.fold.world(JOB) == 64


def test_a_job_begun_again_answers_its_iterations_afresh_after_two_holders() -> None:
    """What the root knew of an iteration's ranks (and which it counted twice) goes with the job: a
    resumed run numbers its iterations again, with other ranks."""
    stats = RootStats()
    world = [32]
    rs = RootSummaries(stats, world=lambda job: world[0], ranks=lambda job, it: set(range(world[0])))
    former, new = ShardSummaries(), ShardSummaries()
    former.fold_in({}, [_partial(0, 1), _partial(1, 1)], 2)
    new.fold_in({}, [_partial(1, 1), _partial(2, 1), _partial(3, 1)], 2)
    rs.whole(JOB, 1)
    for sh in (former, new):
        rs.add([codec.from_pb(m) for m in sh.take()[0][JOB]], lambda job: True)
    assert rs.to_json() == {JOB: []} and stats.summaries_overcounted == 1
    rs.forget(JOB)  # the job began a new run: 16 ranks, two holders, none twice
    world[0] = 16
    former, new = ShardSummaries(), ShardSummaries()
    former.fold_in({}, [_partial(0, 1)], 2)
    new.fold_in({}, [_partial(1, 1)], 2)
    rs.whole(JOB, 1)
    for sh in (former, new):
        rs.add([codec.from_pb(m) for m in sh.take()[0][JOB]], lambda job: True)
    assert rs.to_json()[JOB][0]["ranks_in"] == 16 and stats.summaries_overcounted == 1
