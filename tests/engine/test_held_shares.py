"""An agent holds the store's share of a job whose windows were folded below the root, and sends it
at most every ``share_every_s`` (perfd.engine.shares): fewer records messages for the root to read,
and the root's store ends with the same rows as if every dump had been sent. No engine: what the
agent spooled is read back."""

from __future__ import annotations

import random

from perfd.analytics.collectives.shardfold import ShardCollectives
from perfd.core.collfold import (
    REDUCED_RETENTION,
    SENT_RETENTION,
    CollectivePartial,
    for_sending,
    merge_all,
    reduce,
)
from perfd.core.events import NCCL_HANG, XID
from perfd.core.model import CollectiveRecord, StepRecord
from perfd.engine import shares
from perfd.engine import subjects as S
from perfd.engine.partial import Decoded, decode
from perfd.engine.publisher import EngineClient
from perfd.engine.shares import HeldShares
from tests.collectives.collective_helpers import MS, T0
from tests.collectives.test_collective_partial import PER_NODE, synthetic_job

NODE = 1


def _dumps() -> tuple[list[list[StepRecord]], list[list[CollectiveRecord]]]:
    """Node NODE's step records and operations of the synthetic job, an iteration at a time (a
    dump an iteration: the cadence per-iteration figures need)."""
    recs, steps = synthetic_job()
    its = sorted({s.iteration for s in steps})
    mine = [s for s in steps if isinstance(s.rank, int) and s.rank // PER_NODE == NODE]
    ops: dict[int, list[CollectiveRecord]] = {}
    for r in recs:  # the synthetic job's iteration N runs 100 ms from N x 100 ms
        if (r.rank or 0) // PER_NODE == NODE:
            ops.setdefault(((r.time_created_ns or T0) - T0) // (100 * MS), []).append(r)
    return [[s for s in mine if s.iteration == it] for it in its], [ops.get(it, []) for it in its]


def _client(every_s: float) -> EngineClient:
    return EngineClient(S.EngineConfig(("nats://unused",), partitions=4), f"node-{NODE}/j",
                        node=f"node-{NODE}", window_fold=ShardCollectives(), share_every_s=every_s)


def _shares_spooled(client: EngineClient) -> list[Decoded]:
    out = []
    for _, data in client.spool.pending():
        d = decode(data)
        if d.collectives and not d.is_node_message:
            out.append(d)
    return out


def _store(parts: list[CollectivePartial], job: str = "j") -> CollectivePartial:
    """What the root's store makes of them (its merge and retention)."""
    return merge_all(job, parts, REDUCED_RETENTION)


def test_a_folded_jobs_dumps_are_held_and_go_as_one_share_the_store_merging_the_same_rows() -> None:
    steps, ops = _dumps()
    assert sum(1 for o in ops if o) >= 4, "the case needs several dumps"
    held = _client(every_s=3600.0)  # only the first share goes at once; flush sends the rest
    each = _client(every_s=0.0)  # every dump as it comes (an agent before the shares were held)
    for s, o in zip(steps, ops, strict=True):
        held.submit(steps=s, collectives=o)
        each.submit(steps=s, collectives=o)

    sent_each = _shares_spooled(each)
    assert len(sent_each) == sum(1 for o in ops if o)
    sent_held = _shares_spooled(held)
    assert len(sent_held) == 1, "a job's first share goes at once, the later ones wait their time"
    st = held.stats()
    assert st["collective_rows_held"] > 0 and st["collective_shares_sent"] == 1
    held._send_due_shares(every=True)  # what flush() and close() do first
    sent_held = _shares_spooled(held)
    assert len(sent_held) == 2 and held.stats()["collective_rows_held"] == 0
    assert all(d.collectives_folded for d in sent_held + sent_each)

    def parts(ds: list[Decoded]) -> list[CollectivePartial]:
        return [p for d in ds for p in d.collectives]

    assert _store(parts(sent_held)) == _store(parts(sent_each))
    assert len(_store(parts(sent_held))) > 0
    # every record submitted is either in a share sent or counted as not sent
    for c, sent in ((held, sent_held), (each, sent_each)):
        submitted = sum(len(o) for o in ops)
        assert sum(len(p) for p in parts(sent)) + c.stats()["collectives_not_sent"] == submitted


def test_a_job_whose_windows_the_root_folds_sends_every_dump_at_once() -> None:
    """No rank step records from this node (a Megatron-LM log's job): the root folds the share's
    every operation per window, so none is held."""
    _, ops = _dumps()
    client = _client(every_s=3600.0)
    for o in ops:
        client.submit(collectives=o)
    sent = _shares_spooled(client)
    assert len(sent) == sum(1 for o in ops if o) and not any(d.collectives_folded for d in sent)
    assert client.stats()["collective_rows_held"] == 0


def _part(job: str, rank: int, seq: int) -> CollectivePartial:
    r = CollectiveRecord(job=job, source="flight_recorder", op="all_reduce", rank=rank, pg_id=0, pg_name="0",
                         pg_ranks=[0, 1], group_rank=rank, group_size=2, collective_seq_id=seq,
                         state="completed", time_created_ns=T0 + seq * MS, duration_ms=1.0)
    return reduce(job, [r])


def test_held_shares_go_at_their_jittered_time_and_past_the_jobs_bound() -> None:
    h = HeldShares(every_s=10.0, rng=random.Random(3))
    first = h.hold(_part("a", 0, 1), 1, now=100.0)
    assert [x.part.job for x in first] == ["a"]  # a job's first share at once
    assert h.hold(_part("a", 0, 2), 1, now=101.0) == []
    assert h.due(now=107.4) == []  # 10 s less the jitter's quarter at the most
    went = h.due(now=112.6)  # 10 s and its quarter at the most
    assert len(went) == 1 and went[0].records == 1 and h.rows == 0
    # the next ones' times spread (agents started together do not stay together)
    times = set()
    for k in range(20):
        g = HeldShares(every_s=10.0, rng=random.Random(k))
        g.hold(_part("a", 0, 1), 1, now=0.0)
        times.add(round(g._next["a"], 3))
    assert len(times) == 20 and min(times) >= 7.5 and max(times) <= 12.5
    # past MAX_HELD_JOBS jobs held, the oldest goes at once
    b = HeldShares(every_s=10.0)
    for j in range(shares.MAX_HELD_JOBS):
        b.hold(_part(f"j{j}", 0, 1), 1, now=0.0)  # each job's first: sent
        assert b.hold(_part(f"j{j}", 0, 2), 1, now=1.0) == []
    out = b.hold(_part("late", 0, 1), 1, now=2.0)
    assert [x.part.job for x in out] == ["j0", "late"]


def _world_part(job: str, world: int, rank: int, seq: int, rate: float = 1000.0) -> CollectivePartial:
    """Operation ``seq`` of ``rank`` on the job's world group (its rows show the job's size), enqueued
    as a rank running ``rate`` operations a second enqueues its ``seq``-th."""
    r = CollectiveRecord(job=job, source="flight_recorder", op="all_reduce", rank=rank, pg_id=0, pg_name="0",
                         pg_ranks=list(range(world)), group_rank=rank, group_size=world,
                         collective_seq_id=seq, state="completed",
                         time_created_ns=T0 + round(seq / rate * 1e9), duration_ms=1.0)
    return reduce(job, [r])


def _round_of(world: int, ops_per_s: float, every_s: float = 10.0) -> tuple[float, HeldShares]:
    """The round HeldShares sets for a job of ``world`` ranks whose rank 0 (this agent's one rank, on
    the world group) runs ``ops_per_s`` operations a second: its first share at once (no rate known:
    every_s), the next when due, holding what the rank ran meanwhile (a round's worth, at least two)."""
    h = HeldShares(every_s=every_s, rng=random.Random(1))
    h.hold(_world_part("a", world, 0, 0, ops_per_s), 1, now=0.0)
    assert h.rounds["a"] == every_s
    n = max(2, round(ops_per_s * 12.6))
    for seq in range(1, n + 1):  # the dumps' parts come before the earliest the jitter could make it due
        assert h.hold(_world_part("a", world, 0, seq, ops_per_s), 1, now=0.7 * every_s * seq / n) == []
    went = h.due(now=12.6)
    assert len(went) == 1 and len(went[0].part) == n
    return h.rounds["a"], h


def test_a_large_jobs_share_goes_as_often_as_the_root_can_take_its_round() -> None:
    """A job's round: every_s, unless its whole share would reach the root past SHARE_ROWS_PER_S (by
    ROUND_HYSTERESIS); then as long as the root takes to read one round of it (each rank's newest k)
    at that rate. Each agent tells the size from its rows and the rate from their enqueue times; a job
    that runs few operations keeps every_s whatever its size (a longer round would only cost
    freshness)."""
    rate = shares.SHARE_ROWS_PER_S
    assert shares.share_round_s(100_000, None, 10.0) == 10.0  # no rate known
    for world, ops_per_s, want in ((64, 3.0, 10.0), (512, 3.0, 10.0), (1_024, 3.0, 10.0),
                                   (4_096, 3.0, 4_096 * 61 / rate), (100_000, 3.0, 50.0),
                                   (100_000, 0.02, 10.0)):
        k = SENT_RETENTION.k(world)
        assert k is not None
        assert shares.share_round_s(world, ops_per_s, 10.0) == want, (world, ops_per_s)
        # the rows a second the root gets from the job: no more than before, and under the bound
        # (and its hysteresis) where the round went long
        before = world * min(k, ops_per_s * 10.0) / 10.0
        after = world * min(k, ops_per_s * want) / want
        assert after <= before + 1e-9 and (want == 10.0 or after <= rate + 1e-9)
        got, h = _round_of(world, ops_per_s)
        assert got == want, (world, ops_per_s)
        nxt = h._next["a"]
        assert 12.6 + 0.75 * want <= nxt + 1e-9 and nxt <= 12.6 + 1.25 * want + 1e-9
    # near the bound the round holds: long past it by the hysteresis, back only as far under it
    assert shares.share_round_s(1_333, 3.0, 10.0) == 10.0  # 3,999 rows a second
    assert shares.share_round_s(1_600, 3.0, 10.0) == 10.0  # 4,800: within the hysteresis
    assert shares.share_round_s(1_700, 3.0, 10.0) > 10.0  # 5,100: past it
    assert shares.share_round_s(1_200, 3.0, 10.0, was_long=True) > 10.0  # 3,600: not as far under
    assert shares.share_round_s(1_000, 3.0, 10.0, was_long=True) == 10.0  # 3,000: under by as much


def test_a_ranks_rate_is_read_from_its_operations_own_times() -> None:
    """Not from when the dumps came or how many rows they held: a dump of the rank's whole ring repeats
    its older operations (one row each in the union), and a round may catch one dump or two."""
    h = HeldShares(every_s=10.0, rng=random.Random(2))
    h.hold(_world_part("a", 1_000, 0, 0, 3.0), 1, now=0.0)
    # two dumps in the round, the second repeating the first's operations (a ring read whole)
    for dump in (range(1, 31), range(1, 61)):
        for seq in dump:
            h.hold(_world_part("a", 1_000, 0, seq, 3.0), 1, now=5.0)
    (went,) = h.due(now=12.6)
    got = shares.ops_rate(went.part)
    assert got is not None and abs(got - 3.0) < 1e-6
    one = CollectivePartial("a")
    one.absorb(_world_part("a", 1_000, 0, 5, 3.0))
    assert shares.ops_rate(one) is None  # one operation spans no time: not known


def test_a_hang_this_agent_reported_keeps_its_jobs_share_at_every_s_for_a_while() -> None:
    """The completion that resolves a hang travels in a share: a job's hang reported here pulls its
    next share in to every_s (it was set 50 s on) and keeps that round for HANG_SOON_S; after it,
    the job's size and rate decide again."""
    got, h = _round_of(100_000, 3.0)
    assert got == 50.0 and h._next["a"] > 40.0
    h.hold(_world_part("a", 100_000, 0, 100, 3.0), 1, now=14.0)  # held, due at the long round
    assert h._held["a"].due > 40.0
    h.note_hang("a", now=15.0)
    assert h._held["a"].due == 25.0 and h._next["a"] == 25.0
    assert h.due(now=24.9) == [] and len(h.due(now=25.0)) == 1
    assert h.rounds["a"] == 10.0

    def a_round(first: int, held_at: float, sent_at: float) -> None:
        for seq in range(first, first + 30):  # the rank at its 3 a second, well past k = 2
            assert h.hold(_world_part("a", 100_000, 0, seq, 3.0), 1, now=held_at) == []
        assert len(h.due(now=sent_at)) == 1

    a_round(101, 25.5, 37.6)
    assert h.rounds["a"] == 10.0  # within HANG_SOON_S of the report: every_s still
    a_round(131, 38.0, 15.0 + shares.HANG_SOON_S + 13.0)
    assert h.rounds["a"] == 50.0  # past it: the job's size and rate again
    # a job that hung and never sent again does not hold a flag for ever: the oldest go past the bound
    for j in range(shares.MAX_HELD_JOBS + 1):
        h.note_hang(f"gone{j}", now=400.0)
    assert "gone0" not in h._hung and len(h._hung) == shares.MAX_HELD_JOBS


def test_a_held_share_is_the_newest_operations_a_send_would_carry() -> None:
    """Two dumps held then sent are what the store keeps of both sent apart (SENT_RETENTION's k)."""
    h = HeldShares(every_s=10.0)
    h.hold(_part("a", 0, 0), 1, now=0.0)
    parts = [_part("a", r, s) for s in range(1, 700) for r in (0, 1)]
    for p in parts:
        h.hold(p, 1, now=1.0)
    (one,) = h.take_all(now=2.0)
    assert one.records == len(parts)
    got = _store([for_sending(one.part, SENT_RETENTION)], "a")
    assert got == _store([for_sending(p, SENT_RETENTION) for p in parts], "a")
    assert len(got) == 2 * (shares.HELD_RETENTION.per_rank or 0)  # each rank's newest, of 699


def test_the_agents_hang_event_reaches_its_held_shares() -> None:
    """The publisher reads what it sends: an ``nccl_hang`` event of a job marks it (HeldShares.note_hang),
    any other event does not."""
    steps, ops = _dumps()
    client = _client(every_s=10.0)
    client.submit(steps=steps[0], collectives=ops[0])
    client.submit(events=[{"kind": XID.name, "job": "j", "time": 1.0}])
    assert not client._shares._hung
    client.submit(events=[{"kind": NCCL_HANG.name, "job": "j", "time": 2.0, "severity": "critical"}])
    assert list(client._shares._hung) == ["j"]
