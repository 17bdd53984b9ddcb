"""Which rank and which job a local process is, and its name and user: read through psutil from the
process's environment and status (the agent's collectors share these: collectors/nvml names the
processes on a GPU, collectors/ranks the processes of a job's ranks). Never raises: what is not
visible (another user's process without privileges, a process gone) is absent.

Only the variables named in RANK_ENV and JOB_ENV are read from a process's environment; the rest of
it (which may hold secrets) is never looked at or sent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

CMDLINE_MAX = 200

NameLookup = Callable[[int], "tuple[str | None, str | None]"]


def psutil_lookup(pid: int) -> tuple[str | None, str | None]:
    """(name, cmdline) of ``pid`` when visible to this process, else Nones. Never raises."""
    try:
        import psutil

        p = psutil.Process(pid)
        name = p.name()
        try:
            cmd = " ".join(p.cmdline())
        except (psutil.AccessDenied, psutil.ZombieProcess):
            cmd = None
        return name, cmd
    except Exception:  # NoSuchProcess, AccessDenied, psutil missing: the name is absent
        return None, None


UserLookup = Callable[[int], "str | None"]


def psutil_user(pid: int) -> str | None:
    """The user name owning ``pid`` (its uid as text where the name is not in this host's or
    container's user database); None when the process is not visible. Never raises."""
    try:
        import psutil

        p = psutil.Process(pid)
        try:
            return str(p.username())
        except KeyError:  # a uid with no name here (another container's user): the uid says who
            return str(p.uids().real)
    except Exception:  # NoSuchProcess, AccessDenied, psutil missing: absent
        return None


# Environment variables that say which rank a process is: torchrun/torch.distributed, SLURM, Open
# MPI; and JOB_ENV, the job it belongs to. Only these are read; the rest of a process's environment
# (which may hold secrets) is never looked at or sent.
RANK_ENV = {
    "RANK": "rank", "LOCAL_RANK": "local_rank", "WORLD_SIZE": "world_size",
    "SLURM_PROCID": "rank", "SLURM_LOCALID": "local_rank", "SLURM_NTASKS": "world_size",
    "OMPI_COMM_WORLD_RANK": "rank", "OMPI_COMM_WORLD_LOCAL_RANK": "local_rank",
    "OMPI_COMM_WORLD_SIZE": "world_size",
}
# The job a process belongs to: set by `perfd launch`, by perfd-slurm-run, or in a pod spec (from
# the pod's perfd.dev/job label through the downward API). It places a GPU in a job whatever agent
# reports the GPU (a node DaemonSet's agent serves no job); see docs/prometheus.md.
JOB_ENV = "PERFD_JOB"
JOB_NAME_MAX = 256  # bytes, as the aggregator's cap on job names (perfd.limits.MAX_JOB_NAME_BYTES)
EnvLookup = Callable[[int], "Mapping[str, int | str]"]


def job_from_env(value: str | None) -> str | None:
    """A usable job name from JOB_ENV's value, None when absent, empty or over the cap."""
    if value is None:
        return None
    value = value.strip()
    return value if value and len(value.encode()) <= JOB_NAME_MAX else None


def psutil_rank_env(pid: int) -> dict[str, int | str]:
    """{rank, local_rank, world_size, job} from the process's environment where visible (same
    user or root, host pid namespace); empty when not. The first variable found for a key wins, in
    the order of RANK_ENV (torch's own variables first). Never raises."""
    try:
        import psutil

        env = psutil.Process(pid).environ()
    except Exception:  # AccessDenied, NoSuchProcess, psutil missing
        return {}
    out: dict[str, int | str] = {}
    for var, key in RANK_ENV.items():
        if key not in out and var in env:
            try:
                out[key] = int(env[var])
            except ValueError:
                continue
    job = job_from_env(env.get(JOB_ENV))
    if job is not None:
        out["job"] = job
    return out
