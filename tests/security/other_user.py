"""A second OS user for the permission tests: what another local user can do to perfd's files.

Running as root (CI does), the test makes the user with ``useradd`` (once; concurrent workers may
race, so an existing user is fine) and runs the attacker's steps as that user in a real process.
Not root: the tests that need one skip, saying why.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

NAME = "perfd-other"


@dataclass(frozen=True)
class OtherUser:
    name: str
    uid: int
    gid: int

    def argv(self, *argv: str) -> list[str]:
        """``argv`` run as this user, its groups cleared, by util-linux's setpriv (Debian's essential
        set): the caller's Popen then takes Python's vfork path and execs at once. With Popen's own
        ``user=``/``group=`` it forks instead, from a pytest worker whose gRPC threads may be
        mid-call ("Other threads are currently calling into gRPC, skipping fork() handlers"): beside
        that line an attacker twice printed nothing in 30 s in full suites (a hypothesis, not shown:
        alone, and beside busy loops, it starts within a second)."""
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", *argv]

    def run(self, script: str, *args: str) -> subprocess.CompletedProcess[str]:
        """``sh -c script`` with ``$1...`` = ``args`` as this user (a real process of another uid;
        the shell and coreutils, since this user may not reach the project's Python)."""
        return subprocess.run(self.argv("/bin/sh", "-c", script, "sh", *args), capture_output=True, text=True,
                              timeout=60, check=True, cwd="/")

    def python(self, code: str, *args: str, out: Path | None = None) -> subprocess.Popen[bytes]:
        """The system's Python running ``code`` as this user, in the background (the caller stops
        it); its output in ``out`` when given."""
        log = out.open("wb") if out is not None else subprocess.DEVNULL
        try:
            return subprocess.Popen(self.argv(system_python(), "-c", code, *args), stdout=log,
                                    stderr=subprocess.STDOUT, cwd="/", start_new_session=True)
        finally:
            if out is not None and not isinstance(log, int):
                log.close()


def system_python() -> str:
    """The system's python3 (another user cannot reach the project's venv), or skip."""
    for p in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(p, os.X_OK):
            return p
    pytest.skip("no system python3 for the other user's process")


def other_user() -> OtherUser:
    if os.geteuid() != 0:
        pytest.skip("needs root to create and act as a second OS user (useradd)")
    if shutil.which("useradd") is None:
        pytest.skip("useradd is not installed")
    try:
        pw = pwd.getpwnam(NAME)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", NAME],
                       capture_output=True, check=False)
        pw = pwd.getpwnam(NAME)  # made here or by a concurrent worker
    return OtherUser(NAME, pw.pw_uid, pw.pw_gid)


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A fresh folder like /tmp (root's, mode 1777) that both users reach."""
    d = Path(tempfile.mkdtemp(prefix="perfd-shared-", dir="/tmp"))
    d.chmod(0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
