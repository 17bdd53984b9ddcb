"""The shipped rule `incident_capture` (rules/default.yaml): an open incident → a capture of the ranks
it names while it is open; the capture joins the incident and its finding (kernels slower than in
steady state) becomes typed evidence of the incident's verdict. On a real Megatron DP=2 log whose rank
1 is slowed at the end (a co-tenant's shape)."""

from __future__ import annotations

import dataclasses

from perfd.aggregator.captures import CaptureCoordinator
from perfd.analytics.advice.capture_findings import steady_compute_ms
from perfd.collectors.megatron import parse_file
from perfd.core import events
from perfd.rules.evaluator import RuleEngine
from perfd.rules.pack_loader import default_pack_path, load_pack
from perfd.transport.codec import Command
from tests.incidents.test_incidents_live import DP2, _slowed, _state_with


def test_an_open_incident_is_captured_on_its_rank_and_the_capture_explains_it() -> None:
    parsed = parse_file(DP2, job="dp2")
    st = _state_with(_slowed(parsed.records, range(22, 31), 1, 1.8))
    a = st.analysis("dp2", force=True)
    assert a is not None
    (inc,) = st.incidents.open_incidents("dp2")
    assert inc["ranks"][0] == 1
    sent: list[tuple[str, Command]] = []
    engine = RuleEngine(load_pack(default_pack_path()).rules)

    def send(agent: str, cmd: Command) -> bool:
        sent.append((agent, cmd))
        return True

    co = CaptureCoordinator(st, engine, send)
    fired = [f.rule.name for f in co.evaluate(now=1000.0)]
    assert "incident_capture" in fired
    ((agent, cmd),) = sent
    assert cmd.ranks == (1,) and cmd.args["tool"] == "auto" and cmd.args["steps"] == "3"
    (rec,) = [r for r in co.list() if r["origin"] == "rule:incident_capture"]
    # The agent runs it during the incident; its kernels took 2.4x the steady compute per iteration.
    base = steady_compute_ms(parsed.records, a.steady.iterations, 1)
    assert base is not None
    per_it = 2.4 * base
    dev = {"device": 0, "span_ms": 3 * per_it * 1.05, "busy_ms": 3 * per_it, "idle_ms": 0.05 * 3 * per_it,
           "compute_ms": 3 * per_it, "comm_ms": 0.0, "comm_exposed_ms": 0.0, "sendrecv_ms": 0.0,
           "categories": {"gemm": 0.6, "elementwise": 0.3, "attention": 0.1}, "kernel_median_us": 40.0}
    t = parsed.records[-3].end_time
    assert t is not None
    st.ingest_events(agent, [
        {"kind": events.CAPTURE_STARTED.name, "time": t, "links": {"command_id": rec["id"]}},
        {"kind": events.CAPTURE_FINISHED.name, "time": t + 2.0, "links": {"command_id": rec["id"]},
         "payload": {"status": "ok", "ranks": {"1": {"devices": [dev]}}}}])
    assert co.captures[rec["id"]].slowdown["1"] >= 2.3
    # One more iteration (its line says the run goes to 40: past the log's 30 it would be refused as
    # implausible, perfd.aggregator.jobs).
    st.ingest_steps("agent-a", [dataclasses.replace(parsed.records[-1], iteration=31, train_iters=40)])
    st.analysis("dp2", force=True)
    (inc,) = [i for i in st.incidents.incidents("dp2") if i["ranks"] and i["ranks"][0] == 1]
    assert [c["id"] for c in inc["captures"]] == [rec["id"]]
    v = inc["verdict"]
    assert v["cause"] == "capture_finding" and v["rank"] == 1 and v["lead"]["worst"] >= 2.3
    assert "ran 2.4× slower than in steady state" in inc["cause"]
    assert {e["kind"] for e in v["effects"]} >= {"rank_compute_ratio"}
