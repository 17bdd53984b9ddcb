"""A small client of the kubelet pod-resources API (v1), and GPU → pod mapping.

The kubelet serves ``v1.PodResourcesLister`` on ``unix:///var/lib/kubelet/pod-resources/kubelet.sock``
(GA since Kubernetes 1.20). ``List`` names, for every pod on the node, each container's devices by
resource: the NVIDIA device plugin allocates ``nvidia.com/gpu`` (and ``nvidia.com/mig-*``) with the
GPU (or MIG) UUIDs as device ids — the same UUIDs NVML reports — so the UUID is the join key, as in
NVIDIA's dcgm-exporter. A device plugin configured to use indices (``DEVICE_ID_STRATEGY=index``)
reports ``"0"``, ``"1"``...: those join on the GPU index instead. Devices allocated through dynamic
resource allocation (DRA) are listed too, by their device and CDI names.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from perfd.core import events

if TYPE_CHECKING:
    from perfd.collectors.k8s.gen import podresources_v1_pb2 as pb

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_RESOURCES = ("nvidia.com/",)  # resource-name prefixes; DRA drivers matched on "nvidia.com"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # the kubelet's own limit on this API


@dataclass(frozen=True)
class GpuOwner:
    """One device allocated to one container."""

    device: str  # the device id as the kubelet gives it: a GPU-/MIG- UUID, or an index
    namespace: str
    pod: str
    container: str
    resource: str  # e.g. nvidia.com/gpu, or the DRA driver name

    @property
    def uuid(self) -> str | None:
        return self.device if self.device.startswith(("GPU-", "MIG-")) else None

    def to_json(self) -> events.GpuOwner:
        d: events.GpuOwner = {"device": self.device, "namespace": self.namespace, "pod": self.pod,
                              "container": self.container, "resource": self.resource}
        if self.uuid:
            d["uuid"] = self.uuid
        elif self.device.isdigit():
            d["gpu"] = self.device
        return d


def _wanted(name: str, prefixes: Sequence[str]) -> bool:
    return any(name.startswith(p) or p.rstrip("/") in name for p in prefixes)


def gpu_owners(response: pb.ListPodResourcesResponse,
               resources: Sequence[str] = DEFAULT_RESOURCES) -> list[GpuOwner]:
    """Every (device, container) pair of a ``ListPodResourcesResponse`` whose resource matches."""
    out: list[GpuOwner] = []
    for pod in response.pod_resources:
        for c in pod.containers:
            for dev in c.devices:
                if _wanted(dev.resource_name, resources):
                    out.extend(GpuOwner(d, pod.namespace, pod.name, c.name, dev.resource_name)
                               for d in dev.device_ids)
            for dyn in c.dynamic_resources:
                for claim in dyn.claim_resources:
                    if not _wanted(claim.driver_name, resources):
                        continue
                    names = [claim.device_name] + [cdi.name.rpartition("=")[2] for cdi in claim.cdi_devices]
                    for d in dict.fromkeys(n for n in names if n):
                        out.append(GpuOwner(d, pod.namespace, pod.name, c.name, claim.driver_name))
    out.sort(key=lambda o: (o.device, o.namespace, o.pod, o.container))
    return out


def owners_json(owners: Iterable[GpuOwner]) -> list[events.GpuOwner]:
    return [o.to_json() for o in owners]


class _Lister(Protocol):
    """The generated PodResourcesListerStub (its module has no types)."""

    def List(self, request: pb.ListPodResourcesRequest, *, timeout: float) -> pb.ListPodResourcesResponse: ...


class _Channel(Protocol):
    def close(self) -> None: ...


class PodResourcesClient:
    """``List`` over the kubelet's unix socket, one channel kept open (reopened after a failure)."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout_s: float = 2.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._channel: _Channel | None = None
        self._stub: _Lister | None = None

    def _connect(self) -> _Lister:
        if self._stub is None:
            import grpc

            from perfd.collectors.k8s.gen import podresources_v1_pb2_grpc as pb_grpc

            self._channel = grpc.insecure_channel(
                f"unix://{self.socket_path}",
                options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
            self._stub = pb_grpc.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]
        return self._stub

    def list(self) -> pb.ListPodResourcesResponse:
        """The kubelet's ListPodResourcesResponse. Raises grpc.RpcError (after ``timeout_s``)."""
        from perfd.collectors.k8s.gen import podresources_v1_pb2 as pb

        stub = self._connect()
        try:
            return stub.List(pb.ListPodResourcesRequest(), timeout=self.timeout_s)
        except Exception:
            self.close()  # a kubelet restart replaces the socket: reconnect next time
            raise

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None
