"""Kubernetes collector: GPU → (namespace, pod, container) from the kubelet pod-resources API.

See README.md in this folder for what it reads, the event it emits, config keys and failure
behaviour. The gRPC code in ``gen/`` is generated (``python -m perfd.collectors.k8s.regen_podresources``).
"""

from __future__ import annotations

from perfd.collectors.collector import Registry
from perfd.collectors.k8s.collector import EVENT_KIND, K8sCollector, K8sConfig
from perfd.collectors.k8s.podresources import DEFAULT_SOCKET, GpuOwner, PodResourcesClient, gpu_owners

__all__ = ["DEFAULT_SOCKET", "EVENT_KIND", "GpuOwner", "K8sCollector", "K8sConfig", "PodResourcesClient",
           "gpu_owners", "register"]


def register(registry: Registry) -> None:
    registry.register("k8s", lambda cfg: K8sCollector(cfg))
