"""deploy/k8s: every manifest validates against the Kubernetes JSON schemas (kubernetes-validate ships
them, strict: unknown fields are errors), the Prometheus operator's kinds against their CRD schemas
(tests/deploy/data, strict too), and the pieces fit together: selectors, ports, flags, config."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from perfd.agent.config import apply_overrides, load_config
from perfd.app.cli import build_parser
from perfd.core.placement import gpu_job

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
CRDS = Path(__file__).resolve().parent / "data" / "prometheus_operator_crds.json"
# Native sidecars (initContainers with restartPolicy: Always) are in the 1.29 schema; 1.29 is the
# oldest version the example job supports. The newest version kubernetes-validate ships is checked too.
K8S_VERSIONS = ("1.29",)


def _docs() -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for f in sorted(K8S.glob("*.yaml")):
        if f.name == "kustomization.yaml":
            continue
        out.extend((f.name, d) for d in yaml.safe_load_all(f.read_text()) if d)
    return out


DOCS = _docs()


def _find(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for _, d in DOCS if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _strict(schema: Any) -> Any:
    """A CRD's structural schema with unknown fields forbidden (the API server would prune them
    silently; a typo must fail here instead)."""
    if isinstance(schema, dict):
        s = {k: _strict(v) for k, v in schema.items()}
        if "properties" in s and "additionalProperties" not in s \
                and not s.get("x-kubernetes-preserve-unknown-fields"):
            s["additionalProperties"] = False
        return s
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@pytest.mark.slow
def test_every_builtin_kind_validates_against_the_kubernetes_schemas():
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the dev extra")
    from tests.deploy.k8s_schemas import latest_version, validate

    assert DOCS
    checked = 0
    for fname, doc in DOCS:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue
        for version in (*K8S_VERSIONS, latest_version()):
            try:
                validate(doc, version, strict=True)
            except kv.ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                pytest.fail(f"{fname}: {doc['kind']}/{doc['metadata']['name']} invalid for Kubernetes "
                            f"{version} at {path}: {exc.message}")
        checked += 1
    assert checked >= 10


@pytest.mark.slow
def test_prometheus_operator_kinds_validate_against_their_crds():
    import jsonschema

    schemas = json.loads(CRDS.read_text())["schemas"]
    kinds = []
    for fname, doc in DOCS:
        if not doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue
        schema = _strict(schemas[f"{doc['apiVersion']}/{doc['kind']}"])
        errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc), key=str)
        assert not errors, f"{fname}: {doc['kind']}: " + "; ".join(
            f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors[:5])
        kinds.append(doc["kind"])
    assert sorted(kinds) == ["PodMonitor", "PodMonitor", "PrometheusRule", "ServiceMonitor"]


@pytest.mark.slow
def test_strict_crd_schema_catches_a_typo():
    import jsonschema

    sm = copy.deepcopy(_find("ServiceMonitor"))
    sm["spec"]["endpoints"][0]["intervall"] = "15s"
    schema = _strict(json.loads(CRDS.read_text())["schemas"]["monitoring.coreos.com/v1/ServiceMonitor"])
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(sm))


def test_kustomization_lists_every_manifest_but_the_example():
    k = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {f.name for f in K8S.glob("*.yaml")} - {"kustomization.yaml", "example-training-job.yaml"}
    assert set(k["resources"]) == files


def test_prometheusrule_is_generated_from_the_rules_file(capsys: pytest.CaptureFixture[str]) -> None:
    # The script's own check, run in this process (its main, as `render_prometheusrule.py --check`)
    spec = importlib.util.spec_from_file_location("render_prometheusrule", K8S / "render_prometheusrule.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--check"]) == 0, capsys.readouterr().err
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "perfd.rules.yml").read_text())
    assert _find("PrometheusRule")["spec"]["groups"] == rules["groups"]


def _expand(args: list[str], env: dict[str, str]) -> list[str]:
    return [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), "x"), a) for a in args]


def _parses(args: list[str]) -> Any:
    """The container's args are a valid perfd command line (flags exist, values parse)."""
    return build_parser().parse_args(_expand(args, {"NODE_NAME": "node-1", "PERFD_JOB": "job-1"}))


def test_agent_daemonset_monitors_without_taking_gpus(tmp_path: Path):
    ds = _find("DaemonSet", "perfd-agent")
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["hostPID"] is True and pod["runtimeClassName"] == "nvidia"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["PERFD_NSYS"].startswith("/opt/nvidia/nsight-systems/")
    limits = c["resources"]["limits"]
    assert "nvidia.com/gpu" not in limits and "nvidia.com/gpu" not in c["resources"]["requests"]
    assert set(limits) == {"cpu", "memory"}
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/var/lib/kubelet/pod-resources"]["readOnly"] is True
    assert mounts["/opt/nvidia/nsight-systems"]["readOnly"] is True
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols[mounts["/var/lib/kubelet/pod-resources"]["name"]]["hostPath"]["path"] == \
        "/var/lib/kubelet/pod-resources"
    assert "/var/lib/perfd/spool" in mounts and "/tmp" in mounts
    ns = _parses(c["args"])
    assert ns.command == "agent" and ns.node == "node-1"

    # The config file it reads: valid for the agent, and every collector exists and accepts its keys.
    cm = _find("ConfigMap", "perfd-agent")
    assert mounts[ns.config.rsplit("/", 1)[0]]["name"] == "config"
    cfg_file = tmp_path / "agent.yaml"
    cfg_file.write_text(cm["data"]["agent.yaml"])
    cfg = load_config(cfg_file).finish()
    assert cfg.spool_dir == "/var/lib/perfd/spool" and set(cfg.collectors) == {"nvml", "host", "k8s"}
    from perfd.agent.node_agent import default_registry

    reg = default_registry()
    for name, ccfg in cfg.collectors.items():
        reg.create(name, {"job": cfg.job, **ccfg})
    assert cfg.metrics_port == c["ports"][0]["containerPort"]
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_aggregator_deployment_service_and_monitors_fit_together():
    dep = _find("Deployment", "perfd-aggregator")
    svc = _find("Service", "perfd-aggregator")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    ns = _parses(c["args"])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert (ns.grpc_port, ns.http_port) == (ports["grpc"], ports["metrics"])
    assert {p["name"] for p in svc["spec"]["ports"]} == {"grpc", "metrics"}

    sm = _find("ServiceMonitor")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert {e["port"] for e in sm["spec"]["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}
    pm = _find("PodMonitor", "perfd-agent")
    ds = _find("DaemonSet", "perfd-agent")
    agent_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= agent_labels.items()
    ds_ports = {p["name"] for p in ds["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert {e["port"] for e in pm["spec"]["podMetricsEndpoints"]} <= ds_ports
    assert "--listen-all" in ds["spec"]["template"]["spec"]["containers"][0]["args"]
    # The job sidecars' PodMonitor finds the example job's pod, its port, and an agent that listens
    # on the pod's address (the sidecar topology: its captures are on its own /metrics).
    side = _find("PodMonitor", "perfd-job-sidecars")
    job = _find("Job", "gpt-8b-pretrain")
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    (expr,) = side["spec"]["selector"]["matchExpressions"]
    assert expr == {"key": "perfd.dev/job", "operator": "Exists"} and expr["key"] in pod_labels
    assert side["spec"]["namespaceSelector"] == {"any": True}
    (sidecar,) = [c for c in job["spec"]["template"]["spec"]["initContainers"] if c["name"] == "perfd-agent"]
    assert {e["port"] for e in side["spec"]["podMetricsEndpoints"]} <= {p["name"] for p in sidecar["ports"]}
    assert "--listen-all" in sidecar["args"]
    for monitor in (pm, side):  # one scrape job name for every agent, as the rules and dashboards select
        (ep,) = monitor["spec"]["podMetricsEndpoints"]
        assert {"targetLabel": "job", "replacement": "perfd-agent"} in ep["relabelings"]

    # The agents reach the aggregator through the Service.
    cm = yaml.safe_load(_find("ConfigMap", "perfd-agent")["data"]["agent.yaml"])
    host, port = cm["aggregator"].rsplit(":", 1)
    assert host.split(".")[:2] == [svc["metadata"]["name"], svc["metadata"]["namespace"]]
    assert int(port) == next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc")


def test_rbac_is_minimal_and_bound():
    role = _find("ClusterRole", "perfd-agent")
    (rule,) = role["rules"]
    assert set(rule["resources"]) == {"pods", "nodes"} and set(rule["verbs"]) == {"get", "list"}
    binding = _find("ClusterRoleBinding", "perfd-agent")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    ds = _find("DaemonSet", "perfd-agent")
    (subject,) = binding["subjects"]
    assert subject["name"] == ds["spec"]["template"]["spec"]["serviceAccountName"]
    assert subject["namespace"] == ds["metadata"]["namespace"]
    accounts = {d["metadata"]["name"] for _, d in DOCS if d["kind"] == "ServiceAccount"}
    assert {"perfd-agent", "perfd-aggregator"} <= accounts


def test_example_job_has_the_agent_as_a_sidecar_sharing_the_log():
    job = _find("Job")
    pod = job["spec"]["template"]["spec"]
    (agent,) = [c for c in pod["initContainers"] if c["name"] == "perfd-agent"]
    (trainer,) = pod["containers"]
    assert agent["restartPolicy"] == "Always"  # native sidecar: the Job ends with the trainer
    assert "nvidia.com/gpu" in trainer["resources"]["limits"]
    assert "nvidia.com/gpu" not in agent["resources"].get("limits", {})
    ns = _parses(agent["args"])
    log_dir = ns.megatron_log.rsplit("/", 1)[0]
    a_mounts = {m["mountPath"]: m["name"] for m in agent["volumeMounts"]}
    t_mounts = {m["mountPath"]: m["name"] for m in trainer["volumeMounts"]}
    assert a_mounts[log_dir] == t_mounts[log_dir]
    vol = next(v for v in pod["volumes"] if v["name"] == a_mounts[log_dir])
    assert "emptyDir" in vol
    assert ns.megatron_log in " ".join(trainer["args"])  # the trainer writes where the agent reads
    assert ns.job == "job-1" and ns.aggregator.startswith("perfd-aggregator.perfd.svc:")
    # Captures: the sidecar's folder is an emptyDir's mount point that the trainer mounts at the same
    # path (its ranks write their Kineto traces there), given to the pod's uid before the sidecar
    # starts (perfd uses only a folder its uid owns; an emptyDir is root's, 0777).
    assert ns.capture_dir and a_mounts[ns.capture_dir] == t_mounts[ns.capture_dir]
    vol = next(v for v in pod["volumes"] if v["name"] == a_mounts[ns.capture_dir])
    assert "emptyDir" in vol
    names = [c["name"] for c in pod["initContainers"]]
    owner = pod["initContainers"][0]
    assert names.index(owner["name"]) < names.index("perfd-agent") and "restartPolicy" not in owner
    uid = pod["securityContext"]["runAsUser"]
    assert f"chown {uid}:{uid} {ns.capture_dir}" in " ".join(owner["command"])
    assert f"chmod 0700 {ns.capture_dir}" in " ".join(owner["command"])
    assert owner["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]}
    assert {m["mountPath"] for m in owner["volumeMounts"]} == {ns.capture_dir}
    assert trainer["env"] == [{"name": "KINETO_USE_DAEMON", "value": "1"}]  # no PERFD_JOB


def test_the_daemonset_agent_and_the_sidecar_pair_up_on_one_node(tmp_path: Path) -> None:
    """Both given --node $(NODE_NAME): distinct agent ids, the DaemonSet's in no job; the trainer's
    GPUs placed in the job through the pod it shares with the sidecar (one pid namespace, where the
    sidecar's PERFD_JOB comes from the same pod label its --job reads): the trainer declares nothing
    (tests/deploy/test_pod_placement.py runs it), and the sidecar follows the pod's ranks."""
    ds = _find("DaemonSet", "perfd-agent")
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    node_ns = _parses(c["args"])
    cfg_file = tmp_path / "agent.yaml"
    cfg_file.write_text(_find("ConfigMap", "perfd-agent")["data"]["agent.yaml"])
    node_cfg = apply_overrides(load_config(cfg_file), node=node_ns.node, job=node_ns.job)
    pod = _find("Job")["spec"]["template"]["spec"]
    (sidecar,) = [c for c in pod["initContainers"] if c["name"] == "perfd-agent"]
    (trainer,) = pod["containers"]
    side_ns = _parses(sidecar["args"])
    side_cfg = apply_overrides(load_config(None), node=side_ns.node, job=side_ns.job, nvml=side_ns.nvml,
                               host=side_ns.host == "on", megatron_log=side_ns.megatron_log,
                               ranks=side_ns.ranks)
    assert node_cfg.node == side_cfg.node == "node-1"
    assert node_cfg.agent_id != side_cfg.agent_id
    assert (node_cfg.job, side_cfg.job) == ("", "job-1")
    assert "nvml" not in side_cfg.collectors and "host" not in side_cfg.collectors  # served once
    assert "PERFD_JOB" not in {e["name"] for e in trainer.get("env", [])}
    assert pod["shareProcessNamespace"] is True
    label = "metadata.labels['perfd.dev/job']"
    side_env = {e["name"]: e for e in sidecar["env"]}
    assert side_env["PERFD_JOB"]["valueFrom"]["fieldRef"]["fieldPath"] == label
    assert side_cfg.collectors["ranks"] == {"pod": True}
    assert gpu_job([{"pid": 1, "job": "job-1"}], node_cfg.job or None) == side_cfg.job


@pytest.mark.slow
def test_strict_kubernetes_schema_catches_a_typo():
    """tests/deploy/k8s_schemas.validate (the schemas read once) refuses what kubernetes-validate's own
    validate refuses, and passes what it passes."""
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the dev extra")
    from tests.deploy.k8s_schemas import validate

    assert validate(_find("DaemonSet", "perfd-agent"), K8S_VERSIONS[0]) == kv.validate(
        _find("DaemonSet", "perfd-agent"), K8S_VERSIONS[0], strict=True)
    ds = copy.deepcopy(_find("DaemonSet", "perfd-agent"))
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesytem"] = True
    with pytest.raises(kv.ValidationError):
        kv.validate(ds, K8S_VERSIONS[0], strict=True)
    with pytest.raises(kv.ValidationError):
        validate(ds, K8S_VERSIONS[0], strict=True)
    ds = copy.deepcopy(_find("DaemonSet", "perfd-agent"))
    ds["spec"]["template"]["spec"]["hostPID"] = "yes"
    with pytest.raises(kv.ValidationError):
        kv.validate(ds, K8S_VERSIONS[0], strict=True)
    with pytest.raises(kv.ValidationError):
        validate(ds, K8S_VERSIONS[0], strict=True)
