"""The agent's default /metrics port is declared once (perfd.core.limits.AGENT_METRICS_PORT) and every file
that cannot import it (Dockerfile, manifests, the chart, the scrape config, the docs) repeats the same
number; 9400, dcgm-exporter's default on the same GPU nodes, appears only where dcgm-exporter is
meant (the agent and dcgm-exporter once both took 9400 and one of them could not start)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import yaml

from perfd.agent.config import AgentConfig
from perfd.app.cli import build_parser
from perfd.core import limits as L

ROOT = Path(__file__).resolve().parents[2]
PORT = L.AGENT_METRICS_PORT
DCGM_EXPORTER_PORT = 9400


def test_the_default_is_not_dcgm_exporters_and_outside_the_exporter_range() -> None:
    assert PORT != DCGM_EXPORTER_PORT
    assert not 9100 <= PORT <= 9999  # the Prometheus wiki's exporter range, fully allocated
    assert PORT < 30000  # below Kubernetes' NodePort range and the kernel's ephemeral ports
    assert AgentConfig().metrics_port == PORT
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert f"default {PORT})" in sub.choices["agent"].format_help()  # `perfd agent --help` says it


def _yaml_docs(path: Path) -> list[dict[str, object]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_every_deploy_file_uses_the_declared_port() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(rf"^EXPOSE .*\b{PORT}\b", dockerfile, re.M)
    assert f'"--metrics-port", "{PORT}"' in dockerfile
    values = yaml.safe_load((ROOT / "deploy/helm/perfd/values.yaml").read_text())
    assert values["agent"]["metricsPort"] == PORT
    (cm,) = _yaml_docs(ROOT / "deploy/k8s/agent-configmap.yaml")
    assert yaml.safe_load(cm["data"]["agent.yaml"])["metrics_port"] == PORT  # type: ignore[index]
    ds_text = (ROOT / "deploy/k8s/agent-daemonset.yaml").read_text()
    assert re.search(rf"containerPort: {PORT}\b", ds_text)
    job_text = (ROOT / "deploy/k8s/example-training-job.yaml").read_text()
    assert f'"--metrics-port", "{PORT}"' in job_text and f"containerPort: {PORT}" in job_text
    assert yaml.safe_load((ROOT / "deploy/systemd/agent.yaml").read_text())["metrics_port"] == PORT
    prom = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    agent_job = next(j for j in prom["scrape_configs"] if j["job_name"] == "perfd-agent")
    targets = [t for sc in agent_job["static_configs"] for t in sc["targets"]]
    assert targets and all(t.endswith(f":{PORT}") for t in targets)


def test_9400_appears_only_where_dcgm_exporter_is_meant() -> None:
    files = [ROOT / "README.md", ROOT / "Dockerfile",
             *(p for p in (ROOT / "docs").glob("*.md")),
             *(p for p in (ROOT / "deploy").rglob("*") if p.is_file() and not p.is_symlink()),
             *(p for p in (ROOT / "perfd" / "collectors").rglob("*") if p.suffix in (".md", ".yaml", ".py"))]
    stray = []
    for f in files:
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            if re.search(r"(?<![\d.])9400(?!\d)", line) and "dcgm" not in line.lower():
                stray.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not stray, "9400 outside a dcgm-exporter context:\n" + "\n".join(stray)
