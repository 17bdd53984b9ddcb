"""A shard killed mid-run while it folds collective windows (perfd.engine.shard_windows): real
nats-server, real ``perfd shard`` and ``perfd aggregator --engine`` processes (tests/engine/engine_driver.py),
nodes publishing the step hook's records and, beside them, their ranks' Flight Recorder operations.
The shard that holds more nodes gets SIGKILL while it holds messages whose windows have not settled;
the engine delivers them again to the next holder, which folds them before anything newer. Then the
root's collective analysis is one aggregator's, fed the same records, byte for byte: no window's
figures lost (every rank's per-iteration share is there) and none doubled (the same shares and counts);
and the step records' checks of test_engine_faults.py hold too (every node message folded once).
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator.state import AggregatorState
from perfd.core.model import CollectiveRecord, StepRecord
from perfd.report.collective_text import collectives_json
from tests.engine.engine_driver import (
    RANKS_PER_NODE,
    Plan,
    Rig,
    consumers,
    rig_under,
    settle_and_check,
)
from tests.engine.test_engine_collectives_many import _summarised_agrees
from tests.procs import NOT_YET, WaitTimeout, get_json, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

# An iteration every 0.5 s where Job is used at its own pace (test_shard_lease_busy.py's plan)
PERIOD_S = 0.5
TP_OPS = 3
# The engine's timers in the kill cases (the rig's --engine-lease-ttl and --engine-ack-wait: the hold 2 s),
# shorter than the defaults (6 s, 10 s) as in test_engine_faults.py: a kill's delay ~7-9 s, not ~16 s
LEASE_TTL_S = 4.0
ACK_WAIT_S = 4.0
# An iteration every 0.25 s in the kill cases: the killed shard's partitions' messages are delivered
# again ~30 iterations after the others of theirs, past the 16 the root holds (their partials "late"),
# fewer where the load's thread ran late (engine_driver.MIN_GAP)
KILL_PERIOD_S = 0.25


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    """The engine tests' rig (tests/engine/conftest.py), with this module's timers."""
    yield from rig_under(tmp_path, lease_ttl_s=LEASE_TTL_S, ack_wait_s=ACK_WAIT_S)


class Job:
    """What every node sends each iteration: the plan's step records, and per rank TP_OPS all-reduces
    on its node's group, one on its data-parallel group (across nodes) and a world barrier, each
    enqueued between the rank's previous step end and this one (so in this iteration's window). The
    barrier comes two messages later (Flight Recorder sends an operation once final, in dump order: a
    slow one after those enqueued after it): a window's provisional figures, made once the next
    window's operations show it covered, lack it, and only the settled ones have it — what a shard
    killed between the two would lose."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.sent: list[tuple[int, list[StepRecord], list[CollectiveRecord]]] = []
        self._t: dict[int, float] = {}
        self._seq: dict[tuple[int, int], int] = {}
        # node -> its barriers of the last two iterations, each sent with the second message after its own
        self._late: dict[int, list[list[CollectiveRecord]]] = {}

    def feed(self, n: int, it: int, t: float) -> dict[str, Any]:
        self._t.setdefault(it, t)
        prev = self._t.get(it - 1, t - self.plan.period_s)
        # Past every rank's previous end (Plan.max_end_offset_s) and before its end now; the load sends
        # iterations engine_driver.MIN_GAP periods and MIN_ROOM_S past the offsets apart at least, so
        # there is room between the two however late its thread ran
        lo, hi = max(prev + self.plan.max_end_offset_s + 0.005, t - 0.8 * self.plan.period_s), t - 0.005
        assert hi > lo, f"iteration {it} submitted {t - prev:.3f}s after the last: no room for its operations"
        world, nodes = self.plan.world, self.plan.nodes
        waiting = self._late.setdefault(n, [])
        colls: list[CollectiveRecord] = waiting.pop(0) if len(waiting) == 2 else []
        late: list[CollectiveRecord] = []
        for lr in range(RANKS_PER_NODE):
            r = n * RANKS_PER_NODE + lr
            tp = [n * RANKS_PER_NODE + i for i in range(RANKS_PER_NODE)]
            groups = [(10 + n, tp, "TENSOR_MODEL_PARALLEL_GROUP")] * TP_OPS + [
                (20 + lr, [m * RANKS_PER_NODE + lr for m in range(nodes)], "undefined"),
                (0, list(range(world)), "default_pg")]
            for k, (pg, ranks, desc) in enumerate(groups):
                seq = self._seq[r, pg] = self._seq.get((r, pg), -1) + 1
                created = lo + (hi - lo) * (k + 0.3 * (r % 3) / 3) / len(groups)
                (late if pg == 0 else colls).append(CollectiveRecord(
                    job=self.plan.job, source="flight_recorder", op="all_reduce", rank=r, pg_id=pg,
                    pg_name=str(pg), pg_desc=desc, pg_ranks=ranks, group_rank=ranks.index(r),
                    group_size=len(ranks), collective_seq_id=seq, bytes=4 << 20, dtype="Float",
                    state="completed", time_created_ns=round(created * 1e9),
                    duration_ms=1.0 + ((r * 7 + it * 3 + k) % 11) * 0.5))
        waiting.append(late)
        steps = self.plan.records(n, it, t)
        self.sent.append((n, steps, colls))
        return {"steps": steps, "collectives": colls}

    def one_aggregator(self) -> str:
        single = AggregatorState()
        for n, steps, colls in self.sent:
            single.ingest_steps(f"agent-{n}", steps)
            single.ingest_collectives(f"agent-{n}", colls)
        got = single.collective_analysis(self.plan.job, force=True)
        assert got is not None
        return json.dumps(collectives_json(got), sort_keys=True)  # as served: findings worded


def _differences(got: dict[str, Any], want: dict[str, Any]) -> str:
    """Where the root's analysis is not one aggregator's: each iteration's ranks missing, extra or
    of another share, and the other keys that differ."""
    out = [f"keys differing: {sorted(k for k in want if got.get(k) != want.get(k))}"]
    g = {it["iteration"]: it for it in got.get("iterations") or []}
    for it in want["iterations"]:
        o = g.get(it["iteration"])
        if o is None:
            out.append(f"iteration {it['iteration']}: missing")
            continue
        a, b = o.get("share_by_rank", {}), it.get("share_by_rank", {})
        diff = {r: (a.get(r), b.get(r)) for r in set(a) | set(b) if a.get(r) != b.get(r)}
        if diff or o != it:
            some = dict(list(diff.items())[:4])
            out.append(f"iteration {it['iteration']}: {len(diff)} ranks differ {some}; "
                       f"keys {sorted(k for k in it if o.get(k) != it.get(k))}")
    return "\n".join(out)


def _why(rig: Rig, shards: tuple[str, ...]) -> str:
    """What the root's and the live shards' window folds counted (late operations, windows uncovered,
    retracted, evicted), and the shards' holds: where a figure went that the root lacks."""
    root = get_json(f"{rig.base}/api/stats")["collectives"]["window_fold"]
    out = [f"root window fold: {root}"]
    for s in shards:
        if rig.shards[s].proc.poll() is None:
            st = rig.shard_stats(s)
            out.append(f"{s}: partitions {st.get('partitions')} leases taken {st.get('leases_taken')} "
                       f"takeover waits {st.get('takeover_waits')} windows {st.get('windows')}")
    return "\n".join(out)


def _root_answer(rig: Rig, job: str) -> str:
    doc = get_json(f"{rig.base}/api/jobs/{urllib.parse.quote(job, safe='')}/summary")
    return json.dumps(doc.get("collectives"), sort_keys=True)


@pytest.mark.parametrize(("restart", "at_agents", "summarised"), [
    pytest.param(True, False, False, id="restarted"),
    pytest.param(False, False, False, id="not-restarted"),
    pytest.param(False, True, False, id="agents-fold"),
    pytest.param(False, True, True, id="agents-fold-summarised")])
def test_a_shard_killed_while_folding_windows_loses_and_doubles_no_figures(rig: Rig, restart: bool,
                                                                          at_agents: bool,
                                                                          summarised: bool) -> None:
    """``agents-fold``: the agents fold their ranks' windows (perfd agent's default) and the shards hand
    the figures on: the messages the killed shard had not acknowledged (their figures not yet out)
    come again to the next holder, whose figures join what the root has, once. ``agents-fold-summarised``:
    the shards hold the rows and summarise them (``perfd shard --comm-summaries``): the killed shard's
    rows, acknowledged and gone with it, are read back from the engine by the next holder, whose summaries
    then answer as the analysis of every rank's rows (no window missing, none twice)."""
    # Killed at iteration 8, its partitions' messages of then are folded at 36-44 or after the last (48):
    # 28-40 iterations after the others of theirs
    plan = Plan(nodes=4, iterations=48, period_s=KILL_PERIOD_S)
    job = Job(plan)
    if summarised:
        rig.shard_flags = ("--comm-summaries",)
    with rig.explained():
        rig.up(("shard-a", "shard-b"))
        by_part = rig.node_partitions(plan)
        held = {s: sum(len(by_part.get(p, [])) for p in rig.partitions_of(s)) for s in ("shard-a", "shard-b")}
        victim, survivor = sorted(held, key=lambda s: -held[s])
        assert held[victim] > 0
        load = rig.start_load(plan, job.feed, fold_at_agents=at_agents)
        load.wait_submitted(8)
        mine = rig.partitions_of(victim)
        pending = wait_for(lambda: sum(c["ack_pending"] for c in consumers(rig.urls, mine).values())
                           or None, 5, f"{victim} holding messages", ignore=NOT_YET, interval=0.05)
        rig.kill(victim)
        t_kill = time.monotonic()
        if restart:
            time.sleep(1.0)  # back about when its leases expire, as test_engine_faults.py's
            rig.start_shard(victim)
        # Late at the root (past the 16 iterations it holds) as a rule, but how many iterations the kill
        # takes depends on how fast the load's thread ran: either way counted, not asserted here
        # (test_engine_faults.py's late case and tests/engine/test_late_partials.py hold that path)
        f = settle_and_check(rig, plan, timeout=90, late=None)
        want = job.one_aggregator()
        doc = json.loads(want)
        assert len(doc["iterations"]) >= plan.iterations - 3, doc["iterations"]
        if summarised:  # the shares from the summaries (within the sketch's error), the rest byte for byte
            agrees = lambda: _summarised_agrees(json.loads(_root_answer(rig, plan.job)), doc)  # noqa: E731
        else:
            agrees = lambda: "" if _root_answer(rig, plan.job) == want else "differs"  # noqa: E731
        try:
            wait_for(lambda: agrees() == "" or None, 60,
                     "the root's collective analysis to be one aggregator's", ignore=NOT_YET, interval=0.5)
        except WaitTimeout:
            raise AssertionError(agrees() + "\n" + _differences(json.loads(_root_answer(rig, plan.job)), doc)
                                 + "\n" + _why(rig, (victim, survivor))) from None
        took = time.monotonic() - t_kill
        stats = {s: rig.shard_stats(s) for s in (victim, survivor) if rig.shards[s].proc.poll() is None}
        print(f"FIGURES collectives{' folded at the agents' if at_agents else ''}, shard killed "
              f"({'restarted' if restart else 'not restarted'}): {victim} "
              f"held {held[victim]}/{plan.nodes} nodes, {pending} messages unacknowledged at the kill; "
              f"{f.line()}; partials late at the root {rig.engine_stats()['late']}; answer equal "
              f"{took:.1f}s after the kill; shards {stats}")
        if summarised:  # no row reached the root; the survivor read back the rows the victim had saved
            got = json.loads(_root_answer(rig, plan.job))
            assert got["method"]["summarised_ranks"] == plan.nodes * RANKS_PER_NODE, got["method"]
            assert rig.engine_stats()["figure_rows"] == 0, rig.engine_stats()
            last = json.loads(rig.shards[victim].stats_file.read_text())["comm"]
            assert last["saved_messages"] > 0, last
            assert stats[survivor]["comm"]["rows_replayed"] > 0, stats[survivor]["comm"]
        if at_agents:  # the shard acknowledges each flush's messages once out: it held those of one flush
            assert pending > 0, f.line()
        else:  # the kill had messages delivered again: the case under test
            assert f.redelivered > 0, f.line()
