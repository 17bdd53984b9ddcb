"""Rules read what /metrics exports: every job series the aggregator exports for a job is in the
rules' scope with the same value, and ``perfd rules check`` warns for a series no scope holds.

Derived from the catalog and from a real scrape, not from a list of names: the aggregator is fed a
Megatron-LM job caught inside an incident (the recorded co-tenant run, cut at iteration 80), a PP=2
job, a DDP job with recorded Flight Recorder dumps and a SGLang server with /metrics histograms;
its /metrics is scraped and each job sample must be found in the scope the catalog gives it.
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import io
import itertools
import json
import math
import os
import struct
import time
from pathlib import Path

import pytest

from perfd.aggregator import rule_scopes
from perfd.aggregator.captures import CaptureCoordinator
from perfd.aggregator.http import _StateCollector
from perfd.aggregator.state import AggregatorState
from perfd.collectors.collector import Collected
from perfd.collectors.hook import HookCollector
from perfd.collectors.hook.peers import Sender
from perfd.collectors.megatron import parse_file
from perfd.collectors.sglang import parse_file as parse_sglang
from perfd.core import catalog
from perfd.core.catalog import RANK_HOST_SERIES
from perfd.core.events import SERVING_DATA
from perfd.core.serving_records import HistogramSeries, MetricsSnapshot, ServingData
from perfd.rules.check_command import run_rules_check
from perfd.rules.evaluator import RuleEngine, ScopeKey, scope_of
from perfd.rules.expr import SCOPE_LABELS, series_key
from perfd.rules.pack_loader import check_files_warned, parse_pack
from perfd.rules.rule_types import carrying_scopes
from tests.collectives.collective_helpers import MS, T0, load_fixture_records, step

ROOT = Path(__file__).resolve().parents[2]
COTENANT = ROOT / "tests" / "data" / "incidents" / "costraggler_dp2" / "dp2_cotenant.log"
PP2 = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"
SGLANG = ROOT / "perfd" / "collectors" / "sglang" / "tests" / "data" / "sglang_0_5_5_dp2.log"
# The loop as people write it (the batch fetched before the step), its step hook's datagrams as sent.
LOOP = ROOT / "tests" / "data" / "hook" / "frameworks" / "readme" / "hook.jsonl.gz"

# Catalog job series this state does not make /metrics export, and why. Anything else the catalog
# declares for a job must be exported here, and then be in the rules' scope.
NOT_EXERCISED = {
    "perfd_job_collective_busbw_bytes_per_second": "needs collectives of >= 64 MiB; the recorded "
                                                   "DDP dumps hold smaller ones",
    "perfd_job_collective_busbw_link_ratio": "the same",
    "perfd_serving_spec_accept_length": "needs speculative decoding in the SGLang log",
    "perfd_gpu_info": "a GPU's identity for joins (node-level, job_name only where placed); no rule reads it",
    # A job's rank processes on their hosts (collectors/ranks): node series the agents' /metrics serve,
    # like the GPU's, not re-exported here; rules read them at rank scope from the host view
    # (rule_scopes.add_rank_host_values; tests/host/test_rank_rules.py).
    **{name: "a rank process's host series: the agents' /metrics; rules read it from the host view"
       for name in (*RANK_HOST_SERIES, catalog.RANK_STATE_INFO, catalog.RANK_ALLOWED_CPUS,
                    catalog.RANK_PRESSURE)},
}
# Job series /metrics exports that no rule scope holds, and why: join keys for PromQL, not values.
NOT_IN_SCOPES = {
    catalog.JOB_NODE_INFO: "where a job runs, to join a node's host series to the job on(node)",
}


def _snapshot(t: float, n: float) -> MetricsSnapshot:
    lab = (("model_name", "llama"), ("tp_rank", "0"))

    def hist() -> list[HistogramSeries]:
        buckets = ((0.01, n), (0.1, 3 * n), (1.0, 4 * n), (math.inf, 4 * n))
        return [HistogramSeries(lab, buckets, 4 * n, n / 2)]

    return MetricsSnapshot(t, "http://x/metrics", {"sglang:num_running_reqs": [(lab, 12.0)]},
                           {"sglang:generation_tokens_total": [(lab, 500.0 * n)]},
                           {"sglang:time_to_first_token_seconds": hist(),
                            "sglang:inter_token_latency_seconds": hist(),
                            "sglang:e2e_request_latency_seconds": hist()}, [])


def _gpu_labels(node: str, gpu: str, **extra: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"node": node, "gpu": gpu, "model": "NVIDIA H200", **extra}.items()))


@pytest.fixture(scope="module")
def state() -> AggregatorState:
    st = AggregatorState(gpu_override="NVIDIA H200", min_recompute_s=0.0)
    # Megatron DP=2 with per-rank timers, inside its co-tenant incident (iterations 69-90).
    meg = parse_file(COTENANT, job="meg")
    st.hello("a1", ["meg"])
    st.ingest_job_info("a1", "meg", meg.job_info)
    st.ingest_steps("a1", [r for r in meg.records if r.iteration <= 80])
    st.ingest_events("a1", [
        {"kind": "gpu_processes", "labels": {"node": "n1", "gpu": str(r)},
         "payload": [{"pid": 100 + r, "rank": r, "world_size": 2, "cmdline": "python pretrain_gpt.py"}]}
        for r in (0, 1)])
    defs = {0: ("perfd_gpu_utilization_ratio", _gpu_labels("n1", "0")),
            1: ("perfd_gpu_utilization_ratio", _gpu_labels("n1", "1")),
            2: ("perfd_gpu_throttle_active", _gpu_labels("n1", "1", reason="sw_power_cap"))}
    st.ingest_samples("a1", defs, [0, 1, 2], [1, 1, 1], [0.97, 0.41, 1.0])
    # Megatron PP=2: the pipeline metrics.
    pp = parse_file(PP2, job="pp")
    st.hello("a2", ["pp"])
    st.ingest_job_info("a2", "pp", dataclasses.replace(pp.job_info, mfu_alert=False))  # opted out: its series
    st.ingest_steps("a2", pp.records)
    # DDP with recorded Flight Recorder dumps and hook steps: the collective series.
    recs = load_fixture_records("timing", job="ddp")
    steps = []
    for rank in (0, 1):
        ts = sorted(r.time_created_ns for r in recs if r.rank == rank and r.time_created_ns)
        ends = [a + 50 * MS for a, b in itertools.pairwise(ts) if b - a > 100 * MS]
        steps += [step(rank, i, (t - T0) / MS, job="ddp", step_time_ms=200.0 + rank)
                  for i, t in enumerate(ends)]
    st.ingest_steps("a3", steps)
    st.ingest_collectives("a3", recs)
    # A step-hook loop, its recorded datagrams through the agent's hook collector: the series only
    # the hook measures (the time between two steps, outside the step).
    hook = HookCollector({"socket_path": "/nonexistent/hook.sock", "job": "loop"})  # decodes only
    st.hello("a5", ["loop"])
    with gzip.open(LOOP, "rt") as f:
        for line in f:
            d = base64.b64decode(json.loads(line)["d"])
            got = Collected()
            (pid,) = struct.unpack_from("<I", d, 8)  # the sender's pid, as the kernel gave it live
            hook._handle(d, "replay", Sender(pid, os.getuid(), os.getgid()), json.loads(line)["t"], got)
            for name, info in got.job_info.items():
                st.ingest_job_info("a5", name, info)
            st.ingest_steps("a5", got.steps)
    # SGLang: scheduler lines and two /metrics scrapes (the latency percentiles).
    sg = parse_sglang(SGLANG)
    cfg = {"window_s": 1e9, "gpu": "NVIDIA H100 80GB HBM3", "model": {"params": 8.03e9, "dtype": "bf16"}}
    now, half = time.time(), len(sg.records) // 2
    for recs_part, server, snap in ((sg.records[:half], sg.server, _snapshot(now - 10, 1)),
                                    (sg.records[half:], None, _snapshot(now, 3))):
        st.ingest_events("a4", [{"kind": SERVING_DATA.name, "job": "llm", "time": now,
                                 "payload": ServingData("llm", recs_part, server, snap, cfg).to_json()}])
    st.refresh()
    return st


def exported_job_samples(st: AggregatorState) -> list[tuple[str, dict[str, str], float]]:
    """(catalog name, labels, value) of every job sample on /metrics, histograms left out."""
    out = []
    for fam in _StateCollector(st).collect():
        if fam.type in ("histogram", "gaugehistogram"):
            continue
        for s in fam.samples:
            if "job_name" in s.labels and s.name not in NOT_IN_SCOPES:
                out.append((s.name, dict(s.labels), s.value))
    return out


def expected_key(name: str, labels: dict[str, str]) -> tuple[ScopeKey, str]:
    """Where the catalog says a job sample is: its scope key and series key."""
    scopes, why = carrying_scopes(catalog.get(name))
    assert len(scopes) == 1, f"{name}: {why or scopes}"
    (scope,) = scopes
    job = labels["job_name"]
    key: ScopeKey = job
    if scope == "rank":
        key = (job, int(labels["rank"]))
    elif scope == "gpu":
        key = (job, labels["node"], labels["gpu"])
    return key, series_key(name, {k: v for k, v in labels.items() if k not in SCOPE_LABELS})


def _coordinator(st: AggregatorState, engine: RuleEngine | None = None) -> CaptureCoordinator:
    return CaptureCoordinator(st, engine if engine is not None else RuleEngine([]), lambda a, c: True)


def test_every_job_series_on_metrics_is_in_its_rule_scope_with_its_value(state: AggregatorState) -> None:
    samples = exported_job_samples(state)
    scopes = _coordinator(state).scope_values()
    missing = []
    for name, labels, value in samples:
        key, series = expected_key(name, labels)
        got = scopes.get(key, {}).get(series)
        if got is None or not math.isclose(got, value, rel_tol=1e-9, abs_tol=1e-12):
            missing.append(f"{series} at {key!r}: /metrics {value}, rules {got}")
    assert not missing, "\n".join(missing)
    # What the issue found missing, now read (the incident is open at iteration 80).
    meg = scopes["meg"]
    assert meg["perfd_job_incidents_open"] == 1.0 and (meg["perfd_job_incidents_total"] or 0) >= 1
    assert (meg["perfd_job_incident_lost_seconds_total"] or 0) > 0
    assert (meg["perfd_job_incident_lost_seconds"] or 0) > 0
    assert (meg["perfd_job_last_step_timestamp_seconds"] or 0) > 1e9
    assert meg['perfd_job_state_info{state="running"}'] == 1.0


def test_every_catalog_job_series_is_exported_here_or_said_why_not(state: AggregatorState) -> None:
    """The scrape above covers the catalog: a new job series is exported by this state (and so
    checked above), or it is named in NOT_EXERCISED with the reason."""
    exported = {name for name, _, _ in exported_job_samples(state)}
    declared = {m.name for m in catalog.CATALOG if "job_name" in m.labels and carrying_scopes(m)[0]}
    assert declared - exported == set(NOT_EXERCISED)
    assert exported <= declared  # nothing exported for a job that no scope would hold


def test_a_rule_on_each_exported_series_fires(state: AggregatorState) -> None:
    """Through the engine: one rule per exported job sample, `present(<series>)` at its scope; each
    fires for the key the sample belongs to."""
    samples = exported_job_samples(state)
    lines = ["rules:"]
    want = set()
    for i, (name, labels, _value) in enumerate(samples):
        key, series = expected_key(name, labels)
        lines += [f"  - name: r{i}", f"    expr: 'present({series})'", f"    scope: {scope_of(key)}"]
        want.add((f"r{i}", key))
    pack, errors = parse_pack("\n".join(lines), "generated.yaml")
    assert pack is not None, errors
    engine = RuleEngine(pack.rules)
    fired = {(f.rule.name, f.key) for f in _coordinator(state, engine).evaluate(now=time.time())}
    assert want <= fired, sorted(want - fired)[:10]


def test_join_keys_are_exported_and_held_by_no_scope(state: AggregatorState) -> None:
    exported = {s.name for fam in _StateCollector(state).collect() for s in fam.samples}
    for name in NOT_IN_SCOPES:
        assert name in exported, name
        assert not carrying_scopes(catalog.get(name))[0], name


def test_the_scope_of_each_catalog_series_is_the_one_rules_check_assumes() -> None:
    """Every catalog series, as a row with its labels (the aggregator adds job_name to a node's
    series), lands where :func:`carrying_scopes` says, or nowhere when it says no scope holds it."""
    for m in catalog.CATALOG:
        if m.kind == "histogram":  # exported as buckets, never as a row the rules see
            assert not carrying_scopes(m)[0]
            continue
        labels = {k: {"rank": "3", "node": "n1", "gpu": "0"}.get(k, "x") for k in m.labels}
        if "node" in labels:
            labels["job_name"] = "j"  # /metrics labels a node's series with its agent's job
        got = rule_scopes.scope_key(labels)
        scopes, why = carrying_scopes(m)
        if not scopes:
            assert got is None, (m.name, why)
        elif "job_name" not in m.labels:
            # GPU series reach the rules through the GPU view (gpu scope, and joined onto the rank).
            assert got is not None and scope_of(got[0]) == "gpu" and scopes == {"gpu", "rank"}, m.name
        else:
            assert got is not None and scope_of(got[0]) in scopes, m.name


def test_gpu_series_are_joined_onto_the_rank_that_runs_on_the_gpu(state: AggregatorState) -> None:
    pack, errors = parse_pack("""
rules:
  - {name: rank_gpu_idle, expr: gpu_util < 50%, scope: rank}
  - {name: rank_power_capped, expr: throttle_sw_power_cap > 0, scope: rank}
  - {name: gpu_idle, expr: gpu_util < 50%, scope: gpu}
""", "g.yaml")
    assert pack is not None, errors
    scopes = _coordinator(state, RuleEngine(pack.rules)).scope_values()
    assert scopes[("meg", 1)]["perfd_gpu_utilization_ratio"] == pytest.approx(0.41)
    assert scopes[("meg", 0)]["perfd_gpu_utilization_ratio"] == pytest.approx(0.97)
    assert scopes[("meg", 1)]['perfd_gpu_throttle_active{reason="sw_power_cap"}'] == 1.0
    fired = {(f.rule.name, f.key) for f in _coordinator(state, RuleEngine(pack.rules)).evaluate(now=1.0)}
    assert fired == {("rank_gpu_idle", ("meg", 1)), ("rank_power_capped", ("meg", 1)),
                     ("gpu_idle", ("meg", "n1", "1"))}


def test_rules_check_warns_for_a_series_its_scope_never_holds(tmp_path: Path) -> None:
    pack = tmp_path / "p.yaml"
    pack.write_text("""rules:
  - {name: open_incident, expr: perfd_job_incidents_open > 0}
  - {name: tail, expr: perfd_job_step_duration_seconds > 1}
  - {name: own, expr: perfd_aggregator_samples_total > 1}
  - {name: rank_mfu, expr: mfu < 30%, scope: rank}
  - {name: host, expr: perfd_host_load1 > 10, scope: gpu}
  - {name: rank_gpu, expr: gpu_util < 10%, scope: rank}
""")
    out = io.StringIO()
    assert run_rules_check([str(pack)], out) == 0  # warnings do not fail the check: the pack loads
    text = out.getvalue()
    warned = {line.split(" rule ")[1].split(":")[0] for line in text.splitlines() if "warning:" in line}
    assert warned == {"tail", "own", "rank_mfu", "host"}, text
    assert "perfd_job_step_duration_seconds is in no rule scope" in text and "histogram" in text
    assert "perfd_job_mfu_ratio is not in the rank scope" in text and "use scope: job" in text
    assert f"{pack}: OK, 6 rule(s), 4 warning(s)" in text


def test_the_shipped_packs_have_no_warnings() -> None:
    errors, warnings = check_files_warned([ROOT / "rules"])
    assert errors == [] and warnings == []
