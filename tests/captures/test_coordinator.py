"""Rules → capture commands on the aggregator: cooldown, one capture per process, manual and
Alertmanager requests, progress from the agents' events."""

from __future__ import annotations

from pathlib import Path

from perfd.aggregator.captures import CaptureCoordinator, alertmanager_requests
from perfd.aggregator.snapshot import Analysed
from perfd.aggregator.state import AggregatorState
from perfd.collectors.megatron import parse_file
from perfd.rules.evaluator import RuleEngine
from perfd.rules.pack_loader import parse_pack
from perfd.transport.codec import Command

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"
PACK = """
rules:
  - name: mfu_forced
    expr: mfu < 100%
    for: 0s
    severity: warning
    action:
      type: capture
      tool: kineto
      targets: {slowest_rank: true}
      steps: 3
      cooldown: 10m
      max_per_hour: 4
"""


def _state() -> AggregatorState:
    st = AggregatorState(gpu_override="NVIDIA H200")
    parsed = parse_file(LOG, job="j")
    st.hello("agent-1", ["j"])
    st.ingest_job_info("agent-1", "j", parsed.job_info)
    st.ingest_steps("agent-1", parsed.records)
    return st


def _coordinator(st: AggregatorState, sent: list[tuple[str, Command]]) -> CaptureCoordinator:
    pack, errors = parse_pack(PACK, "test.yaml")
    assert pack is not None, errors
    engine = RuleEngine(pack.rules)

    def send(agent: str, cmd: Command) -> bool:
        sent.append((agent, cmd))
        return True

    return CaptureCoordinator(st, engine, send)


def test_a_firing_rule_sends_one_capture_then_respects_cooldown_and_release():
    st = _state()
    sent: list[tuple[str, Command]] = []
    co = _coordinator(st, sent)
    co.evaluate(now=1000.0)
    assert len(sent) == 1
    agent, cmd = sent[0]
    assert agent == "agent-1" and cmd.kind == "capture" and cmd.job == "j"
    assert cmd.args["tool"] == "kineto" and cmd.args["steps"] == "3"
    assert cmd.ranks == (1,)  # the slowest rank: the straggler detector's max rank on the fixture
    (rec,) = co.list()
    assert rec["status"] == "requested" and rec["origin"] == "rule:mfu_forced"
    assert any(e["kind"] == "rule_firing" for e in st.recent_events())

    co.evaluate(now=1005.0)  # still firing: cooldown (and the busy process) hold it back
    assert len(sent) == 1
    # A manual request for the same process while the capture runs: refused, one CUPTI client.
    refused = co.request("j", [1], "nsys", 2, "manual", now=1006.0)
    assert refused.status == "refused" and "busy" in refused.reason
    # The agent reports the capture done: the process is free again for a manual capture.
    st.ingest_events("agent-1", [{"kind": "capture_finished", "text": "ok",
                                  "links": {"capture_id": rec["id"]}, "payload": {"devices": []}}])
    assert co.list()[0]["status"] == "finished"
    ok = co.request("j", [1], "nsys", 2, "manual", now=1007.0)
    assert ok.status == "requested" and len(sent) == 2
    co.evaluate(now=1010.0)  # the rule is still in its cooldown
    assert len(sent) == 2


def test_undeliverable_when_no_agent_and_the_process_is_released():
    st = AggregatorState()
    st.ingest_job_info("gone", "j2", parse_file(LOG, job="j2").job_info)
    co = CaptureCoordinator(st, None, lambda agent, cmd: False, hosts=lambda job: set())  # no host left
    rec = co.request("j2", [0], "kineto", 3, "manual", now=1.0)
    assert rec.status == "undeliverable"
    assert co.request("j2", [0], "kineto", 3, "manual", now=2.0).status == "undeliverable"  # not "busy"


def test_alertmanager_webhook_body_to_requests():
    body = {"version": "4", "status": "firing", "alerts": [
        {"status": "firing", "labels": {"alertname": "PerfdMfuLow", "job_name": "j", "perfd_tool": "nsys",
                                        "perfd_ranks": "0,3", "perfd_steps": "5", "perfd_capture": "true"}},
        {"status": "resolved", "labels": {"alertname": "Old", "job_name": "j", "perfd_capture": "true"}},
        {"status": "firing", "labels": {"alertname": "NoJob", "perfd_capture": "true"}},
    ]}
    assert alertmanager_requests(body) == [
        {"job": "j", "ranks": [0, 3], "tool": "nsys", "steps": 5, "origin": "alertmanager:PerfdMfuLow"}]


def test_alertmanager_alerts_without_perfd_capture_ask_for_nothing():
    """A route that sends every alert to the webhook: firing job alerts without
    perfd_capture="true" (absent, "false") are counted, not captured."""
    from perfd.aggregator.captures import alertmanager_plan

    body = {"version": "4", "status": "firing", "alerts": [
        {"status": "firing", "labels": {"alertname": "PerfdJobMFULow", "job_name": "j"}},
        {"status": "firing", "labels": {"alertname": "Mine", "job_name": "j", "perfd_capture": "false"}},
        {"status": "firing", "labels": {"alertname": "Wanted", "job_name": "j", "perfd_capture": "true"}},
    ]}
    reqs, unmarked = alertmanager_plan(body)
    assert [r["origin"] for r in reqs] == ["alertmanager:Wanted"] and unmarked == 2


def test_gpu_rules_see_only_the_series_they_read_and_fire_on_a_throttled_gpu():
    from perfd.rules.pack_loader import load_pack

    st = _state()
    lab = (("gpu", "0"), ("node", "n1"))
    defs = {1: ("perfd_gpu_throttle_active", (*lab, ("reason", "hw_thermal"))),
            2: ("perfd_gpu_xid_errors_total", lab),
            3: ("perfd_gpu_temperature_celsius", lab)}  # read by no gpu rule of the pack
    st.ingest_samples("agent-1", defs, [1, 2, 3], [1, 1, 1], [1.0, 0.0, 91.0])
    engine = RuleEngine(load_pack(ROOT / "rules" / "default.yaml").rules)
    co = CaptureCoordinator(st, engine, lambda _a, _c: True)
    gv = co.scope_values()[("j", "n1", "0")]
    assert gv == {'perfd_gpu_throttle_active{reason="hw_thermal"}': 1.0, "perfd_gpu_xid_errors_total": 0.0}
    assert all(f.rule.name != "gpu_throttling" for f in co.evaluate(now=1000.0))  # pending
    fired = co.evaluate(now=1061.0)  # the rule's `for: 1m`
    assert [f.key for f in fired if f.rule.name == "gpu_throttling"] == [("j", "n1", "0")]


def test_a_capture_reaches_the_sidecar_on_the_ranks_node_not_the_others() -> None:
    """The sidecar topology on two nodes: the node agents report the GPU processes (each
    placed in the job through its pod), the job's sidecars read no GPU and name their node in their
    Hello. A capture of rank 1 goes to the sidecar of rank 1's node only: the other would answer "no
    process known for rank(s) [1]", and a node agent hosts no job."""
    st = AggregatorState()
    parsed = parse_file(LOG, job="j")
    for node in ("node-a", "node-b"):
        st.hello(f"{node}/node", [], node=node, capabilities={"nvml": "ok"})
        st.hello(f"{node}/j", ["j"], node=node, capabilities={"megatron": "ok"})
    st.ingest_job_info("node-a/j", "j", parsed.job_info)
    for rank, node in ((0, "node-a"), (1, "node-b")):
        st.ingest_events(f"{node}/node", [{
            "kind": "gpu_processes", "labels": {"node": node, "gpu": "0"},
            "payload": [{"pid": 4000 + rank, "rank": rank, "local_rank": 0, "world_size": 2, "job": "j",
                         "used_memory_bytes": 1 << 30}]}])
    assert {r: p.node for r, p in st.placed_ranks("j").items()} == {0: "node-a", 1: "node-b"}
    sent: list[tuple[str, Command]] = []
    def send(agent: str, cmd: Command) -> bool:
        sent.append((agent, cmd))
        return True

    co = CaptureCoordinator(st, None, send, hosts=lambda job: {"node-a/j", "node-b/j"})
    rec = co.request("j", [1], "kineto", 2, "manual", now=1.0)
    assert rec.agents == ["node-b/j"] and [a for a, _ in sent] == ["node-b/j"]
    rec = co.request("j", [0], "kineto", 2, "manual", now=2.0)
    assert rec.agents == ["node-a/j"]


def test_the_slowest_rank_is_read_from_the_latest_rows_columns_as_the_whole_row_gives_it():
    st = _state()
    co = _coordinator(st, [])
    snap = st.snapshot("j", Analysed.CURRENT)
    assert snap is not None and snap.latest is not None
    row = snap.latest  # the whole row, built: the reference
    # this log's rows time no rank's compute (no hook): the round trips' slowest rank stands
    assert not row.straggler_rank_compute_ratio and row.straggler_rtt_max_rank == 1
    assert co.slowest_rank("j") == 1
    assert co.slowest_rank("no-such-job") is None
