"""A node's agent and a job's sidecar agent on one node, scraped by a real Prometheus under the
shipped PodMonitors (both were once labelled job=perfd-agent, instance=<node>, one series
for the two, so a sidecar that was down hid behind the node's agent).

The monitors come from the real renders (`helm template` of the chart under another release and
namespace, `kubectl kustomize deploy/k8s`), translated into the scrape jobs the Prometheus operator
makes of them (tests/deploy/podmonitor.py); the pods are the rendered DaemonSet's and the example
Job's, their ports real perfd agents on loopback streaming to a real aggregator (both in the test's process:
tests/inproc.py). Prometheus must see
two `up` series and two perfd_agent_connected series, the node's agent as instance <node> (what the
docs' joins keep) and the sidecar as <node>/<pod>; with the sidecar stopped, the shipped
PerfdTargetDown (its expression as shipped, its `for` shortened to seconds) fires for the sidecar only.
"""

from __future__ import annotations

import json
import shutil
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.podmonitor import PodPort, scrape_configs
from tests.deploy.test_helm_chart import _render
from tests.deploy.test_k8s_secure import EXAMPLE, _kustomize
from tests.inproc import pipeline
from tests.integrations.integrations_helpers import need
from tests.procs import Procs, free_port, http_get, wait_for

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "perfd.rules.yml"
LOG = ROOT / "tests" / "data" / "megatron" / "dp2_all_timers.log"
NODE = "gpu-node-3"
JOB = "gpt-8b-pretrain"
SIDECAR_POD = "gpt-8b-pretrain-x2k9q"
pytestmark = pytest.mark.slow


def _helm_docs() -> list[dict[str, Any]]:
    return _render(release="gpu-perf", namespace="monitoring", operator=True)


def _kustomize_docs() -> list[dict[str, Any]]:
    return _kustomize(ROOT / "deploy" / "k8s")


def _query(base: str, q: str) -> list[dict[str, Any]]:
    body = json.loads(http_get(f"{base}/api/v1/query?query={urllib.parse.quote(q)}"))
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def _pods(docs: list[dict[str, Any]], node_port: int, sidecar_port: int) -> list[PodPort]:
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    (job,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d and d["kind"] == "Job"]
    (agent,) = ds["spec"]["template"]["spec"]["containers"]
    (side,) = [c for c in job["spec"]["template"]["spec"]["initContainers"] if c["name"] == "perfd-agent"]
    return [PodPort(ds["metadata"]["namespace"], f"{ds['metadata']['name']}-7xk2p", NODE,
                    ds["spec"]["template"]["metadata"]["labels"], agent["ports"][0]["name"],
                    f"127.0.0.1:{node_port}"),
            PodPort(job["metadata"]["namespace"], SIDECAR_POD, NODE,
                    job["spec"]["template"]["metadata"]["labels"], side["ports"][0]["name"],
                    f"127.0.0.1:{sidecar_port}")]


def _rules_due_in_seconds(dst: Path) -> Path:
    """The shipped rules, each alert's `for` cut to 3 s (the expressions as shipped)."""
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "3s"
    dst.write_text(yaml.safe_dump(rules))
    return dst


@pytest.mark.parametrize("render", [_helm_docs, _kustomize_docs], ids=["helm", "kustomize"])
def test_a_sidecar_down_is_seen_beside_its_nodes_agent(
        tmp_path: Path, render: Callable[[], list[dict[str, Any]]]) -> None:
    prometheus = need("prometheus")
    docs = render()
    monitors = [d for d in docs if d["kind"] == "PodMonitor"]
    assert len(monitors) == 2, [m["metadata"]["name"] for m in monitors]  # the agents', the sidecars'
    node_port, sidecar_port, prom_port = free_port(), free_port(), free_port()
    pods = _pods(docs, node_port, sidecar_port)
    with pipeline(tmp_path, "--no-rules") as p, Procs(tmp_path) as procs:
        p.agent("--node", NODE, "--host", "on", "--ranks", "off", "--nvml", "off",
                "--metrics-port", str(node_port), name="node-agent")
        log = tmp_path / "train.log"
        shutil.copy(LOG, log)
        p.agent("--node", NODE, "--job", JOB, "--megatron-log", log, "--host", "off", "--ranks", "off",
                "--nvml", "off", "--metrics-port", str(sidecar_port), name="sidecar")
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(_rules_due_in_seconds(tmp_path / "perfd.rules.yml"))],
            "scrape_configs": [c for m in monitors for c in scrape_configs(m, pods)]}))
        procs.start("prometheus", [prometheus, f"--config.file={cfg}",
                                   f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{prom_port}"])
        base = f"http://127.0.0.1:{prom_port}"
        wait_for(lambda: http_get(f"{base}/-/ready"), 30, "Prometheus ready")
        # Each monitor discovered its own pod only: the node's agent as <node>, the sidecar as <node>/<pod>.
        want = {NODE: "1", f"{NODE}/{SIDECAR_POD}": "1"}

        def series(q: str) -> dict[str, str]:
            rows = _query(base, q)
            got = {r["metric"]["instance"]: r["value"][1] for r in rows}
            assert len(got) == len(rows), rows  # one series per instance, never two of one
            return got

        wait_for(lambda: series('up{job="perfd-agent"}') == want, 60, f"two up series {want}")
        ups = _query(base, 'up{job="perfd-agent"}')
        assert {r["metric"]["__name__"] for r in ups} == {"up"} and len(ups) == 2
        wait_for(lambda: series('perfd_agent_connected{job="perfd-agent"}') == want, 60,
                 "two perfd_agent_connected series, both connected")

        p.stop_agent("sidecar")

        def firing() -> dict[str, str] | None:
            got = series('ALERTS{alertname="PerfdTargetDown", alertstate="firing"}')
            return got or None

        assert wait_for(firing, 60, "PerfdTargetDown firing") == {f"{NODE}/{SIDECAR_POD}": "1"}
        assert series('up{job="perfd-agent"}') == {NODE: "1", f"{NODE}/{SIDECAR_POD}": "0"}
        assert series('perfd_agent_connected{job="perfd-agent"}') == {NODE: "1"}  # the sidecar's went stale
        assert not _query(base, f'ALERTS{{alertstate="firing", instance="{NODE}"}}')
