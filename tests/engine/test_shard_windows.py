"""A shard's holds on its node messages while their collective windows settle
(perfd.engine.shard_windows), in process: the node messages of a hook-shaped job with collectives (each
rank's barrier two messages late, as Flight Recorder sends a slow operation after those enqueued after
it) go through a shard's window fold, whose figures go to a store as the root hands them on. The
shard is "killed" after any one of the messages: what it acknowledged is gone, what it held is
delivered again, first, to a new shard (a fresh fold), which takes every later message. Whatever the
moment, the store's collective analysis is one aggregator's, byte for byte: nothing lost, nothing
doubled. Acknowledged as soon as folded, the same kill loses windows (the control case)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, cast

import pytest

from perfd.aggregator.state import AggregatorState
from perfd.analytics.collectives.shardfold import ShardCollectives
from perfd.core.collfold import SENT_RETENTION, for_sending, reduce
from perfd.core.jobinfo_json import job_info_from_json, job_info_to_json
from perfd.core.model import JobInfo, ParallelLayout
from perfd.engine import shard_windows
from perfd.engine import subjects as S
from perfd.engine.nats_api import JetStream, MsgMetadata
from perfd.engine.partial import decode, encode, partials_of
from perfd.engine.shard import Shard
from perfd.engine.shard_windows import Holds
from perfd.report.collective_text import collectives_json
from tests.engine.engine_driver import Plan
from tests.engine.test_engine_collectives_faults import Job

ITERATIONS = 14
HOLD_S = S.EngineConfig(()).hold_s  # a deployment's with the engine's default ack wait (7 s)


@dataclass
class _Msg:
    """What a hold keeps of a JetStream message (acknowledged by the caller)."""

    seq: int
    data: bytes
    reply: str = ""
    subject: str = ""

    @property
    def metadata(self) -> MsgMetadata:
        raise AssertionError("a hold reads no metadata")

    async def respond(self, data: bytes) -> None: ...
    async def ack(self) -> None: ...
    async def nak(self) -> None: ...
    async def in_progress(self) -> None: ...
    async def term(self) -> None: ...


def _messages() -> tuple[Plan, list[_Msg], list[dict[str, Any]], str]:
    plan = Plan(nodes=2, iterations=ITERATIONS, period_s=0.5)
    job = Job(plan)
    sent: list[dict[str, Any]] = []
    msgs: list[_Msg] = []
    for it in range(1, ITERATIONS + 1):
        for n in range(plan.nodes):
            d = job.feed(n, it, 1000.0 + 0.5 * it)
            sent.append(d)
            mid = f"agent-{n}:e:{it}"
            msgs.append(_Msg(len(msgs), encode(mid, f"agent-{n}", 1, partials_of(d["steps"], mid),
                                               collectives=[reduce(plan.job, d["collectives"])],
                                               to_partition=True)))
    return plan, msgs, sent, job.one_aggregator()


def _through(plan: Plan, msgs: list[_Msg], sent: list[dict[str, Any]], kill_after: int | None,
             hold_s: float = HOLD_S) -> str:
    """Every message through a shard killed after message ``kill_after`` (its held ones delivered
    again to a fresh shard, before the rest), each held ``hold_s``; the root's store's analysis."""
    root = AggregatorState()
    for d in sent:  # the records stream: the store's share of the rows, kept, not folded
        root.ingest_steps("a", d["steps"])
        root.ingest_collective_partial("a", for_sending(reduce(plan.job, d["collectives"]), SENT_RETENTION),
                                       folded=True)
    holds = Holds(ShardCollectives(), hold_s)
    acked: set[int] = set()
    seqs = {id(m): m.seq for m in msgs}

    def flush() -> None:
        for figs in holds.take():
            root.ingest_window_figures(figs)
        acked.update(seqs[id(m)] for m in holds.release(0.0))

    todo = list(msgs)
    while todo:
        m = todo.pop(0)
        if not holds.fold_in(decode(m.data), m, 0, 0.0):
            acked.add(m.seq)
        flush()
        if kill_after is not None and m.seq == kill_after:
            kill_after = None
            holds = Holds(ShardCollectives(), hold_s)  # the next holder: the unacknowledged come again, first
            todo = [x for x in msgs if x.seq <= m.seq and x.seq not in acked] + todo
    got = root.collective_analysis(plan.job, force=True)
    assert got is not None
    return json.dumps(collectives_json(got), sort_keys=True)  # as served: findings worded


# Every one of the 28 kill points rebuilds the root's analysis: 3.6-3.8 s of CPU each of these two
# (the 2-core machine, 2026-11-26), past the ~2 s that marks a test slow.
@pytest.mark.slow
def test_a_shard_killed_after_any_message_loses_and_doubles_no_window() -> None:
    plan, msgs, sent, want = _messages()
    assert len(json.loads(want)["iterations"]) >= ITERATIONS - 3
    assert _through(plan, msgs, sent, None) == want
    for k in range(len(msgs)):
        assert _through(plan, msgs, sent, k) == want, f"killed after message {k}"


@pytest.mark.slow
def test_acknowledged_as_soon_as_folded_the_same_kills_lose_windows() -> None:
    plan, msgs, sent, want = _messages()
    # a hold of 0: every message released at the flush after it
    lost = [k for k in range(len(msgs)) if _through(plan, msgs, sent, k, hold_s=0.0) != want]
    assert len(lost) > len(msgs) // 2, lost


def test_window_figures_cross_the_wire_whole_and_in_pieces() -> None:
    """perfd.engine.figures_codec: rows with and without classes, excluded or not, settled or not,
    uncovered (ABSENT) come back equal; cut in pieces, they merge back to the same rows."""
    from perfd.core.winfigures import ABSENT, RankWindow, WindowFigures
    from perfd.engine import figures_codec
    from perfd.transport.gen import perfd_pb2 as pb

    figs = WindowFigures("a job")
    figs.add(3, RankWindow(0, 10, 20, 1, None, 5, (("dp", 2), ("tp", 4)), True, 19))
    figs.add(3, RankWindow(1, 11, 21, 1, "warmup", 0, (), False, 25))
    figs.add(4, RankWindow(0, 20, 40, 2, "capture", ABSENT, (("tp", 7),), True, 41))
    figs.add(5, RankWindow(7, 40, 60, 1, "warmup", 9, (("world", 1),), False, 61))
    m = pb.WindowFigures()
    figures_codec.to_pb(figs, m)
    back = figures_codec.from_pb(pb.WindowFigures.FromString(m.SerializeToString()))
    assert back.job == figs.job and back.rows == figs.rows
    merged = WindowFigures("a job")
    for piece in figures_codec.chunks(figs, rows=3):
        assert len(piece) <= 3
        merged.absorb(piece)
    assert merged.rows == figs.rows
    m.rank.append(9)  # columns of unequal length: refused, not read past
    with pytest.raises(ValueError):
        figures_codec.from_pb(m)


def test_window_figures_a_message_naming_a_row_twice_decodes_to_their_join() -> None:
    """A message whose columns hold one (iteration, rank) twice (a provisional row and the settled
    one): the settled stays whichever comes first in the columns; an excluded name past the
    message's list is refused."""
    from perfd.core.winfigures import RankWindow, WindowFigures
    from perfd.engine import figures_codec
    from perfd.transport.gen import perfd_pb2 as pb

    provisional = RankWindow(2, 10, 20, 1, None, 5, (("dp", 2),), False, 15)
    settled = RankWindow(2, 10, 20, 1, None, 6, (("dp", 3),), True, 19)
    other = RankWindow(3, 10, 20, 1, None, 4, (("dp", 1),), True, 19)
    for rows in ((provisional, other, settled), (settled, other, provisional)):
        m = pb.WindowFigures(job="j", iteration=[7, 7, 7], rank=[w.rank for w in rows],
                             start_ns=[10] * 3, end_ns=[20] * 3, n_iterations=[1] * 3,
                             comm_ns=[w.comm_ns for w in rows], basis=[w.basis for w in rows],
                             settled=[w.settled for w in rows], excluded=[0] * 3)
        m.by.add(name="dp", union_ns=[w.by[0][1] for w in rows])
        assert figures_codec.from_pb(m).rows == {(7, 2): settled, (7, 3): other}
    a = WindowFigures("j")
    a.add(7, other)
    m = pb.WindowFigures()
    figures_codec.to_pb(a, m)
    m.excluded[0] = 1  # names excluded 1 of none
    with pytest.raises(ValueError, match="excluded 1 of 0"):
        figures_codec.from_pb(m)


def test_a_jobs_info_is_read_once_whatever_many_messages_carry_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every node message of a hook job carries its info: the shard reads its layout once, again
    only when the text changes; an unreadable one is counted each time it comes."""
    read: list[str] = []
    real = job_info_from_json

    def counting(text: str) -> JobInfo:
        read.append(text)
        return real(text)

    monkeypatch.setattr(shard_windows, "job_info_from_json", counting)
    fold = ShardCollectives()
    holds = Holds(fold, HOLD_S)
    infos = [job_info_to_json(JobInfo(layout=ParallelLayout(world_size=16, tp=tp, pp=1, dp=16 // tp)))
             for tp in (8, 8, 8, 4, 4, 8)] + ["{not json", "{not json"]
    for i, text in enumerate(infos):
        holds.fold_in(decode(encode(f"m{i}", "node-0", 1, (), job_info_json={"j": text}, to_partition=True)),
                      _Msg(i, b""), 0, 0.0)
    assert read == [infos[0], infos[3], infos[5], infos[6], infos[7]]
    assert holds.stats.bad_job_info == 2
    layout = fold.jobs["j"].layout
    assert layout is not None and layout.tp == 8


def test_a_hold_unsettled_at_hold_s_starts_again_once_then_is_released() -> None:
    """A message whose windows have not settled by the hold after its delivery has its hold started
    again once (the shard restarts its ack wait), then is released unsettled a hold after that; one
    whose windows settled is released, not extended."""
    _, msgs, _, _ = _messages()
    hold = HOLD_S
    holds = Holds(ShardCollectives(), hold)
    last = msgs[-1]  # no later message: its windows never settle
    assert holds.fold_in(decode(last.data), last, 0, 0.0)
    assert holds.extend(hold - 0.1) == [] and holds.release(hold - 0.1) == []
    assert holds.extend(hold) == [last]
    assert holds.release(hold) == []  # started again at the hold's end
    assert holds.extend(2 * hold) == []  # once only
    assert holds.release(2 * hold) == [last]
    assert (holds.stats.extended, holds.stats.released_unsettled, holds.stats.held) == (1, 1, 0)

    holds = Holds(ShardCollectives(), hold)
    for m in msgs:
        holds.fold_in(decode(m.data), m, 0, 0.0)
    extended = holds.extend(hold)
    assert msgs[0] not in extended and last in extended
    released = holds.release(hold)
    assert msgs[0] in released and last not in released


def test_an_agents_figures_go_on_as_they_came_and_malformed_ones_are_refused_with_their_message() -> None:
    """A shard hands a folding agent's figures on undecoded (perfd.engine.shard: _forward): their rows
    checked (figures_codec.check), a node message whose figures do not hold together terminated and
    counted, as one that is not an EngineBatch."""
    from perfd.core.winfigures import RankWindow, WindowFigures
    from perfd.engine.figures_codec import to_pb
    from perfd.engine.shard import Shard
    from perfd.transport.gen import perfd_pb2 as pb

    figs = WindowFigures("j")
    for r in range(3):
        figs.add(7, RankWindow(r, 10, 20, 1, None, 5, (("tp", 5),), False, 19))
    good = pb.EngineBatch(id="a:e:1", sender="a", to_partition=True)
    to_pb(figs, good.window_figures.add())
    bad = pb.EngineBatch()
    bad.CopyFrom(good)
    bad.id = "a:e:2"
    bad.window_figures[0].rank.append(3)  # a column longer than the others
    shard = Shard(S.EngineConfig(("nats://unused",)), "s")
    for m in (_Msg(1, good.SerializeToString()), _Msg(2, bad.SerializeToString())):
        d = shard._decode(m)  # the bad one: None, terminated and counted
        if d is not None:
            shard._fold_in(d, m, 0, 0.0)
    assert [len(f.iteration) for f in shard._forward["j"]] == [3] and shard.stats.undecodable == 1
    assert [getattr(m, "seq", None) for m in shard._to_ack] == [1]
    assert [getattr(m, "seq", None) for m in shard._to_term] == [2]


def test_operations_that_come_after_their_window_settled_are_counted_in_the_shards_stats() -> None:
    """A node message held back three iterations (a shard's loop starved, a load caught up): its
    operations come after the windows they were enqueued in settled, which no fold can take back
    (one aggregator's live fold neither). The shard's stats say so (``fold``: its window folds'
    counters), where before only the root's answer, lacking those ranks' shares, did."""
    msgs = _messages()[1]
    holds = Holds(ShardCollectives(), HOLD_S)
    late_one = msgs[8]  # node 0's message of iteration 5
    order = [m for m in msgs if m is not late_one]
    order.insert(order.index(msgs[14]) + 1, late_one)  # after node 0's of iteration 8
    for m in order:
        holds.fold_in(decode(m.data), m, 0, 0.0)
        holds.take()
        holds.release(0.0)
    counts = holds.stats.fold
    assert counts["late"] > 0 and counts["retracted"] > 0, counts
    assert counts == holds.fold.fold_counts()
    in_order = Holds(ShardCollectives(), HOLD_S)
    for m in msgs:
        in_order.fold_in(decode(m.data), m, 0, 0.0)
        in_order.take()
        in_order.release(0.0)
    assert in_order.stats.fold["late"] == 0 and in_order.stats.fold["retracted"] == 0, in_order.stats.fold
    assert in_order.stats.fold["folded"] > counts["folded"]


def test_a_fold_lets_the_in_progress_acks_of_the_holds_a_flush_extends_go_first() -> None:
    """A fold gives its turn of the loop to a flush under way (Shard._flush_first) before folding its
    next messages, which hold the loop (8 a turn, 0.1 s each in the slow-fold test): the in-progress
    acks that start again the ack wait of the holds the flush extends are part of that flush. Counted
    from its publishing only, they waited behind the next messages folded, and under load the engine
    delivered 8 messages again (56 deliveries of 48). Here the acks take two turns to go, as nats-py's
    take its flusher's; the fold must not go on before they went."""
    _, msgs, _, _ = _messages()
    order: list[str] = []

    @dataclass
    class _Slow(_Msg):
        async def in_progress(self) -> None:
            await asyncio.sleep(0)  # the publish's turn, then its flusher's
            await asyncio.sleep(0)
            order.append("in-progress ack sent")

    last = _Slow(msgs[-1].seq, msgs[-1].data)  # no later message: its windows never settle
    shard = Shard(S.EngineConfig(()), "s", collectives=ShardCollectives())
    assert shard.windows is not None
    assert shard.windows.fold_in(decode(last.data), last, 0, time.monotonic() - HOLD_S)  # its hold ran out

    js = cast(JetStream, None)  # nothing else to publish

    async def fold_turn() -> None:
        flush = asyncio.create_task(shard._flush(js))
        await asyncio.sleep(0)  # the fold's turn of the loop (the flush loop's timer fired before it)
        await shard._flush_first(js)
        order.append("next messages folded")
        await flush

    asyncio.run(fold_turn())
    assert order == ["in-progress ack sent", "next messages folded"]
    assert shard.windows.stats.extended == 1

    # The flush loop's flush due while the fold held the loop, its task not begun (a timer's wake-up
    # comes after the fold's own turn): the fold runs it before folding on.
    again = Shard(S.EngineConfig(()), "s", collectives=ShardCollectives())
    assert again.windows is not None
    again.windows.fold_in(decode(last.data), last, 0, time.monotonic() - HOLD_S)
    order.clear()

    async def fold_turn_flush_due() -> None:
        again._flush_due_at = time.monotonic()  # as the flush loop set it FLUSH_S ago
        await again._flush_first(js)
        order.append("next messages folded")
        assert again._flush_due_at > time.monotonic()  # the loop's next one FLUSH_S after it
        await again._flush_first(js)  # not due again: nothing runs
        assert again.windows is not None and again.windows.stats.extended == 1

    asyncio.run(fold_turn_flush_due())
    assert order == ["in-progress ack sent", "next messages folded"]
