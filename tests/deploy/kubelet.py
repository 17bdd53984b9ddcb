"""Play the kubelet for a rendered pod (Helm chart, deploy/k8s, the example job): each volume becomes a
folder holding what its ConfigMap or Secret holds (hostPath and emptyDir volumes: empty folders), each
container path in the args and the config file (and the working directory) is mapped to its folder,
the downward API's fields and a ConfigMap's keys (envFrom) fill the env, `$(VAR)` is expanded from
it, and Service DNS names resolve to this machine. Then the container's command runs for real,
exactly as rendered (a real `perfd aggregator`, a real `perfd agent`).

What it does not play: the network plugin (a NetworkPolicy is read, tests/deploy/netpol.py) and pod
isolation (every process is on this machine). A Secret is looked up in the pod's own namespace, as the
kubelet does: a pod whose Secret is not there does not start (:class:`SecretMissing`)."""

from __future__ import annotations

import base64
import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.procs import http_get

ROOT = Path(__file__).resolve().parents[2]
NODE = "gpu-node-1"
Secrets = dict[tuple[str, str], dict[str, bytes]]  # (namespace, name) -> key -> bytes


class SecretMissing(AssertionError):
    """The pod mounts a Secret its namespace does not hold: the kubelet would leave it waiting."""


def pod_address() -> str:
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
    volumes: dict[str, Path]  # volume name -> its folder here

    def start(self, out: Path) -> subprocess.Popen[bytes]:
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
        return subprocess.Popen([sys.executable, "-m", "perfd.app.cli", *self.args], cwd=self.cwd, env=env,
                                stdout=out.open("wb"), stderr=subprocess.STDOUT)


def _field(path: str, meta: dict[str, Any], namespace: str) -> str:
    """A downward API fieldRef's value for this pod."""
    if path == "spec.nodeName":
        return NODE
    if path == "metadata.namespace":
        return namespace
    if path == "metadata.name":
        return str(meta.get("name") or meta.get("generateName") or "pod-0")
    if path == "status.podIP":
        return "127.0.0.1"  # the pod's address, as its processes here are reached
    m = re.fullmatch(r"metadata\.labels\['([^']+)'\]", path)
    if m:
        return str((meta.get("labels") or {}).get(m.group(1), ""))
    raise AssertionError(f"fieldRef {path} not played here")


def kubelet(obj: dict[str, Any], root: Path, secrets: Secrets, dns: dict[str, str],
            configmaps: dict[str, dict[str, str]] | None = None, container: str | None = None) -> Pod:
    """What the kubelet would run for ``obj``'s (a Deployment's, DaemonSet's or Job's) ``container``
    (its only container when None; init containers too: a native sidecar), in folders under
    ``root``/<kind>. ``configmaps``: name -> data of the ConfigMaps in the pod's namespace."""
    namespace = obj["metadata"].get("namespace", "default")
    template = obj["spec"]["template"]
    spec, meta = template["spec"], template.get("metadata") or {}
    every = [*spec.get("initContainers", []), *spec["containers"]]
    if container is None:
        (c,) = spec["containers"]
    else:
        (c,) = [x for x in every if x["name"] == container]
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    mounts: list[tuple[str, str]] = []  # (container path, host path), longest first
    folders: dict[str, Path] = {}
    for m in c.get("volumeMounts", []):
        vol = vols[m["name"]]
        host = root / obj["kind"] / m["name"]
        host.mkdir(parents=True, exist_ok=True)
        os.chmod(host, 0o700)  # a folder of its own, as perfd wants a capture dir
        folders[m["name"]] = host
        files: dict[str, bytes] = {}
        mode = vol.get("secret", vol.get("configMap", {})).get("defaultMode", 0o644)  # the kubelet's default
        if "configMap" in vol:
            files = {k: v.encode() for k, v in (configmaps or {})[vol["configMap"]["name"]].items()}
        elif "secret" in vol:
            key = (namespace, vol["secret"]["secretName"])
            if key not in secrets and not vol["secret"].get("optional"):
                raise SecretMissing(f"{obj['kind']} {obj['metadata']['name']} in namespace {namespace} "
                                    f"mounts Secret {key[1]}, which namespace {namespace} does not hold")
            files = secrets.get(key, {})
        for name, data in files.items():
            (host / name).write_bytes(data)
            (host / name).chmod(mode)  # perfd refuses a token file others may read
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

    env: dict[str, str] = {}
    for ref in c.get("envFrom", []):  # a ConfigMap's keys, before env (whose names win, as the kubelet's)
        assert set(ref) == {"configMapRef"}, f"envFrom {ref} not played here"
        env.update((configmaps or {})[ref["configMapRef"]["name"]])
    for e in c.get("env", []):
        ref = (e.get("valueFrom") or {}).get("fieldRef")
        env[e["name"]] = _field(ref["fieldPath"], meta, namespace) if ref else str(e.get("value", ""))
    args = [here(re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a)) for a in c["args"]]
    for i, a in enumerate(args):  # the config file: its paths and the aggregator's name mapped too
        if i and args[i - 1] == "--config":
            cfg = yaml.safe_load(Path(a).read_text())
            cfg = {k: here(v) if isinstance(v, str) else v for k, v in cfg.items()}
            mapped = Path(a).with_name("agent.mapped.yaml")
            mapped.write_text(yaml.safe_dump(cfg))
            args[i] = str(mapped)
    ports = {p["name"]: int(p["containerPort"]) for p in c.get("ports", [])}
    return Pod(args, env, Path(here(c["workingDir"])) if "workingDir" in c else ROOT, ports, c, folders)


def secrets_of(docs: list[dict[str, Any]]) -> Secrets:
    """The Secrets among rendered objects, by (namespace, name), their data decoded."""
    return {(d["metadata"]["namespace"], d["metadata"]["name"]):
            {k: base64.b64decode(v) for k, v in d["data"].items()} for d in docs if d["kind"] == "Secret"}


def configmaps_of(docs: list[dict[str, Any]], namespace: str) -> dict[str, dict[str, str]]:
    return {d["metadata"]["name"]: d["data"] for d in docs
            if d["kind"] == "ConfigMap" and d["metadata"].get("namespace", namespace) == namespace}


def probe_port(pod: Pod, probe: dict[str, Any]) -> int:
    port = probe["httpGet"]["port"]
    return pod.ports[port] if isinstance(port, str) else int(port)


def connected(url: str) -> float | None:
    """perfd_agent_connected on an agent's /metrics (None before it serves one)."""
    for fam in text_string_to_metric_families(http_get(url).decode()):
        if fam.name == "perfd_agent_connected":
            return float(fam.samples[0].value)
    return None
