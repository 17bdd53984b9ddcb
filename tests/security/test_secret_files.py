"""TLS files and token files the daemons are given: a file gRPC cannot use is named
with what is wrong with it before any port is bound (not "the port is already in use"), and a token
file other users may read is refused (exit 2, the file, its mode, ``chmod 600``)."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import struct
from pathlib import Path

import grpc
import pytest

from perfd.app.cli import main
from perfd.transport import grpc_bind
from perfd.transport.security import ClientTls, SecurityConfigError, TokenFile
from tests.procs import free_port
from tests.security.certs import CA

pytestmark = pytest.mark.timeout(60)  # an aggregator that took a bad file would run on, in process
TOKEN = "a-token-of-enough-length-0123"


def _aggregator(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    rc = main(["aggregator", "--grpc-port", "0", "--http-port", "0", "--no-rules", *args])
    return rc, capsys.readouterr().err


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, str]:
    ca, other = CA("perfd test CA"), CA("another CA")
    out = {"ca": ca.write_ca(tmp_path, "ca")}
    out["cert"], out["key"] = ca.write(tmp_path, "server", "perfd-aggregator", server=True)
    _, out["other_key"] = other.write(tmp_path, "other", "x", server=True)
    (tmp_path / "junk.pem").write_text("not a PEM file at all\n")
    out["junk"] = str(tmp_path / "junk.pem")
    return out


def test_tls_files_gRPC_cannot_use_are_named_before_binding(capsys: pytest.CaptureFixture[str],
                                                           pki: dict[str, str]) -> None:
    """A key of another pair, junk in the certificate, the key or the client CA: exit 2 naming the file
    and the problem, one line, never the port (the issue: "cannot listen for gRPC on 127.0.0.1:0: the
    port is already in use")."""
    cases = [
        ((pki["cert"], pki["other_key"], None), f"TLS key {pki['other_key']} does not match the certificate "
                                                f"{pki['cert']}"),
        ((pki["junk"], pki["key"], None), f"TLS certificate {pki['junk']} is not a PEM certificate"),
        ((pki["cert"], pki["junk"], None), f"TLS key {pki['junk']} is not a PEM private key"),
        ((pki["cert"], pki["key"], pki["junk"]), f"client CA {pki['junk']} is not a PEM certificate"),
    ]
    for (cert, key, ca), said in cases:
        rc, err = _aggregator(capsys, "--tls-cert", cert, "--tls-key", key,
                              *(["--tls-client-ca", ca] if ca else []))
        assert rc == 2, err
        assert said in err and "in use" not in err and "cannot listen" not in err, err
        assert err.strip().splitlines() == [next(ln for ln in err.splitlines() if said in ln)], err
    # The agent's files the same way, at start-up rather than at its first connection.
    with pytest.raises(SecurityConfigError, match=f"TLS CA {pki['junk']} is not a PEM certificate"):
        ClientTls(pki["junk"])
    with pytest.raises(SecurityConfigError, match="does not match the certificate"):
        ClientTls(pki["ca"], pki["cert"], pki["other_key"])


def test_a_failed_grpc_bind_says_in_use_only_when_the_port_is(monkeypatch: pytest.MonkeyPatch) -> None:
    async def body() -> tuple[int | None, str]:
        server = grpc.aio.server()
        monkeypatch.setattr(server, "add_insecure_port", lambda addr: 0)  # gRPC refusing for its own reason
        with pytest.raises(OSError) as got:
            await grpc_bind.bind(server, "127.0.0.1", free_port(), None)
        return got.value.errno, str(got.value)

    code, text = asyncio.run(body())
    assert code != errno.EADDRINUSE and "in use" not in text, text


def _token(tmp_path: Path, mode: int, name: str = "token") -> Path:
    p = tmp_path / name
    p.write_text(TOKEN + "\n")
    p.chmod(mode)
    return p


def test_the_daemons_refuse_a_token_file_others_may_read(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """`perfd aggregator` and `perfd agent` with ``--auth-token-file`` of mode 0644: exit 2, one line
    naming the file, its mode and the fix (the issue: accepted without a word). Each command through the
    CLI's main() in this process: its return value the exit status (a daemon that took the file would run
    on: the module's timeout ends it), an exception a failure of its own."""
    tok = _token(tmp_path, 0o644)
    said = f"token file {tok} may be read or written by other users (mode 0644): chmod 600 {tok}"
    rc, err = _aggregator(capsys, "--auth-token-file", str(tok))
    assert rc == 2 and err.strip() == f"perfd aggregator: {said}", err
    rc = main(["agent", "--aggregator", f"127.0.0.1:{free_port()}", "--auth-token-file", str(tok),
               "--nvml", "off", "--host", "off", "--metrics-port", "0",
               "--spool-dir", str(tmp_path / "spool"), "--state-dir", str(tmp_path / "state")])
    err = capsys.readouterr().err
    assert rc == 2 and said in err and "Traceback" not in err, err


def test_a_token_file_others_may_read_is_refused(tmp_path: Path) -> None:
    for mode in (0o644, 0o604, 0o602):
        tok = _token(tmp_path, mode)
        with pytest.raises(SecurityConfigError) as got:
            TokenFile(str(tok))
        assert str(got.value) == (f"token file {tok} may be read or written by other users "
                                  f"(mode {mode:04o}): chmod 600 {tok}")
    # A group this process is not in: as good as others.
    tok = _token(tmp_path, 0o640)
    os.chown(tok, -1, _a_group_not_ours())
    with pytest.raises(SecurityConfigError, match=r"group \d+, which this process is not in.*chmod 600"):
        TokenFile(str(tok))


def _acl(*entries: tuple[int, int, int]) -> bytes:
    """A system.posix_acl_access value: version 2, then (tag, permissions, id) each."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


def test_a_token_file_another_user_owns_or_an_acl_opens_is_refused(tmp_path: Path) -> None:
    """Found by a cold review: the mode was all that was checked. A 0600 token another user owns
    (planted in a shared folder: they chose the token, and read it), and a root 0600 file an ACL
    opens to another uid (its mode then reads 0640, the ACL's mask) were both taken."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give the file another owner")
    theirs = _token(tmp_path, 0o600, "theirs")
    os.chown(theirs, 60123, -1)
    with pytest.raises(SecurityConfigError, match=r"belongs to uid 60123, not to this user .* or root"):
        TokenFile(str(theirs))
    tok = _token(tmp_path, 0o600)
    undefined = 0xFFFFFFFF
    try:  # user::rw-, user:60123:r--, group::---, mask::r--, other::---
        os.setxattr(tok, "system.posix_acl_access", _acl((0x01, 6, undefined), (0x02, 4, 60123),
                                                         (0x04, 0, undefined), (0x10, 4, undefined),
                                                         (0x20, 0, undefined)))
    except OSError as exc:
        pytest.skip(f"no POSIX ACLs on this filesystem: {exc}")
    with pytest.raises(SecurityConfigError) as got:
        TokenFile(str(tok))
    assert str(got.value) == (f"token file {tok} has an access control list giving uid 60123 access: "
                              f"setfacl -b {tok}")


def _a_group_not_ours() -> int:
    ours = {os.getegid(), *os.getgroups()}
    gid = next(g for g in range(60000, 65000) if g not in ours)
    if os.geteuid() != 0:
        pytest.skip("needs root to give the file another group")
    return gid


def test_a_token_readable_by_our_own_group_is_taken_with_one_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A Kubernetes Secret a non-root pod reads is root's, 0440, group the pod's fsGroup (a group of the
    process): it cannot be made 0600, so it is taken, and said once."""
    from perfd.transport.security import check_secret_file_mode

    tok = _token(tmp_path, 0o440)
    os.chown(tok, -1, os.getegid())
    with caplog.at_level(logging.WARNING, logger="perfd.transport.security"):
        assert TokenFile(str(tok)).check(f"Bearer {TOKEN}")
        TokenFile(str(tok))
        check_secret_file_mode(str(tok))
    said = [r.getMessage() for r in caplog.records if str(tok) in r.getMessage()]
    assert len(said) == 1 and "fsGroup" in said[0] and f"chmod 600 {tok}" in said[0], said
    for mode in (0o600, 0o400):  # the file's own user only: not a word
        caplog.clear()
        assert TokenFile(str(_token(tmp_path, mode, f"t{mode:o}"))).check(f"Bearer {TOKEN}")
        assert not caplog.records
