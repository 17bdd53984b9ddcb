"""The Helm chart's pods run for real, exactly as rendered (issue 37: the rendered agent listened on
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

import base64
import json
import os
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.test_helm_chart import CHART, REALISTIC, _helm
from tests.procs import free_port, http_get, stop, tail, wait_for
from tests.security.certs import CA

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
NODE = "gpu-node-1"


def _pod_address() -> str:
    """An address of this machine other than 127.0.0.1, where a pod's IP would be: a non-loopback
    IPv4 if there is one, else 127.0.0.2 (Linux routes all of 127/8 to the loopback, and a server
    bound to 127.0.0.1 alone does not answer there)."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return str(a.address)
    return "127.0.0.2"


@dataclass
class Pod:
    """One rendered pod's container, made runnable here."""

    args: list[str]
    env: dict[str, str]
    cwd: Path  # the container's workingDir, mapped (the repository when it sets none)
    ports: dict[str, int]  # container port name -> number
    container: dict[str, Any]


def _render(release: str, namespace: str, sets: tuple[str, ...]) -> list[dict[str, Any]]:
    flags = [a for s in sets for a in ("--set", s)]
    r = subprocess.run([_helm(), "template", release, str(CHART), "--namespace", namespace, *flags],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def _kubelet(docs: list[dict[str, Any]], kind: str, root: Path, secrets: dict[str, dict[str, bytes]],
             dns: dict[str, str]) -> Pod:
    """What the kubelet would run for ``kind``'s first container, in folders under ``root``."""
    (obj,) = [d for d in docs if d["kind"] == kind]
    spec = obj["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    configmaps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    vols = {v["name"]: v for v in spec["volumes"]}
    mounts: list[tuple[str, str]] = []  # (container path, host path), longest first
    for m in c["volumeMounts"]:
        vol = vols[m["name"]]
        host = root / kind / m["name"]
        host.mkdir(parents=True, exist_ok=True)
        os.chmod(host, 0o700)  # a folder of its own, as perfd wants a capture dir
        files: dict[str, bytes] = {}
        if "configMap" in vol:
            files = {k: v.encode() for k, v in configmaps[vol["configMap"]["name"]].items()}
        elif "secret" in vol:
            files = secrets[vol["secret"]["secretName"]]
        for name, data in files.items():
            (host / name).write_bytes(data)
        target = host / m["subPath"] if "subPath" in m else host
        mounts.append((m["mountPath"], str(target)))
    mounts.sort(key=lambda cm: -len(cm[0]))

    def here(text: str) -> str:
        for path, host in mounts:
            if text == path or text.startswith(path + "/"):
                return host + text[len(path):]
        for name, addr in dns.items():
            text = text.replace(name, addr)
        return text

    env = {e["name"]: e.get("value", NODE if e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
                               == "spec.nodeName" else "") for e in c.get("env", [])}
    args = [here(re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a)) for a in c["args"]]
    for i, a in enumerate(args):  # the config file: its paths and the aggregator's name mapped too
        if i and args[i - 1] == "--config":
            cfg = yaml.safe_load(Path(a).read_text())
            cfg = {k: here(v) if isinstance(v, str) else v for k, v in cfg.items()}
            mapped = Path(a).with_name("agent.mapped.yaml")
            mapped.write_text(yaml.safe_dump(cfg))
            args[i] = str(mapped)
    ports = {p["name"]: int(p["containerPort"]) for p in c.get("ports", [])}
    return Pod(args, env, Path(here(c["workingDir"])) if "workingDir" in c else ROOT, ports, c)


def _probe_port(pod: Pod, probe: dict[str, Any]) -> int:
    port = probe["httpGet"]["port"]
    return pod.ports[port] if isinstance(port, str) else int(port)


@pytest.fixture
def procs() -> Iterator[list[tuple[subprocess.Popen[bytes], Path]]]:
    running: list[tuple[subprocess.Popen[bytes], Path]] = []
    yield running
    for p, _out in reversed(running):
        stop(p)


def _start(pod: Pod, out: Path, running: list[tuple[subprocess.Popen[bytes], Path]]) -> None:
    env = {**os.environ, **pod.env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "perfd.cli", *pod.args], cwd=pod.cwd, env=env,
                         stdout=out.open("wb"), stderr=subprocess.STDOUT)
    running.append((p, out))


def _connected(url: str) -> float | None:
    for fam in text_string_to_metric_families(http_get(url).decode()):
        if fam.name == "perfd_agent_connected":
            return float(fam.samples[0].value)
    return None


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
    secrets = {d["metadata"]["name"]: {k: base64.b64decode(v) for k, v in d["data"].items()}
               for d in docs if d["kind"] == "Secret"}
    secrets.setdefault(f"{release}-auth", {"token": b"an-operator-made-token-0123456789"})
    ca = CA("perfd-test-ca")
    server_cert, server_key = ca.issue("perfd-aggregator", server=True)
    agent_cert, agent_key = ca.issue(f"{NODE}/node", server=False)
    secrets["perfd-aggregator-tls"] = {"tls.crt": server_cert, "tls.key": server_key, "ca.crt": ca.pem()}
    secrets["perfd-agent-tls"] = {"tls.crt": agent_cert, "tls.key": agent_key, "ca.crt": ca.pem()}
    # The Service's name, as the cluster's DNS would resolve it (the TLS certificate names 127.0.0.1).
    (svc,) = [d for d in docs if d["kind"] == "Service"]
    dns = {f"{svc['metadata']['name']}.{namespace}.svc": "127.0.0.1"}

    aggregator = _kubelet(docs, "Deployment", tmp_path, secrets, dns)
    agent = _kubelet(docs, "DaemonSet", tmp_path, secrets, dns)
    pod_ip = _pod_address()
    _start(aggregator, tmp_path / "aggregator.out", procs)

    def answers(url: str) -> bytes | None:
        if procs[-1][0].poll() is not None:
            raise AssertionError(f"exited {procs[-1][0].returncode}:\n{tail(procs[-1][1])}")
        return http_get(url)

    agg = aggregator.container
    probes = [f"http://{pod_ip}:{_probe_port(aggregator, p)}{p['httpGet']['path']}"
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
    assert wait_for(lambda: answers(scrape) and _connected(scrape) == 1.0, 60,
                    f"the agent's /metrics at {scrape}, connected")
    live = agent.container["livenessProbe"]["httpGet"]
    assert http_get(f"http://{pod_ip}:{_probe_port(agent, agent.container['livenessProbe'])}{live['path']}")
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
    token = secrets[f"{release}-auth"]["token"].decode()
    req = urllib.request.Request(api, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert f"{NODE}/node" in json.loads(r.read())["agents_seen"]
