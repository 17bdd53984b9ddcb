"""deploy/helm/perfd with the real helm: `helm lint --strict`, `helm template` for the default and
the TLS values, on a plain cluster and on one serving the Prometheus operator's API, every rendered
object validated (Kubernetes schemas, strict; the Prometheus operator's CRD schemas, strict),
values.schema.json refusing bad values, and the pieces fitting together (selectors, ports, flags the
CLI knows, the rules file as is)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from perfd.app.cli import build_parser
from tests.deploy.test_k8s_manifests import CRDS, K8S_VERSIONS, _strict

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "perfd"
RULES = ROOT / "deploy" / "prometheus" / "perfd.rules.yml"
DCGM_RULES = ROOT / "deploy" / "prometheus" / "perfd-dcgm.rules.yml"
# What a cluster beside dcgm-exporter and kube-prometheus-stack would set: another release and
# namespace, a given token, TLS, persistence, the W&B export (tests/deploy/test_helm_agent_runs.py
# runs the agent these render).
REALISTIC = ("tls.enabled=true", "aggregator.exportNodeSeries=true", "monitoring.labels.release=prom",
             "auth.token=0123456789abcdef0123456789abcdef", "aggregator.persistence.enabled=true",
             "agent.collectors.dcgm.url=http://127.0.0.1:9400/metrics",
             "aggregator.extraArgs={--wandb-project,perfd-cluster}")
# A cluster that serves the Prometheus operator's API, as `helm install` would find it there: the chart
# renders its ServiceMonitor, PodMonitors and PrometheusRules only then (`helm template` asks no cluster).
OPERATOR = ("--api-versions", "monitoring.coreos.com/v1")
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def _helm() -> str:
    h = shutil.which("helm")
    if h is None:
        if os.environ.get("PERFD_REQUIRE_SYSTEM_DEPS"):
            pytest.fail("helm missing: ci/install-system-deps.sh installs it")
        pytest.skip("helm not installed (ci/install-system-deps.sh)")
    return h


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_helm(), *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


def _render(*sets: str, release: str = "perfd", namespace: str = "perfd",
            operator: bool = False) -> list[dict[str, Any]]:
    """``helm template``; ``operator``: as on a cluster that serves monitoring.coreos.com/v1."""
    flags = [a for s in sets for a in ("--set", s)]
    api = OPERATOR if operator else ()
    r = _run("template", release, str(CHART), "--namespace", namespace, *flags, *api)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def _one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, len(found))
    return found[0]


def test_helm_lint_strict() -> None:
    r = _run("lint", "--strict", str(CHART))
    assert r.returncode == 0 and "0 chart(s) failed" in r.stdout, r.stdout + r.stderr


def validate_rendered(docs: list[dict[str, Any]]) -> None:
    """Every rendered object against its schema: Prometheus-operator CRDs (strict), Kubernetes'
    own for each supported version (kubernetes-validate, strict)."""
    kv = pytest.importorskip("kubernetes_validate")
    import jsonschema

    from tests.deploy.k8s_schemas import latest_version, validate

    schemas = json.loads(CRDS.read_text())["schemas"]
    for d in docs:
        if d["apiVersion"].startswith("monitoring.coreos.com/"):
            schema = _strict(schemas[f"{d['apiVersion']}/{d['kind']}"])
            errors = list(jsonschema.Draft202012Validator(schema).iter_errors(d))
            assert not errors, f"{d['kind']}: {errors[0].message}"
            continue
        for version in (*K8S_VERSIONS, latest_version()):
            try:
                validate(d, version, strict=True)
            except kv.ValidationError as exc:
                pytest.fail(f"{d['kind']}/{d['metadata']['name']} invalid for {version}: {exc.message}")


@pytest.mark.slow
@pytest.mark.parametrize(("sets", "operator"), [((), False), ((), True), (REALISTIC, True)],
                         ids=["default", "default-operator", "realistic"])
def test_rendered_objects_validate(sets: tuple[str, ...], operator: bool) -> None:
    docs = _render(*sets, release="gpu-perf", namespace="monitoring", operator=operator)
    kinds = sorted(d["kind"] for d in docs)
    made = ["PersistentVolumeClaim", "Secret"] if sets else []  # the state's claim; the token given
    monitors = ["ServiceMonitor", "PodMonitor", "PodMonitor", "PrometheusRule", "PrometheusRule"]
    assert kinds == sorted(["ServiceAccount", "ServiceAccount", "ConfigMap", "DaemonSet", "Deployment",
                            "Service", *(monitors if operator else []), "NetworkPolicy", *made])
    validate_rendered(docs)


def _kinds(docs: list[dict[str, Any]]) -> set[str]:
    return {d["kind"] for d in docs}


@pytest.mark.slow
def test_the_default_install_fits_a_plain_cluster_and_one_with_the_operator() -> None:
    """The chart as shipped, on (a) a plain cluster: no Prometheus operator (monitoring.coreos.com/v1
    not served), no NVIDIA RuntimeClass, no default StorageClass; and (b) one that serves the
    operator's API. (a) renders nothing the cluster would refuse or leave pending: no operator object
    (the install would fail: no such kind), no runtimeClassName (a class the cluster lacks: the
    DaemonSet makes no pods), no claim (with no default class it stays Pending, and so would the
    aggregator); (b) renders the monitors and rules its values enable, and only those."""
    plain = _render(release="gpu-perf", namespace="monitoring")
    assert not _kinds(plain) & MONITORING_KINDS
    assert "runtimeClassName" not in _pod(plain, "DaemonSet")
    assert "PersistentVolumeClaim" not in _kinds(plain)
    data = {v["name"]: v for v in _pod(plain, "Deployment")["volumes"]}["data"]
    assert "emptyDir" in data and "persistentVolumeClaim" not in data
    # The image is the values', placeholder included (the NOTES below say it names no registry).
    for kind in ("Deployment", "DaemonSet"):
        (c,) = _pod(plain, kind)["containers"]
        assert c["image"] == "perfd:0.2.0" and c["imagePullPolicy"] == "IfNotPresent"
    validate_rendered(plain)

    op = _render(release="gpu-perf", namespace="monitoring", operator=True)
    assert [d for d in op if d["kind"] not in MONITORING_KINDS] == plain  # the rest as on a plain cluster
    names = sorted((d["kind"], d["metadata"]["name"]) for d in op if d["kind"] in MONITORING_KINDS)
    assert names == [("PodMonitor", "gpu-perf-agent"), ("PodMonitor", "gpu-perf-job-sidecars"),
                     ("PrometheusRule", "gpu-perf"), ("PrometheusRule", "gpu-perf-dcgm"),
                     ("ServiceMonitor", "gpu-perf-aggregator")]
    validate_rendered(op)
    # Each object is its value's: off, it is not made even where the operator is.
    for sets, gone in ((("serviceMonitor.enabled=false",), {("ServiceMonitor", "gpu-perf-aggregator")}),
                       (("podMonitor.enabled=false",), {("PodMonitor", "gpu-perf-agent"),
                                                        ("PodMonitor", "gpu-perf-job-sidecars")}),
                       (("podMonitor.sidecars=false",), {("PodMonitor", "gpu-perf-job-sidecars")}),
                       (("prometheusRule.enabled=false",), {("PrometheusRule", "gpu-perf"),
                                                            ("PrometheusRule", "gpu-perf-dcgm")}),
                       (("prometheusRule.dcgm=false",), {("PrometheusRule", "gpu-perf-dcgm")})):
        docs = _render(*sets, release="gpu-perf", namespace="monitoring", operator=True)
        made = {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in MONITORING_KINDS}
        assert made == set(names) - gone, sets
    # The older monitoring.* switches are still read, over the new keys.
    docs = _render("monitoring.serviceMonitor=false", "monitoring.dcgmRules=true",
                   "prometheusRule.dcgm=false", release="gpu-perf", namespace="monitoring", operator=True)
    made = {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in MONITORING_KINDS}
    assert made == set(names) - {("ServiceMonitor", "gpu-perf-aggregator")}
    # The values that fit a GPU cluster with a default StorageClass: as asked.
    docs = _render("agent.runtimeClassName=nvidia", "aggregator.persistence.enabled=true",
                   "image.repository=registry.example.com/ml/perfd", "image.tag=0.2.0-wandb",
                   "image.pullPolicy=Always")
    assert _pod(docs, "DaemonSet")["runtimeClassName"] == "nvidia"
    assert _one(docs, "PersistentVolumeClaim")["metadata"]["name"] == "perfd-aggregator-state"
    for kind in ("Deployment", "DaemonSet"):
        (c,) = _pod(docs, kind)["containers"]
        assert (c["image"], c["imagePullPolicy"]) == ("registry.example.com/ml/perfd:0.2.0-wandb", "Always")


@pytest.mark.slow
def test_the_notes_say_what_a_plain_cluster_needs() -> None:
    """`helm install` on no cluster (as on one without the operator): the NOTES name each value a plain
    cluster leaves to the user, and say nothing of those the values already settle."""
    def notes(*sets: str) -> str:
        r = _run("install", "perfd", str(CHART), "--dry-run=client", "--namespace", "perfd",
                 *[a for s in sets for a in ("--set", s)])
        assert r.returncode == 0, r.stderr
        return r.stdout[r.stdout.index("NOTES:"):]

    text = notes("monitoring.podMonitor=false")
    assert "Image: perfd:0.2.0 names no registry" in text and "set image.repository" in text
    assert "does not serve monitoring.coreos.com/v1, so no ServiceMonitor" in text
    assert "monitoring.podMonitor -> podMonitor.enabled" in text
    assert "on an emptyDir" in text and "set aggregator.persistence.enabled=true" in text
    assert "set agent.runtimeClassName" in text
    settled = notes("image.repository=registry.example.com/perfd", "aggregator.persistence.enabled=true",
                    "agent.runtimeClassName=nvidia", "serviceMonitor.enabled=false",
                    "podMonitor.enabled=false", "prometheusRule.enabled=false")
    for said in ("Image:", "Prometheus operator:", "Renamed values", "State:", "GPU runtime:"):
        assert said not in settled, said


def test_values_schema_refuses_bad_values() -> None:
    for bad in ("agent.metricsPort=abc", "agent.bogus=1", "image.pullPolicy=Sometimes",
                "monitoring.interval=often", "agent.collectors.nvmll.source=real", "podMonitor.bogus=1",
                "serviceMonitor.enabled=yes-please", "agent.resources.requests.gpu=1",
                "aggregator.resources.limits.foo=1", "aggregator.resources.requests.memory=1"):
        r = _run("template", "perfd", str(CHART), "--set", bad)
        assert r.returncode != 0 and "values don't meet the specifications" in r.stderr, (bad, r.stderr)


def test_the_pieces_fit_together() -> None:
    docs = _render("tls.enabled=true", "aggregator.exportNodeSeries=true", operator=True)
    ds, dep, svc = _one(docs, "DaemonSet"), _one(docs, "Deployment"), _one(docs, "Service")
    sel = dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["selector"] == sel
    assert sel.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    dsel = ds["spec"]["selector"]["matchLabels"]
    assert dsel.items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    pm, sm = _one(docs, "PodMonitor", "perfd-agent"), _one(docs, "ServiceMonitor")
    assert pm["spec"]["selector"]["matchLabels"] == dsel and sm["spec"]["selector"]["matchLabels"] == sel
    # The agent's config points at the Service's gRPC port, and parses as an agent config.
    cfg = yaml.safe_load(_one(docs, "ConfigMap")["data"]["agent.yaml"])
    grpc = next(p for p in svc["spec"]["ports"] if p["name"] == "grpc")
    assert cfg["aggregator"] == f"{svc['metadata']['name']}.perfd.svc:{grpc['port']}"
    assert cfg["metrics_port"] == ds["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    # Every flag the templates pass is one the CLI knows (TLS flags come with the security release).
    parser = build_parser()
    agg_args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--export-node-series" in agg_args
    known_only = [a for a in agg_args if not a.startswith("--tls")]
    tls_values = {"/etc/perfd/tls/tls.crt", "/etc/perfd/tls/tls.key", "/etc/perfd/tls/ca.crt"}
    parser.parse_args([a for a in known_only if a not in tls_values])
    # The rules are deploy/prometheus/perfd.rules.yml and perfd-dcgm.rules.yml, unchanged.
    rules = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "PrometheusRule"}
    assert rules == {"perfd": yaml.safe_load(RULES.read_text()),
                     "perfd-dcgm": yaml.safe_load(DCGM_RULES.read_text())}
    # TLS mounts the secrets where the flags point.
    vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert vols["tls"]["secret"]["secretName"] == "perfd-aggregator-tls"
    assert "--tls-client-ca" in agg_args


def test_default_render_passes_only_flags_this_perfd_has() -> None:
    docs = _render()
    parser = build_parser()
    for kind in ("Deployment", "DaemonSet"):
        args = _one(docs, kind)["spec"]["template"]["spec"]["containers"][0]["args"]
        parser.parse_args([a.replace("$(NODE_NAME)", "node-1") for a in args])


def _pod(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    spec: dict[str, Any] = _one(docs, kind)["spec"]["template"]["spec"]
    return spec


def _args(docs: list[dict[str, Any]], kind: str) -> list[str]:
    args: list[str] = _pod(docs, kind)["containers"][0]["args"]
    return args


def test_aggregator_scheduling_values() -> None:
    base = _pod(_render(), "Deployment")
    unset = {"nodeSelector", "tolerations", "affinity", "priorityClassName", "imagePullSecrets"}
    assert not unset & set(base)
    docs = _render("aggregator.nodeSelector.pool=system", "aggregator.tolerations[0].key=dedicated",
                   "aggregator.tolerations[0].operator=Exists",
                   "aggregator.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                   ".nodeSelectorTerms[0].matchExpressions[0].key=gpu",
                   "aggregator.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                   ".nodeSelectorTerms[0].matchExpressions[0].operator=DoesNotExist",
                   "aggregator.priorityClassName=perfd-high", "agent.priorityClassName=system-node-critical",
                   "imagePullSecrets[0].name=regcred")
    pod, agent = _pod(docs, "Deployment"), _pod(docs, "DaemonSet")
    assert pod["nodeSelector"] == {"pool": "system"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    required = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    term = required["nodeSelectorTerms"]
    assert term == [{"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}]
    assert pod["priorityClassName"] == "perfd-high" and agent["priorityClassName"] == "system-node-critical"
    assert pod["imagePullSecrets"] == agent["imagePullSecrets"] == [{"name": "regcred"}]
    # The agent keeps its GPU-node selector and tolerations; the aggregator's are its own.
    assert agent["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    _validate(docs)


@pytest.mark.slow
def test_aggregator_persistence_keeps_the_state_dir() -> None:
    # The state is always on (--state-dir). By default on an emptyDir (a container restart keeps it,
    # the pod does not): a claim binds only where the cluster has a default StorageClass, which a
    # render cannot know; persistence on puts it on a claim, which upgrades and reschedules keep.
    off = _render()
    assert "--state-dir" in _args(off, "Deployment")
    assert {v["name"]: v for v in _pod(off, "Deployment")["volumes"]}["data"].get("emptyDir") is not None
    assert not [d for d in off if d["kind"] == "PersistentVolumeClaim"]
    on = _render("aggregator.persistence.enabled=true")
    assert "--state-dir" in _args(on, "Deployment")
    assert "storageClassName" not in _one(on, "PersistentVolumeClaim")["spec"]  # the cluster's default class
    docs = _render("aggregator.persistence.enabled=true", "aggregator.persistence.size=20Gi",
                   "aggregator.persistence.storageClassName=fast")
    args = _args(docs, "Deployment")
    state = args[args.index("--state-dir") + 1]
    pvc = _one(docs, "PersistentVolumeClaim")
    assert pvc["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert pvc["spec"]["storageClassName"] == "fast"
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    pod = _pod(docs, "Deployment")
    vols = {v["name"]: v for v in pod["volumes"]}
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "data")
    assert vols["data"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert state.startswith(mount["mountPath"] + "/")  # the journal is on the claim
    assert _one(docs, "Deployment")["spec"]["strategy"]["type"] == "Recreate"  # one writer of a RWO claim
    _validate(docs)
    # An existing claim: used, none made.
    docs = _render("aggregator.persistence.enabled=true", "aggregator.persistence.existingClaim=mine")
    assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    vols = {v["name"]: v for v in _pod(docs, "Deployment")["volumes"]}
    assert vols["data"]["persistentVolumeClaim"]["claimName"] == "mine"


def _token_wiring(docs: list[dict[str, Any]], secret_name: str, key: str = "token") -> None:
    """Both pods pass --auth-token-file at the mount of ``secret_name``'s ``key``."""
    for kind in ("Deployment", "DaemonSet"):
        pod, args = _pod(docs, kind), _args(docs, kind)
        path = args[args.index("--auth-token-file") + 1]
        vols = {v["name"]: v for v in pod["volumes"]}
        mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "auth")
        assert vols["auth"]["secret"]["secretName"] == secret_name
        assert path == f"{mount['mountPath']}/{key}" and mount["readOnly"] is True
        build_parser().parse_args([a.replace("$(NODE_NAME)", "n") for a in args])  # flags this perfd has


@pytest.mark.slow
def test_auth_is_on_by_default_with_a_secret_that_every_render_keeps() -> None:
    import base64

    # Default: on, the pods refer to <release>-auth, which the chart does not make (no token was
    # given, and one generated at render time would change at every `helm template`).
    docs = _render()
    assert not [d for d in docs if d["kind"] == "Secret"]
    _token_wiring(docs, "perfd-auth")
    # A token given: the chart makes the Secret from it, byte-identical at every render.
    token = "0123456789abcdef0123456789abcdef"
    first, second = (_render(f"auth.token={token}") for _ in range(2))
    secret = _one(first, "Secret")
    assert secret == _one(second, "Secret")
    assert base64.b64decode(secret["data"]["token"]).decode() == token
    _token_wiring(first, secret["metadata"]["name"])
    _validate(first)
    # No template asks the cluster (lookup) or draws a random value: a render is a pure function of
    # the values (GitOps renders without cluster access, and every render must agree).
    for tpl in (CHART / "templates").iterdir():
        text = tpl.read_text()
        assert not {"lookup", "randAlphaNum", "randAlpha", "randNumeric", "randAscii", "uuidv4"} & \
            set(re.findall(r"\b[a-zA-Z0-9]+\b", text)), tpl.name
    # An existing Secret and key: referenced, none made.
    docs = _render("auth.existingSecret=cluster-token", "auth.secretKey=perfd")
    assert not [d for d in docs if d["kind"] == "Secret"]
    _token_wiring(docs, "cluster-token", "perfd")
    # Both: ambiguous, refused with the reason; a short token: refused by the schema.
    r = _run("template", "perfd", str(CHART), "--set", "auth.existingSecret=x",
             "--set", f"auth.token={token}")
    assert r.returncode != 0 and "existingSecret or token, not both" in r.stderr, r.stderr
    r = _run("template", "perfd", str(CHART), "--set", "auth.token=short")
    assert r.returncode != 0 and "values don't meet the specifications" in r.stderr, r.stderr
    # Job namespaces (else the example job's sidecar cannot mount the release's Secret): the
    # same Secret, same name and key, in each one but the release's own; none without a token given.
    docs = _render(f"auth.token={token}", "auth.jobNamespaces={ml,research,perfd}")
    made = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "Secret"}
    assert set(made) == {"perfd", "ml", "research"}
    assert {(d["metadata"]["name"], d["data"]["token"]) for d in made.values()} == \
        {(secret["metadata"]["name"], secret["data"]["token"])}
    _validate(docs)
    assert not [d for d in _render("auth.jobNamespaces={ml}") if d["kind"] == "Secret"]
    r = _run("template", "perfd", str(CHART), "--set", "auth.jobNamespaces={Not_A_Namespace}")
    assert r.returncode != 0 and "values don't meet the specifications" in r.stderr, r.stderr
    # The NOTES say how to copy the Secret into a job namespace when the chart does not make it.
    r = _run("install", "perfd", str(CHART), "--dry-run=client", "--namespace", "perfd")
    assert r.returncode == 0, r.stderr
    notes = r.stdout[r.stdout.index("NOTES:"):]
    assert "kubectl -n NS create secret generic perfd-auth --from-literal=token=" in notes
    assert "kubectl -n perfd get secret perfd-auth -o jsonpath='{.data.token}' | base64 -d" in notes
    # Off only when asked: no flag, no mount.
    docs = _render("auth.enabled=false")
    for kind in ("Deployment", "DaemonSet"):
        assert "--auth-token-file" not in _args(docs, kind)
        assert "auth" not in {v["name"] for v in _pod(docs, kind)["volumes"]}


def test_the_aggregator_admits_only_agents_and_prometheus() -> None:
    """The aggregator listens on its pod's address (its Service needs it), behind a NetworkPolicy
    that selects it and admits, per port, this release's agents and the configured peers only."""
    docs = _render(release="gpu-perf", namespace="monitoring")
    (np,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    dep, ds, svc = _one(docs, "Deployment"), _one(docs, "DaemonSet"), _one(docs, "Service")
    assert np["spec"]["podSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert np["spec"]["policyTypes"] == ["Ingress"]
    by_port = {r["ports"][0]["port"]: r["from"] for r in np["spec"]["ingress"]}
    assert set(by_port) == {p["targetPort"] for p in svc["spec"]["ports"]} == {"grpc", "metrics"}
    agents = {"podSelector": {"matchLabels": ds["spec"]["selector"]["matchLabels"]}}
    values = yaml.safe_load((CHART / "values.yaml").read_text())["networkPolicy"]
    assert by_port["grpc"] == [agents, *values["grpcFrom"]]
    assert by_port["metrics"] == [agents, *values["httpFrom"]]
    prom = [p for p in by_port["metrics"] if p.get("podSelector", {}).get("matchLabels") ==
            {"app.kubernetes.io/name": "prometheus"}]
    assert prom, "Prometheus (kube-prometheus-stack's pod label) reaches /metrics"
    # Named ports resolve in the pods.
    ports = {p["name"] for p in _pod(docs, "Deployment")["containers"][0]["ports"]}
    assert {"grpc", "metrics"} <= ports
    _validate(docs)
    assert not [d for d in _render("networkPolicy.enabled=false") if d["kind"] == "NetworkPolicy"]


def test_monitors_set_one_job_name_whatever_the_namespace_and_release() -> None:
    """The operator would label targets job="<ns>/<PodMonitor>" and job="<Service>"; the monitors
    relabel them to perfd-agent / perfd-aggregator, the names deploy/prometheus uses and the rules'
    `up` selector matches (the rules also catch the operator's own names: perfd.rules.test.yml)."""
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    static = {j["job_name"] for j in prom["scrape_configs"]}
    docs = _render(release="gpu-perf", namespace="monitoring", operator=True)
    pm, sm = _one(docs, "PodMonitor", "gpu-perf-agent"), _one(docs, "ServiceMonitor")
    side = _one(docs, "PodMonitor", "gpu-perf-job-sidecars")
    relabels = {"PodMonitor": pm["spec"]["podMetricsEndpoints"][0]["relabelings"],
                "sidecars": side["spec"]["podMetricsEndpoints"][0]["relabelings"],
                "ServiceMonitor": sm["spec"]["endpoints"][0]["relabelings"]}
    jobs = {kind: [r["replacement"] for r in rs if r.get("targetLabel") == "job"]
            for kind, rs in relabels.items()}
    assert jobs == {"PodMonitor": ["perfd-agent"], "sidecars": ["perfd-agent"],
                    "ServiceMonitor": ["perfd-aggregator"]}
    # The sidecars' monitor finds deploy/k8s/example-training-job.yaml's pods and port, anywhere.
    example = next(d for d in yaml.safe_load_all((ROOT / "deploy/k8s/example-training-job.yaml").read_text())
                   if d and d["kind"] == "Job")
    pod = example["spec"]["template"]
    (expr,) = side["spec"]["selector"]["matchExpressions"]
    assert expr["operator"] == "Exists" and expr["key"] in pod["metadata"]["labels"]
    (agent,) = [c for c in pod["spec"]["initContainers"] if c["name"] == "perfd-agent"]
    assert side["spec"]["podMetricsEndpoints"][0]["port"] in {p["name"] for p in agent["ports"]}
    assert side["spec"]["namespaceSelector"] == {"any": True}
    assert {"perfd-agent", "perfd-aggregator"} <= static
    expr = next(r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
                if r.get("alert") == "PerfdTargetDown")
    matcher = re.search(r'up\{job=~"([^"]+)"\}', expr)
    assert matcher is not None
    for job in ("perfd-agent", "perfd-aggregator"):
        assert re.fullmatch(matcher.group(1), job), (matcher.group(1), job)


def test_grafana_dashboards_configmap_holds_the_dashboards_as_shipped() -> None:
    assert len([d for d in _render() if d["kind"] == "ConfigMap"]) == 1  # the agent's only
    docs = _render("grafana.dashboards.enabled=true")
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and "grafana" in d["metadata"]["name"]]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    for name in ("perfd-dashboard.json", "perfd-serving-dashboard.json"):
        assert json.loads(cm["data"][name]) == json.loads((ROOT / "deploy" / "grafana" / name).read_text())
    _validate(docs)


def test_agent_host_pid_and_uid_are_values() -> None:
    pod = _pod(_render(), "DaemonSet")
    sc = pod["containers"][0]["securityContext"]
    assert pod["hostPID"] is True and sc["runAsUser"] == 0 and sc["runAsNonRoot"] is False
    docs = _render("agent.hostPID=false", "agent.runAsUser=65534")
    pod = _pod(docs, "DaemonSet")
    sc = pod["containers"][0]["securityContext"]
    assert pod["hostPID"] is False and sc["runAsUser"] == 65534 and sc["runAsNonRoot"] is True
    # The token's group, so its Secret is mounted 0440, not readable by others (refused by perfd).
    assert pod["securityContext"]["fsGroup"] == 65534
    assert {v["name"]: v for v in pod["volumes"]}["auth"]["secret"]["defaultMode"] == 0o440
    _validate(docs)


def test_docs_the_chart_cites_exist() -> None:
    text = "".join(p.read_text() for p in CHART.rglob("*") if p.is_file() and p.suffix in (".yaml", ".tpl"))
    cited = set(re.findall(r"docs/[\w./-]+\.md", text))
    assert "docs/security.md" in cited
    assert all((ROOT / c).is_file() for c in cited), cited


def _validate(docs: list[dict[str, Any]]) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    from tests.deploy.k8s_schemas import latest_version, validate

    for d in docs:
        if d["apiVersion"].startswith("monitoring.coreos.com/"):
            continue
        for version in (*K8S_VERSIONS, latest_version()):
            try:
                validate(d, version, strict=True)
            except kv.ValidationError as exc:
                pytest.fail(f"{d['kind']}/{d['metadata']['name']} invalid for {version}: {exc.message}")


def test_the_aggregators_disruption_budget_is_off_unless_asked_for() -> None:
    """A budget on a one-replica aggregator refuses every voluntary eviction (a node drain waits on
    it): none by default; asked for, one that selects the aggregator's pod and no other."""
    assert not [d for d in _render() if d["kind"] == "PodDisruptionBudget"]
    docs = _render("aggregator.podDisruptionBudget.enabled=true", release="gpu-perf", namespace="monitoring")
    pdb = _one(docs, "PodDisruptionBudget")
    assert pdb["metadata"]["namespace"] == "monitoring" and pdb["spec"]["minAvailable"] == 1
    sel = pdb["spec"]["selector"]["matchLabels"]
    assert sel.items() <= _pod_labels(docs, "Deployment").items()
    assert not sel.items() <= _pod_labels(docs, "DaemonSet").items()
    _validate([pdb])
    r = _run("template", "perfd", str(CHART), "--set", "aggregator.podDisruptionBudget.minAvailable=some")
    assert r.returncode != 0 and "values don't meet the specifications" in r.stderr


def _pod_labels(docs: list[dict[str, Any]], kind: str) -> dict[str, str]:
    return dict(_one(docs, kind)["spec"]["template"]["metadata"]["labels"])
