"""The shipped Kubernetes deployments are secure by default and their example job connects under those
defaults (tried as a platform engineer would):

- `kubectl apply -k deploy/k8s` ran the aggregator with --listen-all, no token and no NetworkPolicy:
  an unauthenticated POST /api/captures got 202. Rendered by the real kustomize (`kubectl kustomize`)
  and run as rendered (tests/deploy/kubelet.py), it now needs Secret perfd-auth, refuses that POST with
  401, takes it with the token, and its agent connects with the token; its NetworkPolicy admits the
  agents, job sidecars and Prometheus only. deploy/k8s-insecure is the explicit way out of both.
- deploy/k8s/example-training-job.yaml passed no token and mounted no Secret: under the Helm chart's
  default auth its sidecar was refused, and the token Secret lives in the release's namespace while
  jobs run in others. Its sidecar now mounts Secret perfd-auth of the job's own namespace (a copy of
  the release's: made by the operator as the chart's NOTES say, or by the chart with auth.token and
  auth.jobNamespaces), and the job reaches the aggregator the chart renders with its defaults."""

from __future__ import annotations

import json
import os
import re
import shutil
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
    SecretMissing,
    Secrets,
    configmaps_of,
    connected,
    kubelet,
    pod_address,
    secrets_of,
)
from tests.deploy.netpol import admits
from tests.deploy.test_helm_chart import CHART, _helm
from tests.deploy.test_k8s_manifests import CRDS, K8S_VERSIONS, _strict
from tests.procs import free_port, http_get, stop, tail, wait_for

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
INSECURE = ROOT / "deploy" / "k8s-insecure"
EXAMPLE = K8S / "example-training-job.yaml"
LOG = ROOT / "tests" / "data" / "megatron" / "dp2_all_timers.log"
TOKEN = b"0123456789abcdef0123456789abcdef"


def _kubectl() -> str:
    k = shutil.which("kubectl")
    if k is None:
        if os.environ.get("PERFD_REQUIRE_SYSTEM_DEPS"):
            pytest.fail("kubectl missing: ci/install-system-deps.sh installs it")
        pytest.skip("kubectl not installed (ci/install-system-deps.sh)")
    return k


def _kustomize(path: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize PATH`: what `kubectl apply -k PATH` would send to the API server."""
    r = subprocess.run([_kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def _helm_template(*sets: str, release: str = "perfd", namespace: str = "perfd") -> list[dict[str, Any]]:
    flags = [a for s in sets for a in ("--set", s)]
    r = subprocess.run([_helm(), "template", release, str(CHART), "--namespace", namespace, *flags],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (d,) = [d for d in docs if d["kind"] == kind]
    return d


def _example_job() -> dict[str, Any]:
    (job,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d and d["kind"] == "Job"]
    return dict(job)


def _validate(docs: list[dict[str, Any]]) -> None:
    pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the dev extra")
    import jsonschema

    from tests.deploy.k8s_schemas import latest_version, validate

    schemas = json.loads(CRDS.read_text())["schemas"]
    for d in docs:
        if d["apiVersion"].startswith("monitoring.coreos.com/"):
            errors = list(jsonschema.Draft202012Validator(
                _strict(schemas[f"{d['apiVersion']}/{d['kind']}"])).iter_errors(d))
            assert not errors, f"{d['kind']}: {errors[0].message}"
            continue
        for version in (*K8S_VERSIONS, latest_version()):
            validate(d, version, strict=True)


def _container(doc: dict[str, Any]) -> dict[str, Any]:
    (c,) = doc["spec"]["template"]["spec"]["containers"]
    return dict(c)


def _token_mount(doc: dict[str, Any]) -> str | None:
    """The Secret a workload's --auth-token-file is read from (None: no token asked)."""
    c = _container(doc)
    if "--auth-token-file" not in c["args"]:
        return None
    path = c["args"][c["args"].index("--auth-token-file") + 1]
    mount = max((m for m in c["volumeMounts"] if path.startswith(m["mountPath"] + "/")),
                key=lambda m: len(m["mountPath"]))
    (vol,) = [v for v in doc["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    return str(vol["secret"]["secretName"])


# Who knocks on the aggregator: (labels, namespace), and whether the policy must let them in on gRPC /
# HTTP. The example job's pod is taken from the file itself.
PROMETHEUS = ({"app.kubernetes.io/name": "prometheus", "prometheus": "kube-prometheus-stack"}, "monitoring")
STRANGER = ({"app": "web"}, "default")


def _check_policy(policy: dict[str, Any], aggregator: dict[str, Any], agent: dict[str, Any]) -> None:
    target = aggregator["spec"]["template"]["metadata"]["labels"]
    ports = {p["name"]: p["containerPort"] for p in _container(aggregator)["ports"]}
    job = _example_job()
    peers = {"agent": (agent["spec"]["template"]["metadata"]["labels"], agent["metadata"]["namespace"]),
             "example job": (job["spec"]["template"]["metadata"]["labels"], job["metadata"]["namespace"]),
             "prometheus": PROMETHEUS, "stranger": STRANGER}
    want = {"agent": (True, True), "example job": (True, False), "prometheus": (False, True),
            "stranger": (False, False)}
    for who, (labels, ns) in peers.items():
        got = tuple(admits(policy, target, port, source_labels=labels, source_namespace=ns,
                           target_ports=ports) for port in ("grpc", "metrics"))
        assert got == want[who], (who, got)


@pytest.mark.slow
def test_kustomize_renders_the_plain_manifests_secure_and_the_insecure_overlay_says_so() -> None:
    docs = _kustomize(K8S)
    _validate(docs)
    agg, ds = _one(docs, "Deployment"), _one(docs, "DaemonSet")
    assert _token_mount(agg) == _token_mount(ds) == "perfd-auth"
    assert "--listen-all" in _container(agg)["args"]  # the pod's address, behind the token and the policy
    _check_policy(_one(docs, "NetworkPolicy"), agg, ds)
    # The explicit way out: no token asked, no Secret waited for, no policy; everything else the same.
    insecure = _kustomize(INSECURE)
    _validate(insecure)
    agg_i, ds_i = _one(insecure, "Deployment"), _one(insecure, "DaemonSet")
    assert _token_mount(agg_i) is None and _token_mount(ds_i) is None
    for d in (agg_i, ds_i):
        assert not [v for v in d["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    assert not [d for d in insecure if d["kind"] == "NetworkPolicy"]
    secure_rest = [d for d in docs if d["kind"] not in ("Deployment", "DaemonSet", "NetworkPolicy")]
    insecure_rest = [d for d in insecure if d["kind"] not in ("Deployment", "DaemonSet")]
    assert secure_rest == insecure_rest
    strip = {"--auth-token-file", "/etc/perfd-auth/token"}
    assert [a for a in _container(agg)["args"] if a not in strip] == _container(agg_i)["args"]
    assert [a for a in _container(ds)["args"] if a not in strip] == _container(ds_i)["args"]


@pytest.fixture
def running() -> Iterator[list[tuple[subprocess.Popen[bytes], Path]]]:
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    yield procs
    for p, _out in reversed(procs):
        stop(p)


def _post(url: str, body: dict[str, Any], token: bytes | None = None) -> int:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token.decode()}"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _ports(docs: list[dict[str, Any]], grpc: int, http: int, metrics: int) -> list[dict[str, Any]]:
    """The plain manifests with this run's ports (each test run needs its own; an operator would
    patch them the same way): every 50051, 9401 and 14400 in the rendered objects."""
    text = yaml.safe_dump_all(docs)
    for old, new in ((50051, grpc), (9401, http), (14400, metrics)):
        assert str(old) in text
        text = re.sub(rf"(?<!\d){old}(?!\d)", str(new), text)
    return [d for d in yaml.safe_load_all(text) if d]


def _start(pod: Pod, out: Path, running: list[tuple[subprocess.Popen[bytes], Path]]) -> None:
    running.append((pod.start(out), out))


def _run_pair(aggregator: Pod, sidecar: Pod, tmp_path: Path,
              running: list[tuple[subprocess.Popen[bytes], Path]], what: str) -> str:
    """Start the rendered aggregator, then the rendered sidecar with the trainer's log in the emptyDir
    both containers mount, until the sidecar says it is connected; the aggregator's HTTP base."""
    side_port = free_port()
    sidecar.args[sidecar.args.index("--metrics-port") + 1] = str(side_port)
    (sidecar.volumes["logs"] / "train.log").write_text(LOG.read_text())  # the trainer's tee
    _start(aggregator, tmp_path / "aggregator.out", running)
    base = f"http://{pod_address()}:{aggregator.ports['metrics']}"
    wait_for(lambda: _serves(f"{base}/healthz", running), 60, "the aggregator's probe")
    _start(sidecar, tmp_path / "sidecar.out", running)
    scrape = f"http://127.0.0.1:{side_port}/metrics"
    assert wait_for(lambda: _serves(scrape, running) and connected(scrape) == 1.0, 60, what)
    return base


def _serves(url: str, running: list[tuple[subprocess.Popen[bytes], Path]]) -> bytes | None:
    p, out = running[-1]
    if p.poll() is not None:
        raise AssertionError(f"exited {p.returncode}:\n{tail(out)}")
    return http_get(url)


@pytest.mark.slow
def test_plain_manifests_refuse_an_unauthenticated_capture_request(
        tmp_path: Path, running: list[tuple[subprocess.Popen[bytes], Path]]) -> None:
    grpc, http, metrics = free_port(), free_port(), free_port()
    docs = _ports(_kustomize(K8S), grpc, http, metrics)
    dns = {"perfd-aggregator.perfd.svc": "127.0.0.1"}
    agg_doc, ds_doc = _one(docs, "Deployment"), _one(docs, "DaemonSet")
    cms = configmaps_of(docs, "perfd")
    # Before the operator makes the Secret the pods wait for it (nothing listens without a token).
    with pytest.raises(SecretMissing, match="perfd-auth"):
        kubelet(agg_doc, tmp_path / "waiting", {}, dns, cms)
    secrets: Secrets = {("perfd", "perfd-auth"): {"token": TOKEN}}  # kubectl create secret ... perfd-auth
    aggregator = kubelet(agg_doc, tmp_path, secrets, dns, cms)
    agent = kubelet(ds_doc, tmp_path, secrets, dns, cms)
    ip = pod_address()
    _start(aggregator, tmp_path / "aggregator.out", running)
    base = f"http://{ip}:{aggregator.ports['metrics']}"
    wait_for(lambda: _serves(f"{base}/healthz", running), 60, "the aggregator's probe")
    capture = {"job": "any-job", "ranks": [0], "steps": 1, "tool": "kineto"}
    assert _post(f"{base}/api/captures", capture) == 401  # was once 202
    assert _post(f"{base}/api/captures", capture, b"not-the-token-0123456789") == 401
    assert _post(f"{base}/api/captures", capture, TOKEN) == 202  # taken (no agent hosts that job)
    assert b"perfd_build_info" in http_get(f"{base}/metrics")  # Prometheus needs no token
    _start(agent, tmp_path / "agent.out", running)
    scrape = f"http://{ip}:{agent.ports['metrics']}/metrics"
    assert wait_for(lambda: _serves(scrape, running) and connected(scrape) == 1.0, 60,
                    "the DaemonSet's agent connected with the token")
    req = urllib.request.Request(f"{base}/api/stats", headers={"Authorization": f"Bearer {TOKEN.decode()}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert f"{NODE}/node" in json.loads(r.read())["agents_seen"]


@pytest.mark.slow
def test_the_insecure_overlay_is_open_as_it_says(tmp_path: Path,
                                                 running: list[tuple[subprocess.Popen[bytes], Path]]) -> None:
    grpc, http, metrics = free_port(), free_port(), free_port()
    docs = _ports(_kustomize(INSECURE), grpc, http, metrics)
    aggregator = kubelet(_one(docs, "Deployment"), tmp_path, {}, {}, configmaps_of(docs, "perfd"))
    _start(aggregator, tmp_path / "aggregator.out", running)
    base = f"http://{pod_address()}:{aggregator.ports['metrics']}"
    wait_for(lambda: _serves(f"{base}/healthz", running), 60, "the aggregator's probe")
    assert _post(f"{base}/api/captures", {"job": "any-job", "steps": 1}) == 202


@pytest.mark.slow
@pytest.mark.parametrize("token_from", ["operator", "chart"])
def test_the_example_job_connects_under_the_charts_defaults_from_another_namespace(
        tmp_path: Path, running: list[tuple[subprocess.Popen[bytes], Path]], token_from: str) -> None:
    """The chart as installed by docs/deploy.md (release perfd in namespace perfd, auth on), the example
    job in its own namespace (ml). ``operator``: no token in the values; the operator makes Secret
    perfd-auth (the NOTES' step 2) and copies it into ml (the NOTES' command). ``chart``: auth.token
    and auth.jobNamespaces={ml}; the chart makes both."""
    grpc, http = free_port(), free_port()
    sets = [f"aggregator.grpcPort={grpc}", f"aggregator.httpPort={http}"]
    if token_from == "chart":
        sets += [f"auth.token={TOKEN.decode()}", "auth.jobNamespaces={ml}"]
    docs = _helm_template(*sets)
    _validate(docs)
    job = _example_job()
    namespace = job["metadata"]["namespace"]
    assert namespace != "perfd"
    secrets = secrets_of(docs)
    if token_from == "operator":
        assert not secrets  # the chart makes none without a token given
        secrets[("perfd", "perfd-auth")] = {"token": TOKEN}
    dns = {"perfd-aggregator.perfd.svc:50051": f"127.0.0.1:{grpc}"}
    # The chart's policy lets the job's pod in on gRPC, from its namespace.
    agg_doc, ds_doc = _one(docs, "Deployment"), _one(docs, "DaemonSet")
    _check_policy(_one(docs, "NetworkPolicy"), agg_doc, ds_doc)
    # The Secret must be in the job's namespace: the release's is out of the pod's reach.
    if token_from == "operator":
        with pytest.raises(SecretMissing, match=f"namespace {namespace} does not hold"):
            kubelet(job, tmp_path / "waiting", secrets, dns, container="perfd-agent")
        secrets[(namespace, "perfd-auth")] = secrets[("perfd", "perfd-auth")]  # the NOTES' copy command
    assert (namespace, "perfd-auth") in secrets
    aggregator = kubelet(agg_doc, tmp_path, secrets, {}, configmaps_of(docs, "perfd"))
    sidecar = kubelet(job, tmp_path, secrets, dns, container="perfd-agent")
    base = _run_pair(aggregator, sidecar, tmp_path, running, "the example job's sidecar connected")
    name = job["spec"]["template"]["metadata"]["labels"]["perfd.dev/job"]

    def seen() -> dict[str, Any] | None:
        req = urllib.request.Request(f"{base}/api/jobs",
                                     headers={"Authorization": f"Bearer {TOKEN.decode()}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            jobs = {j["job"]: j for j in json.loads(r.read())["jobs"]}
        return jobs.get(name) if (jobs.get(name) or {}).get("last_iteration") else None

    got = wait_for(seen, 60, f"job {name} at the aggregator")
    assert got["last_iteration"] > 0
    assert "UNAUTHENTICATED" not in (tmp_path / "sidecar.out").read_text()


@pytest.mark.slow
def test_the_chart_runs_the_example_job_in_a_third_namespace_with_no_step_by_hand(
        tmp_path: Path, running: list[tuple[subprocess.Popen[bytes], Path]]) -> None:
    """The example once hardcoded perfd-aggregator.perfd.svc and Secret perfd-auth, so it
    worked only for release perfd in namespace perfd, and waited for someone to copy the Secret. Here
    the release is gpu-perf in namespace monitoring and the job runs in research: the chart renders
    the Job with this release's address and Secret, the Secret's copy in research, and a NetworkPolicy
    that admits research's sidecars by name even with grpcFrom narrowed to none; the rendered sidecar
    then connects to the rendered aggregator with nothing added."""
    grpc, http = free_port(), free_port()
    release, namespace, job_ns = "gpu-perf", "monitoring", "research"
    docs = _helm_template(f"aggregator.grpcPort={grpc}", f"aggregator.httpPort={http}",
                          f"auth.token={TOKEN.decode()}", f"auth.jobNamespaces={{{job_ns}}}",
                          "exampleJob.enabled=true", f"exampleJob.namespace={job_ns}",
                          "networkPolicy.grpcFrom=null", release=release, namespace=namespace)
    _validate(docs)
    job = _one(docs, "Job")
    assert job["metadata"]["namespace"] == job_ns
    # Its aggregator address is this release's Service, on its gRPC port.
    svc = _one(docs, "Service")
    (port,) = [p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc"]
    address = f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc:{port}"
    (side,) = [c for c in job["spec"]["template"]["spec"]["initContainers"] if c["name"] == "perfd-agent"]
    assert side["args"][side["args"].index("--aggregator") + 1] == address == \
        f"{release}-aggregator.{namespace}.svc:{grpc}"
    assert not [a for a in side["args"] if "perfd-aggregator.perfd" in a]
    # Its token Secret exists in its namespace, with the key the sidecar reads, the aggregator's token.
    secrets = secrets_of(docs)
    (vol,) = [v for v in job["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    assert (job_ns, vol["secret"]["secretName"]) in secrets
    agg_secret = _token_mount(_one(docs, "Deployment"))
    assert secrets[(job_ns, vol["secret"]["secretName"])] == secrets[(namespace, str(agg_secret))]
    assert side["args"][side["args"].index("--auth-token-file") + 1] == "/etc/perfd-auth/token"
    # The policy admits the job's pod from research (by name: grpcFrom is empty), not from elsewhere.
    agg_doc = _one(docs, "Deployment")
    policy, target = _one(docs, "NetworkPolicy"), agg_doc["spec"]["template"]["metadata"]["labels"]
    ports = {p["name"]: p["containerPort"] for p in _container(agg_doc)["ports"]}
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert admits(policy, target, "grpc", source_labels=pod_labels, source_namespace=job_ns,
                  target_ports=ports)
    assert not admits(policy, target, "grpc", source_labels=pod_labels, source_namespace="default",
                      target_ports=ports)
    # Run as rendered: the aggregator, then the sidecar, the cluster's DNS name mapped to loopback.
    aggregator = kubelet(agg_doc, tmp_path, secrets, {}, configmaps_of(docs, namespace))
    sidecar = kubelet(job, tmp_path, secrets, {address: f"127.0.0.1:{grpc}"}, container="perfd-agent")
    _run_pair(aggregator, sidecar, tmp_path, running, "the chart's example job's sidecar connected")
    assert "UNAUTHENTICATED" not in (tmp_path / "sidecar.out").read_text()


@pytest.mark.parametrize(("sets", "why"), [
    (("exampleJob.enabled=true", "auth.jobNamespaces={ml}"), "needs auth.token"),
    (("exampleJob.enabled=true", "auth.token=0123456789abcdef0123456789abcdef"), "not in auth.jobNamespaces"),
    (("exampleJob.enabled=true", "exampleJob.namespace=perfd", "auth.enabled=false"), "the release's"),
])
def test_an_example_job_that_would_wait_is_refused_at_render(sets: tuple[str, ...], why: str) -> None:
    flags = [a for s in sets for a in ("--set", s)]
    r = subprocess.run([_helm(), "template", "perfd", str(CHART), "--namespace", "perfd", *flags],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode != 0 and why in r.stderr, r.stderr
