"""deploy/helm/perfd with the real helm: `helm lint --strict`, `helm template` for the default and
the TLS values, every rendered object validated (Kubernetes schemas, strict; the Prometheus
operator's CRD schemas, strict), values.schema.json refusing bad values, and the pieces fitting
together (selectors, ports, flags the CLI knows, the rules file as is)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from perfd.cli import build_parser
from tests.deploy.test_k8s_manifests import CRDS, K8S_VERSIONS, _strict

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "perfd"
RULES = ROOT / "deploy" / "prometheus" / "perfd.rules.yml"


def _helm() -> str:
    h = shutil.which("helm")
    if h is None:
        if os.environ.get("PERFD_REQUIRE_SYSTEM_DEPS"):
            pytest.fail("helm missing: ci/install-system-deps.sh installs it")
        pytest.skip("helm not installed (ci/install-system-deps.sh)")
    return h


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_helm(), *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


def _render(*sets: str) -> list[dict[str, Any]]:
    flags = [a for s in sets for a in ("--set", s)]
    r = _run("template", "perfd", str(CHART), "--namespace", "perfd", *flags)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, (kind, len(found))
    return found[0]


def test_helm_lint_strict() -> None:
    r = _run("lint", "--strict", str(CHART))
    assert r.returncode == 0 and "0 chart(s) failed" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("sets", [(), ("tls.enabled=true", "aggregator.exportNodeSeries=true",
                                       "monitoring.labels.release=prom")], ids=["default", "tls"])
def test_rendered_objects_validate(sets: tuple[str, ...]) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    import jsonschema
    from kubernetes_validate.utils import latest_version

    docs = _render(*sets)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(["ServiceAccount", "ServiceAccount", "ConfigMap", "DaemonSet", "Deployment",
                            "Service", "ServiceMonitor", "PodMonitor", "PrometheusRule"])
    schemas = json.loads(CRDS.read_text())["schemas"]
    for d in docs:
        if d["apiVersion"].startswith("monitoring.coreos.com/"):
            schema = _strict(schemas[f"{d['apiVersion']}/{d['kind']}"])
            errors = list(jsonschema.Draft202012Validator(schema).iter_errors(d))
            assert not errors, f"{d['kind']}: {errors[0].message}"
            continue
        for version in (*K8S_VERSIONS, latest_version()):
            try:
                kv.validate(d, version, strict=True)
            except kv.ValidationError as exc:
                pytest.fail(f"{d['kind']}/{d['metadata']['name']} invalid for {version}: {exc.message}")


def test_values_schema_refuses_bad_values() -> None:
    for bad in ("agent.metricsPort=abc", "agent.bogus=1", "image.pullPolicy=Sometimes",
                "monitoring.interval=often", "agent.collectors.nvmll.source=real"):
        r = _run("template", "perfd", str(CHART), "--set", bad)
        assert r.returncode != 0 and "values don't meet the specifications" in r.stderr, (bad, r.stderr)


def test_the_pieces_fit_together() -> None:
    docs = _render("tls.enabled=true", "aggregator.exportNodeSeries=true")
    ds, dep, svc = _one(docs, "DaemonSet"), _one(docs, "Deployment"), _one(docs, "Service")
    sel = dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["selector"] == sel
    assert sel.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    dsel = ds["spec"]["selector"]["matchLabels"]
    assert dsel.items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    pm, sm = _one(docs, "PodMonitor"), _one(docs, "ServiceMonitor")
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
    # The rules are deploy/prometheus/perfd.rules.yml, unchanged.
    rule = _one(docs, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
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
