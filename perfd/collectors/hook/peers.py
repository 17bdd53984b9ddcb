"""Who sent a hook datagram: the kernel's word, not the datagram's (docs/security.md).

The hook socket may be open to the job's user or group, or to everyone (mode 0666, for a job of
another user): any process that may write it could put any pid and rank into a record, and the agent
runs as root and acts on the pids it is given (py-spy stacks, host evidence, captures). So the socket
has ``SO_PASSCRED`` set, every datagram arrives with ``SCM_CREDENTIALS`` (the sender's pid, uid and
gid, filled in by the kernel: an unprivileged sender cannot forge them), and a record's pid is taken
only when it is

- the sender's own pid (the hook's records always are), or its pid in its own pid namespace (a job
  in a container sending to a host agent: the kernel gives the host pid, the record the container's;
  the host pid is used), or
- a descendant of the sender running as the sender's user alone (real, effective, saved and
  filesystem uids all the sender's: a setuid child is not the sender's to name).

Anything else is refused, counted by reason and logged (rate-limited by the collector): the record
never becomes a step, a phase or a peer the agent would act on. The pid the collector then uses is the
kernel's (the host pid), and the sender's uid goes with it (:class:`Verified`).
"""

from __future__ import annotations

import socket
import struct
import time
from collections import OrderedDict
from dataclasses import dataclass

from perfd.core.procinfo import JOB_ENV, PROC, is_descendant, job_from_env, read_identity

UCRED = struct.Struct("iII")  # struct ucred: pid, uid, gid
ANCILLARY_BYTES = socket.CMSG_SPACE(UCRED.size) if hasattr(socket, "CMSG_SPACE") else 64
# A descendant found to be the sender's is believed for this long before /proc is read again (its
# uid could change: an exec of a setuid program); the sender's own pid needs no read at all.
VERDICT_TTL_S = 5.0
MAX_VERDICTS = 4096

@dataclass
class HookPeer:
    """A training process that has sent us records (the collector's latest word of each rank: requests
    to the hook go back to its address)."""

    rank: int
    pid: int  # as the kernel numbers it here (Verified)
    address: str | bytes
    last_step: int
    last_seen: float
    uid: int | None = None  # the sender's, from its credentials


# Refusal reasons (counted as the collector's errors "sender:<reason>").
NO_CREDENTIALS = "no_credentials"  # no SCM_CREDENTIALS with the datagram (SO_PASSCRED unavailable)
UNKNOWN_SENDER = "unknown_sender"  # the kernel's pid is 0: the sender is in a pid namespace we do not see
NOT_SENDER = "claimed_pid_not_sender"  # neither the sender nor a descendant of it
OTHER_UID = "claimed_pid_other_uid"  # a descendant that does not run as the sender's user alone
NOT_JOB_USER = "not_job_user"  # the sender does not run as the job's user
OTHER_JOB = "other_job"  # the sender's environment declares another job (PERFD_JOB)
NOT_LAUNCHED = "not_launched"  # a perfd launch's agent: the sender declares no job (not under the launch)


@dataclass(frozen=True)
class Sender:
    """The credentials the kernel attached to a datagram."""

    pid: int
    uid: int
    gid: int


@dataclass(frozen=True)
class Verified:
    """A record's process as the agent may act on it: the host pid and the sender's uid."""

    pid: int
    uid: int


def credentials(ancdata: list[tuple[int, int, bytes]]) -> Sender | None:
    """The SCM_CREDENTIALS of a datagram's ancillary data, None when there are none."""
    kind = getattr(socket, "SCM_CREDENTIALS", None)
    for level, typ, data in ancdata:
        if level == socket.SOL_SOCKET and typ == kind and len(data) >= UCRED.size:
            pid, uid, gid = UCRED.unpack_from(data)
            return Sender(pid, uid, gid)
    return None


def enable(sock: socket.socket) -> bool:
    """Ask the kernel to attach the sender's credentials to every datagram (before bind, so no
    datagram arrives without them). False where the platform has no SO_PASSCRED."""
    opt = getattr(socket, "SO_PASSCRED", None)
    if opt is None:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, opt, 1)
    except OSError:
        return False
    return True


class SenderCheck:
    """Decides which pid a record of a sender names (see the module docstring). Not thread-safe:
    the collector calls it from ``collect`` only."""

    def __init__(self, proc: str = PROC, ttl_s: float = VERDICT_TTL_S) -> None:
        self.proc = proc
        self.ttl_s = ttl_s
        # (sender pid, sender uid, claimed pid) -> (verdict: the pid to use or a refusal, when decided)
        self._verdicts: OrderedDict[tuple[int, int, int], tuple[int | str, float]] = OrderedDict()

    def resolve(self, sender: Sender | None, claimed: int) -> Verified | str:
        """The process a record claiming ``claimed`` may be taken for, or the reason it may not."""
        if sender is None:
            return NO_CREDENTIALS
        if sender.pid <= 0:
            return UNKNOWN_SENDER
        if claimed == sender.pid:
            return Verified(sender.pid, sender.uid)
        now = time.monotonic()
        key = (sender.pid, sender.uid, claimed)
        held = self._verdicts.get(key)
        if held is not None and now - held[1] < self.ttl_s:
            got = held[0]
        else:
            got = self._decide(sender, claimed)
            self._verdicts[key] = (got, now)
            self._verdicts.move_to_end(key)
            while len(self._verdicts) > MAX_VERDICTS:
                self._verdicts.popitem(last=False)
        return Verified(got, sender.uid) if isinstance(got, int) else got

    def _decide(self, sender: Sender, claimed: int) -> int | str:
        me = read_identity(sender.pid, self.proc)
        if me is not None and len(me.nspid) > 1 and me.nspid[-1] == claimed:
            return sender.pid  # the sender's own pid as its namespace numbers it: the host pid stands
        if claimed <= 0 or not is_descendant(claimed, sender.pid, self.proc):
            return NOT_SENDER
        child = read_identity(claimed, self.proc)
        if child is None or child.uid != sender.uid:
            return OTHER_UID
        return claimed


UNREADABLE = object()  # a sender whose environment the agent cannot read: its job is not known


class JobDeclarations:
    """The job each sending process declares in its environment (``PERFD_JOB``, what `perfd launch`
    sets), read from /proc at most every ``ttl_s`` per pid. Only that variable is looked at (the
    rest of an environment may hold secrets). Not thread-safe: the collector calls it from
    ``collect`` only."""

    def __init__(self, proc: str = PROC, ttl_s: float = VERDICT_TTL_S) -> None:
        self.proc, self.ttl_s = proc, ttl_s
        self._held: OrderedDict[int, tuple[object, float]] = OrderedDict()

    def declared(self, pid: int) -> object:
        """The job ``pid`` declares (a str), None when it declares none, UNREADABLE when its
        environment cannot be read (another user's without privileges, gone)."""
        now = time.monotonic()
        held = self._held.get(pid)
        if held is not None and now - held[1] < self.ttl_s:
            return held[0]
        got = self._read(pid)
        self._held[pid] = (got, now)
        self._held.move_to_end(pid)
        while len(self._held) > MAX_VERDICTS:
            self._held.popitem(last=False)
        return got

    def _read(self, pid: int) -> object:
        try:
            with open(f"{self.proc}/{pid}/environ", "rb") as f:
                env = f.read(1 << 20)  # the kernel's limit on an environment is larger; a job's is not
        except OSError:
            return UNREADABLE
        prefix = JOB_ENV.encode() + b"="
        for entry in env.split(b"\0"):
            if entry.startswith(prefix):
                return job_from_env(entry[len(prefix):].decode("utf-8", "replace"))
        return None

    def refusal(self, pid: int, job: str, other_jobs: bool, required: bool) -> str | None:
        """Why records of ``pid`` are not ``job``'s (OTHER_JOB, NOT_LAUNCHED), or None: with
        ``other_jobs`` a process declaring another job is refused; with ``required`` one declaring
        none too (a perfd launch's agent: its job's processes all carry PERFD_JOB). A process whose
        environment cannot be read is taken (its uid was checked already)."""
        if not (other_jobs or required):
            return None
        got = self.declared(pid)
        if got is UNREADABLE or got == job:
            return None
        if got is None:
            return NOT_LAUNCHED if required else None
        return OTHER_JOB
