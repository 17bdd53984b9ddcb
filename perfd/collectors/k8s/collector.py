"""The ``k8s`` collector: which pod and container each GPU of this node is allocated to.

Every ``interval_s`` it asks the kubelet's pod-resources API (``List``) and, when the allocation
changed (or every ``event_interval_s`` anyway, so a restarted aggregator learns it), emits one
``gpu_pods`` event: ``payload`` is the list of ``{device, uuid | gpu, namespace, pod, container,
resource}``, ``labels`` the node (added by the agent). The aggregator joins ``uuid`` with the
``uuid`` label of the NVML series of the same node. No samples: pod names are not metric labels.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass

from perfd.collectors.collector import Capabilities, Collected, Collector
from perfd.collectors.k8s.podresources import (
    DEFAULT_RESOURCES,
    DEFAULT_SOCKET,
    PodResourcesClient,
    gpu_owners,
    owners_json,
)
from perfd.core.events import GPU_PODS, GpuOwner

EVENT_KIND = GPU_PODS.name


@dataclass
class K8sConfig:
    socket: str = DEFAULT_SOCKET
    interval_s: float = 10.0
    timeout_s: float = 2.0
    event_interval_s: float = 60.0
    resources: tuple[str, ...] = DEFAULT_RESOURCES

    @classmethod
    def from_dict(cls, cfg: Mapping[str, object]) -> K8sConfig:
        known = {"socket", "interval_s", "timeout_s", "event_interval_s", "resources", "job"}
        unknown = set(cfg) - known
        if unknown:
            raise ValueError(f"k8s: unknown config key(s) {sorted(unknown)}; known: {sorted(known)}")
        res = cfg.get("resources", list(DEFAULT_RESOURCES))
        if not isinstance(res, list) or not res or not all(isinstance(r, str) and r for r in res):
            raise ValueError(f"k8s: resources must be a non-empty list of resource-name prefixes, "
                             f"not {res!r}")
        out = cls(socket=str(cfg.get("socket", DEFAULT_SOCKET)), resources=tuple(res))
        for key in ("interval_s", "timeout_s", "event_interval_s"):
            value = cfg.get(key, getattr(out, key))
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"k8s: {key} must be a number > 0, not {value!r}")
            setattr(out, key, float(value))
        return out


class K8sCollector(Collector):
    name = "k8s"

    def __init__(self, config: Mapping[str, object] | None = None) -> None:
        super().__init__()
        self.config = K8sConfig.from_dict(dict(config or {}))
        self.default_interval_s = self.config.interval_s
        self.client = PodResourcesClient(self.config.socket, self.config.timeout_s)
        self._caps: Capabilities | None = None
        self._last_payload: list[GpuOwner] | None = None
        self._last_event = 0.0

    def probe(self) -> Capabilities:
        if self._caps is None:
            try:
                mode = os.stat(self.config.socket).st_mode
            except OSError as exc:
                self._caps = Capabilities(False, f"no kubelet pod-resources socket at {self.config.socket}: "
                                                 f"{exc.strerror} (mount /var/lib/kubelet/pod-resources)")
                return self._caps
            if not stat.S_ISSOCK(mode):
                self._caps = Capabilities(False, f"{self.config.socket} is not a unix socket")
            else:
                self._caps = Capabilities(True)
        return self._caps

    def collect(self, now: float) -> Collected:
        out = Collected()
        if not self.probe().available:
            return out
        try:
            response = self.client.list()
        except Exception as exc:  # grpc.RpcError: kubelet restarting, permission, timeout
            code = getattr(exc, "code", None)
            self.count_error("list-failed", str(code() if callable(code) else exc))
            return out
        payload = owners_json(gpu_owners(response, self.config.resources))
        if payload != self._last_payload or now - self._last_event >= self.config.event_interval_s:
            self._last_payload, self._last_event = payload, now
            pods = sorted({f"{p['namespace']}/{p['pod']}" for p in payload})
            out.events.append({"kind": EVENT_KIND, "severity": "info", "time": now, "labels": {},
                               "text": f"{len(payload)} GPU(s) allocated to {len(pods)} pod(s)",
                               "payload": payload})
        return out

    def stop(self) -> None:
        self.client.close()
