"""The local sockets perfd listens on: the step hook's and the Kineto daemon's. Another local user
can neither take their name first nor take a job's trace config from them."""

from __future__ import annotations

import logging
import os
import socket
import stat
import time
from pathlib import Path

import pytest

import perfd.core.privdir
from perfd.agent.capture_executor import KINETO_SQUATTED, AgentCaptures
from perfd.capture.dynolog import socket_holders
from perfd.capture.kineto_daemon import KinetoDaemon, build_config, pack_request, unpack_message
from perfd.collectors.hook.collector import HookCollector
from perfd.hook import wire
from perfd.hook.sender import DatagramSender
from tests.procs import wait_for
from tests.security.other_user import other_user

# What the other user runs (the system's Python: that user cannot reach the project's venv).
_BIND = "import socket, sys; socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).bind(sys.argv[1])"
_SEND = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
try:
    s.sendto(b"x" * 16, sys.argv[1])
    print("sent")
except OSError as exc:
    print(type(exc).__name__)
"""
# A Kineto client asking for the armed pid (libkineto's request, byte for byte), from its own socket.
_ASK = """
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[2])
s.settimeout(5)
s.sendto(bytes.fromhex(sys.argv[3]), sys.argv[1])
data = s.recv(65536)
print(len(data) - 40)
"""


def _python() -> str:
    for p in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(p, os.X_OK):
            return p
    pytest.skip("no system python3 for the other user's process")


def test_default_hook_socket_is_private_to_its_user() -> None:
    path = Path(wire.default_socket_path())
    assert path.name == "hook.sock" and str(path) != "/tmp/perfd-hook.sock"
    assert path.parent == perfd.core.privdir.runtime_dir()
    # Never a name every user shares: /run/perfd for root, the user's runtime dir, or <tmp>/perfd-<uid>.
    assert (os.geteuid() == 0 and str(path.parent) == "/run/perfd") or str(os.geteuid()) in str(path) \
        or "XDG_RUNTIME_DIR" in os.environ


def test_default_hook_socket_folder_is_made_private(shared_tmp: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    other = other_user()
    monkeypatch.setattr(perfd.core.privdir, "runtime_dir", lambda: shared_tmp / "rt")
    col = HookCollector({"job": "j"})
    assert col.config.socket_path == str(shared_tmp / "rt" / "hook.sock")
    assert col.probe().available
    col.start()
    try:
        assert col.sock is not None
        st = (shared_tmp / "rt").stat()
        assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700
        # Our own process reaches it...
        DatagramSender(col.config.socket_path).send(b"\x01")
        # ...another user's does not (the folder stops it before the socket's mode is asked).
        out = other.run(f'{_python()} -c "$1" "$2"', _SEND, col.config.socket_path).stdout.strip()
        assert out == "PermissionError"
    finally:
        col.stop()


def test_a_hook_socket_of_another_user_is_refused_not_removed(shared_tmp: Path) -> None:
    other = other_user()
    path = shared_tmp / "perfd-hook.sock"
    other.run(f'{_python()} -c "$1" "$2"', _BIND, str(path))  # bound first by the other user
    assert path.lstat().st_uid == other.uid
    col = HookCollector({"job": "j", "socket_path": str(path)})
    caps = col.probe()
    assert not caps.available and f"belongs to uid {other.uid}" in caps.reason
    col.start()
    assert col.sock is None and col.errors.get("bind_failed") == 1
    assert path.lstat().st_uid == other.uid  # theirs, left in place (root could have removed it)


def test_kineto_daemon_answers_an_armed_pid_only_to_its_owner(shared_tmp: Path) -> None:
    other = other_user()
    sdir = shared_tmp / "k"
    sdir.mkdir(mode=0o755)
    theirs = shared_tmp / "theirs"
    other.run('mkdir -m 700 "$1"', str(theirs))
    with KinetoDaemon(socket_dir=str(sdir)) as daemon:  # mode 0666: any user may send, as libkineto's
        me = os.getpid()
        arming = daemon.arm({me: build_config(shared_tmp / "trace.json", iterations=3)},
                            expires_at=time.time() + 30)
        req = pack_request(2, 0, [me, 1]).hex()  # ACTIVITIES, claiming our pid
        got = other.run(f'{_python()} -c "$1" "$2" "$3" "$4"', _ASK, str(daemon.address),
                        str(theirs / "dynoconfigclient-a"), req).stdout.strip()
        assert got == "0"  # an empty answer: nothing to trace
        assert daemon.errors.get("foreign_sender") == 1 and not arming.answered()
        # The process's own user gets it.
        c = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            c.bind(str(sdir / "dynoconfigclient-b"))
            c.settimeout(5)
            c.sendto(bytes.fromhex(req), str(daemon.address))
            _kind, payload = unpack_message(c.recv(65536))
        finally:
            c.close()
        assert payload.startswith(b"ACTIVITIES_LOG_FILE=") and me in arming.answered()


# Another user squats the Kineto daemon's abstract name and runs a dynolog look-alike on a port of its
# own, which says yes to everything it is handed.
_SQUAT_KINETO = r"""
import json, os, socket, struct, sys
u = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
u.bind(b"\0" + sys.argv[1].encode() + b"\0")
t = socket.socket()
t.bind(("127.0.0.1", 0))
t.listen(8)
print("squatting", os.getpid(), t.getsockname()[1], flush=True)
while True:
    c, _ = t.accept()
    req = json.loads(c.recv(struct.unpack("=i", c.recv(4))[0]))
    pids = req.get("pids", [])
    rep = {"status": 1} if req.get("fn") == "getStatus" else {
        "processesMatched": pids, "activityProfilersTriggered": pids}
    body = json.dumps(rep).encode()
    c.sendall(struct.pack("=i", len(body)) + body)
    c.close()
"""


def test_a_squatted_kineto_socket_is_named_and_counted_and_never_used(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The issue: a user who binds the Kineto daemon's name first turned Kineto captures off node-wide
    ("the Kineto socket is taken") — or, with a look-alike dynolog on a port, got the agent's trace
    configs and reported every capture triggered. Now its holder is found (/proc/net/unix → the fds),
    named in an error with its pid and uid, and counted; nothing is handed to it."""
    other = other_user()
    name = f"perfd-test-{os.urandom(6).hex()}"  # not the real "dynolog": tests run side by side
    out = tmp_path / "squat.out"
    squat = other.python(_SQUAT_KINETO, name, out=out)
    try:
        wait_for(lambda: "squatting" in out.read_text(), 30, "the squatter's socket")
        _, pid, port = next(ln for ln in out.read_text().splitlines() if ln.startswith("squatting")).split()
        assert [(h.pid, h.uid) for h in socket_holders(name) or []] == [(int(pid), other.uid)]
        with caplog.at_level(logging.ERROR, logger="perfd.agent.capture_executor"):
            caps = AgentCaptures("j", str(tmp_path / "captures"), 1 << 30, lambda e: None, kineto=True,
                                 kineto_socket=name, dynolog_port=int(port))
        try:
            assert caps.kineto is None  # neither its socket nor its port is used
            assert caps.kineto_errors == {KINETO_SQUATTED: 1}
            said = " ".join(r.getMessage() for r in caplog.records)
            assert f"held by pid {pid} (uid {other.uid}" in said
            assert "Kineto on-demand captures are off" in said
        finally:
            caps.close()
    finally:
        os.killpg(squat.pid, 9)
        squat.wait(10)
    # Its own socket (this process, root): found as root's, the dynolog path's precondition.
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as mine:
        mine.bind(b"\0" + name.encode() + b"\0")
        assert [(h.pid, h.uid) for h in socket_holders(name) or []] == [(os.getpid(), 0)]
    assert socket_holders(name) is None  # nobody holds it now
