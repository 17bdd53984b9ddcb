"""The ONE catalog of event kinds: name, payload type, who produces it, who consumes it.

Events travel as plain mappings (``kind``, ``severity``, ``time``, ``job``, ``text``, ``labels``,
``links``, ``payload``; see perfd.transport.record_codec) so that an agent and an aggregator of different
versions still talk. Every producer names its kind through a constant here, and every consumer
looks its kind up here, so a kind is spelled once. ``payload_of`` checks a payload against its
declared shape before a consumer reads it: a malformed payload from the network is refused (and
counted by the caller), never half-read.

Two sorts of kind: *history* events go into the aggregator's bounded event log (a rule firing, an
XID); *state* events replace the previous value for their key (the latest process list of a GPU)
and never enter the log. Each payload a consumer reads has its type declared here (a TypedDict;
``Required`` marks what must be there): :func:`checked` turns an event that arrives into a value of
that type, or says why not, where events enter the aggregator. Pure data: imports nothing of perfd
but plain types and the checker of them (perfd.core.typed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Required, TypedDict

from perfd.core.model import CaptureStatus
from perfd.core.typed import fit, fit_entries

Severity = Literal["info", "warning", "critical"]


class GpuProcess(TypedDict, total=False):
    """One process on a GPU (collectors/nvml processes): RANK etc. come from its environment."""

    pid: Required[int]
    name: str | None
    user: str | None
    cmdline: str | None
    used_memory_bytes: int | None
    rank: int | None
    local_rank: int | None
    world_size: int | None
    job: str | None  # the PERFD_JOB its environment declares (perfd launch sets it): GPU -> job
    rank_from: str  # set when the agent took the rank from the process's step hook (perfd.agent.hook_gpus)


class GpuOwner(TypedDict, total=False):
    """The pod a GPU is allocated to (collectors/k8s, kubelet pod-resources API)."""

    device: str  # as the kubelet gives it: a GPU-/MIG- UUID, or an index
    uuid: str
    gpu: str
    namespace: str
    pod: str
    container: str
    resource: str


# A rank process's state as the agent reports it (proc(5) state letters, grouped): "gone" when its pid
# no longer exists (or now belongs to another process), "other" for a letter not listed.
PROCESS_STATES = ("running", "sleeping", "disk_sleep", "stopped", "zombie", "gone", "other")


class RankHost(TypedDict, total=False):
    """One rank process as the agent sees it on its node (collectors/ranks): what the aggregator's
    host evidence, live stall detector and host panel read. Absent keys: the platform does not say."""

    rank: Required[int]
    pid: Required[int]
    source: str  # how the agent knows it: launch (manifest descendants), gpu (NVML process list), hook
    state: str  # one of PROCESS_STATES
    state_since: float  # epoch s the agent first saw it in this state
    observed_at: float  # epoch s of the reading
    started_at: float  # epoch s the process started (the node's clock, as observed_at)
    threads: int  # the process's threads (proc(5) stat num_threads)
    cpu_cores: float  # CPU seconds per second over the last interval (all threads)
    wait_ratio: float  # run-queue wait ÷ (run + wait), all threads, last interval
    cpu_demand_cores: float  # (run + wait) ÷ interval: the CPU its threads wanted
    allowed_cpus: list[int]
    allowed_busy_ratio: float  # busy share of the allowed CPUs (every process)
    others_ratio: float  # share of the allowed CPUs other processes took (contention scan)
    own_ratio: float  # share of the allowed CPUs the job's own other processes took (contention scan)
    children: int  # the rank's live descendants (data-loader workers, compile workers): the job's own
    children_cpu_cores: float  # their CPU seconds per second over the last interval (the job's, not others')
    others: list[dict[str, object]]  # the top of them: pid, user, name, cmdline, cpu_ratio, own
    cgroup: str
    throttled_ratio: float  # cgroup CFS periods throttled ÷ periods, last interval
    throttled_s: float  # seconds the cgroup was throttled in the last interval
    cpu_quota_cores: float  # the cgroup's CPU quota (cpu.max / cfs_quota_us), when one is set
    pressure: dict[str, float]  # resource (cpu, memory, io) -> PSI "some" share, last interval
    pressure_source: str  # "cgroup" or "node" (the rank's cgroup is the root: /proc/pressure)
    oom_kills: int  # the cgroup's oom_kill counter
    oom_kills_since_follow: int  # ... since the agent began following the rank
    major_faults_per_second: float
    write_bytes_per_second: float  # proc(5) io write_bytes over the last interval (a checkpoint save)


class LaunchExit(TypedDict, total=False):
    """How a job's ``perfd launch`` ended, from its manifest (collectors/ranks). None: the manifest
    gives no integer code or no time (one written by an older or a killed launcher)."""

    status: str  # perfd.core.manifest.STATUS_EXITED
    exit_code: int | None
    ended: float | None


class RankProcesses(TypedDict, total=False):
    """The payload of a ``rank_processes`` event: one job's rank processes on one node."""

    job: Required[str]
    ranks: Required[list[RankHost]]
    interval_s: float
    node: dict[str, float]  # node-wide values read beside the ranks (swap_in_bytes_per_second)
    launch: LaunchExit  # once the job's launch manifest says the launch exited


Phase = Literal["checkpoint", "evaluation"]
PHASES: tuple[Phase, ...] = ("checkpoint", "evaluation")


class JobPhase(TypedDict, total=False):
    """The payload of a ``job_phase`` event: a pause the job announces (perfd.hook, the Megatron log)."""

    job: str | None  # the event's job when absent
    phase: Required[Phase]
    state: Required[Literal["begin", "end"]]
    iteration: int | None  # the step it began after (the hook), or the log's iteration
    rank: int | None  # the announcing rank (the hook); None: the job's log
    pid: int | None
    at: float | None
    source: str | None


class RankStack(TypedDict, total=False):
    """One rank's answer to a stacks request (perfd/agent/stacks.py)."""

    pid: int | None
    stack: str
    error: str


class RankStacks(TypedDict, total=False):
    """The payload of a ``rank_stacks`` event: a stacks request's answer from one agent."""

    job: str | None  # the event's job when absent
    command_id: str
    ranks: Required[dict[str, RankStack]]
    note: str | None
    py_spy: str | None


@dataclass(frozen=True)
class EventKind:
    name: str
    payload: Literal["none", "list", "mapping", "any"]  # the payload's JSON shape
    item: type | None  # the TypedDict of each list element / of the mapping, where declared
    state: bool  # True: latest value per key (not history)
    producer: str
    consumers: tuple[str, ...]
    description: str
    # A consumer besides the event log reads the whole payload (a state kind, the capture records, the
    # hang merge): the event is kept whole up to the wire cap. Any other kind is only read in the log,
    # and is kept there (and journalled) cut to perfd.core.limits.MAX_KEPT_EVENT_BYTES (:func:`cut`).
    whole: bool = False


def _k(name: str, payload: Literal["none", "list", "mapping", "any"], state: bool, producer: str,
       consumers: tuple[str, ...], description: str, item: type | None = None,
       whole: bool = False) -> EventKind:
    return EventKind(name, payload, item, state, producer, consumers, description, whole or state)


_AGG_LOG = "aggregator event log (/api/events)"

GPU_PROCESSES = _k("gpu_processes", "list", True, "collectors/nvml (processes)",
                   ("perfd/aggregator/nodes.py: rank placement, GPU hints",),
                   "The processes on one GPU (labels node, gpu)", GpuProcess)
GPU_PODS = _k("gpu_pods", "list", True, "collectors/k8s",
              ("perfd/aggregator/nodes.py: GPU -> pod",), "GPU -> pod allocation of a node", GpuOwner)
SERVING_DATA = _k("serving_data", "mapping", True, "collectors/sglang",
                  ("perfd/aggregator/serving.py: the job's serving window and analysis",),
                  "SGLang log records, server facts and a /metrics scrape "
                  "(perfd.core.serving_records.ServingData)")
NCCL_HANG = _k("nccl_hang", "mapping", False, "collectors/nccl (Flight Recorder hang detector)",
               ("perfd/aggregator/collectives.py: hangs merged across agents", _AGG_LOG),
               "A collective stuck past the hang threshold (and its resolution)", whole=True)
HOOK_PROFILE = _k("hook_profile", "mapping", False, "collectors/hook",
                  ("perfd/agent/capture_executor.py: cudaProfilerApi ranges",),
                  "A rank's step hook state (profiler range open/closed)", whole=True)
GPU_LOST = _k("gpu_lost", "none", False, "collectors/nvml", (_AGG_LOG,), "A GPU fell off the bus")
XID = _k("xid", "mapping", False, "collectors/nvml", (_AGG_LOG,), "An XID error on a GPU")
VALIDATION = _k("validation", "any", False, "collectors/megatron (parser)", (_AGG_LOG,),
                "A log value refused by validation")
LOG_GAP = _k("log_gap", "mapping", False, "collectors/megatron (tail)", (_AGG_LOG,),
            "Log lines not read: the tail fell too far behind and skipped ahead, or the log was "
            "truncated or rotated and its unread part was nowhere to read (no <log>.1)")
REPLAY_FINISHED = _k("replay_finished", "none", False, "collectors/nvml (replay)", (_AGG_LOG,),
                     "A recorded NVML replay reached its end")
RULE_FIRING = _k("rule_firing", "mapping", False, "perfd/aggregator/captures.py (rules engine)",
                 (_AGG_LOG, "perfd.exporters.wandb"), "A rule started firing")
CAPTURE_STARTED = _k("capture_started", "any", False, "perfd/capture/manager.py (agent)",
                     ("perfd/aggregator/captures.py: capture records", _AGG_LOG), "A capture began",
                     whole=True)
CAPTURE_FINISHED = _k("capture_finished", "any", False, "perfd/capture/manager.py (agent)",
                      ("perfd/aggregator/captures.py: capture records", _AGG_LOG),
                      "A capture finished; payload: its analysis and artifacts", whole=True)
CAPTURE_FAILED = _k("capture_failed", "any", False, "perfd/capture/manager.py (agent)",
                    ("perfd/aggregator/captures.py: capture records", _AGG_LOG),
                    "A capture failed; payload: status, reason, and cause (perfd.core.model.CaptureFailure: "
                    "not_ready is asked again when the target is ready, with no rule cooldown taken)",
                    whole=True)

STEP_CONFLICT = _k("step_conflict", "mapping", False, "perfd/aggregator/state.py (job store)",
                   (_AGG_LOG,), "Step records of a job from one agent for (iteration, rank) pairs held from "
                   "another: refused, the held ones kept; or (outcome: replaced) the held ones were written "
                   "ahead of the job and the agent continuing it took them (payload: job, holder, sender, "
                   "iterations)")
INCIDENT_OPENED = _k("incident_opened", "mapping", False, "perfd/aggregator/incidents.py",
                     (_AGG_LOG, "Alertmanager/Grafana via /api/events"),
                     "A stretch of iterations departs from steady state (who, why, cost so far)")
INCIDENT_CLOSED = _k("incident_closed", "mapping", False, "perfd/aggregator/incidents.py",
                     (_AGG_LOG,), "An incident ended (its cost and evidence are kept)")

RANK_PROCESSES = _k("rank_processes", "mapping", True, "collectors/ranks",
                    ("perfd/aggregator/hosts.py: each rank's host evidence, the live stall detector, the "
                     "host panel of /api/jobs/<job>/gpus",),
                    "The host state of one job's rank processes on a node (payload job, ranks: "
                    "RankHost, node; launch: {status, exit_code, ended} once its launch manifest says the "
                    "launch exited)",
                    RankProcesses)
JOB_PHASE = _k("job_phase", "mapping", True,
               "collectors/megatron (save and evaluation lines), collectors/hook (StepHook.phase)",
               ("perfd/aggregator/hosts.py: no live stall while a checkpoint save or an evaluation runs",),
               "A checkpoint save or an evaluation began or ended (payload job, phase, state, iteration, "
               "rank)", JobPhase)
RANK_STACKS = _k("rank_stacks", "mapping", True, "perfd/agent/stacks.py (py-spy dump)",
                 ("perfd/aggregator/hosts.py: the Python stacks of a stalled job's ranks, kept with the "
                  "stall",),
                 "Python stacks of a job's rank processes, taken when the aggregator asked (payload job, "
                 "command_id, ranks: rank -> pid, stack or error)", RankStacks)

KINDS: dict[str, EventKind] = {k.name: k for k in (
    GPU_PROCESSES, GPU_PODS, SERVING_DATA, NCCL_HANG, HOOK_PROFILE, GPU_LOST, XID, VALIDATION, LOG_GAP,
    REPLAY_FINISHED, RULE_FIRING, CAPTURE_STARTED, CAPTURE_FINISHED, CAPTURE_FAILED, INCIDENT_OPENED,
    INCIDENT_CLOSED, STEP_CONFLICT, RANK_PROCESSES, JOB_PHASE, RANK_STACKS)}
CAPTURE_PROGRESS: dict[str, CaptureStatus] = {  # capture event kind -> capture record status
    CAPTURE_STARTED.name: CaptureStatus.STARTED, CAPTURE_FINISHED.name: CaptureStatus.FINISHED,
    CAPTURE_FAILED.name: CaptureStatus.FAILED}


def get(name: str) -> EventKind | None:
    return KINDS.get(name)


def kept_whole(name: str) -> bool:
    """Whether events of kind ``name`` are journalled whole (see EventKind.whole); an unknown kind is
    only ever shown in the log."""
    kind = KINDS.get(name)
    return kind is not None and kind.whole


CUT_MARK = "… [cut]"


def cut(text: str, payload_json: str, cap: int) -> tuple[str, str, int]:
    """What is kept of one event's ``text`` and payload (as JSON) within ``cap`` bytes of UTF-8
    together, and how many bytes went. The text keeps its first quarter of the cap (marked as cut);
    a payload that does not fit what is left is replaced by ``{"cut_bytes": N}`` — never half a JSON
    document. Within the cap both come back as they were, 0 cut."""
    t, p = len(text.encode()), len(payload_json.encode())
    if t + p <= cap:
        return text, payload_json, 0
    if t > cap // 4:
        text = text.encode()[:cap // 4].decode("utf-8", "ignore") + CUT_MARK
    room = cap - len(text.encode())
    if p > room:
        payload_json = f'{{"cut_bytes": {p}}}'
    return text, payload_json, t + p - len(text.encode()) - len(payload_json.encode())


def checked(ev: Mapping[str, object]) -> tuple[dict[str, Any] | None, list[str]]:
    """``ev`` as its kind declares it, where events enter the aggregator: (the event — its payload
    the declared type, the entries of a list that are not left out — or None when the event itself
    is refused; one line per event or entry refused, which the caller counts and logs). A kind not
    in the catalog, or one whose payload has no declared type, is only shown in the event log: it
    passes as it is. Never raises on a value from the network."""
    kind = KINDS.get(str(ev.get("kind", "")))
    if kind is None or kind.payload in ("none", "any"):
        return dict(ev), []
    p = ev.get("payload")
    if kind.payload == "list":
        if not isinstance(p, list):
            return None, [f"payload {type(p).__name__}, not a list"]
        if kind.item is None:
            return dict(ev), []
        entries, problems = fit_entries(p, kind.item)
        return {**ev, "payload": entries}, problems
    if not isinstance(p, Mapping):
        return None, [f"payload {type(p).__name__}, not a mapping"]
    if kind.item is None:
        return dict(ev), []
    value, problems = fit(p, kind.item)
    return (None if value is None else {**ev, "payload": value}), problems


def payload_of(ev: Mapping[str, Any], kind: EventKind) -> Any:
    """The event's payload if it has ``kind``'s declared shape, else None (the caller counts it).
    List payloads keep only mapping elements: one bad element does not drop a process list."""
    p = ev.get("payload")
    if kind.payload == "list":
        return [dict(x) for x in p if isinstance(x, Mapping)] if isinstance(p, list) else None
    if kind.payload == "mapping":
        return dict(p) if isinstance(p, Mapping) else None
    return p
