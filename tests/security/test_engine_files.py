"""The files of ``perfd engine serve``: its folder, nats-server's configs, logs and
JetStream store. Another local user reads nothing of them and never learns the engine's token (with
which they could command agents or squat the root's lease); a folder that is theirs, or one others
may write in, is refused; nothing is written through a link, or blocks on a FIFO, planted in it."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil
import pytest

from perfd.core.privdir import UnsafeDirError
from perfd.engine.natsd import TOKEN_ENV, NatsCluster
from tests.engine.test_natsd import _need_nats_server
from tests.security.other_user import other_user

TOKEN = "engine-token-0123456789abcdef"  # long and unlike anything nats-server writes by itself
# Prints each file named that this user could read, and the listing of the folder if it could list it.
_READ_ALL = ('ls -A "$1" 2>/dev/null && echo LISTED; shift; '
             'for f; do cat "$f" 2>/dev/null && echo "READ $f"; done; true')


def _files(root: Path) -> list[Path]:
    return [Path(d, f) for d, _, names in os.walk(root) for f in names]


def _token_file(tmp_path: Path) -> Path:
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    f.chmod(0o600)
    return f


@pytest.mark.e2e  # another user against a running `perfd engine serve` process
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_another_user_gets_nothing_of_a_running_engine_nor_its_token(shared_tmp: Path,
                                                                     tmp_path: Path) -> None:
    _need_nats_server()
    other = other_user()
    base = shared_tmp / "engine"  # a folder /tmp-like: every user reaches what it holds, unless private
    serve = subprocess.Popen([sys.executable, "-m", "perfd.app.cli", "engine", "serve", "--dir", str(base),
                              "--token-file", str(_token_file(tmp_path))],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert serve.stdout is not None and serve.stderr is not None
        line = serve.stdout.readline()  # printed once the server is JetStream-ready
        assert "Ctrl-C stops it" in line, (line, serve.stderr.read() if serve.poll() is not None else "")
        files = _files(base)
        assert base / "n0.conf" in files and base / "n0.log" in files
        seen = other.run(_READ_ALL, str(base), *map(str, files)).stdout
        assert "LISTED" not in seen and "READ" not in seen and TOKEN not in seen
        assert stat.S_IMODE(base.stat().st_mode) == 0o700
        for f in (base / "n0.conf", base / "n0.log"):
            assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
        # Not in any file at all, whatever its mode: the config names the variable, not the token
        for f in files:
            assert TOKEN.encode() not in f.read_bytes(), f
        assert f"${TOKEN_ENV}" in (base / "n0.conf").read_text()
        # Where the token is: the server's environment, which only its uid and root read
        (server,) = psutil.Process(serve.pid).children()
        assert TOKEN in Path(f"/proc/{server.pid}/environ").read_text()
        environ = other.run('cat "$1" 2>&1; true', f"/proc/{server.pid}/environ").stdout
        assert TOKEN not in environ and "Permission denied" in environ
        # The monitoring port is open to every local user: it does not show the token either
        http = re.search(r'http: "([^"]+)"', (base / "n0.conf").read_text())
        assert http is not None
        for path in ("/varz", "/connz?auth=true", "/jsz?accounts=true"):
            with urllib.request.urlopen(f"http://{http[1]}{path}", timeout=10) as r:
                assert TOKEN.encode() not in r.read(), path
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.communicate(timeout=30)
    assert serve.returncode == 0


@pytest.mark.e2e  # `perfd engine serve`'s refusal at start, its exit status
@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("whose", ["another user's", "a shared one"])
def test_serve_refuses_a_folder_it_cannot_keep_private(shared_tmp: Path, tmp_path: Path, whose: str) -> None:
    other = other_user()
    if whose == "another user's":
        base, says = shared_tmp / "squatted", f"belongs to uid {other.uid}"
        other.run('mkdir -m 777 "$1"', str(base))
    else:  # /tmp itself, say: narrowing it to 0700 would shut every other user out of it
        base, says = shared_tmp, "other users may write in (mode 1777)"
    res = subprocess.run([sys.executable, "-m", "perfd.app.cli", "engine", "serve", "--dir", str(base),
                          "--token-file", str(_token_file(tmp_path))],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res
    assert res.stderr.startswith("perfd engine serve: ") and says in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert os.listdir(base) == []  # nothing written in it
    assert stat.S_IMODE(base.stat().st_mode) == (0o777 if whose == "another user's" else 0o1777)


def _planted(shared_tmp: Path, name: str, kind: str) -> tuple[Path, Path]:
    """A folder of ours that others could once write in, and the other user's ``kind`` at ``name`` in
    it, planted then (the folder since narrowed); returns the folder and the root's file or folder
    the link leads to."""
    other = other_user()
    base, victim = shared_tmp / "engine", shared_tmp / "root-only"
    base.mkdir(mode=0o777)
    base.chmod(0o777)
    if name.endswith("store"):
        victim.mkdir(mode=0o700)
    else:
        victim.write_text("keep me\n")
        victim.chmod(0o600)
    other.run('ln -s "$2" "$1"' if kind == "link" else 'mkfifo -m 666 "$1"', str(base / name), str(victim))
    base.chmod(0o755)
    return base, victim


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, kind", [("n0.conf", "link"), (".n0.conf.tmp", "link"), ("n0.log", "link"),
                                        ("n0-store", "link"), ("n0.log", "fifo")])
def test_nothing_is_written_through_what_was_planted_in_the_engines_folder(shared_tmp: Path, name: str,
                                                                          kind: str) -> None:
    _need_nats_server()
    base, victim = _planted(shared_tmp, name, kind)
    refused = name in ("n0.log", "n0-store")  # the config is replaced whole instead (a rename)
    c = NatsCluster(base, 1, token=TOKEN)
    try:
        if refused:
            with pytest.raises(UnsafeDirError, match=f"{re.escape(str(base / name))} is "):
                c.start(timeout_s=20)
            assert not c.servers[0].running
        else:
            c.start(timeout_s=20)
            assert stat.S_ISREG(os.lstat(base / "n0.conf").st_mode)
    finally:
        c.stop()
    if victim.is_dir():
        assert os.listdir(victim) == []
    else:
        assert victim.read_text() == "keep me\n"
    assert stat.S_IMODE(base.stat().st_mode) == 0o700


@pytest.mark.timeout(60)
def test_an_older_engines_folder_is_made_private_and_its_token_gone(tmp_path: Path) -> None:
    """The folder a previous perfd left: 0755, its config 0644 holding the token, its log 0644."""
    _need_nats_server()
    base = tmp_path / "engine"
    base.mkdir()
    base.chmod(0o755)
    for name, text in (("n0.conf", f'authorization {{ token: "{TOKEN}" }}\n'), ("n0.log", "old run\n")):
        (base / name).write_text(text)
        (base / name).chmod(0o644)
    with NatsCluster(base, 1, token=TOKEN):
        assert stat.S_IMODE(base.stat().st_mode) == 0o700
        for name in ("n0.conf", "n0.log"):
            assert stat.S_IMODE((base / name).stat().st_mode) == 0o600, name
        assert stat.S_IMODE((base / "n0-store").stat().st_mode) == 0o700
        assert TOKEN not in (base / "n0.conf").read_text()
        assert (base / "n0.log").read_text().startswith("old run\n")  # appended to, as before
