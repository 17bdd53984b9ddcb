"""The agent's capture executor: capture commands from the aggregator → Kineto/nsys/ncu on this node.

Knows which pid is which rank from the NVML collector's process lists (each process's RANK), asks
the step hook for step-aligned nsys and ncu ranges when the job runs one (and cancels an ncu range
past its time budget), and for a Kineto trace of its own process when the job polls no Kineto daemon
(perfd.capture.hook_trace), and reports progress back as events (capture_started / capture_finished /
capture_failed) through the same stream as the data. Ranks under ncu are found where ``perfd
ncu-exec`` records them, under this agent's capture directory (``<capture_dir>/ncu``).

Whose process a rank is: a GPU process's ``RANK`` is its own word. With a job user
(AgentConfig.job_uid: ``job_user``, the launch manifest's, or the agent's own), a process is taken for
a rank only when it runs as that uid alone, checked when it is learnt and again right before a capture
names it (a pid reused by another user's process is not armed); the step hook's senders are the job
user's already (collectors/hook). Without one (a node agent), a process that runs as several uids (a
setuid program) is never a target. Another user's ``RANK=3`` process once became the capture target
for rank 3.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from perfd.capture.dynolog import (
    DYNOLOG_PORT,
    DynologClient,
    DynologError,
    DynologKineto,
    kineto_socket_taken,
    socket_holders,
)
from perfd.capture.kineto_daemon import DEFAULT_SOCKET_NAME, KinetoDaemon, KinetoDaemonError
from perfd.capture.manager import CaptureManager
from perfd.capture.ncu_exec import NcuExecutor
from perfd.capture.nsys_exec import RANGE_SUBDIR, NsysExecutor, default_capture_root
from perfd.capture.store import CaptureStore
from perfd.collectors.collector import Collector
from perfd.core.events import GPU_PROCESSES, HOOK_PROFILE, payload_of
from perfd.core.procinfo import uid_alone

if TYPE_CHECKING:
    from perfd.transport.codec import Command

log = logging.getLogger(__name__)

KINETO_SQUATTED = "socket_squatted"  # another user holds the Kineto daemon's name (kineto_errors)


class AgentCaptures:
    def __init__(self, job: str, root: str | None, quota_bytes: int,
                 emit: Callable[[dict[str, object]], None], kineto: bool = True,
                 hook: Collector | None = None, kineto_socket: str = DEFAULT_SOCKET_NAME,
                 dynolog_port: int = DYNOLOG_PORT, kineto_socket_dir: str | None = None,
                 rank_pids: Callable[[str], Mapping[int, int]] | None = None, job_uid: int | None = None,
                 uid_of: Callable[[int], int | None] = uid_alone) -> None:
        self.job = job
        self.job_uid, self._uid_of = job_uid, uid_of
        self.foreign = 0  # GPU processes claiming a rank not taken: another user's, or setuid
        # The rank processes the ranks collector follows (a sidecar's: those of its pod), by job.
        self._followed = rank_pids
        self.root = Path(root) if root else default_capture_root()
        self.store = CaptureStore(self.root, quota_bytes)
        self.kineto: KinetoDaemon | DynologKineto | None = None
        self.kineto_errors: dict[str, int] = {}  # why the Kineto daemon is off (KINETO_SQUATTED)
        if kineto and kineto_socket_dir:
            try:  # a file socket (the jobs set KINETO_IPC_SOCKET_DIR): no host-wide name to share
                self.kineto = KinetoDaemon(socket_dir=kineto_socket_dir)
                self.kineto.start()
            except (KinetoDaemonError, OSError) as exc:
                log.warning("Kineto daemon not started in %s: %s", kineto_socket_dir, exc)
                self.kineto = None
        elif kineto and kineto_socket_taken(kineto_socket) and not self._squatted(kineto_socket):
            # dynolog serves this node (root or this agent's user holds the Kineto socket): do not
            # fight it for the socket, hand our trace configs to it over its RPC port instead.
            try:
                self.kineto = DynologKineto(DynologClient(port=dynolog_port)).start()
                log.warning("the Kineto socket is taken: Kineto captures go through dynolog on port %d",
                            dynolog_port)
            except DynologError as exc:
                log.warning("the Kineto socket is taken and dynolog does not answer (%s): Kineto "
                            "captures are off; nsys captures still work", exc)
        elif kineto and self.kineto_errors.get(KINETO_SQUATTED) is None:
            try:
                self.kineto = KinetoDaemon(socket_name=kineto_socket)
                self.kineto.start()
            except (KinetoDaemonError, OSError) as exc:
                # Taken between the check and the bind, or another failure: Kineto captures are
                # then refused with this reason; nsys captures still work.
                log.warning("Kineto daemon not started: %s", exc)
                self.kineto = None
        nsys = self.nsys = NsysExecutor(range_dir=str(self.root / RANGE_SUBDIR))
        self._lock = threading.Lock()
        self._rank_pid: dict[int, tuple[int, int]] = {}  # rank -> (pid, the uid it ran as alone)
        requester = getattr(hook, "request_profile", None)
        canceller = getattr(hook, "cancel_profile", None)
        peers = getattr(hook, "peers", None)
        self._hook_peers: Mapping[int, object] | None = peers  # rank -> collectors.hook HookPeer
        # What each rank's hook said of its process (collectors.hook HookRank): whether it can open a
        # Kineto trace itself, for a job started without KINETO_USE_DAEMON.
        self._hook_ranks: Mapping[int, object] | None = getattr(hook, "ranks", None)
        tracer = getattr(hook, "request_trace", None)
        self.manager = CaptureManager(
            self.store, self.kineto, nsys if nsys.available() is None else None,
            hook_requester=requester, pids_for_ranks=self._pids_for_ranks, emit=emit,
            hook_last_step=(lambda r: getattr(peers.get(r), "last_step", None)) if peers is not None
            else None, ncu=NcuExecutor(self.root), hook_canceller=canceller,
            hook_tracer=tracer, hook_can_trace=self._hook_can_trace if tracer is not None else None)

    def _squatted(self, name: str) -> bool:
        """Whether a process of another user than root and this agent's holds the Kineto daemon's
        abstract name: then it, not a dynolog, receives the jobs' polls and could
        answer them, and its RPC port would be its too. Said in an error naming it and counted;
        Kineto on-demand captures stay off (nothing is handed to it) until the agent restarts with
        the name free. A holder this agent cannot see (a non-root agent) is not trusted either."""
        holders = socket_holders(name)
        if holders is None:
            return False  # freed meanwhile: the daemon binds it below
        foreign = [h for h in holders if h.uid not in (0, os.geteuid())]
        if holders and not foreign:
            return False
        self.kineto_errors[KINETO_SQUATTED] = self.kineto_errors.get(KINETO_SQUATTED, 0) + 1
        who = ", ".join(map(str, foreign)) if foreign else "a process this agent cannot see (not root?)"
        log.error("the Kineto daemon socket %r is held by %s, not by root or this agent's user: it "
                  "receives the jobs' Kineto polls and could answer them, so perfd neither shares it nor "
                  "hands it trace configs; Kineto on-demand captures are off (counted as %s). Stop that "
                  "process and restart the agent (it binds the name at its start, before users can), or "
                  "give jobs a private socket folder (kineto_socket_dir, KINETO_IPC_SOCKET_DIR)",
                  name, who, KINETO_SQUATTED)
        return True

    def _hook_can_trace(self, rank: int) -> bool:
        """The rank's hook can trace and its process polls no Kineto daemon, and the hook that said so
        is the one requests go to (the same process)."""
        info = (self._hook_ranks or {}).get(rank)
        peer = (self._hook_peers or {}).get(rank)
        return (info is not None and peer is not None and bool(getattr(info, "can_trace", False))
                and getattr(info, "pid", None) == getattr(peer, "pid", None))

    def observe(self, events: list[dict[str, object]]) -> None:
        """Learn rank → pid from process lists (only processes of this agent's job: one that declares
        another job in its environment is that job's rank, not ours); pass the hook's profile events
        to the manager."""
        for ev in events:
            kind = ev.get("kind")
            procs = payload_of(ev, GPU_PROCESSES) if kind == GPU_PROCESSES.name else None
            if procs is not None:
                with self._lock:
                    for p in procs:
                        declared = p.get("job")
                        if declared and declared != self.job:
                            continue
                        if isinstance(p.get("rank"), int) and isinstance(p.get("pid"), int):
                            pid = int(p["pid"])
                            uid = self._owner(pid)
                            if uid is None:
                                self.foreign += 1
                                continue
                            self._rank_pid[int(p["rank"])] = (pid, uid)
            elif kind == HOOK_PROFILE.name:
                self.manager.on_hook_event(ev)

    def _pids_for_ranks(self, job: str, ranks: tuple[int, ...]) -> Mapping[int, int]:
        """rank -> pid: from the GPU process lists (RANK in each process's environment), else the
        rank processes the ranks collector follows (a job's sidecar: those of its pod, in the pod's
        pid namespace as the ranks' Kineto requests name them), else from the step hook's senders
        (their rank, and the pid the kernel's credentials vouched for: collectors/hook/peers.py), for
        jobs without a GPU context yet, or an agent without NVML."""
        with self._lock:
            held = dict(self._rank_pid)
        # Checked again now: the pid is still a process of the uid it was learnt with.
        known = {r: pid for r, (pid, uid) in held.items() if self._uid_of(pid) == uid}
        for rank, followed in (self._followed(job) if self._followed is not None else {}).items():
            known.setdefault(int(rank), int(followed))
        for rank, peer in list((self._hook_peers or {}).items()):
            pid = getattr(peer, "pid", None)
            if isinstance(pid, int) and rank not in known:
                known[int(rank)] = pid
        if not ranks:
            return known
        return {r: known[r] for r in ranks if r in known}

    def _owner(self, pid: int) -> int | None:
        """The uid ``pid`` runs as alone when it may be the job's (the job user's, when one is known)."""
        uid = self._uid_of(pid)
        if uid is None or (self.job_uid is not None and uid != self.job_uid):
            return None
        return uid

    def handle(self, command: Command) -> None:
        if getattr(command, "kind", "") == "capture":
            self.manager.handle(command)
        else:
            log.warning("command %s of kind %s: no executor for it", getattr(command, "id", "?"),
                        getattr(command, "kind", "?"))

    def close(self, timeout_s: float = 5.0) -> None:
        """End every capture and the Kineto daemon within ``timeout_s``: the captures are told first,
        then the daemon stops, which cancels its armings (a capture waiting for a rank's poll ends at
        once instead of at its arming's end, 5 s at least), then the capture threads
        are waited for."""
        self.manager.stop()
        if self.kineto is not None:
            self.kineto.stop()
        if not self.manager.wait_idle(timeout_s):
            log.warning("captures still running %.1f s after the agent was told to stop: left behind "
                        "(their threads end with the process)", timeout_s)
