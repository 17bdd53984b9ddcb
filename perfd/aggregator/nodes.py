"""The node/GPU view: the latest value of every node series, each GPU's process list and pod.

Fed by the agents' samples and by two state events (perfd.events GPU_PROCESSES, GPU_PODS); read to
place ranks on GPUs, to explain a slow rank by its GPU's state, and for /metrics. One lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from perfd.analytics.bottleneck import GpmReading
from perfd.catalog import GPU_THROTTLE_ACTIVE
from perfd.events import GPU_PODS, GPU_PROCESSES, payload_of

LabelKey = tuple[tuple[str, str], ...]
GpuKey = tuple[str, str]  # (node, gpu index)
# catalog name -> GpmReading field
_GPM_FIELDS = {"perfd_gpu_sm_util_ratio": "sm_util", "perfd_gpu_sm_occupancy_ratio": "sm_occupancy",
               "perfd_gpu_tensor_util_ratio": "tensor_util", "perfd_gpu_dram_bw_util_ratio": "dram_bw_util",
               "perfd_gpu_utilization_ratio": "nvml_util"}
# Any GPU series names the GPU model; this one is sampled on every GPU and rarely changes.
MODEL_SERIES = "perfd_gpu_memory_total_bytes"
# Series an agent serves on its own /metrics (GPU and host): the aggregator keeps their latest values
# for its joins, and leaves them off its /metrics unless asked (docs/prometheus.md).
NODE_SERIES_PREFIXES = ("perfd_gpu_", "perfd_host_")

SeriesKey = tuple[str, LabelKey]  # (name, labels) within one agent


@dataclass
class NodeSeries:
    """Latest value of one time series from one agent."""

    name: str
    labels: LabelKey
    time_ns: int
    value: float


class NodeView:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        # agent -> (name, labels) -> latest value. Per agent, so a job's reads touch only its
        # agents' series; node series (GPU, host) apart from the rest, so /metrics — which leaves
        # them to the agents — never walks them (400k at 2,000 agents).
        self.node: dict[str, dict[SeriesKey, NodeSeries]] = {}
        self.other: dict[str, dict[SeriesKey, NodeSeries]] = {}
        # agent -> the GPM/utilisation series among its node series (the same objects): what every
        # analysis reads, without walking the agent's other GPU series.
        self.gpm_series: dict[str, dict[SeriesKey, NodeSeries]] = {}
        # agent -> GPU series name -> [(node, gpu), throttle reason or "", its NodeSeries]: what
        # gpu_view reads, classified once per series rather than on every read (the rules read the
        # GPU scope of every job every tick: at 2,000 agents that walk was 13% of the aggregator).
        self.gpu_index: dict[str, dict[str, list[tuple[GpuKey, str, NodeSeries]]]] = {}
        self.agent_seen: dict[str, float] = {}
        self.samples = 0
        # agent -> series id -> its NodeSeries: the hot path's map. An id a stream defines (again:
        # a restarted agent numbers its series anew) leaves it through defined(), so its next
        # sample resolves from the new definition.
        self._resolved: dict[str, dict[int, NodeSeries]] = {}
        self.model: dict[str, str] = {}  # agent -> the GPU model its series name
        # (node, gpu) -> (agent, latest process list from the NVML collector)
        self.gpu_procs: dict[GpuKey, tuple[str, list[dict[str, Any]]]] = {}
        # node -> latest GPU -> pod allocation from the k8s collector (kubelet pod-resources)
        self.gpu_pods: dict[str, list[dict[str, Any]]] = {}

    def seen(self, agent_id: str) -> None:
        with self._lock:
            self.agent_seen[agent_id] = time.time()

    def defined(self, agent_id: str, series_ids: Sequence[int]) -> None:
        """The agent's stream (re)defined these ids: forget what they resolved to."""
        with self._lock:
            objs = self._resolved.get(agent_id)
            if objs:
                for sid in series_ids:
                    objs.pop(sid, None)

    def ingest_samples(self, agent_id: str, series_defs: Mapping[int, tuple[str, LabelKey]],
                       series_ids: Sequence[int], timestamps_ns: Sequence[int],
                       values: Sequence[float], on_model: Callable[[str], None]) -> None:
        """Keep the latest value per series. Columnar in, no object per sample: each id resolves to
        its NodeSeries through a per-agent map, so a sample costs one lookup and a compare (the
        name tests, the key and the table choice are made once per series; under cProfile at 500
        agents 0.85 → 0.44 ms for a batch of 200; 39 → ~27 µs per 200 once the definition was no
        longer looked up and compared per sample). Ids defined again must go through defined()
        first.
        ``on_model`` hears the GPU model an agent's series name (the job store keeps it for the
        peak table)."""
        with self._lock:
            self.samples += len(values)
            self.agent_seen[agent_id] = time.time()
            objs = self._resolved.setdefault(agent_id, {})
            for sid, ts, val in zip(series_ids, timestamps_ns, values, strict=True):
                cur = objs.get(sid)
                if cur is None:
                    d = series_defs[sid]
                    cur = objs[sid] = self._series(agent_id, d[0], d[1], ts, val)
                if ts >= cur.time_ns:
                    cur.time_ns, cur.value = ts, val
            model = self.model.get(agent_id)
        if model:
            on_model(model)

    def _series(self, agent_id: str, name: str, labels: LabelKey, ts: int, val: float) -> NodeSeries:
        """The agent's NodeSeries of (name, labels), made on first sight (lock held)."""
        table = (self.node if name.startswith(NODE_SERIES_PREFIXES) else self.other).setdefault(agent_id, {})
        key = (name, labels)
        cur = table.get(key)
        if cur is None:
            table[key] = cur = NodeSeries(name, labels, ts, val)
            if name in _GPM_FIELDS:
                self.gpm_series.setdefault(agent_id, {})[key] = cur
            lab = dict(labels)
            if name.startswith("perfd_gpu_"):
                reason = lab.get("reason")
                # a reason-labelled series counts only as a throttle flag; a typed one (e.g. ECC
                # by type) is not a per-GPU value
                flag = reason is not None and name == GPU_THROTTLE_ACTIVE
                if flag or (reason is None and "type" not in lab):
                    self.gpu_index.setdefault(agent_id, {}).setdefault(name, []).append(
                        ((lab.get("node", agent_id), lab.get("gpu", "?")), reason or "", cur))
            if name == MODEL_SERIES and lab.get("model"):
                self.model[agent_id] = lab["model"]
        return cur

    # ---- state events ------------------------------------------------------------------------
    def on_gpu_processes(self, agent_id: str, ev: Mapping[str, Any]) -> bool:
        """The latest process list of a GPU replaces the previous one; False if malformed."""
        payload = payload_of(ev, GPU_PROCESSES)
        if payload is None:
            return False
        labels = ev.get("labels") or {}
        with self._lock:
            self.gpu_procs[(labels.get("node", agent_id), labels.get("gpu", "?"))] = (agent_id, payload)
        return True

    def on_gpu_pods(self, agent_id: str, ev: Mapping[str, Any]) -> bool:
        payload = payload_of(ev, GPU_PODS)
        if payload is None:
            return False
        with self._lock:
            self.gpu_pods[(ev.get("labels") or {}).get("node", agent_id)] = payload
        return True

    # ---- read side ---------------------------------------------------------------------------
    def gpu_view(self, agents: set[str], names: Collection[str] | None = None
                 ) -> tuple[dict[GpuKey, list[dict[str, Any]]], dict[GpuKey, dict[str, float]],
                            dict[GpuKey, list[str]]]:
        """For the given agents: process lists, latest GPU values and active throttle reasons,
        each keyed by (node, gpu). ``names``: only these series (the rules read a few of ~25)."""
        with self._lock:
            procs = {k: list(v[1]) for k, v in self.gpu_procs.items() if v[0] in agents}
            values: dict[GpuKey, dict[str, float]] = {}
            throttles: dict[GpuKey, list[str]] = {}
            for agent in agents:
                index = self.gpu_index.get(agent)
                if not index:
                    continue
                for name in (index if names is None else [n for n in names if n in index]):
                    for key, reason, s in index[name]:
                        if reason:
                            if s.value >= 1:
                                throttles.setdefault(key, []).append(reason)
                        else:
                            values.setdefault(key, {})[name] = s.value
            return procs, values, throttles

    def procs_of(self, agents: set[str]) -> dict[GpuKey, list[dict[str, Any]]]:
        """The process lists of the given agents' GPUs (what rank placement needs, without the
        GPU values gpu_view also gathers)."""
        with self._lock:
            return {k: list(v[1]) for k, v in self.gpu_procs.items() if v[0] in agents}

    def node_of_agent(self) -> dict[str, str]:
        """agent -> the node whose GPUs' processes it reports."""
        with self._lock:
            return {agent: node for (node, _gpu), (agent, _p) in self.gpu_procs.items()}

    def pods_by_gpu(self) -> dict[GpuKey, dict[str, Any]]:
        """(node, gpu index) -> the pod and container its GPU is allocated to (collectors/k8s),
        joined on the GPU UUID of the node's NVML series, or on the index the kubelet gave."""
        with self._lock:
            index_of = {(dict(lab).get("node", agent), dict(lab)["uuid"]): dict(lab).get("gpu", "?")
                        for agent, table in self.node.items() for (name, lab) in table
                        if name == MODEL_SERIES and "uuid" in dict(lab)}
            out: dict[GpuKey, dict[str, Any]] = {}
            for node, owners in self.gpu_pods.items():
                for o in owners:
                    uuid = o.get("uuid")
                    gpu = index_of.get((node, str(uuid))) if uuid else o.get("gpu")
                    if gpu is not None:
                        out[(node, str(gpu))] = o
            return out

    def serving_values(self, agents: set[str], job: str) -> dict[str, float]:
        """Latest serving series (catalog names) of a job's agents."""
        with self._lock:
            return {name: s.value for agent in agents
                    for (name, labels), s in self.other.get(agent, {}).items()
                    if name.startswith("perfd_serving_") and dict(labels).get("job_name", job) == job}

    def snapshot(self, node_series: bool = True) -> list[tuple[str, NodeSeries]]:
        """(agent id, series) pairs for export, node series (GPU, host) only when asked; a copy,
        safe to iterate without the lock."""
        with self._lock:
            tables = [self.other, self.node] if node_series else [self.other]
            return [(agent, NodeSeries(s.name, s.labels, s.time_ns, s.value))
                    for t in tables for agent, table in t.items() for s in table.values()]

    def snapshot_of(self, agents: set[str]) -> list[tuple[str, NodeSeries]]:
        """As :meth:`snapshot`, the given agents' series only (node series included)."""
        with self._lock:
            return [(agent, NodeSeries(s.name, s.labels, s.time_ns, s.value))
                    for agent in agents for t in (self.other, self.node) for s in t.get(agent, {}).values()]

    def gpm(self, agents: set[str]) -> GpmReading | None:
        """Mean GPM (and NVML) utilisation over the GPUs of the given agents, None without GPM."""
        sums: dict[str, list[float]] = {}
        with self._lock:
            for agent in agents:
                for (name, _labels), s in self.gpm_series.get(agent, {}).items():
                    sums.setdefault(_GPM_FIELDS[name], []).append(s.value)
        if not any(k != "nvml_util" for k in sums):
            return None
        return GpmReading(**{k: sum(v) / len(v) for k, v in sums.items()})

    def agents_seen(self) -> dict[str, float]:
        with self._lock:
            return dict(self.agent_seen)
