"""Compute processes per GPU, named via psutil, reported as events when the set of pids changes.

Why events and not samples: a pid or a command line is not a label value (unbounded). The aggregator
needs them to map ranks to GPUs and to name a foreign process that shares a rank's GPU, which only
changes when processes come and go. So a ``gpu_processes`` event goes out when the pid set of a GPU
changes, and again every ``event_interval_s`` (a late-joining aggregator learns the state), while
the count goes out every collect as ``perfd_gpu_processes``.

What is shown of each process (docs/security.md "Command lines and stacks"): pid, name, user and GPU
memory always; the command line only of the job's own processes — those whose environment declares
a rank or a job (RANK, PERFD_JOB: a job's ranks) — redacted by allow-list
(perfd.core.procinfo.shown_cmdline). Another process on the GPU (a co-tenant, another user's notebook) is
named without its arguments: they may hold its passwords and tokens.

Whose a declaration is: a variable in a process's environment is the process's
word, and any user may set ``RANK=3``. An agent that serves a job knows the job's user (``job_user``:
AgentConfig.job_uid); a process is the job's own only when it runs as that uid alone (real,
effective, saved and filesystem: a setuid program is not). A process of another user that claims
this job or a bare rank is nobody's rank: its rank and job are not reported (the agent's captures
and the aggregator's placement never take it for one) and its command line is not shown; one that
declares another job by name is reported with that job, not this one's. A node agent (no job, no
job user) reports each process's declarations as they are, with its user, for the aggregator to place.

Caveat: NVML reports pids in the host's pid namespace. An agent in a container without the host
pid namespace (``hostPID: true`` in Kubernetes) sees other pids: the names are then absent, or, if a
container process happens to have the same pid, wrong. Run the agent in the host pid namespace.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypedDict

from perfd.core import events
from perfd.core.events import GPU_PROCESSES
from perfd.core.procinfo import (  # shared with collectors/ranks: which rank and job a process is
    CMDLINE_MAX,
    JOB_ENV,
    JOB_NAME_MAX,
    RANK_ENV,
    EnvLookup,
    NameLookup,
    UserLookup,
    job_from_env,
    psutil_lookup,
    psutil_rank_env,
    psutil_user,
    shown_cmdline,
    uid_alone,
)

if TYPE_CHECKING:
    from perfd.collectors.nvml.probe import ProcessInfo

__all__ = ["CMDLINE_MAX", "JOB_ENV", "JOB_NAME_MAX", "RANK_ENV", "EnvLookup", "GpuProcess", "NameLookup",
           "ProcessTracker", "UserLookup", "job_from_env", "psutil_lookup", "psutil_rank_env", "psutil_user"]


def _text(v: object) -> str | None:
    return v if isinstance(v, str) else None


def _int(v: object) -> int | None:
    return v if isinstance(v, int) else None


class ProcessesEvent(TypedDict):
    """The ``gpu_processes`` event of one GPU (perfd.core.events.GPU_PROCESSES)."""

    kind: str
    severity: Literal["info"]
    time: float
    labels: dict[str, str]
    text: str
    changed: bool
    payload: list[events.GpuProcess]


@dataclass
class GpuProcess:
    pid: int
    used_memory_bytes: int | None

    @classmethod
    def from_nvml(cls, obj: ProcessInfo) -> GpuProcess:
        used = getattr(obj, "usedGpuMemory", None)
        return cls(pid=int(obj.pid), used_memory_bytes=int(used) if used is not None else None)


class ProcessTracker:
    """Remembers each GPU's pid set and when it last reported it; caches names per pid."""

    def __init__(self, event_interval_s: float = 60.0, lookup: NameLookup = psutil_lookup,
                 env_lookup: EnvLookup = psutil_rank_env, user_lookup: UserLookup = psutil_user,
                 pod_job: Callable[[int], str | None] | None = None, *, job: str | None = None,
                 job_uid: int | None = None, uid_lookup: Callable[[int], int | None] = uid_alone) -> None:
        self.event_interval_s = event_interval_s
        # The job this agent serves and its user (None: a node agent, see the module).
        self.job, self.job_uid, self._uid_lookup = job, job_uid, uid_lookup
        self._uids: dict[int, int | None] = {}
        self.foreign_claims = 0  # processes of another user that claimed this job or a rank, not taken
        self._lookup = lookup
        self._env_lookup = env_lookup
        self._user_lookup = user_lookup
        # A process that declares no job: the job its pod declares (perfd.core.procinfo.PodJobs), looked up
        # at every event (the pod's sidecar may start after the process), cached there per pod.
        self._pod_job = pod_job
        self._users: dict[int, str | None] = {}
        self._ranks: dict[int, Mapping[str, int | str]] = {}
        self._last: dict[str, tuple[frozenset[int], float]] = {}  # gpu -> (pids, last event time)
        self._names: dict[int, tuple[str | None, str | None]] = {}

    def update(self, labels: dict[str, str], procs: list[GpuProcess], now: float) -> ProcessesEvent | None:
        """The event to emit for this GPU now, or None (same pids, reported recently)."""
        gpu = labels["gpu"]
        pids = frozenset(p.pid for p in procs)
        last = self._last.get(gpu)
        if last is not None and last[0] == pids and now - last[1] < self.event_interval_s:
            return None
        changed = last is None or last[0] != pids
        self._last[gpu] = (pids, now)
        self._forget_gone()
        payload: list[events.GpuProcess] = []
        for p in sorted(procs, key=lambda q: q.pid):
            name, cmd = self._name(p.pid)
            if p.pid not in self._ranks:
                self._ranks[p.pid] = self._env_lookup(p.pid)
            rank = self._ranks[p.pid]
            job = _text(rank.get("job"))
            if job is None and self._pod_job is not None:
                job = self._pod_job(p.pid)
            if self._users.get(p.pid) is None:  # looked up once per pid (retried while unknown)
                self._users[p.pid] = self._user_lookup(p.pid)
            own = isinstance(rank.get("rank"), int) or bool(rank.get("job"))  # a job's: it declares so
            if own and self.job_uid is not None and self._uid(p.pid) != self.job_uid:
                # Another user's process: the job's only if it names another job (then that job's).
                own = False
                if job is None or job == self.job:
                    self.foreign_claims += 1
                    rank, job = {}, None
            payload.append({
                "pid": p.pid, "name": name, "user": self._users[p.pid],
                "cmdline": shown_cmdline(cmd, own, CMDLINE_MAX),
                "used_memory_bytes": p.used_memory_bytes,
                # The basis for rank -> GPU attribution; absent (None) when the environment is not
                # visible or not the job user's word, never guessed from the GPU index.
                "rank": _int(rank.get("rank")), "local_rank": _int(rank.get("local_rank")),
                "world_size": _int(rank.get("world_size")), "job": job,
            })
        return {
            "kind": GPU_PROCESSES.name, "severity": "info", "time": now, "labels": dict(labels),
            "text": f"{len(payload)} compute process(es) on GPU {gpu}" + (" (changed)" if changed else ""),
            "changed": changed, "payload": payload,
        }

    def _uid(self, pid: int) -> int | None:
        """The uid ``pid`` runs as alone (None: several, or not visible), looked up once per pid."""
        if pid not in self._uids:
            self._uids[pid] = self._uid_lookup(pid)
        return self._uids[pid]

    def _name(self, pid: int) -> tuple[str | None, str | None]:
        cached = self._names.get(pid)
        if cached is not None:
            return cached
        found = self._lookup(pid)
        if found[0] is not None:  # a failed lookup is retried at the next event, not cached
            self._names[pid] = found
        return found

    def _forget_gone(self) -> None:
        # A pid no GPU reports any more may be reused by another process later: drop its name.
        live: set[int] = set()
        for pids, _ in self._last.values():
            live |= pids
        for pid in [p for p in self._names if p not in live]:
            del self._names[pid]
        for pid in [p for p in self._ranks if p not in live]:
            del self._ranks[pid]
        for pid in [p for p in self._users if p not in live]:
            del self._users[pid]
        for pid in [p for p in self._uids if p not in live]:
            del self._uids[pid]
