"""Which job a GPU belongs to, from what runs on it (pure; the agent and the aggregator both ask).

A GPU belongs to the job its compute processes declare (collectors/nvml reads JOB_ENV, PERFD_JOB,
from each process's environment, as it reads RANK), whatever agent reports the GPU: the node
DaemonSet's agent serves no job, yet its GPU series must land in the job that runs there. A GPU whose
processes declare no job belongs to the job of the agent that reports it, if that agent serves one
(a job's sidecar that sees only its job's GPUs); otherwise to no job (an idle GPU, or a job started
without PERFD_JOB): it is then exported without ``job_name``, never under a made-up job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def declared_jobs(procs: Sequence[Mapping[str, object]]) -> frozenset[str]:
    """Every job some process on the GPU declares: each is a job of that GPU (its ranks run there;
    the others' processes are the co-tenants its GPU hints name)."""
    return frozenset(j for p in procs if isinstance(j := p.get("job"), str) and j)


def declared_job(procs: Sequence[Mapping[str, object]]) -> str | None:
    """The one job a GPU's series are labelled with (job_name): the job its processes declare. Two
    jobs on one GPU (time slicing, MPS, a stray process of another job) are rare; the one holding
    more GPU memory wins, then the first name, so the answer is stable. Views of a job (its GPUs,
    rank placement) take every GPU where it runs: :func:`declared_jobs`."""
    held: dict[str, int] = {}
    for p in procs:
        job = p.get("job")
        if isinstance(job, str) and job:
            mem = p.get("used_memory_bytes")
            held[job] = held.get(job, 0) + (mem if isinstance(mem, int) and not isinstance(mem, bool) else 0)
    if not held:
        return None
    return min(held, key=lambda j: (-held[j], j))


def gpu_job(procs: Sequence[Mapping[str, object]] | None, agent_job: str | None) -> str | None:
    """The GPU's job: what its processes declare, else the reporting agent's job (None: no job).
    ``procs`` None: no process list known for the GPU."""
    return (declared_job(procs) if procs else None) or agent_job or None
