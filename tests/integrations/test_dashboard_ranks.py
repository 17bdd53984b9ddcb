"""The dashboard's rank-host, stall and incident panels against a real Prometheus, and the job's
counters present at 0 from its first record (before, no panel showed perfd_host_rank_* nor stalls,
and perfd_job_incidents_total appeared with the first incident, so increase() read 2.03 where 3
happened).

A job started by `perfd launch` (a real rank process printing a real Megatron-LM log, then idle
while alive: a stall), its agent following the rank (collectors/ranks, --nvml off), one aggregator (the
agent and the aggregator in the test's process: tests/inproc.py); Prometheus scrapes both every second.
The panels' queries are the dashboard's own with Grafana's variables filled in."""

from __future__ import annotations

import json
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfd.core import catalog
from tests.inproc import pipeline
from tests.integrations.integrations_helpers import need
from tests.integrations.test_dashboard_topology import _dashboard, _fill, _query
from tests.procs import Procs, free_port, get_json, http_get, wait_for, wait_manifest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "tests" / "data" / "megatron" / "dp2_all_timers.log"
JOB, NODE = "gpt-topology", "gpu-node-5"  # the job test_dashboard_topology's VARIABLES select
RANK = ("import sys, time\n"
        "for line in open(sys.argv[1]):\n"
        "    sys.stdout.write(line); sys.stdout.flush(); time.sleep(0.02)\n"
        "time.sleep(600)\n")
PANELS = ("Job state", "Stalls", "Incidents", "Rank process state",
          "Rank CPU wait, others on its CPUs, quota throttling", "Rank CPU used and its CPUs' load")


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    with Procs(tmp_path) as p:
        yield p


def _targets(title: str) -> list[str]:
    def walk(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for p in panels:
            yield p
            yield from walk(p.get("panels") or [])

    (p,) = [p for p in walk(_dashboard()["panels"]) if p["title"] == title]
    return [_fill(t["expr"]) for t in p["targets"]]


def _first_sample_time(base: str, q: str, start: float) -> float | None:
    """When Prometheus first holds a sample of ``q`` since ``start`` (a range query at 1 s steps)."""
    args = urllib.parse.urlencode({"query": q, "start": f"{start:.3f}", "end": f"{time.time():.3f}",
                                   "step": "1"})
    body = json.loads(http_get(f"{base}/api/v1/query_range?{args}"))
    assert body["status"] == "success", body
    firsts = [float(s["values"][0][0]) for s in body["data"]["result"] if s["values"]]
    return min(firsts) if firsts else None


def test_rank_host_stall_and_incident_panels_fill_and_counters_start_at_zero(
        tmp_path: Path, procs: Procs) -> None:
    prometheus = need("prometheus")
    with pipeline(tmp_path, "--gpu", "NVIDIA H200") as p:
        agg_url = p.base
        run, rank = tmp_path / "run", tmp_path / "rank.py"
        rank.write_text(RANK)
        launch = procs.perfd("launch", "launch", "--job", JOB, "--run-dir", str(run), "--log",
                             str(run / "train.log"), "--", sys.executable, str(rank), str(LOG))
        # The agent binds a port of its own (--metrics-port 0), and it is read from the agent (a free port
        # picked here was once taken by another test's process before the agent bound it)
        agent = p.agent("--node", NODE, "--launch-manifest", wait_manifest(run / "launch.json", launch),
                        "--nvml", "off", "--metrics-port", "0")
        agent_port = agent.agent.metrics_port
        prom_port = free_port()
        base = f"http://127.0.0.1:{prom_port}"
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: perfd-agent
    static_configs: [{{targets: ["127.0.0.1:{agent_port}"]}}]
  - job_name: perfd-aggregator
    static_configs: [{{targets: ["{agg_url.removeprefix('http://')}"]}}]
""")
        procs.start("prometheus", [prometheus, f"--config.file={cfg}",
                                   f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{prom_port}",
                                   "--storage.tsdb.retention.time=1h"])
        wait_for(lambda: http_get(f"{base}/-/ready"), 30, "Prometheus ready")
        start = time.time()

        # The rank prints its log, then idles alive: the job stalls (every rank idle), an incident.
        wait_for(lambda: _query(base, f'perfd_job_state_info{{job_name="{JOB}", state="stalled"}} == 1'), 180,
                 "the job stalled, as Prometheus sees it")
        incidents = get_json(f"{agg_url}/api/jobs/{JOB}/incidents")["incidents"]
        assert incidents and any("stall" in i["kinds"] for i in incidents), incidents

        # Every job counter was there, at 0, from the job's first scraped record: no later than its first
        # iteration gauge. Then increase() counts every incident, the first one too.
        first_iteration = _first_sample_time(base, f'perfd_job_iteration{{job_name="{JOB}"}}', start)
        assert first_iteration is not None
        counters = [n for n in catalog.names()
                    if catalog.get(n).kind == "counter" and n.startswith("perfd_job_")]
        assert {"perfd_job_incidents_total", "perfd_job_incident_lost_seconds_total"} <= set(counters)
        for name in counters:
            first = _first_sample_time(base, f'{name}{{job_name="{JOB}"}}', start)
            assert first is not None and first <= first_iteration, (name, first, first_iteration)
        for name in ("perfd_job_incidents_total", "perfd_job_incident_lost_seconds_total"):
            (row,) = _query(base, f'min_over_time({name}{{job_name="{JOB}"}}[10m])')
            assert float(row["value"][1]) == 0.0, (name, row)
        total = f'perfd_job_incidents_total{{job_name="{JOB}"}}'
        opened = wait_for(lambda: (r := _query(base, total)) and float(r[0]["value"][1]) >= 1
                          and float(r[0]["value"][1]), 30, "the incident counted")
        (inc,) = _query(base, f'increase(perfd_job_incidents_total{{job_name="{JOB}"}}[10m])')
        assert round(float(inc["value"][1])) == opened, inc

        # Each new panel has rows for the job.
        for title in PANELS:
            rows = wait_for(lambda t=title: [r for q in _targets(t) for r in _query(base, q)], 60,  # type: ignore[misc]
                            f"rows in the panel {title!r}")
            assert rows, title
        (state,) = _query(base, _targets("Rank process state")[0])
        assert state["metric"]["rank"] == "0" and state["metric"]["process_state"] in ("sleeping", "running")
        stalled = _query(base, _targets("Stalls")[0])
        assert stalled and float(stalled[0]["value"][1]) > 0
