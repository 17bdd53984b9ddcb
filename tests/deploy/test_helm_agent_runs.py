"""The Helm chart's pods run for real, exactly as rendered (a rendered agent once listened on
127.0.0.1 only, so neither the PodMonitor nor the liveness probe could reach it).

`helm template` renders the chart (default values, and a realistic set: another release and
namespace, a token, TLS, persistence, dcgm-exporter's collector, the W&B export); this test plays
the kubelet for the aggregator Deployment and the agent DaemonSet: each volume becomes a folder
holding what the ConfigMap or Secret holds (hostPath and emptyDir volumes: empty folders), each
container path in the args and the config file (and the working directory) is mapped to its folder,
`$(VAR)` is expanded from the container's env, and the Service's DNS name resolves to this machine.
Then a real `perfd aggregator` and a real `perfd agent` start with exactly those args and that
config, and the test GETs what Prometheus and the kubelet would: the PodMonitor's and the liveness
probe's port and path on the pod's address (an address of this machine other than 127.0.0.1), and
the aggregator's probes and ServiceMonitor endpoint the same way. The agent must be connected to the
aggregator through the rendered token (and TLS)."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.kubelet import (
    NODE,
    Pod,
    Secrets,
    configmaps_of,
    connected,
    kubelet,
    pod_address,
    probe_port,
    secrets_of,
)
from tests.deploy.test_helm_chart import CHART, OPERATOR, REALISTIC, _helm
from tests.procs import free_port, http_get, stop, tail, wait_for
from tests.security.certs import CA

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _render(release: str, namespace: str, sets: tuple[str, ...]) -> list[dict[str, Any]]:
    flags = [a for s in sets for a in ("--set", s)]
    r = subprocess.run([_helm(), "template", release, str(CHART), "--namespace", namespace, *flags,
                        *OPERATOR], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def _kubelet(docs: list[dict[str, Any]], kind: str, root: Path, secrets: Secrets, dns: dict[str, str]) -> Pod:
    (obj,) = [d for d in docs if d["kind"] == kind]
    return kubelet(obj, root, secrets, dns, configmaps_of(docs, obj["metadata"]["namespace"]))


@pytest.fixture
def procs() -> Iterator[list[tuple[subprocess.Popen[bytes], Path]]]:
    running: list[tuple[subprocess.Popen[bytes], Path]] = []
    yield running
    for p, _out in reversed(running):
        stop(p)


def _start(pod: Pod, out: Path, running: list[tuple[subprocess.Popen[bytes], Path]]) -> None:
    running.append((pod.start(out), out))


@pytest.mark.parametrize("realistic", [False, True], ids=["default", "realistic"])
def test_rendered_pods_listen_where_prometheus_and_the_kubelet_look(
        tmp_path: Path, procs: list[tuple[subprocess.Popen[bytes], Path]], realistic: bool) -> None:
    release, namespace = ("gpu-perf", "monitoring") if realistic else ("perfd", "perfd")
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    # Ports are values (each test run needs its own); everything else is the chart's.
    sets = (f"aggregator.grpcPort={grpc_port}", f"aggregator.httpPort={http_port}",
            f"agent.metricsPort={metrics_port}", *(REALISTIC if realistic else ()))
    docs = _render(release, namespace, sets)
    # The Secrets the pods mount: the chart's own (a token given), else the one an operator makes
    # (`kubectl create secret ... RELEASE-auth`, as the chart's NOTES say); the TLS Secrets.
    secrets: Secrets = secrets_of(docs)
    secrets.setdefault((namespace, f"{release}-auth"), {"token": b"an-operator-made-token-0123456789"})
    ca = CA("perfd-test-ca")
    server_cert, server_key = ca.issue("perfd-aggregator", server=True)
    agent_cert, agent_key = ca.issue(f"{NODE}/node", server=False)
    secrets[(namespace, "perfd-aggregator-tls")] = {"tls.crt": server_cert, "tls.key": server_key,
                                                    "ca.crt": ca.pem()}
    secrets[(namespace, "perfd-agent-tls")] = {"tls.crt": agent_cert, "tls.key": agent_key,
                                               "ca.crt": ca.pem()}
    # The Service's name, as the cluster's DNS would resolve it (the TLS certificate names 127.0.0.1).
    (svc,) = [d for d in docs if d["kind"] == "Service"]
    dns = {f"{svc['metadata']['name']}.{namespace}.svc": "127.0.0.1"}

    aggregator = _kubelet(docs, "Deployment", tmp_path, secrets, dns)
    agent = _kubelet(docs, "DaemonSet", tmp_path, secrets, dns)
    pod_ip = pod_address()
    _start(aggregator, tmp_path / "aggregator.out", procs)

    def answers(url: str) -> bytes | None:
        if procs[-1][0].poll() is not None:
            raise AssertionError(f"exited {procs[-1][0].returncode}:\n{tail(procs[-1][1])}")
        return http_get(url)

    agg = aggregator.container
    probes = [f"http://{pod_ip}:{probe_port(aggregator, p)}{p['httpGet']['path']}"
              for p in (agg["readinessProbe"], agg["livenessProbe"])]
    assert wait_for(lambda: all(answers(u) for u in probes), 60, f"the aggregator's probes {probes}")
    (sm,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    ep = sm["spec"]["endpoints"][0]
    body = http_get(f"http://{pod_ip}:{aggregator.ports[ep['port']]}{ep['path']}").decode()
    assert "perfd_build_info{" in body

    _start(agent, tmp_path / "agent.out", procs)
    (pm,) = [d for d in docs if d["kind"] == "PodMonitor" and d["metadata"]["name"] == f"{release}-agent"]
    ep = pm["spec"]["podMetricsEndpoints"][0]
    scrape = f"http://{pod_ip}:{agent.ports[ep['port']]}{ep['path']}"
    # Connected: the agent reached the aggregator with the rendered token (and, realistic, TLS).
    assert wait_for(lambda: answers(scrape) and connected(scrape) == 1.0, 60,
                    f"the agent's /metrics at {scrape}, connected")
    live = agent.container["livenessProbe"]["httpGet"]
    assert http_get(f"http://{pod_ip}:{probe_port(agent, agent.container['livenessProbe'])}{live['path']}")
    text = (tmp_path / "agent.out").read_text()
    assert f"listening on http://0.0.0.0:{metrics_port}/metrics" in text, text[-2000:]
    assert "--auth-token-file" in aggregator.args and "--auth-token-file" in agent.args
    if realistic:
        assert "--tls-ca" in agent.args and "--tls-client-ca" in aggregator.args
        # --wandb-project in the chart's aggregator: its runs go under the data volume, writable
        # (the container's root filesystem is read-only), checked at start.
        assert "--wandb-project" in aggregator.args
        assert (tmp_path / "Deployment" / "data" / "state" / "wandb").is_dir()
    # The API wants the token; with it, the aggregator knows the agent by its node ($(NODE_NAME)).
    api = f"http://{pod_ip}:{aggregator.ports['metrics']}/api/stats"
    with pytest.raises(urllib.error.HTTPError) as refused:
        http_get(api)
    assert refused.value.code == 401
    token = secrets[(namespace, f"{release}-auth")]["token"].decode()
    req = urllib.request.Request(api, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert f"{NODE}/node" in json.loads(r.read())["agents_seen"]
