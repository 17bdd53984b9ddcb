"""The node/GPU view: the latest value of every node series, each GPU's process list and pod.

Fed by the agents' samples and by two state events (perfd.core.events GPU_PROCESSES, GPU_PODS); read to
place ranks on GPUs, to explain a slow rank by its GPU's state, and for /metrics. One lock.

An agent's latest values live in columns (:class:`AgentColumns`: an array of values and one of
times, indexed by a slot per series), not in an object per series. An agent sends the same series
in the same order batch after batch, so a batch whose id sequence was seen before is copied into
the columns as two slices, in C, from the arrays the codec decoded (issue: scale, "columnar batches
decoded into arrays"): at 2,000 agents the per-sample Python loop was ~18% of the aggregator's event
loop, and 400k series objects made each full garbage collection ~240 ms.

The value kept is the last one the agent sent. The transport hands over an agent's batches in the
order it made them (per-agent sequence numbers, duplicates dropped; a new spool epoch is a newer
process), and within a batch the samples are in the order taken, so arrival order is time order —
and, unlike comparing timestamps, it does not freeze a series when the node's clock steps back.
"""

from __future__ import annotations

import math
import threading
from array import array
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from perfd.analytics.breakdown.bottleneck import GpmReading
from perfd.core.catalog import GPU_THROTTLE_ACTIVE
from perfd.core.clock import REAL_CLOCK, Clock
from perfd.core.events import GPU_PODS, GPU_PROCESSES, GpuOwner, GpuProcess, payload_of
from perfd.core.model import LabelSet
from perfd.core.placement import declared_job, declared_jobs
from perfd.core.typed import obj
from perfd.transport.codec import F64, I64, U32
from perfd.transport.series import SeriesKey

GpuKey = tuple[str, str]  # (node, gpu index)
# A view of GPUs: their process lists, latest values and active throttle reasons (NodeView.gpu_view)
GpuView = tuple[dict[GpuKey, list[GpuProcess]], dict[GpuKey, dict[str, float]], dict[GpuKey, list[str]]]
# catalog name -> GpmReading field
_GPM_FIELDS = {"perfd_gpu_sm_util_ratio": "sm_util", "perfd_gpu_sm_occupancy_ratio": "sm_occupancy",
               "perfd_gpu_tensor_util_ratio": "tensor_util", "perfd_gpu_dram_bw_util_ratio": "dram_bw_util",
               "perfd_gpu_utilization_ratio": "nvml_util"}
# Any GPU series names the GPU model; this one is sampled on every GPU and rarely changes.
MODEL_SERIES = "perfd_gpu_memory_total_bytes"
MODEL_MAX = 128  # characters of a GPU model kept from a process list's labels (NVML's names are ~30)
# Series an agent serves on its own /metrics (GPU and host): the aggregator keeps their latest values
# for its joins, and leaves them off its /metrics unless asked (docs/prometheus.md).
NODE_SERIES_PREFIXES = ("perfd_gpu_", "perfd_host_")
# Id sequences remembered per agent: an agent sends a few shapes of batch (every series, or those
# of one collector); past this many the memory is cleared and rebuilt from the next batches.
_MAX_LAYOUTS = 16
MAX_JOB_NODES = 1024  # jobs whose nodes are kept (job_nodes): past it the oldest computed goes
_MAX_HELLO_COLLECTORS = 32  # collectors' states kept from one Hello


@dataclass
class NodeSeries:
    """Latest value of one time series from one agent (a copy, for export)."""

    name: str
    labels: LabelSet
    time_ns: int
    value: float


class AgentColumns:
    """One agent's series: what each slot is (decided once per series), and its latest time and
    value in two columns indexed by slot."""

    __slots__ = ("by_id", "gpm", "gpu_index", "keys", "layouts", "model", "node", "nodes", "other",
                 "slot_of", "times", "values")

    def __init__(self) -> None:
        self.keys: list[SeriesKey] = []  # slot -> (name, labels)
        self.slot_of: dict[SeriesKey, int] = {}
        self.times: array[int] = array(I64)
        self.values: array[float] = array(F64)
        # The stream's series id -> slot. An id a stream defines again (a restarted agent numbers
        # its series anew) leaves it through NodeView.defined, so its next sample resolves anew.
        self.by_id: dict[int, int] = {}
        # A batch's id column (its bytes) -> the first of the consecutive slots it fills: a batch
        # of that shape is two slice assignments.
        self.layouts: dict[bytes, int] = {}
        # Slots of node series (GPU, host: left to the agents' /metrics) and of the rest, so
        # /metrics never walks the node series (400k at 2,000 agents).
        self.node: list[int] = []
        self.other: list[int] = []
        self.gpm: list[tuple[str, int]] = []  # (GpmReading field, slot): what every analysis reads
        # GPU series name -> [(node, gpu), throttle reason or "", slot]: what gpu_view reads,
        # classified once per series rather than on every read (the rules read the GPU scope of
        # every job every tick: at 2,000 agents that walk was 13% of the aggregator).
        self.gpu_index: dict[str, list[tuple[GpuKey, str, int]]] = {}
        self.model: str | None = None  # the GPU model its series name
        self.nodes: set[str] = set()  # the node labels its series carry (where the agent runs)

    def row(self, slot: int) -> NodeSeries:
        name, labels = self.keys[slot]
        return NodeSeries(name, labels, self.times[slot], self.values[slot])


def _column(code: str, seq: Sequence[Any]) -> array[Any]:
    return seq if isinstance(seq, array) and seq.typecode == code else array(code, seq)


def _placement_fields(procs: Sequence[object]) -> list[tuple[object, ...]]:
    """What of a process list rank placement and a job's GPUs depend on (perfd.core.placement,
    perfd.analytics.incidents.attribution.place_ranks): per process its pid, rank, local_rank,
    world_size, job."""
    return [(p.get("pid"), p.get("rank"), p.get("local_rank"), p.get("world_size"), p.get("job"))
            if isinstance(p, Mapping) else (repr(p),) for p in procs]


class NodeView:
    def __init__(self, clock: Clock = REAL_CLOCK) -> None:
        self.clock = clock  # when an agent was last heard from
        self._lock = threading.Lock()
        self._agents: dict[str, AgentColumns] = {}
        self.agent_seen: dict[str, float] = {}
        # agent -> (its node, what each of its collectors said at start: "ok" or "unavailable: why"),
        # from its Hello: why a job's GPU panel is empty (no NVML there) is said where it is shown.
        self.hellos: dict[str, tuple[str, dict[str, str]]] = {}
        self.samples = 0
        self.undefined_samples = 0  # samples of an id with no held definition: dropped
        # (node, gpu) -> (agent, latest process list from the NVML collector)
        self.gpu_procs: dict[GpuKey, tuple[str, list[GpuProcess]]] = {}
        # node -> latest GPU -> pod allocation from the k8s collector (kubelet pod-resources)
        self.gpu_pods: dict[str, list[GpuOwner]] = {}
        # Placement (perfd.core.placement), kept as process lists arrive so a job's GPUs are found
        # without walking every GPU: the job a GPU's series are labelled with, and the inverse of
        # every job its processes declare (a job's view takes each GPU where it runs).
        self._declared: dict[GpuKey, str] = {}
        self._declared_all: dict[GpuKey, frozenset[str]] = {}
        self._placed: dict[str, set[GpuKey]] = {}
        self._agent_gpus: dict[str, set[GpuKey]] = {}  # agent -> the GPUs whose process lists it sends
        # (node, gpu) -> the GPU model its process lists' labels name (collectors/nvml: every device's
        # labels carry it). A job seen only through the engine has no series at its root (they stay on
        # the agents): its process lists are what name its GPUs, and MFU's peak needs the model.
        self._gpu_model: dict[GpuKey, str] = {}
        # job -> (placement_version, the agents and the nodes of its declared GPUs): see _placed_of
        self._placed_at: dict[str, tuple[int, frozenset[str], frozenset[str]]] = {}
        # Counts the process-list changes that can move a rank placement or a job's GPUs: a GPU
        # reported by another agent, or a process's pid, rank, local_rank, world_size or job that
        # differs from the list held (a resend of the same processes, their memory or names aside,
        # leaves it). Read without the lock by caches of placement (perfd.aggregator.gpu_views): an
        # int, and a reader takes it before the data, so a change it races with makes it recompute.
        self.placement_version = 0
        # Counts the changes that can move a job's nodes (job_nodes): an agent's GPUs, the job a GPU's
        # processes declare, the nodes an agent's series name, an agent forgotten (lock held).
        self._nodes_version = 0
        # job -> (_nodes_version, placement_version, its agents, its nodes): see job_nodes
        self._job_nodes: dict[str, tuple[int, int, frozenset[str], frozenset[str]]] = {}

    def seen(self, agent_id: str) -> None:
        with self._lock:
            self.agent_seen[agent_id] = self.clock.time()

    def said_hello(self, agent_id: str, node: str, capabilities: Mapping[str, str]) -> None:
        """The agent's node and its collectors' start-up state, bounded (the network sends them)."""
        caps = {str(k)[:64]: str(v)[:300] for k, v in list(capabilities.items())[:_MAX_HELLO_COLLECTORS]}
        with self._lock:
            self.hellos[agent_id] = (node[:256], caps)

    def hello_of(self, agent_id: str) -> tuple[str, dict[str, str]] | None:
        with self._lock:
            got = self.hellos.get(agent_id)
            return (got[0], dict(got[1])) if got is not None else None

    def agents_on(self, nodes: Collection[str]) -> set[str]:
        """The agents whose Hello named one of ``nodes``."""
        with self._lock:
            return {a for a, (node, _caps) in self.hellos.items() if node in nodes}

    def defined(self, agent_id: str, series_ids: Sequence[int]) -> None:
        """The agent's stream (re)defined these ids: forget what they resolved to."""
        with self._lock:
            cols = self._agents.get(agent_id)
            if cols is not None and series_ids:
                for sid in series_ids:
                    cols.by_id.pop(sid, None)
                cols.layouts.clear()

    def ingest_samples(self, agent_id: str, series_defs: Mapping[int, SeriesKey],
                       series_ids: Sequence[int], timestamps_ns: Sequence[int],
                       values: Sequence[float], on_model: Callable[[str], None]) -> None:
        """Keep each series' last value. Columnar in (the codec's arrays; other sequences are
        converted), columnar kept: a batch shaped like an earlier one (the same ids in the same
        order) is copied into the columns as two slices; any other batch goes sample by sample
        (each id resolved to its slot) and teaches its shape. Ids defined again must go through
        defined() first. ``on_model`` hears the GPU model an agent's series name (the job store
        keeps it for the peak table)."""
        ids, ts, vals = _column(U32, series_ids), _column(I64, timestamps_ns), _column(F64, values)
        n = len(vals)
        if not len(ids) == len(ts) == n:
            raise ValueError(f"sample columns differ in length: {len(ids)}, {len(ts)}, {n}")
        with self._lock:
            self.samples += n
            self.agent_seen[agent_id] = self.clock.time()
            cols = self._agents.get(agent_id)
            if cols is None:
                cols = self._agents[agent_id] = AgentColumns()
            if n:
                key = ids.tobytes()
                start = cols.layouts.get(key)
                if start is not None:
                    cols.values[start:start + n] = vals
                    cols.times[start:start + n] = ts
                else:
                    self._scatter(agent_id, cols, series_defs, key, ids, ts, vals)
            model = cols.model
        if model:
            on_model(model)

    def _scatter(self, agent_id: str, cols: AgentColumns, defs: Mapping[int, SeriesKey], key: bytes,
                 ids: array[int], ts_col: array[int], val_col: array[float]) -> None:
        """Sample by sample (lock held); remembers the batch's shape when its slots follow on."""
        by_id, times, vals = cols.by_id, cols.times, cols.values
        slots = []
        for sid, ts, val in zip(ids, ts_col, val_col, strict=True):
            slot = by_id.get(sid)
            if slot is None:
                sk = defs.get(sid)
                if sk is None:  # a series the caps refused (held nowhere), or never defined
                    self.undefined_samples += 1
                    continue
                slot = by_id[sid] = self._slot(agent_id, cols, sk[0], sk[1])
            times[slot], vals[slot] = ts, val
            slots.append(slot)
        if len(slots) == len(ids) and slots == list(range(slots[0], slots[0] + len(slots))):
            if len(cols.layouts) >= _MAX_LAYOUTS:
                cols.layouts.clear()
            cols.layouts[key] = slots[0]

    def _slot(self, agent_id: str, cols: AgentColumns, name: str, labels: LabelSet) -> int:
        """The agent's slot of (name, labels), made and classified on first sight (lock held)."""
        key = (name, labels)
        slot = cols.slot_of.get(key)
        if slot is not None:
            return slot
        slot = cols.slot_of[key] = len(cols.keys)
        cols.keys.append(key)
        cols.times.append(0)  # written by the sample that made the slot
        cols.values.append(math.nan)
        (cols.node if name.startswith(NODE_SERIES_PREFIXES) else cols.other).append(slot)
        lab = dict(labels)
        if "node" in lab and lab["node"] not in cols.nodes:
            cols.nodes.add(lab["node"])
            self._nodes_version += 1
        if name in _GPM_FIELDS and "replay" not in lab:  # a recording of another run says nothing of this job
            cols.gpm.append((_GPM_FIELDS[name], slot))
        if name.startswith("perfd_gpu_"):
            reason = lab.get("reason")
            # a reason-labelled series counts only as a throttle flag; a typed one (e.g. ECC
            # by type) is not a per-GPU value
            flag = reason is not None and name == GPU_THROTTLE_ACTIVE
            if flag or (reason is None and "type" not in lab):
                cols.gpu_index.setdefault(name, []).append(
                    ((lab.get("node", agent_id), lab.get("gpu", "?")), reason or "", slot))
        if name == MODEL_SERIES and lab.get("model"):
            cols.model = lab["model"]
        return slot

    # ---- state events ------------------------------------------------------------------------
    def on_gpu_processes(self, agent_id: str, ev: Mapping[str, object]) -> bool:
        """The latest process list of a GPU replaces the previous one; False if malformed."""
        payload: list[GpuProcess] | None = payload_of(ev, GPU_PROCESSES)
        if payload is None:
            return False
        labels = obj(ev.get("labels"))
        key = (str(labels.get("node", agent_id)), str(labels.get("gpu", "?")))
        label_job, jobs = declared_job(payload), declared_jobs(payload)
        model = labels.get("model")
        with self._lock:
            if isinstance(model, str) and model:
                self._gpu_model[key] = model[:MODEL_MAX]
            before = self.gpu_procs.get(key)
            if before is None or before[0] != agent_id \
                    or _placement_fields(before[1]) != _placement_fields(payload):
                self.placement_version += 1
            if before is not None and before[0] != agent_id:
                self._agent_gpus.get(before[0], set()).discard(key)
            mine = self._agent_gpus.setdefault(agent_id, set())
            if key not in mine or self._declared.get(key) != label_job:
                self._nodes_version += 1
            mine.add(key)
            self.gpu_procs[key] = (agent_id, payload)
            for old in self._declared_all.pop(key, frozenset()) - jobs:
                held = self._placed.get(old)
                if held is not None:
                    held.discard(key)
                    if not held:
                        del self._placed[old]
            self._declared.pop(key, None)
            if label_job is not None:
                self._declared[key] = label_job
                self._declared_all[key] = jobs
                for job in jobs:
                    self._placed.setdefault(job, set()).add(key)
        return True

    # ---- placement ---------------------------------------------------------------------------
    def _scope(self, job: str, job_agents: Collection[str]) -> tuple[set[str], Callable[[str, GpuKey], bool]]:
        """The agents that report ``job``'s GPUs, and whether one agent's GPU is the job's (lock
        held): a GPU whose processes declare the job, whoever reports it; a GPU of the job's own
        agents whose processes declare no job. A GPU another job's processes declare is not this
        job's, even on this job's agent (perfd.core.placement)."""
        placed = self._placed.get(job, set())
        agents = set(job_agents) | self._placed_of(job)[0]
        declared = self._declared

        def keep(agent: str, key: GpuKey) -> bool:
            return key in placed or (agent in job_agents and key not in declared)

        return agents, keep

    def _placed_of(self, job: str) -> tuple[frozenset[str], frozenset[str]]:
        """The agents that report the GPUs ``job``'s processes declare, and those GPUs' nodes (lock
        held), kept while the placement is unchanged: at 100,000 GPUs, gathering them took a job's
        root 60 ms and 40 ms a read, and every tick reads them (the stall check, the snapshot)."""
        v = self.placement_version
        held = self._placed_at.get(job)
        if held is None or held[0] != v:
            placed = self._placed.get(job, ())
            self._placed_at = {j: h for j, h in self._placed_at.items() if h[0] == v}  # ended jobs' go
            agents = frozenset(self.gpu_procs[k][0] for k in placed if k in self.gpu_procs)
            held = self._placed_at[job] = (v, agents, frozenset(node for node, _g in placed))
        return held[1], held[2]

    def jobs_on(self, agent: str) -> set[str]:
        """The jobs whose processes run on the GPUs this agent reports (a node agent's GPUs)."""
        with self._lock:
            return {j for k in self._agent_gpus.get(agent, ()) for j in self._declared_all.get(k, ())}

    def job_nodes(self, job: str, job_agents: Collection[str]) -> frozenset[str]:
        """The nodes ``job`` runs on: those of the GPUs its processes declare (whoever reports
        them: a node agent), of its own agents' GPUs no other job declares, and those its own
        agents' series name. What joins a node agent's host series (no job_name) to the job.
        Kept while neither those inputs nor the job's agents change: every snapshot of a job reads
        it, and at 100,000 GPUs (12,500 agents) walking them was 25% of the engine root's samples
        (py-spy, perfd bench engine --nodes 12500 --iteration-s 20;
        docs/evidence/entries/48-scale-history.md)."""
        agents = job_agents if isinstance(job_agents, frozenset) else frozenset(job_agents)
        with self._lock:
            held = self._job_nodes.get(job)
            if held is not None and held[0] == self._nodes_version and held[1] == self.placement_version \
                    and held[2] == agents:
                return held[3]
            nodes = set(self._placed_of(job)[1])
            for agent in agents:
                nodes.update(k[0] for k in self._agent_gpus.get(agent, ()) if k not in self._declared)
                cols = self._agents.get(agent)
                if cols is not None:
                    nodes.update(cols.nodes)
            out = frozenset(nodes)
            if held is None:  # a job not held before: ended jobs' go once they are the oldest
                while len(self._job_nodes) >= MAX_JOB_NODES:
                    del self._job_nodes[next(iter(self._job_nodes))]
            self._job_nodes[job] = (self._nodes_version, self.placement_version, agents, out)
            return out

    def model_of(self, job: str, job_agents: Collection[str]) -> str | None:
        """The GPU model of ``job``'s GPUs as their process lists name it (one found is enough: a
        job's nodes are alike), or as its own agents' series name it; None: none named yet."""
        with self._lock:
            for key in self._placed.get(job, ()):
                model = self._gpu_model.get(key)
                if model:
                    return model
            for agent in job_agents:
                for key in self._agent_gpus.get(agent, ()):
                    if key not in self._declared and self._gpu_model.get(key):
                        return self._gpu_model[key]
                cols = self._agents.get(agent)
                if cols is not None and cols.model:
                    return cols.model
        return None

    def gpu_job(self, agent: str, key: GpuKey, agent_job: str | None) -> str | None:
        """The job of one agent's GPU: what its processes declare, else the agent's own job."""
        with self._lock:
            return self._declared.get(key) or agent_job or None

    def job_gpu_series(self, job: str, job_agents: Collection[str]) -> list[tuple[str, NodeSeries]]:
        """(agent, series) of every GPU series of the job's GPUs, whichever agent reports them."""
        with self._lock:
            agents, keep = self._scope(job, job_agents)
            out = []
            for agent in agents:
                cols = self._agents.get(agent)
                if cols is None:
                    continue
                for entries in cols.gpu_index.values():
                    for key, _reason, slot in entries:
                        if keep(agent, key):
                            out.append((agent, cols.row(slot)))
            return out

    def on_gpu_pods(self, agent_id: str, ev: Mapping[str, object]) -> bool:
        payload: list[GpuOwner] | None = payload_of(ev, GPU_PODS)
        if payload is None:
            return False
        with self._lock:
            self.gpu_pods[str(obj(ev.get("labels")).get("node", agent_id))] = payload
        return True

    # ---- read side ---------------------------------------------------------------------------
    def _columns(self, agents: Collection[str]) -> list[AgentColumns]:
        """The columns of those of ``agents`` that sent samples (lock held)."""
        return [c for a in agents if (c := self._agents.get(a)) is not None]

    def latest(self, agent_id: str, name: str, labels: LabelSet) -> NodeSeries | None:
        """The agent's latest value of one series, None if it never sent it."""
        with self._lock:
            cols = self._agents.get(agent_id)
            slot = cols.slot_of.get((name, labels)) if cols is not None else None
            return cols.row(slot) if cols is not None and slot is not None else None

    def gpu_view(self, agents: Collection[str], names: Collection[str] | None = None, job: str | None = None,
                 procs: bool = True
                 ) -> GpuView:
        """For the given agents: process lists, latest GPU values and active throttle reasons,
        each keyed by (node, gpu). ``names``: only these series (the rules read a few of ~25).
        ``job``: ``agents`` are that job's, and the view is of the job's GPUs (:meth:`_scope`).
        ``procs`` False: no process lists (empty): a reader of values only does not copy every GPU's."""
        with self._lock:
            keep: Callable[[str, GpuKey], bool] = lambda _a, _k: True  # noqa: E731
            if job is not None:
                agents, keep = self._scope(job, agents)
            lists = ({k: list(v[1]) for k, v in self.gpu_procs.items() if v[0] in agents and keep(v[0], k)}
                     if procs else {})
            values: dict[GpuKey, dict[str, float]] = {}
            throttles: dict[GpuKey, list[str]] = {}
            for agent in agents:
                cols = self._agents.get(agent)
                if cols is None or not cols.gpu_index:
                    continue
                index, vals = cols.gpu_index, cols.values
                for name in (index if names is None else [n for n in names if n in index]):
                    for key, reason, slot in index[name]:
                        if not keep(agent, key):
                            continue
                        if reason:
                            if vals[slot] >= 1:
                                throttles.setdefault(key, []).append(reason)
                        else:
                            values.setdefault(key, {})[name] = vals[slot]
            return lists, values, throttles

    def procs_of(self, agents: set[str], job: str | None = None) -> dict[GpuKey, list[GpuProcess]]:
        """The process lists of the given agents' GPUs (what rank placement needs, without the
        GPU values gpu_view also gathers); ``job``: of that job's GPUs, as :meth:`gpu_view`."""
        with self._lock:
            if job is None:
                return {k: list(v[1]) for k, v in self.gpu_procs.items() if v[0] in agents}
            agents, keep = self._scope(job, agents)
            return {k: list(v[1]) for k, v in self.gpu_procs.items() if v[0] in agents and keep(v[0], k)}

    def node_of_agent(self) -> dict[str, str]:
        """agent -> the node whose GPUs' processes it reports."""
        with self._lock:
            return {agent: node for (node, _gpu), (agent, _p) in self.gpu_procs.items()}

    def pods_by_gpu(self) -> dict[GpuKey, GpuOwner]:
        """(node, gpu index) -> the pod and container its GPU is allocated to (collectors/k8s),
        joined on the GPU UUID of the node's NVML series, or on the index the kubelet gave."""
        with self._lock:
            index_of = {}
            for agent, cols in self._agents.items():
                for slot in cols.node:
                    name, labels = cols.keys[slot]
                    lab = dict(labels)
                    if name == MODEL_SERIES and "uuid" in lab:
                        index_of[(lab.get("node", agent), lab["uuid"])] = lab.get("gpu", "?")
            out: dict[GpuKey, GpuOwner] = {}
            for node, owners in self.gpu_pods.items():
                for o in owners:
                    uuid = o.get("uuid")
                    gpu = index_of.get((node, str(uuid))) if uuid else o.get("gpu")
                    if gpu is not None:
                        out[(node, str(gpu))] = o
            return out

    def serving_values(self, agents: set[str], job: str) -> dict[str, float]:
        """Latest serving series (catalog names) of a job's agents."""
        out = {}
        with self._lock:
            for cols in self._columns(agents):
                for slot in cols.other:
                    name, labels = cols.keys[slot]
                    if name.startswith("perfd_serving_") and dict(labels).get("job_name", job) == job:
                        out[name] = cols.values[slot]
        return out

    def snapshot(self, node_series: bool = True) -> list[tuple[str, NodeSeries]]:
        """(agent id, series) pairs for export, node series (GPU, host) only when asked; a copy,
        safe to iterate without the lock."""
        with self._lock:
            return [(agent, cols.row(slot)) for agent, cols in self._agents.items()
                    for slot in (cols.other + cols.node if node_series else cols.other)]

    def gpm(self, agents: set[str]) -> GpmReading | None:
        """Mean GPM (and NVML) utilisation over the GPUs of the given agents, None without GPM."""
        sums: dict[str, list[float]] = {}
        with self._lock:
            for cols in self._columns(agents):
                for field, slot in cols.gpm:
                    sums.setdefault(field, []).append(cols.values[slot])
        if not any(k != "nvml_util" for k in sums):
            return None
        return GpmReading(**{k: sum(v) / len(v) for k, v in sums.items()})

    def agents_seen(self) -> dict[str, float]:
        with self._lock:
            return dict(self.agent_seen)

    def forget_agent(self, agent_id: str) -> None:
        """Drop what the agent sent (its series' latest values, its GPUs' process lists and pods):
        it is gone for good (perfd.aggregator.retention)."""
        with self._lock:
            self._agents.pop(agent_id, None)
            self.agent_seen.pop(agent_id, None)
            self.hellos.pop(agent_id, None)
            self._nodes_version += 1
            gpus = self._agent_gpus.pop(agent_id, set())
            for key in [k for k, (a, _p) in self.gpu_procs.items() if a == agent_id]:
                del self.gpu_procs[key]
                gpus.add(key)
            for key in gpus:
                self._declared.pop(key, None)
                self._declared_all.pop(key, None)
                self._gpu_model.pop(key, None)
            for held in self._placed.values():
                held.difference_update(gpus)
            self._placed = {j: g for j, g in self._placed.items() if g}
            if gpus:
                self.placement_version += 1
