"""The ``hook`` collector: receives step records from perfd step hooks in training processes.

Binds a Unix datagram socket (the path the hooks send to) and turns each record into a
``StepRecord`` for the rank the hook reports: step time, data wait and compute as the timers
``data-wait`` and ``compute`` (the hook's timer names, perfd.core.model), and the hook's
rolling percentiles as fields, ``tokens_per_step`` and ``flops_per_step`` as the record's numbers
(:mod:`perfd.collectors.hook.step_records`, with the pauses a rank announced before its step).
It also sends profile requests back to a rank's hook (``request_profile``), to the address its
records came from, and reports the hook's answers as ``hook_profile`` events.

Why a receiver thread: Linux queues at most ``net.unix.max_dgram_qlen`` datagrams (default 10) at
a Unix datagram socket whatever ``SO_RCVBUF`` says; beyond that the hooks' ``sendto`` fails with
EAGAIN and the records are dropped (the hook counts them). A collector that drained only once per
``collect()`` would lose records of a few fast ranks. So a daemon thread blocks in ``recvmsg`` and
queues raw datagrams (:mod:`perfd.collectors.hook.inbox`: bounded in datagrams and in bytes, ``max_queued``,
``max_queued_bytes``, and per sending process; another uid's datagrams are refused there, before they
take room); ``collect()`` takes them without blocking and decodes them. (The hooks also batch
records, ~10 datagrams per second per rank.)

Never raises from ``collect``: malformed datagrams are counted by reason and dropped.

Who sent it (:mod:`perfd.collectors.hook.peers`): the socket passes the sender's credentials (SO_PASSCRED),
and a record naming a pid that is neither the sender's nor a descendant of it running as the sender's
user is refused (``sender:<reason>``, one log line per reason and minute with the count): the agent
acts only on processes the kernel says the sender may name.

Whose ranks: the job's user's only. ``job_user`` names it (a user name or uid;
``perfd launch`` records the launching user in its manifest, which the agent passes on); without it,
the agent's own user. A record from any other uid is refused (``sender:not_job_user``) whatever rank
it names and whenever it comes: a rank is never held first-come, so another user who sends step
records for ranks 0-7 before the job starts locks no real rank out (131 real steps were once refused
that way while the squatter's 33 were shown).

Requests back to the hooks (:mod:`perfd.collectors.hook.requests`): a status is taken only for a request
this agent sent to that very process (``sender:unsolicited_status`` otherwise); a trace's file is
named by its hook (``KIND_TRACE_WRITTEN``) and reported with the sender's uid, which must own it.

What each rank's hook says of its process is kept in ``ranks`` (:class:`HookRank`): its pid (as
verified above), the CUDA device it computes on (UUID: the agent places a rank whose process declares
no RANK on its GPU, perfd.agent.hook_gpus) and what it can do for a capture (a Kineto trace of its
own, or the Kineto daemon: perfd.agent.capture_executor). Step records a hook could not deliver (its backlog
overflowed while the agent was away) are counted here when a later record says so (``records_lost``).

Where it listens: by default ``<runtime dir>/hook.sock`` (:func:`perfd.hook.wire.default_socket_path`),
in a folder made private to this user (0700, :mod:`perfd.core.privdir`), so another local user can neither
bind the name first (which disabled the collector when the default was ``/tmp/perfd-hook.sock``) nor
send records into it. A socket path given in the config is used as given; a socket already there
that belongs to another user is refused (counted as ``bind_failed`` with the owner), never removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import socket
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from perfd.collectors.collector import Capabilities, Collected
from perfd.collectors.hook import peers as P
from perfd.collectors.hook.config import HookConfig
from perfd.collectors.hook.inbox import Inbox
from perfd.collectors.hook.model_record import take_model
from perfd.collectors.hook.requests import Requests, RequestSender
from perfd.collectors.hook.step_records import MAX_PAUSE_RANKS, Pauses, step_record
from perfd.core.bounds import LAYOUT_BOUNDS, STEP_REASON, check_step_record, in_bounds
from perfd.core.dtypes import normalize_dtype
from perfd.core.events import HOOK_PROFILE, JOB_PHASE
from perfd.core.limits import HOOK_MAX_RANKS, REFUSAL_LOG_INTERVAL_S
from perfd.core.model import CPU, CUDA, HOOK_FRAMEWORK, Device, JobInfo, ModelSpec, ParallelLayout, StepRecord
from perfd.core.privdir import UnsafeDirError, private_dir
from perfd.hook import wire

log = logging.getLogger(__name__)


@dataclass
class HookRank:
    """What a rank's hook said of its process (job and device records)."""

    rank: int
    pid: int
    flags: int = 0  # wire.JOB_FLAG_*
    device_uuid: str | None = None
    device_index: int | None = None
    cuda_timed: bool = False  # a step record of its came with wire.FLAG_CUDA (timed with CUDA events)

    @property
    def device(self) -> Device | None:
        """Where the rank computes: CUDA when its hook says so (its job flags, a CUDA-timed step, a
        CUDA device record), CPU when its hook found torch without CUDA; None when it has not said."""
        if self.cuda_timed or self.device_uuid is not None or self.flags & wire.JOB_FLAG_CUDA:
            return CUDA
        return CPU if self.flags & wire.JOB_FLAG_NO_CUDA else None

    @property
    def can_trace(self) -> bool:
        """The hook can open a Kineto trace itself and the process does not poll the Kineto daemon."""
        return bool(self.flags & wire.JOB_FLAG_CAN_TRACE) and not self.flags & wire.JOB_FLAG_KINETO_DAEMON


def _bound(path: str) -> bool:
    """Whether a socket is bound at ``path`` now (a datagram socket connects to it), not a stale
    name left by an agent that exited."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(path)
    except OSError:  # ECONNREFUSED: nobody bound; anything else: not usable either
        return False
    finally:
        probe.close()
    return True


def _foreign_owner(path: str) -> int | None:
    """The uid owning ``path`` when it exists and is not ours (root's is foreign too: a root-owned
    socket is not ours to remove unless we are root)."""
    try:
        uid = os.lstat(path).st_uid
    except OSError:
        return None
    return uid if uid != os.geteuid() else None

class HookCollector(RequestSender):
    name = "hook"
    default_interval_s = 1.0

    def __init__(self, config: Mapping[str, object] | None = None) -> None:
        super().__init__()
        self.config = HookConfig.from_dict(dict(config or {}))
        self.sock: socket.socket | None = None
        self.peers: dict[int, P.HookPeer] = {}  # rank -> latest sender
        self.counts: dict[str, int] = {}
        self.requests = Requests()  # sent to the hooks, not answered to the end yet
        self.job_served = self.config.job
        self.told_refused = OrderedDict()
        job_user = self.config.job_user
        self.job_uid = job_user if job_user is not None else os.geteuid()  # whose processes are the job's
        # Received, not yet collected: filled by the receiver thread, which refuses another uid's.
        self.inbox = Inbox(self.config.max_queued, self.config.max_queued_bytes, self.job_uid)
        self._inbox_seen: dict[str, int] = {}  # what collect() reported of the inbox's counters
        self._recv_errors = 0
        self._recv_errors_seen = 0
        self._rx: threading.Thread | None = None
        self._stopping = threading.Event()
        self._layout = ParallelLayout()  # what the hooks' job records said (KIND_JOB)
        self._spec = ModelSpec()
        self._job_sent: JobInfo | None = None
        # the job's framework and version: PyTorch, or the trainer a callback names (KIND_FRAMEWORK)
        self._framework: tuple[str, str | None] = (HOOK_FRAMEWORK, None)
        self.pauses = Pauses(self._c)  # each rank's announced pauses, for its next record
        self._senders = P.SenderCheck()
        self._jobs = P.JobDeclarations()  # the job each sender declares (PERFD_JOB)
        # pid -> the uid of the sender that vouched for it, for the agent (Agent._note_ranks): the
        # newest MAX_PAUSE_RANKS verified pids. Written here, read by the agent's thread (dict get).
        self.verified: OrderedDict[int, int] = OrderedDict()
        self._refused_unlogged: dict[str, int] = {}
        self._refused_logged_at: dict[str, float] = {}
        self.ranks: dict[int, HookRank] = {}  # rank -> its process as its hook describes it
        self._lost_seen: dict[tuple[int, int], int] = {}  # (rank, pid) -> send_drops last seen

    def _c(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def probe(self) -> Capabilities:
        path = self.config.socket_path
        parent = os.path.dirname(path) or "."
        if path == wire.default_socket_path():
            try:
                private_dir(parent)  # this user's runtime folder: made 0700 here, another user's refused
            except OSError as exc:
                return Capabilities(False, f"hook socket folder: {exc}")
        if not os.path.isdir(parent):
            return Capabilities(False, f"directory {parent!r} for the hook socket does not exist")
        if os.path.lexists(path) and not stat.S_ISSOCK(os.lstat(path).st_mode):
            return Capabilities(False, f"{path!r} exists and is not a socket; refusing to remove it")
        owner = _foreign_owner(path)
        if owner is not None:
            return Capabilities(False, f"{path!r} belongs to uid {owner}, not this user "
                                       f"(uid {os.geteuid()}): another user's socket; refusing to remove "
                                       "or share it")
        return Capabilities(True)

    def start(self) -> None:
        path = self.config.socket_path
        try:
            if path == wire.default_socket_path():
                private_dir(os.path.dirname(path))
            owner = _foreign_owner(path)
            if owner is not None:
                raise UnsafeDirError(errno.EPERM, f"the socket belongs to uid {owner}, not this user "
                                                  f"(uid {os.geteuid()}): refusing to remove it")
            if os.path.lexists(path) and stat.S_ISSOCK(os.lstat(path).st_mode):
                if _bound(path):  # another agent listens there: taking its name would take its job's steps
                    self.count_error("socket_in_use", f"{path}: another agent listens there (give this one "
                                                      "its own: hook socket_path, or perfd launch)")
                    return
                os.unlink(path)  # a stale socket of ours from an earlier agent: nobody is bound to it
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.settimeout(0.2)  # the receiver thread wakes up this often to see stop()
            with contextlib.suppress(OSError):  # the kernel caps it (net.core.rmem_max): fine
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.config.rcvbuf_bytes)
            if not P.enable(sock):  # every datagram is then refused (no_credentials): say why once
                self.count_error("no_passcred", "SO_PASSCRED unavailable: no sender can be verified")
            sock.bind(path)
            os.chmod(path, self.config.mode)
        except OSError as exc:
            self.count_error("bind_failed", f"{path}: {exc}")
            return
        self.sock = sock
        self._stopping.clear()
        self._rx = threading.Thread(target=self._receive, args=(sock,), name="perfd-hook-rx", daemon=True)
        self._rx.start()

    def flush(self, now: float) -> Collected:
        """At the agent's stop: what the job sent before it ended and no collect took yet — queued in
        the inbox, or still in the socket's buffer behind a receiver thread the load kept waiting —
        is handed over, not dropped with the socket (a job's last steps, often exactly these). The
        socket's name goes first, so that a hook sending after this drain is refused, and counts it."""
        with contextlib.suppress(OSError):
            if self.sock is not None:
                os.unlink(self.config.socket_path)
        self._stop_receiver()
        out = Collected()
        if self.sock is None:
            return out
        self._recv_errors += self.inbox.take_pending(self.sock)
        # every collect takes at most max_records_per_collect: as many as the queue can hold (bounded,
        # should a receiver not stopped go on queueing)
        for _ in range(-(-self.config.max_queued // self.config.max_records_per_collect) + 1):
            out.extend(self.collect(now))
            if not self.inbox.items:
                break
        return out

    def _stop_receiver(self) -> None:
        """The receiver thread ended; one still running after its join's bound (not run for that long:
        it may yet queue a datagram no collect takes) is counted."""
        self._stopping.set()
        if self._rx is not None:
            self._rx.join(timeout=2.0)
            if self._rx.is_alive():
                self.count_error("receiver_not_stopped", "the receiver thread did not end within 2 s of "
                                                         "the stop: a datagram it holds may be lost")
            self._rx = None

    def stop(self) -> None:
        self._stop_receiver()
        if self.sock is not None:
            self.sock.close()
            self.sock = None
            with contextlib.suppress(OSError):
                os.unlink(self.config.socket_path)

    @property
    def queued_bytes(self) -> int:
        """What the datagrams received and not yet collected cost, as the byte cap counts them."""
        return self.inbox.bytes

    def _receive(self, sock: socket.socket) -> None:
        """Receiver thread: only recvmsg and the inbox's cheap checks, so it keeps up with many ranks."""
        put, anc = self.inbox.put, P.ANCILLARY_BYTES
        while not self._stopping.is_set():
            try:
                data, ancdata, _flags, addr = sock.recvmsg(65536, anc)
            except TimeoutError:
                continue
            except OSError:
                if self._stopping.is_set():
                    return
                self._recv_errors += 1  # reported by collect(); the thread lives on
                self._stopping.wait(0.1)
                continue
            put(data, addr, P.credentials(ancdata))

    def _inbox_report(self) -> None:
        """Count and log what the receiver thread dropped since the last collect (it never logs)."""
        refused, last, dropped, over_share, over_share_last = self.inbox.counters()
        seen = self._inbox_seen
        for reason, n in refused.items():
            new = n - seen.get(reason, 0)
            if new > 0:
                self._refuse(reason, f"datagrams from {last.get(reason, '?')}, refused before queueing "
                                     f"(the job's user is uid {self.job_uid})", new)
                seen[reason] = n
        for reason, n, why in (("queue_full", dropped, "the agent is not collecting fast enough"),
                               ("queue_share_full", over_share, f"{over_share_last} sent past its share "
                                "of the queue (max_queued / HOOK_QUEUE_SHARES)")):
            if n > seen.get(reason, 0):
                self.errors[reason] = self.errors.get(reason, 0) + n - seen.get(reason, 0) - 1
                self.count_error(reason, why)
                seen[reason] = n

    def collect(self, now: float) -> Collected:
        out = Collected()
        if self.sock is None:
            self.start()
            if self.sock is None:
                return out
        self._inbox_report()
        if self._recv_errors > self._recv_errors_seen:
            self._recv_errors_seen = self._recv_errors
            self.count_error("recv_failed")
        pop = self.inbox.pop
        for _ in range(self.config.max_records_per_collect):
            item = pop()
            if item is None:
                break
            data, addr, sender = item
            try:
                self._handle(data, addr, sender, now, out)
            except Exception as exc:  # a bug or a hostile datagram must not stop the drain
                self.count_error("internal_error", repr(exc))
        else:
            self._c("drain_limit_reached")  # more remain; the next collect goes on
        return out

    def _handle(self, datagram: bytes, addr: str | bytes, sender: P.Sender | None, now: float,
                out: Collected) -> None:
        records, problem = wire.split_records(datagram)
        if problem is not None:
            self.count_error(f"malformed:{problem}")
        for kind, data in records:
            self._record(kind, data, addr, sender, now, out)

    def _refuse(self, reason: str, detail: str, count: int = 1) -> None:
        """``count`` records (or datagrams) refused for who sent them: counted, and one log line per
        reason every REFUSAL_LOG_INTERVAL_S with the count since the last one and the latest example."""
        key = f"sender:{reason}"
        self.errors[key] = self.errors.get(key, 0) + count
        n = self._refused_unlogged[key] = self._refused_unlogged.get(key, 0) + count
        now = time.monotonic()
        if now - self._refused_logged_at.get(key, -REFUSAL_LOG_INTERVAL_S) >= REFUSAL_LOG_INTERVAL_S:
            self._refused_logged_at[key], self._refused_unlogged[key] = now, 0
            log.warning("collector hook: refused %d record(s) for %s since the last line (latest: %s)",
                        n, reason, detail)

    def _verify(self, sender: P.Sender | None, addr: str | bytes, rank: int, claimed: int,
                what: str) -> P.Verified | None:
        """The process a record claiming ``claimed`` for ``rank`` stands for, or None (refused)."""
        got = self._senders.resolve(sender, claimed)
        who = f"pid {sender.pid} uid {sender.uid}" if sender is not None else "a sender without credentials"
        if isinstance(got, str):
            self._refuse(got, f"{what} for rank {rank} claiming pid {claimed} from {who}")
            return None
        if got.uid != self.job_uid:
            self._refuse(P.NOT_JOB_USER, f"{what} for rank {rank} from {who}: the job's user is uid "
                                       f"{self.job_uid} (hook job_user, the launch manifest's user)")
            return None
        other = self._jobs.refusal(got.pid, self.config.job, self.config.refuse_other_jobs,
                                   self.config.require_declared_job)
        if other is not None:
            self._refuse(other, f"{what} for rank {rank} from {who}: " + (
                f"it declares another job than {self.config.job!r} (PERFD_JOB)" if other == P.OTHER_JOB else
                f"no perfd launch names it (no PERFD_JOB); this agent serves the launch of job "
                f"{self.config.job!r}: run the script under `perfd launch`, or give it an agent of its own "
                "(`perfd agent --job NAME`)"))
            self.tell_refused(got.pid, addr, other == P.OTHER_JOB)
            return None
        self.verified[got.pid] = got.uid
        self.verified.move_to_end(got.pid)
        while len(self.verified) > MAX_PAUSE_RANKS:
            self.verified.popitem(last=False)
        return got

    def _record(self, kind: int, data: bytes, addr: str | bytes, sender: P.Sender | None, now: float,
                out: Collected) -> None:
        if kind in wire.STEP_KINDS:
            msg = wire.unpack_step(data)
            v = self._verify(sender, addr, msg.rank, msg.pid, "a step record")
            if v is None:
                return
            msg.pid = v.pid
            self._peer(msg.rank, msg.pid, addr, msg.step, now, v.uid)
            rec = self._step_record(msg, kind)
            if rec is not None:
                out.steps.append(rec)
            cuda = msg.flags & wire.FLAG_CUDA and msg.rank >= 0
            held = self._rank_info(msg.rank, msg.pid) if cuda else None
            if held is not None and not held.cuda_timed:
                held.cuda_timed = True  # the job computes on CUDA: said once, if its job record did not
                self._send_job(out)
        elif kind == wire.KIND_JOB:
            job = wire.unpack_job(data)
            v = self._verify(sender, addr, job.rank, job.pid, "a job record")
            if v is not None:
                job.pid = v.pid
                self._job(job, out)
        elif kind == wire.KIND_MODEL:
            model = wire.unpack_model(data)
            if self._verify(sender, addr, model.rank, model.pid, "a model record") is not None:
                self._model(model, out)
        elif kind == wire.KIND_DEVICE:
            dev = wire.unpack_device(data)
            v = self._verify(sender, addr, dev.rank, dev.pid, "a device record")
            if v is not None:
                dev.pid = v.pid
                self._device(dev)
        elif kind == wire.KIND_FRAMEWORK:
            fw = wire.unpack_framework(data)
            if self._verify(sender, addr, fw.rank, fw.pid, "a framework record") is not None:
                self._trainer(fw, out)
        elif kind == wire.KIND_PHASE:
            phase = wire.unpack_phase(data)
            v = self._verify(sender, addr, phase.rank, phase.pid, "a phase record")
            if v is not None:
                phase.pid = v.pid
                self._phase(phase, now, out)
        elif kind == wire.KIND_PROFILE_STATUS:
            st = wire.unpack_profile_status(data)
            v = self._verify(sender, addr, st.rank, st.pid, "a profile status")
            if v is not None:
                self._status(st.rank, v, st.request_id, st.state, st.step, None, now, out)
        elif kind == wire.KIND_TRACE_WRITTEN:
            w = wire.unpack_trace_written(data)
            if w is None:
                self.count_error("malformed:trace_written")
                return
            v = self._verify(sender, addr, w.rank, w.pid, "a trace written")
            if v is not None:
                self._status(w.rank, v, w.request_id, wire.PROFILE_WRITTEN, w.step, w.path, now, out)
        else:
            self.count_error("malformed:unexpected_kind")

    def _status(self, rank: int, v: P.Verified, request_id: int, state_code: int, step: int,
                path: str | None, now: float, out: Collected) -> None:
        """A hook's answer to a request this agent sent to that process (else refused): a
        ``hook_profile`` event. The agent's own keys (pid, uid, path) stay on the agent: only the
        text, labels and payload go over the wire (perfd.transport.record_codec)."""
        if self.requests.answer(rank, request_id, v.pid, state_code) is None:
            self._refuse("unsolicited_status", f"request {request_id} of rank {rank} from pid {v.pid}: "
                                               "no such request was sent to that process")
            return
        state = wire.PROFILE_STATE_NAMES.get(state_code, f"state_{state_code}")
        severity = "warning" if state_code in (wire.PROFILE_FAILED, wire.PROFILE_REJECTED) else "info"
        out.events.append({
            "kind": HOOK_PROFILE.name, "severity": severity, "time": now, "job": self.config.job,
            "text": f"rank {rank} (pid {v.pid}) profile request {request_id}: {state} at step {step}",
            "labels": {"job": self.config.job, "rank": str(rank), "state": state,
                       "request_id": str(request_id), "step": str(step)},
            "rank": rank, "state": state, "request_id": request_id, "step": step,
            "pid": v.pid, "uid": v.uid, "path": path,
        })

    def _phase(self, m: wire.PhaseMsg, now: float, out: Collected) -> None:
        """A rank announced a checkpoint save or an evaluation (StepHook.phase): a ``job_phase``
        event, which keeps a pause the loop makes on purpose from reading as a stall."""
        phase, state = wire.PHASES.get(m.phase), wire.PHASE_STATES.get(m.state)
        if phase is None or state is None or m.rank < 0:
            self.count_error("malformed:phase", f"phase {m.phase} state {m.state} rank {m.rank}")
            return
        self._c("phase_records")
        self.pauses.time(m, phase, state)
        out.events.append({
            "kind": JOB_PHASE.name, "severity": "info", "time": now, "job": self.config.job,
            "text": f"rank {m.rank} (pid {m.pid}): {phase} {state}s after step {m.step}",
            "labels": {"job": self.config.job, "rank": str(m.rank)},
            "payload": {"job": self.config.job, "phase": phase, "state": state, "iteration": m.step,
                        "rank": m.rank, "pid": m.pid, "at": m.time_ns / 1e9, "source": "hook"},
        })

    def _job(self, m: wire.JobMsg, out: Collected) -> None:
        """The job as the hooks describe it: one JobInfo (its framework: _trainer), sent on change.
        Ranks agree on it; where one names a size another does not, the named one is kept."""
        if m.rank < 0:
            self.count_error("malformed:no_rank")
            return
        held = self._rank_info(m.rank, m.pid)
        if held is not None:
            held.flags = m.flags
        lay, spec = self._layout, self._spec
        for key in ("world_size", "tp", "pp", "dp", "cp", "ep"):
            value = getattr(m, key)
            if value is not None and in_bounds(value, *LAYOUT_BOUNDS[key]):
                setattr(lay, key, value)
            elif value is not None:
                self.count_error("malformed:layout_out_of_bounds", f"{key}={value}")
        if m.dtype is not None:
            if normalize_dtype(m.dtype) is None:
                self.count_error("malformed:unknown_dtype", repr(m.dtype))
            else:
                spec.dtype = m.dtype
        self._send_job(out)
        self._c("job_records")

    def _trainer(self, m: wire.FrameworkMsg, out: Collected) -> None:
        """The trainer whose callback drives a rank's hook (KIND_FRAMEWORK): the job's framework."""
        name = wire.FRAMEWORKS.get(m.framework)
        if name is None or m.rank < 0 or not (m.version or "").isprintable():
            self.count_error("malformed:framework", f"framework {m.framework} rank {m.rank} {m.version!r}")
            return
        self._framework = (name, m.version)
        self._send_job(out)
        self._c("framework_records")

    def _model(self, m: wire.ModelMsg, out: Collected) -> None:
        """The model a rank's hook counts FLOPs with: the job's spec (collectors.hook.model_record)."""
        for problem in take_model(self._spec, m):
            self.count_error("malformed:model_out_of_bounds", problem)
        self._send_job(out)
        self._c("model_records")

    def _job_device(self) -> Device | None:
        """CUDA if any rank computes on CUDA, CPU if every rank that said found no CUDA, else None."""
        said = [d for r in self.ranks.values() if (d := r.device) is not None]
        if CUDA in said:
            return CUDA
        return CPU if said else None

    def _send_job(self, out: Collected) -> None:
        """The job as the hooks describe it, sent when it changed."""
        info = JobInfo(framework=self._framework[0], framework_version=self._framework[1],
                       layout=dataclasses.replace(self._layout), spec=dataclasses.replace(self._spec),
                       device=self._job_device())
        if info != self._job_sent:
            self._job_sent = info
            out.job_info[self.config.job] = info

    def _rank_info(self, rank: int, pid: int) -> HookRank | None:
        """The rank's entry, anew when its process changed; None past HOOK_MAX_RANKS (counted)."""
        info = self.ranks.get(rank)
        if info is None or info.pid != pid:
            if info is None and len(self.ranks) >= HOOK_MAX_RANKS:
                self._c("ranks_over_cap")
                return None
            info = self.ranks[rank] = HookRank(rank, pid)
        return info

    def _device(self, m: wire.DeviceMsg) -> None:
        """The CUDA device a rank computes on (KIND_DEVICE)."""
        uuid = wire.normalize_uuid(m.uuid)
        if m.rank < 0 or uuid is None or not uuid.isprintable():
            self.count_error("malformed:device", f"rank {m.rank} uuid {m.uuid!r}")
            return
        info = self._rank_info(m.rank, m.pid)
        if info is not None:
            info.device_uuid, info.device_index = m.uuid, m.index if m.index >= 0 else None
            self._c("device_records")

    def _lost(self, m: wire.StepMsg) -> None:
        """Records the rank's hook could not deliver (absent or busy agent, its backlog full), as its
        later records count them: counted here and logged once (the records themselves carry it in
        the hook_send_drops field)."""
        key = (m.rank, m.pid)
        seen = self._lost_seen.get(key, 0)
        if m.send_drops > seen:
            if key not in self._lost_seen and len(self._lost_seen) >= HOOK_MAX_RANKS:
                self._lost_seen.clear()  # a flood of pids: forget, never grow without bound
            self._lost_seen[key] = m.send_drops
            self.errors["records_lost"] = self.errors.get("records_lost", 0) + m.send_drops - seen - 1
            self.count_error("records_lost", f"rank {m.rank} (pid {m.pid}): {m.send_drops} step records "
                                             "never reached the agent (it was absent or busy past the "
                                             "hook's backlog)")

    def _peer(self, rank: int, pid: int, addr: str | bytes, step: int, now: float,
              uid: int | None = None) -> None:
        if not addr:
            self._c("unaddressed_sender")  # a hook that could not bind cannot get requests
            return
        p = self.peers.get(rank)
        if p is None and len(self.peers) >= HOOK_MAX_RANKS:
            self._c("ranks_over_cap")  # a flood of rank numbers: counted, never held
            return
        if p is None or p.pid != pid or p.address != addr:
            self.peers[rank] = P.HookPeer(rank, pid, addr, step, now, uid)
        else:
            p.last_step, p.last_seen = step, now

    def _step_record(self, m: wire.StepMsg, kind: int = wire.KIND_STEP2) -> StepRecord | None:
        # Taken by the rank's next step whether or not it becomes a record: the pause lies before it
        # (in its period, for a KIND_STEP2 record ending after the pause).
        paused = self.pauses.take(m, kind)
        warmup = bool(m.flags & wire.FLAG_WARMUP)
        if warmup and not self.config.include_warmup:
            self._c("warmup_skipped")
            return None
        if m.rank < 0:
            self.count_error("malformed:no_rank")
            return None
        if m.send_drops or m.harvest_drops:
            self._lost(m)
        self._c("records")
        rec = step_record(m, kind, self.config.job, paused)
        for reason in check_step_record(rec):  # perfd.core.bounds, before anything sums it: absent, never 0
            self.count_error(f"malformed:{STEP_REASON}", f"rank {m.rank} step {m.step}: {reason}")
        return rec
