"""Kineto captures through dynolog, when dynolog already serves the node.

dynolog owns the Kineto daemon socket (``"\\0dynolog\\0"``): a second daemon cannot bind it, and
must not fight for it. perfd then hands its trace configs to dynolog, which passes them to the
process at its next poll, exactly as ``dyno gputrace`` does. Only when root or the agent's own user
holds the name (:func:`socket_holders`): any user may bind an abstract name first, and its RPC port
could be anyone's too (perfd.agent.capture_executor). Protocol, as dynolog
implements it (read from its source, not from a running dynolog):

- ``dynolog/src/rpc/SimpleJsonServer.cpp``: TCP (default port 1778, ``DYNO_PORT`` in
  ``cli/src/main.rs``); each message, both ways, is an ``int32`` length in native byte order
  followed by that many bytes of JSON; one request per connection.
- ``dynolog/src/rpc/SimpleJsonServerInl.h``: ``{"fn": "getStatus"}`` → ``{"status": 1}``;
  ``{"fn": "getVersion"}`` → ``{"version": "..."}``; ``{"fn": "setKinetOnDemandRequest",
  "config": TEXT, "job_id": N, "pids": [...], "process_limit": N}`` → ``{"processesMatched": [pid..],
  "activityProfilersTriggered": [pid..], "activityProfilersBusy": n, "eventProfilersTriggered": [...],
  "eventProfilersBusy": n}`` (``{"status": "failed"}`` without ``config``/``pids``).
- ``dynolog/src/LibkinetoConfigManager.cpp``: a process matches when a requested pid is the process or
  one of its ancestors; it is *triggered* when its activity profiler has no pending config, else
  counted busy. The process picks the config up at its next poll of dynolog's socket.
- ``cli/src/commands/gputrace.rs``: the config is the same ``KEY=VALUE`` text perfd builds
  (``ACTIVITIES_LOG_FILE``, ``PROFILE_START_ITERATION``/``ACTIVITIES_ITERATIONS`` or
  ``ACTIVITIES_DURATION_MSECS``), so traces land where perfd's own daemon would put them.

:class:`DynologKineto` has the surface of :class:`perfd.capture.kineto_daemon.KinetoDaemon` that the
capture manager's Kineto run (:mod:`perfd.capture.kineto_capture`) uses (``arm``/``disarm``, an
arming with ``wait_answered``/``answered``/``state``), so that run works unchanged. "Answered" here
means dynolog accepted the config for that pid (the process applies it at its next poll, up to its
poll period later).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from perfd.capture.kineto_daemon import DEFAULT_SOCKET_NAME, PidState, socket_address
from perfd.core.limits import MAX_SCAN_PIDS
from perfd.core.procinfo import read_identity
from perfd.core.typed import JSON

DYNOLOG_PORT = 1778  # dynolog's --port default (cli/src/main.rs DYNO_PORT)
_LEN = struct.Struct("=i")  # native-endian int32, as dynolog reads and writes it
_MAX_REPLY = 1 << 20


class DynologError(RuntimeError):
    """dynolog did not answer, or answered something that is not its protocol."""


def kineto_socket_taken(socket_name: str = DEFAULT_SOCKET_NAME, socket_dir: str | None = None) -> bool:
    """True when another process (dynolog) holds the Kineto daemon socket name."""
    if socket_dir is not None:  # a file socket: taken when the file is a live socket
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            s.connect(str(socket_address(socket_name, socket_dir)))
            return True
        except OSError:
            return False
        finally:
            s.close()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        s.bind(socket_address(socket_name, None))
        return False
    except OSError as exc:
        return exc.errno == errno.EADDRINUSE
    finally:
        s.close()


@dataclass(frozen=True)
class Holder:
    """A process holding a Unix socket name: its pid, the user it runs as (real uid) and its name."""

    pid: int
    uid: int
    comm: str

    def __str__(self) -> str:
        return f"pid {self.pid} (uid {self.uid}, {self.comm!r})"


def socket_holders(name: str = DEFAULT_SOCKET_NAME, proc: str = "/proc") -> list[Holder] | None:
    """Who holds the Kineto daemon's abstract name (``"\\0name\\0"``): the processes with a
    descriptor of the socket bound to it, found through ``/proc/net/unix`` (the socket's inode) and
    ``/proc/*/fd`` (which descriptor is that inode: only root reads every process's). None when no
    socket is bound to the name; [] when one is but no process that holds it could be read. At most
    MAX_SCAN_PIDS processes are looked at."""
    shown = f"@{name}@"  # how the kernel lists it: each NUL of the address as "@"
    inodes: set[str] = set()
    try:
        with open(f"{proc}/net/unix", encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 8 and " ".join(parts[7:]) == shown:
                    inodes.add(parts[6])
    except OSError:
        return []
    if not inodes:
        return None
    links = {f"socket:[{i}]" for i in inodes}
    out: list[Holder] = []
    pids = [e for e in os.listdir(proc) if e.isdigit()][:MAX_SCAN_PIDS]
    for pid in pids:
        try:
            fds = os.listdir(f"{proc}/{pid}/fd")
        except OSError:
            continue  # gone, or not ours to read
        if any(_readlink(f"{proc}/{pid}/fd/{fd}") in links for fd in fds):
            ident = read_identity(int(pid), proc)
            if ident is not None and ident.uids:
                try:
                    with open(f"{proc}/{pid}/comm", encoding="utf-8", errors="replace") as f:
                        comm = f.read(64).strip()
                except OSError:
                    comm = "?"
                out.append(Holder(int(pid), ident.uids[0], comm))
    return out


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


class DynologClient:
    """dynolog's JSON RPC (what ``dyno`` sends)."""

    def __init__(self, host: str = "127.0.0.1", port: int = DYNOLOG_PORT, timeout_s: float = 5.0) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s

    def call(self, request: Mapping[str, JSON]) -> dict[str, object]:
        body = json.dumps(request).encode()
        try:
            with socket.create_connection((self.host, self.port), timeout=self.timeout_s) as s:
                s.sendall(_LEN.pack(len(body)) + body)
                size = _LEN.unpack(_recv_exact(s, _LEN.size))[0]
                if not 0 < size <= _MAX_REPLY:
                    raise DynologError(f"dynolog at {self.host}:{self.port}: reply size {size} "
                                       "(an empty reply means it did not understand the request)")
                reply = json.loads(_recv_exact(s, size).decode("utf-8"))
        except OSError as exc:
            raise DynologError(f"dynolog at {self.host}:{self.port}: {exc}") from exc
        except ValueError as exc:
            raise DynologError(f"dynolog at {self.host}:{self.port}: not JSON: {exc}") from exc
        if not isinstance(reply, dict):
            raise DynologError(f"dynolog at {self.host}:{self.port}: unexpected reply {reply!r}")
        return reply

    def status(self) -> object:
        return self.call({"fn": "getStatus"}).get("status")

    def version(self) -> str | None:
        v = self.call({"fn": "getVersion"}).get("version")
        return str(v) if v is not None else None

    def request_trace(self, config: str, pids: list[int], job_id: int = 0,
                      process_limit: int = 1000) -> dict[str, object]:
        reply = self.call({"fn": "setKinetOnDemandRequest", "config": config, "job_id": job_id,
                           "pids": list(pids), "process_limit": process_limit})
        if "processesMatched" not in reply:
            raise DynologError(f"dynolog refused the trace request: {reply}")
        return reply


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise DynologError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def _pids(v: object) -> set[int]:
    """The pids of a reply's list (absent, or not a list: none)."""
    return {int(p) for p in v if isinstance(p, int | float | str)} if isinstance(v, list) else set()


def _count(v: object) -> int:
    """A reply's count (absent, or not a number: 0)."""
    return int(v) if isinstance(v, int | float | str) and v else 0


@dataclass
class DynologArming:
    """The manager's view of one request handed to dynolog."""

    states: dict[int, PidState] = field(default_factory=dict)
    _answered: dict[int, float] = field(default_factory=dict)
    replies: list[dict[str, object]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def answered(self) -> dict[int, float]:
        return dict(self._answered)

    def state(self, pid: int) -> PidState:
        return self.states.setdefault(pid, PidState())

    def wait_answered(self, timeout: float | None = None, pids: object = None) -> bool:
        return bool(self._answered)  # dynolog answered synchronously in arm()

    def wait_idle(self, pid: int, timeout: float | None = None) -> bool:
        return True


class DynologKineto:
    """Kineto on demand through a running dynolog (see the module docstring)."""

    kind = "dynolog"

    def __init__(self, client: DynologClient, clock: Callable[[], float] = time.time) -> None:
        self.client, self.clock = client, clock
        self.intervals: dict[int, float] = {}  # poll periods are dynolog's to know, not ours
        self.requests_seen: set[int] = set()
        self.sender_pids: dict[int, int] = {}
        self._lock = threading.Lock()

    def start(self) -> DynologKineto:
        self.client.status()  # raises DynologError when nothing answers on the port
        return self

    def stop(self) -> None:
        pass

    def arm(self, configs: Mapping[int, str], expires_at: float | None = None) -> DynologArming:
        """Hand each pid its config (one request per pid: each rank has its own trace file)."""
        arming = DynologArming()
        with self._lock:
            for pid, config in configs.items():
                try:
                    reply = self.client.request_trace(config, [pid])
                except DynologError as exc:
                    arming.errors.append(str(exc))
                    continue
                arming.replies.append(reply)
                matched = _pids(reply.get("processesMatched"))
                triggered = _pids(reply.get("activityProfilersTriggered"))
                if matched:
                    self.requests_seen.add(pid)
                    for leaf in matched:
                        self.sender_pids.setdefault(leaf, pid)
                if triggered:
                    arming._answered[pid] = arming.state(pid).answered_at = self.clock()
                elif _count(reply.get("activityProfilersBusy")) > 0:
                    arming.state(pid).busy_polls += 1
        return arming

    def disarm(self, arming: object) -> None:
        pass  # dynolog clears a config once the process has taken it

    def __enter__(self) -> DynologKineto:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.stop()
