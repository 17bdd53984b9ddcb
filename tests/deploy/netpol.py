"""Whether a NetworkPolicy admits a pod's traffic to a port: the Kubernetes semantics of
networking.k8s.io/v1 ingress rules (no network plugin runs here to enforce one), for the checks of
the rendered policies. A rule's `ports` absent: every port; its `from` absent: every source. A peer
with a podSelector alone selects pods of the policy's namespace; with a namespaceSelector alone, every
pod of the namespaces it selects; with both, the pods it selects in those namespaces. A namespace
carries kubernetes.io/metadata.name=<its name>, as the API server labels every namespace."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector: every matchLabels pair and every matchExpressions requirement holds; the
    empty selector selects everything."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for req in selector.get("matchExpressions") or []:
        key, op, values = req["key"], req["operator"], req.get("values") or []
        ok = {"In": key in labels and labels[key] in values,
              "NotIn": key not in labels or labels[key] not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


def _port_matches(rule_port: Mapping[str, Any], port: str | int, named: Mapping[str, int]) -> bool:
    want = rule_port.get("port")
    if want is None:
        return True
    if isinstance(want, str):  # a named port: the target pod's port of that name
        return bool(port == want or named.get(want) == port)
    return bool(port == want or named.get(str(port)) == want)


def admits(policy: Mapping[str, Any], target_labels: Mapping[str, str], port: str | int, *,
           source_labels: Mapping[str, str], source_namespace: str,
           source_namespace_labels: Mapping[str, str] | None = None,
           target_ports: Mapping[str, int] | None = None) -> bool:
    """Whether ``policy`` lets a pod (``source_labels`` in ``source_namespace``) reach ``port`` (a
    name or number) of a pod labelled ``target_labels`` in the policy's namespace. A pod the policy
    does not select is not restricted by it (True)."""
    spec = policy["spec"]
    if not selects(spec.get("podSelector"), target_labels):
        return True
    if "Ingress" not in spec.get("policyTypes", ["Ingress"]):
        return True
    ns_labels = {"kubernetes.io/metadata.name": source_namespace, **(source_namespace_labels or {})}
    own_ns = policy["metadata"].get("namespace", "default")
    for rule in spec.get("ingress") or []:
        if "ports" in rule and not any(_port_matches(p, port, target_ports or {}) for p in rule["ports"]):
            continue
        if "from" not in rule:
            return True
        for peer in rule["from"]:
            if "ipBlock" in peer:
                continue
            if "namespaceSelector" in peer:
                ns_ok = selects(peer["namespaceSelector"], ns_labels)
            else:
                ns_ok = source_namespace == own_ns
            if ns_ok and selects(peer.get("podSelector"), source_labels):
                return True
    return False
