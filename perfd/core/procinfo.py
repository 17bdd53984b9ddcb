"""Which rank and which job a local process is, and its name and user: read through psutil from the
process's environment and status (the agent's collectors share these: collectors/nvml names the
processes on a GPU, collectors/ranks the processes of a job's ranks). Never raises: what is not
visible (another user's process without privileges, a process gone) is absent.

Only the variables named in RANK_ENV and JOB_ENV are read from a process's environment; the rest of
it (which may hold secrets) is never looked at or sent.

Who a process is, as the kernel says (:func:`read_identity`: its uids, parent, pid in each pid
namespace, start time), is what the agent checks before it acts on a process another source named
(a step hook's datagram, collectors/hook): a process is one user's only when its real, effective,
saved and filesystem uids are that user's (a setuid child of a job is not the job's user's).

Command lines (docs/security.md "Command lines and stacks"): only the job's own processes carry
theirs, every value not known to be safe masked (:func:`perfd.core.redact.redact_cmdline`, an allow-list);
another process is named by pid, user and command name only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

# Where perfd's collectors have always found them (re-exported).
from perfd.core.redact import REDACTED as REDACTED
from perfd.core.redact import redact_cmdline as redact_cmdline

CMDLINE_MAX = 200
PROC = "/proc"
MAX_ANCESTRY = 64  # parents walked from a process to find an ancestor (a job's tree is a few deep)

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
JOB_NAME_MAX = 256  # bytes, as the aggregator's cap on job names (perfd.core.limits.MAX_JOB_NAME_BYTES)
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


# ---- who a process is (the kernel's word) ------------------------------------------------------------

@dataclass(frozen=True)
class ProcIdentity:
    """What /proc/<pid>/status and /proc/<pid>/stat say of who a process is."""

    pid: int
    ppid: int
    uids: tuple[int, ...]  # real, effective, saved, filesystem
    nspid: tuple[int, ...]  # its pid in each pid namespace, this one first, its own innermost last
    start_ticks: int  # start time since boot (clock ticks): a reused pid has another

    @property
    def uid(self) -> int | None:
        """The one user the process runs as; None when its uids differ (a setuid program)."""
        return self.uids[0] if self.uids and len(set(self.uids)) == 1 else None


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(64 << 10).decode("utf-8", "replace")
    except OSError:  # gone, not readable: absent
        return None


def read_identity(pid: int, proc: str = PROC) -> ProcIdentity | None:
    """Who ``pid`` is, None when it is gone or unreadable. Never raises."""
    if pid <= 0:
        return None
    status, stat = _read(f"{proc}/{pid}/status"), _read(f"{proc}/{pid}/stat")
    if status is None or stat is None:
        return None
    fields: dict[str, list[str]] = {}
    for line in status.splitlines():
        key, _, rest = line.partition(":")
        if key in ("PPid", "Uid", "NSpid"):
            fields[key] = rest.split()
    rest_of_stat = stat[stat.rfind(")") + 2:].split()
    try:
        nspid = tuple(int(v) for v in fields.get("NSpid", [str(pid)]))
        return ProcIdentity(pid, int(fields["PPid"][0]), tuple(int(v) for v in fields["Uid"]),
                            nspid or (pid,), int(rest_of_stat[19]))
    except (KeyError, IndexError, ValueError):
        return None


def user_id(user: object) -> int | None:
    """A uid from a configured user: an int (or digits) as it is, a name from the user database;
    None for None or "". ValueError (saying which) for anything else, or a name this host lacks."""
    if user is None or user == "":
        return None
    if isinstance(user, int) and not isinstance(user, bool) and user >= 0:
        return user
    if isinstance(user, str):
        if user.isdigit():
            return int(user)
        try:
            import pwd

            return pwd.getpwnam(user).pw_uid
        except (ImportError, KeyError):
            raise ValueError(f"no user named {user!r} on this host") from None
    raise ValueError(f"a user must be a name or a uid, not {user!r}")


def uid_alone(pid: int, proc: str = PROC) -> int | None:
    """The one uid ``pid`` runs as (real, effective, saved and filesystem alike); None when it is gone,
    unreadable, or runs as several (a setuid program)."""
    ident = read_identity(pid, proc)
    return ident.uid if ident is not None else None


def is_descendant(pid: int, ancestor: int, proc: str = PROC) -> bool:
    """Whether ``ancestor`` is a parent, grandparent, ... of ``pid`` (at most MAX_ANCESTRY up)."""
    cur = pid
    for _ in range(MAX_ANCESTRY):
        ident = read_identity(cur, proc)
        if ident is None or ident.ppid <= 0:
            return False
        if ident.ppid == ancestor:
            return True
        cur = ident.ppid
    return False


def same_process(pid: int, start_ticks: int | None, uid: int | None, proc: str = PROC) -> bool:
    """``pid`` is still the process it was (same start time) and runs as ``uid`` alone: what the
    agent checks right before it acts on a process it followed (a pid reused by another user's
    process, or a process that became setuid, fails)."""
    ident = read_identity(pid, proc)
    return (ident is not None and (start_ticks is None or ident.start_ticks == start_ticks)
            and uid is not None and ident.uid == uid)


# ---- what is shown of a process ---------------------------------------------------------------------

def shown_cmdline(cmd: str | None, own: bool, cut: int = CMDLINE_MAX) -> str | None:
    """What perfd shows of a process's command line: the job's own process's, redacted and cut to
    ``cut`` characters; nothing of any other process's (its pid, user and name say which it is)."""
    if cmd is None or not own:
        return None
    return redact_cmdline(cmd)[:cut]


# --- a process's pod -------------------------------------------------------------------------------
# The containers of a Kubernetes pod with shareProcessNamespace: true share one pid namespace: the
# trainer's ranks and the job's sidecar agent, whose PERFD_JOB comes from the pod's perfd.dev/job label.
# A GPU process that declares no job of its own belongs to the job a process of its pid namespace
# declares, when that namespace is not the node agent's own (hostPID: the node's, where processes of
# every job and of none live side by side). So the trainer needs no PERFD_JOB.
POD_JOB_TTL_S = 30.0  # a pod's job is looked up again this often (a pod's label does not change)
MAX_POD_NAMESPACES = 4096  # pid namespaces whose job is remembered (pods on one node)


def pid_namespace(pid: int | str, proc: str = "/proc") -> int | None:
    """The inode of ``pid``'s pid namespace (``/proc/PID/ns/pid`` reads ``pid:[4026532178]``), None
    when not visible (gone, or another user's without privileges). Never raises."""
    try:
        link = os.readlink(f"{proc}/{pid}/ns/pid")
    except OSError:
        return None
    inode = link[link.find("[") + 1:-1]
    return int(inode) if link.startswith("pid:[") and inode.isdigit() else None


class PodJobs:
    """The job a process's pod declares (see above): ``job_of(pid)``. A namespace's answer (a job or
    none) is kept POD_JOB_TTL_S; finding it reads the pid namespace of each process (a readlink each)
    and the environment of those in that namespace only, first the oldest (lowest pid)."""

    def __init__(self, proc: str = "/proc", env_lookup: EnvLookup = psutil_rank_env,
                 clock: Callable[[], float] = time.monotonic, ttl_s: float = POD_JOB_TTL_S) -> None:
        self.proc, self._env, self._clock, self.ttl_s = proc, env_lookup, clock, ttl_s
        self.own = pid_namespace("self", proc)  # the agent's own: a node agent's is the node's
        self._known: dict[int, tuple[str | None, float]] = {}
        self.scans = 0  # namespaces looked up (a test's and a benchmark's reading)

    def job_of(self, pid: int) -> str | None:
        ns = pid_namespace(pid, self.proc)
        if ns is None or ns == self.own:
            return None
        now = self._clock()
        held = self._known.get(ns)
        if held is not None and now - held[1] < self.ttl_s:
            return held[0]
        job = self._scan(ns)
        if len(self._known) >= MAX_POD_NAMESPACES:
            self._known.clear()
        self._known[ns] = (job, now)
        return job

    def _scan(self, ns: int) -> str | None:
        self.scans += 1
        try:
            pids = sorted(int(p) for p in os.listdir(self.proc) if p.isdigit())
        except OSError:
            return None
        for p in pids:
            if pid_namespace(p, self.proc) == ns:
                job = self._env(p).get("job")
                if isinstance(job, str) and job:
                    return job
        return None


INIT_PID_NAMESPACE = 0xEFFFFFFC  # the host's own pid namespace (Linux: PROC_PID_INIT_INO, fixed)


def pod_ranks(job: str, proc: str = "/proc", env_lookup: EnvLookup = psutil_rank_env,
              limit: int = 4096) -> dict[int, tuple[int, int | None]] | None:
    """The rank processes of the caller's own pod: every process of its pid namespace (a pod with
    shareProcessNamespace: true shows its containers' processes, the trainer's among them) that
    declares a rank (RANK, SLURM_PROCID, ...) and no job but ``job``, as {pid: (rank, parent pid)}.
    None when the caller runs in the host's pid namespace (every process of the node there: no pod).
    ``limit``: processes looked at, at most."""
    own = pid_namespace("self", proc)
    if own is None or own == INIT_PID_NAMESPACE:
        return None
    me = os.getpid()
    out: dict[int, tuple[int, int | None]] = {}
    try:
        pids = sorted(int(p) for p in os.listdir(proc) if p.isdigit())[:limit]
    except OSError:
        return out
    for pid in pids:
        if pid == me or pid_namespace(pid, proc) != own:
            continue
        env = env_lookup(pid)
        rank, declared = env.get("rank"), env.get("job")
        if not isinstance(rank, int) or (isinstance(declared, str) and declared != job):
            continue
        out[pid] = (rank, _ppid(pid, proc))
    return out


def _ppid(pid: int, proc: str) -> int | None:
    """The parent's pid from /proc/PID/stat (the field after the command's closing parenthesis)."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            rest = f.read().rsplit(b")", 1)[1].split()
        return int(rest[1])
    except (OSError, IndexError, ValueError):
        return None
