"""Collectives at the aggregator: ingest (dedupe, retention), hang merge across agents, the
summary's "collectives" key, /metrics, and the agent side (registry, forwarding, hang payloads)."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from perfd.agent.config import AgentConfig
from perfd.agent.node_agent import Agent, default_registry
from perfd.aggregator.collectives import CollectiveStore
from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.aggregator.http import _StateCollector, job_summary
from perfd.aggregator.state import AggregatorState, job_level_steps
from perfd.analytics.collectives.collective_hangs import merge_hangs
from perfd.collectors.nccl import NcclCollector
from perfd.collectors.nccl.hangs import HangReport
from perfd.core.collfold import Progress
from perfd.core.hang_fact import HangEvent, HangFact
from perfd.core.model import StepRecord, TimerValue
from perfd.report.collective_text import hang_text, resolution_text
from perfd.transport.codec import decode_batch, encode_batch
from perfd.transport.gen import perfd_pb2 as pb
from perfd.transport.series import SeriesTable
from tests.collectives.collective_helpers import FIXTURES, MS, T0, fr, load_fixture_records, step


class FakeClient:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def submit(self, samples: Any = (), steps: Any = (), events: Any = (), **kw: Any) -> int:
        self.calls.append({"samples": list(samples), "steps": list(steps), "events": list(events), **kw})
        return len(self.calls)


def _through_wire(call: dict[str, Any]) -> Any:
    b = encode_batch("n1", 1, call["samples"], call["steps"], call["events"], SeriesTable(),
                     collectives=call.get("collectives") or ())
    return decode_batch(pb.Batch.FromString(b.SerializeToString()), {})


def _hang_event(agent: str, t: float, stuck: str, not_joined: str = "", without: str = "", seq: int = 5,
                age: float | None = None) -> HangEvent:
    """An older agent's event (ranks in labels, the age in the text unless given), read as the
    aggregator reads it."""
    labels = {"job": "j", "process_group": "0", "op": "all_reduce", "seq": str(seq), "stuck_ranks": stuck,
              "ranks_not_joined": not_joined}
    if without:
        labels["ranks_without_dump"] = without
    ev: dict[str, Any] = {"kind": "nccl_hang", "time": t, "job": "j", "labels": labels, "agent": agent,
                          "text": f"all_reduce #{seq} on process group 0 stuck 7s on rank(s) {stuck}"}
    if age is not None:
        ev["payload"] = {"age_s": age}
    got = HangEvent.from_event(ev)
    assert got is not None
    return got


# ---------------------------------------------------------------------------------- hang merge


def test_a_hang_fact_reads_back_from_its_event_as_it_was_written():
    fact = HangFact(process_group="0", op="all_reduce", seq=5, stuck_ranks=(0, 1), ranks_not_joined=(2,),
                    unknown_ranks=(4, 5), age_s=12.5, user_frame="train.py:10")
    ev = {"kind": "nccl_hang", "time": 3.0, "text": "t", "labels": {"job": "j", **fact.labels()},
          "payload": fact.payload()}
    assert ev["labels"] == {"job": "j", "process_group": "0", "op": "all_reduce", "seq": "5",
                            "ranks_not_joined": "2", "stuck_ranks": "0,1", "ranks_without_dump": "4,5"}
    got = HangEvent.from_event(ev, "a")
    assert got == HangEvent(fact, "a", 3.0, "t")
    assert HangEvent.from_event({**ev, "kind": "xid"}) is None


def test_a_hangs_age_travels_as_a_number_and_an_older_agents_text_reads_by_the_writers_format():
    """The collector's event carries the age in its payload, a number: the aggregator takes it from there
    whatever the text says. An older agent's event, with no payload, said it only in the text the
    collector writes (HangReport.text, through hang_fact.age_words): read by the same declaration."""
    report = HangReport(pg_name="0", pg_desc=None, pg_id=0, op="all_reduce", seq=5, is_p2p=False, age_s=42.4,
                        stuck_ranks=[0, 1], missing_ranks=[2], unknown_ranks=[], last_seq_by_rank={})
    fact = HangFact(process_group="0", op="all_reduce", seq=5, stuck_ranks=(0, 1), ranks_not_joined=(2,),
                    unknown_ranks=(), age_s=report.age_s)
    ev = {"kind": "nccl_hang", "time": 3.0, "text": "no age in these words", "labels": fact.labels(),
          "payload": fact.payload()}
    got = HangEvent.from_event(ev)
    assert got is not None and got.fact.age_s == 42.4
    older = HangEvent.from_event({**ev, "text": report.text(), "payload": None})
    assert older is not None and older.fact.age_s == 42.0  # the text's whole seconds
    assert HangEvent.from_event({**ev, "payload": None}).fact.age_s is None  # type: ignore[union-attr]


def test_hang_merged_across_two_nodes():
    evs = [_hang_event("a", 10.0, "0,1,2,3", without="4,5,6,7"),
           _hang_event("b", 11.0, "4,5,7", not_joined="6", without="0,1,2,3")]
    (h,) = merge_hangs(evs, Progress())
    assert h.stuck_ranks == [0, 1, 2, 3, 4, 5, 7] and h.ranks_not_joined == [6] and h.ranks_unknown == []
    assert h.active and h.agents == ["a", "b"] and h.age_at_first_report_s == 7.0
    assert "rank(s) 6 never reached it" in hang_text(h)


def test_ranks_no_agent_saw_are_settled_from_the_records():
    p = Progress()
    for r in (fr(2, 4, 0, 1.0), fr(3, 7, 0, 1.0)):
        p.add(r)
    (h,) = merge_hangs([_hang_event("a", 1.0, "0,1", without="2,3,4", age=12.5)], p)
    assert h.inferred_not_joined == [2] and h.ranks_not_joined == [2]  # 3 got past #5: it joined
    assert h.ranks_unknown == [4] and h.age_at_first_report_s == 12.5


def test_a_hang_is_resolved_once_the_stuck_ranks_complete_the_op():
    p = Progress()
    (h,) = merge_hangs([_hang_event("a", 1.0, "0", not_joined="1")], p)
    assert h.active
    p.add(fr(0, 5, 0, 20_000.0))
    (h,) = merge_hangs([_hang_event("a", 1.0, "0", not_joined="1")], p)
    assert h.resolved and not h.active and "completed #5" in resolution_text(h)


def _recorded_hang_collected(tmp_path: Path) -> tuple[Any, float]:
    manifest = json.loads((FIXTURES / "manifest.json").read_text())
    run = next(r for r in manifest["runs"] if r["mode"] == "hang")
    for rank in (0, 1):
        shutil.copy(FIXTURES / "hang" / f"dump00_rank{rank}", tmp_path / f"fr_dump_{rank}")
    c = NcclCollector({"job": "ddp", "flight_recorder": {
        "pipe_prefix": str(tmp_path / "frp_"), "dump_prefix": str(tmp_path / "fr_dump_"),
        "hang_threshold_s": 2.0, "read_existing": True}})
    c.probe()
    c.start()
    now = run["dumps"][0]["trigger_time_ns"] / 1e9
    return c.collect(now), now


def test_recorded_hang_reaches_the_summary_and_metrics(tmp_path: Path) -> None:
    out, _ = _recorded_hang_collected(tmp_path)
    assert [e["kind"] for e in out.events] == ["nccl_hang"]
    agent = Agent(AgentConfig(job="ddp", node="n1", metrics_port=None))
    agent.client = FakeClient()
    agent._forward([("nccl", out)])
    (call,) = agent.client.calls
    ev = call["events"][0]
    assert ev["payload"]["ranks_not_joined"] == [1] and ev["payload"]["age_s"] >= 2.0
    agg = Aggregator(AggregatorConfig(rules_files=[]))
    agg.on_batch("n1", _through_wire(call))
    s = job_summary(agg.state, "ddp")
    assert s is not None and s["collectives"] is not None
    (h,) = s["collectives"]["hangs"]
    assert h["stuck_ranks"] == [0] and h["ranks_not_joined"] == [1] and h["active"]
    assert h["user_frame"] and "make_nccl_fixtures.py" in h["user_frame"]
    assert any(f["id"].startswith("collective-hang") and f["severity"] == "critical"
               for f in s["collectives"]["findings"])
    reg = CollectorRegistry()
    reg.register(_StateCollector(agg.state))
    metrics = generate_latest(reg).decode()
    assert 'perfd_job_collective_hang_active{job_name="ddp"} 1.0' in metrics


# ---------------------------------------------------------------------------------- ingest


def test_redelivered_records_replace_and_retention_is_bounded():
    store = CollectiveStore(max_records_per_job=10)
    recs = [fr(0, s, s, 1.0) for s in range(8)]
    store.ingest("a", recs)
    store.ingest("a", recs)  # the same batch again after a reconnect
    assert len(store.jobs["j"].records) == 8 and store.ingested == 16
    store.ingest("a", [fr(1, s, s, 1.0) for s in range(8)])
    assert len(store.jobs["j"].records) == 10 and store.dropped == 6
    kept = list(store.jobs["j"].records.values())
    assert kept[-1].rank == 1 and kept[0].rank == 0 and kept[0].collective_seq_id == 6  # oldest dropped
    assert store.jobs["j"].rank_agent == {0: "a", 1: "a"}


def test_p2p_and_collective_with_the_same_seq_are_different_records():
    store = CollectiveStore()
    store.ingest("a", [fr(0, 3, 0, 1.0), fr(0, 3, 0, 1.0, p2p=True, op="send", peer=1)])
    assert len(store.jobs["j"].records) == 2


def test_summary_and_metrics_from_recorded_dumps_and_hook_steps():
    recs = load_fixture_records("timing", job="ddp")
    steps: list[StepRecord] = []
    for rank in (0, 1):
        ts = sorted(r.time_created_ns for r in recs if r.rank == rank and r.time_created_ns)
        ends = [a + 50 * MS for a, b in itertools.pairwise(ts) if b - a > 100 * MS]
        for i, t in enumerate(ends):
            s = step(rank, i, (t - T0) / MS, job="ddp", step_time_ms=200.0 + rank)
            s.timers["data-wait"] = TimerValue(1.0, 1.0, {rank: 1.0})
            steps.append(s)
    st = AggregatorState(gpu_override="NVIDIA H200")
    st.ingest_steps("n1", steps)
    st.ingest_collectives("n1", recs)
    summ = job_summary(st, "ddp")
    assert summ is not None
    c = summ["collectives"]
    assert c["method"]["name"] == "step_windows" and c["summary"]["comm_total_share"] > 0
    assert c["iterations"] and c["groups"][0]["class"] == "world"
    # one analysed iteration per step (per-rank hook records folded), the slowest rank's time
    its = st.analysis("ddp", force=True).iterations  # type: ignore[union-attr]
    assert len(its) == len({x.iteration for x in steps})
    assert its[0].step_time_ms == 201.0
    reg = CollectorRegistry()
    reg.register(_StateCollector(st))
    metrics = generate_latest(reg).decode()
    assert 'perfd_job_comm_total_ratio{job_name="ddp"}' in metrics
    assert 'perfd_job_comm_total_group_ratio{group="world",job_name="ddp"}' in metrics
    assert 'perfd_job_collective_hang_active{job_name="ddp"} 0.0' in metrics
    assert 'perfd_job_collective_last_arrival_ratio{job_name="ddp",rank="1"}' in metrics
    assert "perfd_aggregator_collective_records_total" in metrics
    reg2 = CollectorRegistry()
    reg2.register(_StateCollector(st, per_rank_series=False))
    assert "perfd_job_collective_last_arrival_ratio{" not in generate_latest(reg2).decode()


def test_job_level_steps_prefers_job_records_and_folds_per_rank_ones():
    per_rank = [step(0, 1, 10, step_time_ms=5.0), step(1, 1, 12, step_time_ms=7.0)]
    (folded,) = job_level_steps(per_rank)
    assert folded.rank == "all" and folded.step_time_ms == 7.0
    assert folded.end_time == pytest.approx(per_rank[1].end_time)
    megatron = step("last", 1, 11, step_time_ms=6.0)
    assert job_level_steps([*per_rank, megatron]) == [megatron]
    assert job_level_steps([]) == []


def test_unknown_job_has_no_collectives():
    st = AggregatorState()
    st.ingest_steps("n1", [step("last", 1, 1.0)])
    s = job_summary(st, "j")
    assert s is not None and s["collectives"] is None


# ---------------------------------------------------------------------------------- agent side


def test_default_registry_has_nccl_and_hook():
    names = default_registry().names()
    assert {"nccl", "hook", "megatron", "nvml", "host"} <= set(names)


def test_agent_forwards_collectives_in_bounded_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    import perfd.agent.node_agent as am
    from perfd.collectors.collector import Collected

    monkeypatch.setattr(am, "MAX_COLLECTIVES_PER_BATCH", 3)
    agent = Agent(AgentConfig(job="j", node="n1", metrics_port=None))
    agent.client = FakeClient()
    recs = [fr(0, s, s, 1.0) for s in range(7)]
    agent._forward([("nccl", Collected(collectives=recs))])
    calls = agent.client.calls
    assert [len(c["collectives"]) for c in calls] == [3, 3, 1]
    assert [r for c in calls for r in c["collectives"]] == recs


def test_link_overrides_from_the_command_line():
    from perfd.aggregator.collectives import collective_configs

    base, jobs = collective_configs("ib-400g", ["llama=50", "30"], ["600"])
    assert base.inter_node_link == "ib-400g" and base.inter_node_busbw_gbs == 30.0
    assert base.intra_node_busbw_gbs == 600.0
    assert jobs["llama"].inter_node_busbw_gbs == 50.0 and jobs["llama"].intra_node_busbw_gbs == 600.0
    with pytest.raises(ValueError, match="unknown link"):
        collective_configs("ib-1t")
    with pytest.raises(ValueError, match=r"\[JOB=\]GBS"):
        collective_configs(None, ["fast"])
    agg = Aggregator(AggregatorConfig(rules_files=[], collectives=base, collectives_per_job=jobs))
    assert agg.state.collectives.config is base and agg.state.collectives.job_config["llama"] is jobs["llama"]
