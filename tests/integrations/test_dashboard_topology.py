"""The dashboard in the recommended topology, against a real Prometheus (before, its Host panels
were blank for a selected job and the first capture never showed).

The topology deploy/k8s and the Helm chart recommend, on one node: a node agent WITHOUT --job (NVML,
whose processes declare the job, and the host's psutil series, which carry no job_name), a job's
agent (its Megatron log, --nvml off --host off), one aggregator; Prometheus scrapes all three with
the scrape jobs of deploy/prometheus/prometheus.yml. The queries are the dashboard's own, read from
deploy/grafana/perfd-dashboard.json with its variables filled in as Grafana would (the job selected,
node = All): the node variable lists the job's node, the Host panels return the node agent's rows
for the job, and the Captures panel and annotation return the job's first capture (the counters are
served from 0, so increase() sees the first event)."""

from __future__ import annotations

import json
import re
import shutil
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfd.agent.scheduler import RUNNING_ERROR_REASONS
from perfd.app.cli import main
from perfd.core import limits as L
from perfd.core.model import CAPTURE_OUTCOMES, CAPTURE_TOOLS
from tests.inproc import Pipeline, pipeline
from tests.integrations.integrations_helpers import DEMO_LOG, NVML_REPLAY, ROOT, need
from tests.procs import Procs, free_port, http_get, placed_recording, wait_for

pytestmark = pytest.mark.slow

DASHBOARD = ROOT / "deploy" / "grafana" / "perfd-dashboard.json"
JOB, NODE, BUS = "gpt-topology", "gpu-node-5", "00000000:18:00.0"
# Grafana's values for the variables: the job selected, every node (the variable's allValue), and a
# rate window several scrapes wide (Prometheus scrapes every second here).
VARIABLES = {"$job_name": JOB, "$node": ".*", "$__rate_interval": "2m"}


def _dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def _panel(title: str) -> list[str]:
    def walk(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for p in panels:
            yield p
            yield from walk(p.get("panels") or [])

    (p,) = [p for p in walk(_dashboard()["panels"]) if p["title"] == title]
    return [_fill(t["expr"]) for t in p["targets"]]


def _fill(expr: str) -> str:
    for var, value in VARIABLES.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, expr
    return expr


def _query(base: str, q: str) -> list[dict[str, Any]]:
    body = json.loads(http_get(f"{base}/api/v1/query?query={urllib.parse.quote(q)}"))
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def _label_values(base: str, definition: str) -> list[str]:
    """Grafana's label_values(SELECTOR, LABEL), through Prometheus' series API as Grafana runs it."""
    m = re.fullmatch(r"label_values\((.+), (\w+)\)", definition)
    assert m, definition
    selector, label = _fill(m.group(1)), m.group(2)
    body = json.loads(http_get(f"{base}/api/v1/series?match[]={urllib.parse.quote(selector)}"))
    return sorted({s[label] for s in body["data"] if label in s})


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    with Procs(tmp_path) as p:
        yield p


@pytest.fixture
def pipe(tmp_path: Path) -> Iterator[Pipeline]:
    """The aggregator and the agents, in the test's process (tests/inproc.py); Prometheus a process."""
    with pipeline(tmp_path) as p:
        yield p


def test_host_and_capture_panels_fill_for_a_job_with_a_node_agent_without_job(
        tmp_path: Path, procs: Procs, pipe: Pipeline, capfd: pytest.CaptureFixture[str]) -> None:
    prometheus = need("prometheus")
    agg_url = pipe.base
    node_port, job_port = free_port(), free_port()
    recording = placed_recording(NVML_REPLAY, tmp_path / "node.jsonl", JOB, BUS)
    node_cfg = tmp_path / "node-agent.yaml"  # the DaemonSet's: NVML (its processes declare the job), host
    node_cfg.write_text(f"batch_interval_s: 0.2\naggregator_sample_interval_s: 0.5\n"
                        f"collectors:\n  nvml: {{source: 'replay:{recording}', loop: true}}\n  host: {{}}\n")
    pipe.agent("--node", NODE, "--config", node_cfg, "--nvml", f"replay:{recording}",
               "--metrics-port", str(node_port), name="node-agent")
    train_log = tmp_path / "train.log"
    shutil.copy(DEMO_LOG, train_log)
    pipe.agent("--job", JOB, "--megatron-log", str(train_log), "--host", "off", "--node", NODE,
               "--nvml", "off", "--metrics-port", str(job_port), name="job-agent")
    node_metrics, job_metrics = (f"http://127.0.0.1:{p}/metrics" for p in (node_port, job_port))

    # Counters with known label values are there at 0 before their first event (the captures' once
    # the agent can capture: it has connected to the aggregator).
    zeros = [f'perfd_agent_captures_total{{node="{NODE}",status="{status}",tool="{tool}"}} 0.0'
             for tool in CAPTURE_TOOLS for status in CAPTURE_OUTCOMES]
    zeros += [f'perfd_agent_http_refused_total{{node="{NODE}",reason="{reason}"}} 0.0'
              for reason in L.REFUSED_HTTP_REASONS]


    def missing() -> list[str]:
        text = http_get(job_metrics).decode()
        return [z for z in zeros if z not in text]

    wait_for(lambda: not missing(), 30, "the job agent's counters at 0")
    node_text = wait_for(lambda: (t := http_get(node_metrics).decode()) and "perfd_host_cpu_util_ratio{" in t
                         and t, 30, "the node agent's host series")
    for collector in ("nvml", "host"):
        for reason in RUNNING_ERROR_REASONS:
            assert f'perfd_agent_collector_errors_total{{collector="{collector}",node="{NODE}",' \
                f'reason="{reason}"}} 0.0' in node_text, (collector, reason)
    assert f'\nperfd_host_cpu_util_ratio{{node="{NODE}"}} ' in node_text, \
        "the node agent's host series carry no job_name"

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cfg = tmp_path / "prometheus.yml"
    agg_target = agg_url.removeprefix("http://")
    cfg.write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: perfd-agent
    static_configs: [{{targets: ["127.0.0.1:{node_port}", "127.0.0.1:{job_port}"]}}]
  - job_name: perfd-aggregator
    static_configs: [{{targets: ["{agg_target}"]}}]
""")
    procs.start("prometheus", [prometheus, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                               f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"])
    wait_for(lambda: http_get(f"{base}/-/ready"), 30, "Prometheus ready")
    wait_for(lambda: len(_query(base, 'up{job=~"perfd-.*"} == 1')) == 3, 60, "the three targets up")

    # The node variable: the job's node, from the aggregator's placement (no GPU series needed).
    (node_var,) = [v for v in _dashboard()["templating"]["list"] if v["name"] == "node"]
    assert "perfd_gpu_" not in node_var["definition"]
    assert wait_for(lambda: _label_values(base, node_var["definition"]) == [NODE], 60,
                    f"the node variable to list {NODE}")

    # The Host panels: rows of the node agent's host series, for the selected job. What they read
    # before (host series filtered by job_name) is empty in this topology.
    assert not _query(base, f'perfd_host_cpu_util_ratio{{job_name="{JOB}"}}')
    (cpu,) = _panel("Host CPU")
    rows = wait_for(lambda: _query(base, cpu), 60, "the Host CPU panel's rows")
    assert [r["metric"] for r in rows] == [{"node": NODE}]
    assert 0.0 <= float(rows[0]["value"][1]) <= 1.0
    if "perfd_host_net_rx_bytes_per_second{" in node_text:  # a machine with a network interface
        for q in _panel("Host network"):
            got = wait_for(lambda q=q: _query(base, q), 60, f"rows of {q}")  # type: ignore[misc]
            assert {r["metric"]["node"] for r in got} == {NODE}
    # Another job's selection shows none of this node's host rows.
    other = cpu.replace(f'job_name=~"{JOB}"', 'job_name=~"another-job"')
    assert not _query(base, other)

    # The first capture of the job: a request by hand (the same path as a rule); the job's agent
    # cannot find rank 0's process on this machine and skips it, counted. increase() sees it because
    # the counter was served at 0 before.
    # `perfd capture` through the CLI's main() in this process: its exit status, what it printed.
    capfd.readouterr()
    rc = main(["capture", "--aggregator", agg_url, "--job", JOB, "--ranks", "0", "--steps", "1",
               "--tool", "kineto"])
    out = capfd.readouterr()
    assert rc == 0, out.out + out.err
    (captures,) = _panel("Captures")

    def captured() -> list[dict[str, Any]]:
        return [row for row in _query(base, captures) if float(row["value"][1]) > 0]

    rows = wait_for(captured, 90, "the Captures panel to show the first capture")
    assert {(row["metric"]["tool"], row["metric"]["status"]) for row in rows} <= \
        {(t, s) for t in CAPTURE_TOOLS for s in CAPTURE_OUTCOMES if s != "ok"}
    (note,) = [a for a in _dashboard()["annotations"]["list"]
               if "perfd_agent_captures_total" in a.get("expr", "")]
    assert wait_for(lambda: _query(base, _fill(note["expr"])), 30, "the capture annotation")
