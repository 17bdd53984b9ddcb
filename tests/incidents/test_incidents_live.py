"""Incidents through the aggregator, on recorded real data: a capture-disturbed window (a real
Megatron PP=2 log and the real capture breakdown of that job), a collective hang (real Flight Recorder
dumps of a hung DDP job), and a slow stretch whose rank's GPU was shared (the log's rank 1 slowed)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from perfd.aggregator.captures import CaptureCoordinator
from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.aggregator.http import _StateCollector, job_summary
from perfd.aggregator.state import AggregatorState
from perfd.analytics.breakdown.bottleneck import ClassSource
from perfd.analytics.steps.provenance import Code
from perfd.collectors.megatron import parse_file
from perfd.core import events
from perfd.core.model import StepRecord, TimerValue
from tests.collectives.test_collectives_aggregator import FakeClient, _recorded_hang_collected, _through_wire

ROOT = Path(__file__).resolve().parents[2]
DP2 = ROOT / "tests" / "data" / "megatron" / "dp2_all_timers.log"
PP2 = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"
PP2_CAPTURE = json.loads((ROOT / "tests" / "data" / "captures" / "megatron_pp2_nsys_h200x2.analysis.json")
                         .read_text())


def _state_with(records: list[StepRecord], log: Path = DP2) -> AggregatorState:
    parsed = parse_file(log, job="dp2")
    st = AggregatorState(min_recompute_s=0.0)
    st.hello("agent-a", ["dp2"])
    st.ingest_job_info("agent-a", "dp2", parsed.job_info)
    st.ingest_steps("agent-a", records)
    return st


def test_a_capture_window_is_listed_apart_never_an_incident_and_informs_the_class() -> None:
    # the capture's own job: the PP=2 run whose nsys capture this is (a capture of another job is not
    # read against this one: perfd.analytics.breakdown.capture_match)
    parsed = parse_file(PP2, job="dp2")
    st = _state_with(parsed.records, PP2)
    co = CaptureCoordinator(st, None, lambda agent, cmd: True)
    by_it = {r.iteration: r for r in parsed.records}
    assert by_it[16].end_time and by_it[14].end_time
    rec = co.request("dp2", [1], "kineto", 3, "manual", now=by_it[14].end_time)
    payload = {"status": "ok", "ranks": {"1": {"devices": [dict(PP2_CAPTURE["devices"][0], device=1)]}}}
    st.ingest_events("agent-a", [
        {"kind": events.CAPTURE_STARTED.name, "time": by_it[14].end_time + 0.01,
         "links": {"command_id": rec.id}},
        {"kind": events.CAPTURE_FINISHED.name, "time": by_it[16].end_time - 0.01,
         "links": {"command_id": rec.id}, "payload": payload}])
    assert co.captures[rec.id].status == "finished" and co.captures[rec.id].findings  # findings joined
    a = st.analysis("dp2", force=True)
    assert a is not None
    # perfd's own disturbance is no incident: no incident, no incident_opened event, not the headline.
    assert st.incidents.incidents("dp2") == []
    assert events.INCIDENT_OPENED.name not in [e["kind"] for e in st.recent_events("dp2")]
    dist = a.summary.capture_disturbances
    assert dist.n == 1 and dist.stretches[0].last_iteration == 16
    assert all(not it.steady_state for it in a.iterations if 15 <= it.iteration <= 16)
    assert a.summary.excluded[15].code is Code.IN_CAPTURE
    summary = job_summary(st, "dp2")
    assert summary is not None and "capture" not in summary["report"]["summary"]["headline"]
    # The capture's timeline votes for the job's class although its iterations stay out of the steady
    # state (it ran during no real incident).
    st.ingest_steps("agent-a", [dataclasses.replace(parsed.records[-1], iteration=31)])
    a2 = st.analysis("dp2", force=True)
    assert a2 is not None
    votes = {v.source: v for v in a2.summary.bottleneck.votes}
    assert votes[ClassSource.CAPTURE].label.startswith(f"capture {rec.id}")


def test_a_capture_that_never_started_disturbs_nothing() -> None:
    parsed = parse_file(DP2, job="dp2")
    st = _state_with(parsed.records)
    co = CaptureCoordinator(st, None, lambda agent, cmd: True)
    by_it = {r.iteration: r for r in parsed.records}
    t14 = by_it[14].end_time
    assert t14 is not None
    rec = co.request("dp2", [1], "kineto", 3, "manual", now=t14)
    st.ingest_events("agent-a", [{"kind": events.CAPTURE_FAILED.name, "time": t14 + 0.01,
                                  "links": {"command_id": rec.id}, "text": "no process known"}])
    a = st.analysis("dp2", force=True)
    assert a is not None and a.summary.capture_disturbances.n == 0
    assert not any(v.code is Code.IN_CAPTURE for v in a.summary.excluded.values())


def _slowed(records: list[StepRecord], its: range, rank: int, factor: float) -> list[StepRecord]:
    """Rank ``rank``'s compute and the step slowed by ``factor`` over ``its`` (a co-tenant)."""
    out = []
    for r in records:
        if r.iteration not in its:
            out.append(r)
            continue
        timers = {}
        for name, tv in r.timers.items():
            per = dict(tv.per_rank)
            if name in ("forward-compute", "backward-compute") and rank in per:
                per[rank] *= factor
            timers[name] = TimerValue(min(per.values()) if per else tv.min_ms, max(per.values()) if per
                                      else tv.max_ms, per)
        out.append(dataclasses.replace(r, timers=timers, step_time_ms=(r.step_time_ms or 0) * factor))
    return out


def test_a_shared_gpu_names_the_rank_the_foreign_process_and_the_cost_after_it_ended() -> None:
    parsed = parse_file(DP2, job="dp2")
    slow = range(14, 22)
    st = _state_with(_slowed(parsed.records, slow, 1, 2.5))
    # What the agent's NVML collector reported while it happened: rank 1's GPU shared.
    procs: list[dict[str, Any]] = [{"pid": 4101, "name": "python", "cmdline": "python train.py", "rank": 1}]
    foreign = {"pid": 5555, "name": "python", "cmdline": "python matmul_burn.py --bf16", "rank": None}
    st.ingest_events("agent-a", [
        {"kind": events.GPU_PROCESSES.name, "labels": {"node": "n1", "gpu": "0"},
         "payload": [{"pid": 4100, "name": "python", "cmdline": "python train.py", "rank": 0}]},
        {"kind": events.GPU_PROCESSES.name, "labels": {"node": "n1", "gpu": "1"},
         "payload": [*procs, foreign]}])
    a = st.analysis("dp2", force=True)
    assert a is not None
    (inc,) = st.incidents.incidents("dp2")
    assert inc["ranks"][0] == 1 and inc["first_iteration"] <= 14 and inc["last_iteration"] == 21
    steady_ms = a.summary.median("step_time_ms")
    assert steady_ms is not None
    its = [it for it in a.iterations if inc["first_iteration"] <= it.iteration <= inc["last_iteration"]]
    want = sum((it.step_time_ms or 0.0) - steady_ms for it in its) / 1e3  # Σ(step − steady median)
    assert abs(inc["cost_s"] - want) <= 0.10 * want and inc["cost_s"] > 4.0  # 8 steps at 2.5x
    assert "pid 5555" in inc["cause"] and "matmul_burn.py" in inc["cause"]
    # The co-tenant leaves; the evidence of the time stays with the incident.
    st.ingest_events("agent-a", [{"kind": events.GPU_PROCESSES.name, "labels": {"node": "n1", "gpu": "1"},
                                  "payload": procs}])
    st.ingest_steps("agent-a", [dataclasses.replace(parsed.records[-1], iteration=31)])
    st.analysis("dp2", force=True)
    (inc2,) = st.incidents.incidents("dp2")
    assert "pid 5555" in inc2["cause"]
    s = job_summary(st, "dp2")
    assert s is not None and s["incidents"][0]["id"] == inc2["id"]
    headline = s["report"]["summary"]["headline"]
    assert "rank 1's GPU" in headline and "s lost" in headline
    f = next(x for x in s["report"]["findings"] if x["id"] == f"incident-{inc2['id']}")
    assert "pid 5555" in f["observation"]
    rec = next(r for r in s["report"]["recommendations"] if r["finding_id"] == f["id"])
    assert "other processes off rank 1's GPU" in rec["action"]
    from prometheus_client import CollectorRegistry, generate_latest

    reg = CollectorRegistry()
    reg.register(_StateCollector(st))
    text = generate_latest(reg).decode()
    assert 'perfd_job_incidents_total{job_name="dp2"} 1.0' in text
    assert 'perfd_job_incident_lost_seconds_total{job_name="dp2"}' in text


def test_a_recorded_hang_is_an_incident_naming_the_rank_that_never_joined(tmp_path: Path) -> None:
    out, _ = _recorded_hang_collected(tmp_path)
    from perfd.agent.config import AgentConfig
    from perfd.agent.node_agent import Agent

    agent = Agent(AgentConfig(job="ddp", node="n1", metrics_port=None))
    agent.client = FakeClient()
    agent._forward([("nccl", out)])
    (call,) = agent.client.calls
    agg = Aggregator(AggregatorConfig(rules_files=[]))
    agg.on_batch("n1", _through_wire(call))
    agg.state.refresh()
    (inc,) = agg.state.incidents.incidents("ddp")
    assert inc["kinds"] == ["hang"] and inc["ranks"] == [1] and inc["open"]
    assert "never reached it" in inc["cause"]
    s = job_summary(agg.state, "ddp")
    assert s is not None and s["incidents"][0]["id"] == inc["id"]
    assert agg.state.incidents.open_incidents("ddp")


def test_the_html_report_marks_incidents_on_the_step_time_chart() -> None:
    from perfd.report import analysis_json
    from perfd.report.html import page_from_json, render_html

    parsed = parse_file(DP2, job="dp2")
    st = _state_with(_slowed(parsed.records, range(14, 22), 1, 2.5))
    a = st.analysis("dp2", force=True)
    assert a is not None
    page = render_html(page_from_json(analysis_json(a, st.incidents.typed_incidents("dp2"))))
    assert page.count('class="incident"') == 1 and "s lost" in page and "rank 1 computed" in page


NVML_REC = ROOT / "perfd" / "collectors" / "nvml" / "data" / "h100_phases.jsonl"


def _recorded_gpu(phase: str, t_min: float) -> list[dict[str, Any]]:
    """One collect of the real H100 NVML recording (a matmul loop under the power cap: SM clock
    1305 MHz, sw_power_cap active; idle: 1980 MHz, nothing active)."""
    for line in NVML_REC.read_text().splitlines():
        d = json.loads(line)
        if d.get("type") == "collect" and d.get("phase") == phase and d["t"] >= t_min:
            return list(d["samples"])
    raise AssertionError(f"no {phase} sample in the recording")


def test_a_throttled_gpu_is_named_with_its_clock_and_throttle_reason() -> None:
    parsed = parse_file(DP2, job="dp2")
    st = _state_with(_slowed(parsed.records, range(14, 22), 1, 1.6))
    defs: dict[int, tuple[str, tuple[tuple[str, str], ...]]] = {}
    ids, ts, vals = [], [], []
    for gpu, samples in (("0", _recorded_gpu("idle", 1.0)), ("1", _recorded_gpu("matmul", 7.0))):
        for s in samples:
            labels = tuple(sorted({**s["labels"], "gpu": gpu, "node": "n1"}.items()))
            defs[len(defs)] = (s["name"], labels)
            ids.append(len(defs) - 1)
            ts.append(1)
            vals.append(float(s["value"]))
    st.ingest_samples("agent-a", defs, ids, ts, vals)
    st.ingest_events("agent-a", [
        {"kind": events.GPU_PROCESSES.name, "labels": {"node": "n1", "gpu": g},
         "payload": [{"pid": 4100 + int(g), "name": "python", "cmdline": "python train.py", "rank": int(g)}]}
        for g in ("0", "1")])
    st.analysis("dp2", force=True)
    (inc,) = st.incidents.incidents("dp2")
    assert inc["ranks"][0] == 1
    # Typed: the power cap leads, the clock drop and the rank's compute ratio are its effects.
    assert inc["verdict"]["cause"] == "power_cap" and inc["verdict"]["rank"] == 1
    assert {e["kind"] for e in inc["verdict"]["effects"]} >= {"clock_drop", "rank_compute_ratio"}
    assert "power-capped (sw_power_cap" in inc["cause"] and "1305 MHz" in inc["cause"]
    snap = inc["evidence"]["gpu"]["1"]
    assert snap["gpu_values"]["perfd_gpu_power_watts"] > 600 and "sw_power_cap" in snap["throttle_reasons"]
    summary = job_summary(st, "dp2")
    assert summary is not None
    rec = next(r for r in summary["report"]["recommendations"] if r["finding_id"] == f"incident-{inc['id']}")
    assert "power limit and power delivery" in rec["action"] and "rank 1" in rec["action"]


def test_a_power_cap_present_in_steady_state_explains_no_incident() -> None:
    """The GPU was power-capped all along (a matmul-heavy job at its limit); rank 1 then computes
    1.6x longer: the verdict is the rank's compute, the cap stays listed as part of steady state."""
    parsed = parse_file(DP2, job="dp2")
    st = _state_with([])
    st.gpu_baseline.every_s = 0.0  # a steady sighting at every new analysis (the refresher: every 5 s)
    defs: dict[int, tuple[str, tuple[tuple[str, str], ...]]] = {}
    ids, ts, vals = [], [], []
    for gpu in ("0", "1"):
        for s in _recorded_gpu("matmul", 7.0):  # both GPUs power-capped, as in the recording
            labels = tuple(sorted({**s["labels"], "gpu": gpu, "node": "n1"}.items()))
            defs[len(defs)] = (s["name"], labels)
            ids.append(len(defs) - 1)
            ts.append(1)
            vals.append(float(s["value"]))
    st.ingest_samples("agent-a", defs, ids, ts, vals)
    st.ingest_events("agent-a", [
        {"kind": events.GPU_PROCESSES.name, "labels": {"node": "n1", "gpu": g},
         "payload": [{"pid": 4100 + int(g), "name": "python", "cmdline": "python train.py", "rank": int(g)}]}
        for g in ("0", "1")])
    for r in parsed.records:  # the steady iterations arrive one by one, each analysed
        if r.iteration >= 14:
            break
        st.ingest_steps("agent-a", [r])
        st.analysis("dp2", force=True)
    slowed = _slowed(parsed.records, range(14, 22), 1, 1.6)
    st.ingest_steps("agent-a", [r for r in slowed if r.iteration >= 14])
    st.analysis("dp2", force=True)
    (inc,) = st.incidents.incidents("dp2")
    v = inc["verdict"]
    assert v["cause"] == "rank_compute_ratio" and v["rank"] == 1
    cap = [e for e in v["also"] if e["kind"] == "power_cap"]
    assert cap and cap[0]["detail"]["in_steady_state"] >= 0.5
    assert "power" not in inc["cause"]
