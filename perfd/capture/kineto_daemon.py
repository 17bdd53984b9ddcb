"""A Kineto on-demand daemon: serves trace configs to PyTorch processes started with
``KINETO_USE_DAEMON=1`` (the protocol dynolog speaks), so perfd can trace a running job with no change
to its code (docs/design.md §3 "Captures").

Wire format, as libkineto and dynolog implement it (kineto ``libkineto/src/IpcFabricConfigClient.cpp``,
``libkineto/third_party/dynolog_headers/dynolog/src/ipcfabric/{FabricManager,Endpoint,Utils}.h``;
dynolog ``dynolog/src/tracing/IPCMonitor.cpp``, ``dynolog/src/LibkinetoConfigManager.cpp``):

- Unix *datagram* sockets. Each side binds its own name: the daemon ``dynolog``, every client
  ``dynoconfigclient<uuid4>``. Without ``KINETO_IPC_SOCKET_DIR`` the names are abstract: the address
  is ``"\\0" + name + "\\0"`` (the trailing NUL is part of it: addrlen = 2 + len(name) + 2 bytes). With
  ``KINETO_IPC_SOCKET_DIR=D`` they are files ``D/name`` (the endpoint chmods them 0666).
- One datagram = a 40-byte header ``struct Metadata {size_t size; char type[32];}`` (little-endian
  on x86-64/aarch64) followed by ``size`` payload bytes.
- Request, type ``"req"``: ``struct LibkinetoRequest {int type; int n; int64_t jobid; int32_t
  pids[n];}``. ``pids`` is the process itself, then its ancestors (``pidCommandPairsOfAncestors``);
  ``jobid`` is ``$SLURM_JOB_ID`` or 0; ``type`` is a bit mask, EVENTS = 1, ACTIVITIES = 2. libkineto
  sets ACTIVITIES only while its activity profiler can accept a config
  (``ConfigLoader::readOnDemandConfigFromDaemon`` → ``canHandlerAcceptConfig``): a poll without it
  means a trace (ours or the job's own ``torch.profiler``) is running in that process.
- Reply, type ``"req"``, to the address the request came from: the config text, or size 0 for
  "nothing" (dynolog always replies, an empty string when it has no config). The client waits for it
  only ~90 ms (``poll_recv(9, 10000 µs)``), so replies are sent from the receiving thread at once.
- Registration, type ``"ctxt"``: ``struct LibkinetoContext {int32 gpu; pid_t pid; int64 jobid;}``,
  answered with an ``int32`` (dynolog: the number of processes registered on that GPU).
- The client aborts the whole process (``std::terminate``) if a reply comes from a name of the
  other kind (an abstract client receiving from a file socket, or from a file outside its
  ``KINETO_IPC_SOCKET_DIR``): the daemon therefore always replies from the socket the request reached.

The config is ``KEY=VALUE`` lines (:func:`build_config`). Kineto appends ``_<pid>`` before ``.json``
of ``ACTIVITIES_LOG_FILE`` (``.pt.trace.json`` keeps its suffix: ``x_<pid>.pt.trace.json``). Recent
libkineto accepts an on-demand log file only under ``/tmp/`` or ``$KINETO_ONDEMAND_TRACE_DIR`` and
without ``..`` (``Config.cpp`` ``isAllowedOnDemandTraceFile``); elsewhere it writes
``/tmp/libkineto_activities_<pid>.json``. :func:`kineto_env` sets that variable for jobs perfd starts.
The poll period is ``ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS`` of the base config (``KINETO_CONFIG``;
whole seconds, default 5 s on the clients measured here).

Who gets answered: only processes armed with :meth:`KinetoDaemon.arm`, matched on the *first* pid of a
request (the process itself) or on the pid the kernel reports for the sender (``SO_PASSCRED``; the
two differ when the job runs in another pid namespace). Launchers and helpers (torchrun, data-loader
workers, compile workers) poll too — their first pid is their own, so they are never answered: an
answered helper writes an empty trace.

Who may ask: the name ``dynolog`` is abstract by default (what an unmodified job polls, with no
change to it: that is the point of Kineto on demand), and any local user can send to an abstract
socket and claim any pid in its request. So every request's sender is identified by the kernel
(``SO_PASSCRED``: its uid travels with the datagram and cannot be forged without privilege), and an
armed config is handed over only to root, to this daemon's own user, or to the uid that owns the
armed process (``/proc/<pid>``): another user cannot take a job's trace config (and with it the
trace) or make its capture fail. Refusals are counted in ``errors["foreign_sender"]``. Jobs perfd
launches may use a file socket instead (``KINETO_IPC_SOCKET_DIR``, :func:`kineto_env`), in a
folder of the job's user.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from perfd.core.logfiles import XZ_MAGIC, compression_of_bytes

log = logging.getLogger(__name__)

DEFAULT_SOCKET_NAME = "dynolog"
HEADER = struct.Struct("<Q32s")  # struct Metadata {size_t size; char type[32];}
REQUEST = struct.Struct("<iiq")  # struct LibkinetoRequest {int type; int n; int64_t jobid;} + int32 pids[n]
CONTEXT = struct.Struct("<iiq")  # struct LibkinetoContext {int32_t gpu; pid_t pid; int64_t jobid;}
TYPE_REQUEST = b"req"
TYPE_CONTEXT = b"ctxt"
CONFIG_EVENTS = 0x1
CONFIG_ACTIVITIES = 0x2
MAX_DATAGRAM = 65536
MAX_SOCKET_DIR = 107 - 1 - len("dynoconfigclient") - 36  # sun_path, "/", the client name
_UCRED = struct.Struct("iII")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}


def socket_address(name: str = DEFAULT_SOCKET_NAME, socket_dir: str | None = None) -> str | bytes:
    """The address libkineto's ``EndPoint::setAddress_`` gives ``name``: ``b"\\0name\\0"`` (abstract),
    or ``DIR/name`` when a socket directory is set."""
    if not name or "/" in name or "\0" in name or len(name) > 106:
        raise ValueError(f"bad Kineto IPC socket name {name!r} (1-106 characters, no '/' or NUL)")
    if socket_dir:
        path = str(Path(socket_dir) / name)
        if len(path.encode()) > 107:
            raise ValueError(f"socket path {path} is longer than a Unix socket address allows (107 bytes)")
        return path
    return b"\0" + name.encode() + b"\0"


def pack_message(kind: bytes, payload: bytes) -> bytes:
    """One datagram: the 40-byte header, then the payload."""
    if len(kind) >= 32:
        raise ValueError("message type must be shorter than 32 bytes")
    return HEADER.pack(len(payload), kind) + payload


def unpack_message(data: bytes) -> tuple[bytes, bytes]:
    """(type, payload) of a datagram; ValueError when it is not a well-formed message."""
    if len(data) < HEADER.size:
        raise ValueError(f"datagram of {len(data)} bytes is shorter than the {HEADER.size}-byte header")
    size, raw_type = HEADER.unpack_from(data)
    payload = data[HEADER.size:]
    if size != len(payload):
        raise ValueError(f"header says {size} payload bytes, datagram has {len(payload)}")
    return raw_type.split(b"\0", 1)[0], payload


def pack_request(config_type: int, job_id: int, pids: Collection[int]) -> bytes:
    """A request as libkineto sends it (for tests and tools)."""
    p = list(pids)
    body = REQUEST.pack(config_type, len(p), job_id) + struct.pack(f"<{len(p)}i", *p)
    return pack_message(TYPE_REQUEST, body)


def unpack_request(payload: bytes) -> tuple[int, int, tuple[int, ...]]:
    """(type, jobid, pids) of a ``req`` payload."""
    if len(payload) < REQUEST.size:
        raise ValueError("request payload shorter than its 16-byte head")
    config_type, n, job_id = REQUEST.unpack_from(payload)
    if n <= 0 or len(payload) != REQUEST.size + 4 * n:
        raise ValueError(f"request says {n} pids, payload has {len(payload) - REQUEST.size} bytes for them")
    return config_type, job_id, struct.unpack_from(f"<{n}i", payload, REQUEST.size)


# --- configs -----------------------------------------------------------------------------------
def build_config(log_file: str | Path, iterations: int | None = None, start_iteration: int | None = None,
                 roundup: int = 1, duration_ms: int | None = None, start_time_ms: int | None = None,
                 warmup_s: int | None = None, stack: bool = False) -> str:
    """An on-demand trace config (``KEY=VALUE`` lines; key names from libkineto ``Config.cpp``).

    Iteration-aligned (``iterations`` set; Kineto counts optimizer steps): starts at
    ``start_iteration`` (default 0: at once), rounded up to a multiple of ``roundup`` — the same
    multiple on every rank that receives the config within one ``roundup`` window. Time-based
    (``duration_ms``): starts after the warm-up, or at ``start_time_ms`` (epoch ms, the same instant
    on every node; it must leave the warm-up time). Both may be given: libkineto uses the duration
    when the process never counted an iteration (no ``torch.optim`` step). ``stack``: Python stacks and
    input shapes too (``PROFILE_WITH_STACK``, ``PROFILE_REPORT_INPUT_SHAPES``: PyTorch's on-demand
    client reads them), so a trace names the module of each op; on an H100 Megatron-LM job the captured
    steps ran 16% slower with them, 3% without (docs/evidence/remedies_h100).
    """
    path = str(log_file)
    if not path or "\n" in path or "=" in path or ".." in path:
        raise ValueError(f"bad trace log file {path!r}")
    if iterations is None and duration_ms is None:
        raise ValueError("give iterations or duration_ms")
    lines = [f"ACTIVITIES_LOG_FILE={path}"]
    if iterations is not None:
        if iterations < 1 or roundup < 1 or (start_iteration is not None and start_iteration < 0):
            raise ValueError("iterations and roundup must be >= 1, start_iteration >= 0")
        lines += [f"PROFILE_START_ITERATION={start_iteration or 0}",
                  f"PROFILE_START_ITERATION_ROUNDUP={roundup}", f"ACTIVITIES_ITERATIONS={iterations}"]
    if duration_ms is not None:
        if duration_ms < 1:
            raise ValueError("duration_ms must be >= 1")
        lines.append(f"ACTIVITIES_DURATION_MSECS={duration_ms}")
    if start_time_ms is not None:
        lines.append(f"PROFILE_START_TIME={int(start_time_ms)}")
    if warmup_s is not None:
        if warmup_s < 0:
            raise ValueError("warmup_s must be >= 0")
        lines.append(f"ACTIVITIES_WARMUP_PERIOD_SECS={int(warmup_s)}")
    if stack:
        lines += ["PROFILE_REPORT_INPUT_SHAPES=true", "PROFILE_WITH_STACK=true"]
    return "\n".join(lines) + "\n"


# libkineto calls cuptiFinalize after a trace only with TEARDOWN_CUPTI=1 (PyTorch's own profiler sets it;
# an on-demand trace through the daemon does not go through that code). Without it CUPTI's callbacks stay
# subscribed after the trace and every later kernel launch pays for them: a host-bound Hugging Face
# Trainer run stepped ~30% slower for the rest of its life after one 3-step capture, Lightning's demo
# 24% (docs/evidence/kineto_teardown_h200). Teardown with CUDA graphs crashed before CUDA 12.6.
TEARDOWN_ENV = "TEARDOWN_CUPTI"


def kineto_env(poll_s: int = 1, config_dir: str | Path | None = None, socket_dir: str | None = None,
               trace_dir: str | Path | None = None) -> dict[str, str]:
    """Environment for a job perfd starts: Kineto asks the daemon every ``poll_s`` seconds.

    Writes ``<config_dir>/kineto-base.conf`` (``ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS``; libkineto
    reads it at start-up and every 5 minutes) and sets ``TEARDOWN_CUPTI=1`` (see :data:`TEARDOWN_ENV`).
    ``trace_dir``: where on-demand traces may be written
    (``KINETO_ONDEMAND_TRACE_DIR``, honoured by recent libkineto). ``socket_dir``: file sockets
    (``KINETO_IPC_SOCKET_DIR``; the daemon must use the same directory).
    """
    if int(poll_s) != poll_s or poll_s < 1:
        raise ValueError("poll_s must be a whole number of seconds >= 1 (libkineto reads an int)")
    if config_dir is not None:
        cdir = Path(config_dir)
        cdir.mkdir(parents=True, exist_ok=True)
    else:  # this user's own folder, never a shared /tmp name (the file below is written through it)
        from perfd.core.privdir import private_dir, user_dir

        cdir = private_dir(user_dir("kineto"))
    conf = cdir / "kineto-base.conf"
    tmp = conf.with_suffix(".tmp")
    tmp.write_text(f"ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS={int(poll_s)}\n")
    tmp.replace(conf)
    env = {"KINETO_USE_DAEMON": "1", "KINETO_CONFIG": str(conf), TEARDOWN_ENV: "1"}
    if socket_dir:
        # Each client binds DIR/dynoconfigclient<uuid4> (52 characters): a longer DIR makes its
        # bind fail and the process never polls.
        if len(str(socket_dir).encode()) > MAX_SOCKET_DIR:
            raise ValueError(f"KINETO_IPC_SOCKET_DIR {socket_dir} is too long: at most {MAX_SOCKET_DIR} "
                             "bytes leave room in a Unix socket address for libkineto's client names")
        env["KINETO_IPC_SOCKET_DIR"] = str(socket_dir)
    if trace_dir is not None:
        env["KINETO_ONDEMAND_TRACE_DIR"] = str(trace_dir)
    return env


def trace_complete(path: str | Path) -> bool:
    """A Kineto trace file that has been written to its end: JSON ends with ``}``; a compressed one is
    taken as it is (what it inflates to is the reader's to bound: perfd.capture.trace_input). A trace
    that is still being written fails this, and so does what is not a regular file: the job's process
    writes where the trace goes, and opening a FIFO it put there would wait for a writer (opened
    without blocking), a device such as /dev/zero never ends (only the last 64 bytes are read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return False
            if compression_of_bytes(f.read(len(XZ_MAGIC))) is not None:
                return True
            f.seek(max(0, st.st_size - 64))
            return f.read(64).rstrip().endswith(b"}")
        except OSError:
            return False


# --- arming ------------------------------------------------------------------------------------
@dataclass
class PidState:
    """What the daemon saw of one armed process."""

    answered_at: float | None = None  # the config was handed over in reply to its poll
    active_at: float | None = None  # first poll after that without ACTIVITIES: the profiler took it
    idle_at: float | None = None  # first poll after active with ACTIVITIES again: the trace is over
    busy_polls: int = 0  # polls before the answer while its profiler could not accept a config


@dataclass
class Arming:
    """Configs for a set of processes, each answered once, until ``expires_at`` (epoch s)."""

    id: int
    configs: dict[int, str]  # pid -> config text
    expires_at: float
    created_at: float
    states: dict[int, PidState] = field(default_factory=dict)
    cancelled: bool = False
    _cond: threading.Condition = field(default_factory=threading.Condition, repr=False)

    @property
    def pids(self) -> frozenset[int]:
        return frozenset(self.configs)

    def answered(self) -> dict[int, float]:
        with self._cond:
            return {p: s.answered_at for p, s in self.states.items() if s.answered_at is not None}

    def state(self, pid: int) -> PidState:
        with self._cond:
            s = self.states[pid]
            return PidState(s.answered_at, s.active_at, s.idle_at, s.busy_polls)

    def wait_answered(self, timeout: float | None = None, pids: Collection[int] | None = None) -> bool:
        """Until every pid (or those given) was answered; False at the timeout."""
        want = set(self.configs if pids is None else pids)
        with self._cond:
            return self._cond.wait_for(
                lambda: all(self.states[p].answered_at is not None for p in want) or self.cancelled, timeout)

    def wait_idle(self, pid: int, timeout: float | None = None) -> bool:
        """Until the pid's profiler took the config and then became free again (trace written or
        being written); False at the timeout."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self.states[pid].idle_at is not None or self.cancelled, timeout)


class KinetoDaemonError(RuntimeError):
    pass


class KinetoDaemon:
    """The daemon side of the protocol; a thread answers requests as they arrive.

    ``KinetoDaemon(socket_name="dynolog", socket_dir=None)``: ``socket_dir`` (or
    ``$KINETO_IPC_SOCKET_DIR`` when ``socket_dir=""`` is not given explicitly) switches to a file
    socket. :meth:`start` binds (a clear error when another daemon, e.g. dynolog, holds the name).
    """

    def __init__(self, socket_name: str = DEFAULT_SOCKET_NAME, socket_dir: str | None = None,
                 clock: Callable[[], float] = time.time, file_mode: int = 0o666,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if socket_dir is None:
            socket_dir = os.environ.get("KINETO_IPC_SOCKET_DIR") or None
        self.socket_name = socket_name
        self.socket_dir = socket_dir
        self.address = socket_address(socket_name, socket_dir)
        self.clock = clock  # the wall clock: armings' times, as the capture reads them
        self.monotonic = monotonic  # what times a process's polls (a wall clock's step does not move it)
        self.file_mode = file_mode
        self.sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._armings: dict[int, Arming] = {}
        self._by_pid: dict[int, Arming] = {}
        self._ids = itertools.count(1)
        # Per process (the first pid of its requests): how often it polled, when last, what it said.
        self.requests_seen: dict[int, int] = {}
        self.last_seen: dict[int, float] = {}  # the monotonic clock's
        self.last_type: dict[int, int] = {}
        self.ancestors: dict[int, tuple[int, ...]] = {}
        self.job_ids: dict[int, int] = {}
        self.sender_pids: dict[int, int] = {}  # first pid -> pid the kernel reported (when known)
        self.intervals: dict[int, float] = {}  # first pid -> seconds between its last two polls
        # ... and the shortest between two of its polls: the period it polls at (a busy machine delays a
        # poll's receipt; only a late receipt followed by a prompt one reads a period short, by that delay)
        self.shortest_intervals: dict[int, float] = {}
        self.errors: dict[str, int] = {}
        self.answers_sent = 0
        self.on_answer: Callable[[int, Arming, float], None] | None = None  # (pid, arming, time)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> KinetoDaemon:
        if self.sock is not None:
            return self
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            if isinstance(self.address, str):
                self._replace_stale(Path(self.address))
            s.bind(self.address)
            if isinstance(self.address, str):
                os.chmod(self.address, self.file_mode)
            with contextlib.suppress(OSError, AttributeError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            s.settimeout(0.2)
        except OSError as exc:
            s.close()
            where = self.address if isinstance(self.address, str) else f"abstract {self.address!r}"
            in_use = exc.errno == errno.EADDRINUSE
            hint = " (another Kineto daemon, e.g. dynolog, is running)" if in_use else ""
            raise KinetoDaemonError(f"cannot bind the Kineto daemon socket {where}: {exc}{hint}") from exc
        self.sock = s
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="perfd-kineto-daemon", daemon=True)
        self._thread.start()
        return self

    @staticmethod
    def _replace_stale(path: Path) -> None:
        try:
            st = path.lstat()
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise OSError(errno.EEXIST, f"{path} exists and is not a socket")
        path.unlink()  # libkineto's EndPoint does the same before binding

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None
            if isinstance(self.address, str):
                with contextlib.suppress(OSError):
                    os.unlink(self.address)
        with self._lock:
            for a in list(self._armings.values()):
                self._cancel_locked(a)

    def __enter__(self) -> KinetoDaemon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- arming -------------------------------------------------------------------------------
    def arm(self, pids: Collection[int] | Mapping[int, str], config_text: str | None = None,
            expires_at: float | None = None) -> Arming:
        """Answer the next poll of each of ``pids`` (once each) with ``config_text`` — or, with a
        mapping, each pid with its own config — until ``expires_at`` (epoch s, default 60 s on).

        Raises ValueError when a pid is already armed (one trace per process at a time).
        """
        if isinstance(pids, Mapping):
            configs = {int(p): str(c) for p, c in pids.items()}
        else:
            if config_text is None:
                raise ValueError("config_text is required with a pid collection")
            configs = {int(p): config_text for p in pids}
        if not configs:
            raise ValueError("no pids to arm")
        now = self.clock()
        arming = Arming(next(self._ids), configs, now + 60.0 if expires_at is None else expires_at, now)
        arming.states = {p: PidState() for p in configs}
        with self._lock:
            busy = sorted(p for p in configs if p in self._by_pid)
            if busy:
                raise ValueError(f"pid(s) {busy} already armed (one Kineto trace per process at a time)")
            self._armings[arming.id] = arming
            for p in configs:
                self._by_pid[p] = arming
        return arming

    def disarm(self, arming: Arming) -> None:
        """Stop answering for this arming (pids already answered keep tracing)."""
        with self._lock:
            self._cancel_locked(arming)

    def _cancel_locked(self, arming: Arming) -> None:
        self._armings.pop(arming.id, None)
        for p in arming.configs:
            if self._by_pid.get(p) is arming:
                del self._by_pid[p]
        with arming._cond:
            arming.cancelled = True
            arming._cond.notify_all()

    def armed_pids(self) -> set[int]:
        with self._lock:
            return set(self._by_pid)

    def polling(self, within_s: float = 30.0) -> dict[int, tuple[int, ...]]:
        """Processes that polled in the last ``within_s`` seconds: first pid -> its ancestors."""
        cutoff = self.monotonic() - within_s
        with self._lock:
            return {p: self.ancestors.get(p, ()) for p, t in self.last_seen.items() if t >= cutoff}

    # -- the receive loop ---------------------------------------------------------------------
    def _err(self, reason: str) -> None:
        self.errors[reason] = self.errors.get(reason, 0) + 1

    def _loop(self) -> None:
        sock = self.sock
        assert sock is not None
        anc = socket.CMSG_SPACE(_UCRED.size)
        while not self._stop.is_set():
            try:
                data, ancdata, _flags, addr = sock.recvmsg(MAX_DATAGRAM, anc)
            except TimeoutError:
                continue
            except OSError as exc:
                if self._stop.is_set():
                    return
                self._err("recv_failed")
                log.warning("kineto daemon: recv failed: %s", exc)
                time.sleep(0.05)
                continue
            try:
                self._handle(data, ancdata, addr)
            except Exception as exc:  # one bad datagram never stops the daemon
                self._err("handler_failed")
                log.warning("kineto daemon: %s", exc)

    def handle_datagram(self, data: bytes, addr: str | bytes, sender_pid: int | None = None,
                        sender_uid: int | None = None) -> bytes | None:
        """Process one datagram; returns the reply (None: no reply). The loop sends it; exposed for
        tests and for embedding the daemon in another event loop."""
        try:
            kind, payload = unpack_message(data)
        except ValueError:
            self._err("malformed")
            return None
        if kind == TYPE_CONTEXT:
            if len(payload) != CONTEXT.size:
                self._err("malformed_ctxt")
                return None
            return pack_message(TYPE_CONTEXT, struct.pack("<i", 1))
        if kind != TYPE_REQUEST:
            self._err("unknown_type")
            return None
        try:
            config_type, job_id, pids = unpack_request(payload)
        except ValueError:
            self._err("malformed_req")  # dynolog does not answer a request without pids either
            return None
        return pack_message(TYPE_REQUEST,
                            self._on_request(config_type, job_id, pids, sender_pid, sender_uid).encode())

    def _handle(self, data: bytes, ancdata: list[tuple[int, int, bytes]], addr: object) -> None:
        sender: int | None = None
        uid: int | None = None
        for level, kind, cdata in ancdata:
            if level == socket.SOL_SOCKET and kind == getattr(socket, "SCM_CREDENTIALS", -1) \
                    and len(cdata) >= _UCRED.size:
                sender, uid, _gid = _UCRED.unpack_from(cdata)
        if not isinstance(addr, (str, bytes)) or not addr:
            self._err("unaddressed")  # an unbound sender cannot be answered
            return
        reply = self.handle_datagram(data, addr, sender, uid)
        if reply is None or self.sock is None:
            return
        try:
            self.sock.sendto(reply, addr)
        except OSError as exc:
            self._err("send_failed")
            log.info("kineto daemon: reply to %r failed: %s", addr, exc)

    def _on_request(self, config_type: int, job_id: int, pids: tuple[int, ...], sender: int | None,
                    sender_uid: int | None = None) -> str:
        now, polled = self.clock(), self.monotonic()
        me = pids[0]
        with self._lock:
            self.requests_seen[me] = self.requests_seen.get(me, 0) + 1
            if me in self.last_seen:
                self.intervals[me] = took = polled - self.last_seen[me]
                self.shortest_intervals[me] = min(took, self.shortest_intervals.get(me, took))
            self.last_seen[me] = polled
            self.last_type[me] = config_type
            self.ancestors[me] = pids[1:]
            self.job_ids[me] = job_id
            if sender is not None:
                self.sender_pids[me] = sender
            key = me if me in self._by_pid else sender if sender in self._by_pid else None
            arming = self._by_pid.get(key) if key is not None else None
        if arming is None or key is None:
            return ""
        if sender_uid is not None and not _may_ask_for(sender_uid, key):
            self._err("foreign_sender")  # another user claiming an armed pid: not answered
            log.warning("kineto daemon: a request for armed pid %d came from uid %d, not the process's "
                        "owner: refused", key, sender_uid)
            return ""
        can_accept = bool(config_type & CONFIG_ACTIVITIES)
        answer = ""
        with arming._cond:
            st = arming.states[key]
            if st.answered_at is None:
                if now > arming.expires_at or arming.cancelled:
                    # too late, or disarmed since this request was looked up (its capture failed and
                    # said so): never answered now, no trace that nobody collects
                    pass
                elif can_accept:
                    st.answered_at = now
                    answer = arming.configs[key]
                else:
                    st.busy_polls += 1
            elif st.active_at is None:
                if not can_accept:
                    st.active_at = now
                elif now - st.answered_at > 0.5:
                    # Took the config but is free again at its next poll: the trace was short, or
                    # the config was ignored (a log line in the job says why).
                    st.active_at = st.idle_at = now
            elif st.idle_at is None and can_accept:
                st.idle_at = now
            arming._cond.notify_all()
            expired = now > arming.expires_at
            done = all(s.idle_at is not None or (expired and s.answered_at is None)
                       for s in arming.states.values())
        if answer:
            self.answers_sent += 1
            if self.on_answer is not None:
                try:
                    self.on_answer(key, arming, now)
                except Exception as exc:
                    log.warning("kineto daemon: on_answer callback failed: %s", exc)
        if done:
            with self._lock:
                self._cancel_locked(arming)
        return answer


def _may_ask_for(uid: int, pid: int) -> bool:
    """Root, this daemon's user, or the user owning process ``pid`` (see the module docstring)."""
    if uid in (0, os.geteuid()):
        return True
    try:
        return os.stat(f"/proc/{pid}").st_uid == uid
    except OSError:
        return False  # no such process here: nobody's to take
