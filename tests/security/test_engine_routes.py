"""The route port of ``perfd engine serve --servers 3``: another local user's nats-server that names it
in its ``--routes`` (the port is in /proc/net/tcp, the cluster's name in the monitoring port's /varz)
is refused, so its own clients, which need no token there, get nothing the cluster's clients publish;
the route password, like the token, is in no file and not on the monitoring port."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import nats
import nats.errors
import psutil
import pytest

from perfd.engine.natsd import ROUTE_PASSWORD_ENV, ROUTES_ENV
from tests.engine.test_natsd import _need_nats_server, _quiet, w
from tests.security.other_user import other_user
from tests.security.test_engine_files import TOKEN, _files, _token_file

SECRET = b"root-only-payload-5b1c9e"  # what the cluster's clients publish
# The intruder's subscriber: the system Python, no nats-py; the raw protocol, every byte to stdout
_SUBSCRIBER = r"""
import socket, sys, time
deadline = time.monotonic() + 20
while True:
    try:
        s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=60)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.1)
s.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\nSUB > 1\r\nPING\r\n')
while True:
    data = s.recv(65536)
    if not data:
        break
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
    if b"PING\r\n" in data:
        s.sendall(b"PONG\r\n")
"""
_EXEC = "import os, sys; os.execv(sys.argv[1], sys.argv[1:])"  # the intruder's nats-server, as that user


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def _ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _until(what: str, ok: Any, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < deadline, f"not {what} after {timeout_s:.0f}s"
        time.sleep(0.1)


def _routes(monitor: str) -> int:
    try:
        return int(_get(monitor + "/routez")["num_routes"])
    except OSError:
        return 0


async def _publish_across(urls: list[str]) -> None:
    """Published on the first server, received on the others: the cluster's own routes carry it."""
    pub = await w(nats.connect(urls[0], token=TOKEN, allow_reconnect=False, error_cb=_quiet))
    subs = [await w(nats.connect(u, token=TOKEN, allow_reconnect=False, error_cb=_quiet)) for u in urls[1:]]
    try:
        got = [await w(nc.subscribe("perfd.secret.>")) for nc in subs]
        for nc in subs:
            await w(nc.flush())
        deadline = time.monotonic() + 15  # the subscriptions' interest reaching the first server
        for sub in got:
            while True:
                await w(pub.publish("perfd.secret.x", SECRET))
                await w(pub.flush())
                try:
                    assert (await sub.next_msg(timeout=0.5)).data == SECRET
                    break
                except nats.errors.TimeoutError:
                    assert time.monotonic() < deadline, "the cluster's routes did not carry a publish"
        for i in range(20):  # and more, for any subscriber anywhere
            await w(pub.publish(f"perfd.secret.{i}", SECRET))
        await w(pub.flush())
    finally:
        for nc in [pub, *subs]:
            await w(nc.close())


@pytest.mark.e2e  # another user's NATS server against a running `perfd engine serve` process
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_another_users_nats_server_cannot_join_the_cluster_as_a_route(shared_tmp: Path,
                                                                      tmp_path: Path) -> None:
    binary = _need_nats_server()
    other = other_user()
    base = shared_tmp / "engine"
    serve = subprocess.Popen([sys.executable, "-m", "perfd.app.cli", "engine", "serve", "--dir", str(base),
                              "--servers", "3", "--token-file", str(_token_file(tmp_path))],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    intruders: list[subprocess.Popen[bytes]] = []
    try:
        assert serve.stdout is not None and serve.stderr is not None
        line = serve.stdout.readline()  # printed once the cluster is JetStream-ready
        assert "Ctrl-C stops it" in line, (line, serve.stderr.read() if serve.poll() is not None else "")
        urls = line.split()[3].split(",")
        conf = (base / "n0.conf").read_text()
        http = re.search(r'http: "([^"]+)"', conf)
        assert http is not None
        varz = _get(f"http://{http[1]}/varz")  # what any local user reads there
        name, route_port = varz["cluster"]["name"], varz["cluster"]["cluster_port"]
        log0 = base / "n0.log"
        assert "authentication error" not in log0.read_text()  # the cluster's own routes all authenticated

        # The intruder: its own nats-server (a copy it may run), routes to ours, a tokenless subscriber
        own = shared_tmp / "intruder"
        own.mkdir()
        shutil.copy(binary, own / "nats-server")
        os.chmod(own / "nats-server", 0o755)
        client, cluster, monitor = _ports(3)
        intruders.append(other.python(
            _EXEC, str(own / "nats-server"), "-a", "127.0.0.1", "-p", str(client), "-m", str(monitor),
            "-n", "intruder", "--cluster_name", name, "--cluster", f"nats://127.0.0.1:{cluster}",
            "--routes", f"nats-route://127.0.0.1:{route_port}", out=tmp_path / "intruder.log"))
        intruders.append(other.python(_SUBSCRIBER, str(client), out=tmp_path / "got"))
        _until("subscribed", lambda: b"PONG" in (tmp_path / "got").read_bytes())
        mon = f"http://127.0.0.1:{monitor}"
        # Its route tried: refused by ours, or (before routes authenticated) joined
        _until("a route tried", lambda: "authentication error" in log0.read_text() or _routes(mon) > 0)
        time.sleep(1.0)  # a joined route's interest (its subscriber's ">") reaching ours

        asyncio.run(_publish_across(urls))
        time.sleep(1.0)
        got = (tmp_path / "got").read_bytes()
        assert SECRET not in got and TOKEN.encode() not in got, got[-2000:]
        assert _routes(mon) == 0
        assert "Authorization Violation" in (tmp_path / "intruder.log").read_text()
        assert "authentication error" in log0.read_text()

        # The route password: in no file, nor on the monitoring port, as the token
        servers = psutil.Process(serve.pid).children()
        assert len(servers) == 3
        environ = Path(f"/proc/{servers[0].pid}/environ").read_bytes().split(b"\0")
        password = json.loads(next(e for e in environ if e.startswith(f"{ROUTE_PASSWORD_ENV}=".encode()))
                              .split(b"=", 1)[1])
        assert len(password) >= 32 and f"${ROUTE_PASSWORD_ENV}" in conf and f"${ROUTES_ENV}" in conf
        for f in _files(base):
            assert password.encode() not in f.read_bytes(), f
        for path in ("/varz", "/routez", "/routez?subs=1", "/connz?auth=true"):
            with urllib.request.urlopen(f"http://{http[1]}{path}", timeout=10) as r:
                assert password.encode() not in r.read(), path
    finally:
        for p in intruders:
            p.kill()
            p.wait(timeout=10)
        serve.send_signal(signal.SIGTERM)
        serve.communicate(timeout=30)
    assert serve.returncode == 0
