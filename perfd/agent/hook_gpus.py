"""A rank whose process declares no RANK, placed on its GPU by what its step hook says ("any
process is a rank").

The aggregator places a rank on a GPU from the GPU process lists (collectors/nvml reads RANK from each
process's environment). A job of one process (``python3 train.py``, no torchrun) or a launcher that
sets no RANK left every rank unplaced: "the rank's GPU is unknown", and a co-tenant on its GPU went
unnamed. The step hook knows better: its records carry its rank, its pid (vouched for by the kernel's
credentials, collectors/hook/peers.py: the pid as this agent numbers it) and the UUID of the CUDA device
it computes on (wire.KIND_DEVICE: no pid namespace needed). Here the agent writes that into the GPU
process lists before they leave, so placement, GPU hints and incidents work unchanged:

- the process on a GPU whose pid is a hook's is that hook's rank (``rank_from`` "hook pid");
- a GPU whose UUID a hook named, where no listed process has the hook's pid (NVML lists no processes
  in some containers), gets the rank's process added (``rank_from`` "hook device", memory unknown);
- a process that declares a RANK of its own keeps it (its environment is the better word), and a
  process that declares another job is never taken for this job's rank.

The lists go out when NVML's change or every minute; a hook heard after its GPU's list went out makes
the agent send that list again, attributed, at once (:meth:`HookGpus.apply`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from perfd.core.events import GPU_PROCESSES, payload_of
from perfd.hook.wire import normalize_uuid

FROM_PID = "hook pid"  # the hook's verified pid is a process NVML lists on the GPU
FROM_DEVICE = "hook device"  # the hook named the GPU's UUID; its process is not in NVML's list


@dataclass(frozen=True)
class HookRankInfo:
    """What the attribution needs of one rank's hook (collectors.hook.HookRank)."""

    rank: int
    pid: int
    device_uuid: str | None


def hook_ranks(ranks: Mapping[int, object]) -> list[HookRankInfo]:
    """The hook collector's ``ranks`` (rank -> HookRank) as plain values."""
    out = []
    for r, info in list(ranks.items()):
        pid = getattr(info, "pid", None)
        uuid = getattr(info, "device_uuid", None)
        if isinstance(r, int) and isinstance(pid, int) and pid > 0:
            out.append(HookRankInfo(r, pid, normalize_uuid(uuid) if isinstance(uuid, str) else None))
    return out


def attribute(procs: list[dict[str, object]], uuid: str | None, ranks: Iterable[HookRankInfo],
              job: str | None, listed: frozenset[int] = frozenset()) -> list[tuple[int, int, str]]:
    """Write the hooks' ranks into one GPU's process list (in place); returns what was attributed,
    (rank, pid, how), for the caller to tell a change. ``listed``: the pids NVML lists on any GPU of
    the node (a hook's process listed on another GPU is placed there, never added here too)."""
    gpu_uuid = normalize_uuid(uuid) if uuid else None
    done: list[tuple[int, int, str]] = []
    for h in ranks:
        p = next((q for q in procs if q.get("pid") == h.pid), None)
        if p is not None:
            declared = p.get("job")
            if isinstance(p.get("rank"), int) or (job and isinstance(declared, str) and declared
                                                  and declared != job):
                continue  # its own RANK, or another job's process: not the hook's to relabel
            p["rank"], p["rank_from"] = h.rank, FROM_PID
            if job and not declared:
                p["job"] = job
            done.append((h.rank, h.pid, FROM_PID))
        elif gpu_uuid is not None and h.device_uuid == gpu_uuid and h.pid not in listed:
            procs.append({"pid": h.pid, "name": None, "user": None, "cmdline": None,
                          "used_memory_bytes": None, "rank": h.rank, "local_rank": None, "world_size": None,
                          "job": job or None, "rank_from": FROM_DEVICE})
            done.append((h.rank, h.pid, FROM_DEVICE))
    return done


class HookGpus:
    """Keeps each GPU's latest process list event as NVML gave it, attributes the hooks' ranks in the
    events of each batch, and re-sends a list whose attribution changed since it last went out."""

    def __init__(self, job: str | None) -> None:
        self.job = job or None
        self._raw: dict[str, dict[str, object]] = {}  # gpu -> its latest GPU_PROCESSES event, unattributed
        self._sent: dict[str, tuple[tuple[int, int, str], ...]] = {}  # gpu -> attribution last sent

    def apply(self, events: list[dict[str, object]], ranks: Iterable[HookRankInfo], now: float) -> None:
        """Attribute in place the process lists among ``events``; append a list again (attributed)
        for a GPU whose attribution changed while NVML had nothing new to say of it."""
        ranks = list(ranks)
        batch: dict[str, dict[str, object]] = {}
        for ev in events:
            gpu = self._gpu(ev)
            if gpu is not None:
                self._raw[gpu] = copy.deepcopy(ev)
                batch[gpu] = ev
        listed = frozenset(pid for raw in self._raw.values() for p in _entries(raw.get("payload"))
                           if isinstance(p, Mapping) and isinstance(pid := p.get("pid"), int))
        for gpu, ev in batch.items():
            self._sent[gpu] = self._attribute(ev, ranks, listed)
        if not ranks:
            return
        for gpu, raw in list(self._raw.items()):
            if gpu in batch:
                continue
            ev = copy.deepcopy(raw)
            got = self._attribute(ev, ranks, listed)
            if got != self._sent.get(gpu, ()):
                self._sent[gpu] = got
                ev["time"], ev["changed"] = now, True
                ev["text"] = f"{ev.get('text', 'compute processes')} (ranks placed by their step hooks)"
                events.append(ev)

    def _gpu(self, ev: Mapping[str, object]) -> str | None:
        if ev.get("kind") != GPU_PROCESSES.name or payload_of(ev, GPU_PROCESSES) is None:
            return None
        gpu = label_of(ev, "gpu")
        return gpu if isinstance(gpu, str) else None

    def _attribute(self, ev: dict[str, object], ranks: list[HookRankInfo], listed: frozenset[int]
                   ) -> tuple[tuple[int, int, str], ...]:
        procs = ev.get("payload")
        if not isinstance(procs, list) or not ranks:
            return ()
        uuid = label_of(ev, "uuid")
        return tuple(sorted(attribute(procs, uuid if isinstance(uuid, str) else None, ranks, self.job,
                                      listed)))


def _entries(payload: object) -> list[object]:
    """A process list event's payload as a list (a missing or empty one: no entries)."""
    return payload if isinstance(payload, list) else []


def label_of(ev: Mapping[str, object], key: str) -> object:
    """One of an event's labels (None where it has none, or no labels)."""
    labels = ev.get("labels")
    return labels.get(key) if isinstance(labels, Mapping) else None
