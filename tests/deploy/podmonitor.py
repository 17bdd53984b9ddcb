"""A Prometheus-operator PodMonitor as the scrape configuration the operator generates from it, for a
real Prometheus without a cluster: the pods it would discover are static targets carrying the
``__meta_kubernetes_*`` labels Kubernetes service discovery gives a pod's container port (static
targets may carry them, and relabelling reads them as it would from discovery).

What is generated, in the operator's order: the pod selection (its selector's labels and label
expressions, the endpoint's port name, the namespace unless ``namespaceSelector.any``), the
operator's default ``job`` (``<namespace>/<PodMonitor name>``), then the PodMonitor's own
relabelings. Left out: the operator's ``namespace``, ``pod``, ``container`` and ``endpoint`` target
labels (a plain ``kubernetes_sd_configs`` job has none of them, and no shipped rule may lean on them)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_RELABEL_KEYS = {"sourceLabels": "source_labels", "targetLabel": "target_label", "separator": "separator",
                 "regex": "regex", "replacement": "replacement", "modulus": "modulus"}


def label_name(key: str) -> str:
    """A Kubernetes label key as service discovery names it in a meta label (app.kubernetes.io/name
    -> app_kubernetes_io_name)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


@dataclass(frozen=True)
class PodPort:
    """One container port of one pod, where a discovered target would be."""

    namespace: str
    pod: str
    node: str
    labels: dict[str, str]
    port_name: str
    address: str  # host:port the test's process listens on

    def target(self) -> dict[str, Any]:
        meta = {"__meta_kubernetes_namespace": self.namespace, "__meta_kubernetes_pod_name": self.pod,
                "__meta_kubernetes_pod_node_name": self.node,
                "__meta_kubernetes_pod_container_port_name": self.port_name}
        for k, v in self.labels.items():
            meta[f"__meta_kubernetes_pod_label_{label_name(k)}"] = v
            meta[f"__meta_kubernetes_pod_labelpresent_{label_name(k)}"] = "true"
        return {"targets": [self.address], "labels": meta}


def _selection(monitor: dict[str, Any], endpoint: dict[str, Any]) -> list[dict[str, Any]]:
    spec = monitor["spec"]
    keep: list[dict[str, Any]] = []
    for k, v in (spec["selector"].get("matchLabels") or {}).items():
        keep.append({"source_labels": [f"__meta_kubernetes_pod_label_{label_name(k)}",
                                       f"__meta_kubernetes_pod_labelpresent_{label_name(k)}"],
                     "regex": f"({re.escape(v)});true", "action": "keep"})
    for expr in spec["selector"].get("matchExpressions") or []:
        if expr["operator"] != "Exists":
            raise ValueError(f"selector operator {expr['operator']!r} not translated")
        keep.append({"source_labels": [f"__meta_kubernetes_pod_labelpresent_{label_name(expr['key'])}"],
                     "regex": "true", "action": "keep"})
    keep.append({"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": endpoint["port"],
                 "action": "keep"})
    if not (spec.get("namespaceSelector") or {}).get("any"):
        names = (spec.get("namespaceSelector") or {}).get("matchNames") or [monitor["metadata"]["namespace"]]
        keep.append({"source_labels": ["__meta_kubernetes_namespace"], "regex": "|".join(names),
                     "action": "keep"})
    return keep


def _relabel(r: dict[str, Any]) -> dict[str, Any]:
    unknown = set(r) - set(_RELABEL_KEYS) - {"action"}
    if unknown:
        raise ValueError(f"relabeling keys {sorted(unknown)} not translated")
    out = {_RELABEL_KEYS[k]: v for k, v in r.items() if k in _RELABEL_KEYS}
    if "action" in r:
        out["action"] = str(r["action"]).lower()
    return out


def scrape_configs(monitor: dict[str, Any], pods: list[PodPort], interval: str = "1s"
                   ) -> list[dict[str, Any]]:
    """The operator's scrape jobs of ``monitor`` (one per endpoint), every pod offered to each: the
    selection keeps those the monitor would discover."""
    meta = monitor["metadata"]
    out = []
    for i, ep in enumerate(monitor["spec"]["podMetricsEndpoints"]):
        relabel = _selection(monitor, ep)
        relabel.append({"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"})
        relabel.extend(_relabel(r) for r in ep.get("relabelings") or [])
        out.append({"job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/{i}",
                    "scrape_interval": interval, "metrics_path": ep.get("path", "/metrics"),
                    "static_configs": [p.target() for p in pods], "relabel_configs": relabel})
    return out
