"""TLS, mutual TLS and the shared bearer token, for gRPC and the aggregator's HTTP API.

Files are re-read when they change, never needing a restart: the server's certificate and key (and
the client CA) through gRPC's dynamic SSL credentials, whose fetcher gRPC calls before every new
TLS handshake; the agent's through a fresh channel on every reconnect; the token through its
file's modification time. A file that cannot be read at start-up stops the daemon (a clear error);
one that breaks later keeps the last good copy and is logged.

Identity (what an agent id is bound to, see docs/reliability.md): the client certificate's subject
(common name, else its first subject alternative name) under mutual TLS; ``token`` when only the
shared token authenticates (every holder of the token is the same identity); the peer's address
when nothing authenticates (loopback by default).
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import hmac
import logging
import os
import ssl
import stat
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

if TYPE_CHECKING:
    from perfd.transport.grpc_api import ServicerContext

log = logging.getLogger(__name__)

AUTH_HEADER = "authorization"  # gRPC metadata key and HTTP header (gRPC wants it lower case)
CERT_PREFIX = "cert:"  # peer_identity's prefix for an identity taken from a client certificate
UNAUTHENTICATED_PREFIX = "addr:"  # ... for a client without credentials: its address
IDENTITY_PLACEHOLDER = "{identity}"  # in an identity policy's agent patterns: the certificate's name


class SecurityConfigError(ValueError):
    """A TLS or token file is missing, unreadable or inconsistent (start-up refuses)."""


def _read(path: str, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SecurityConfigError(f"cannot read {what} {path}: {exc.strerror}") from exc
    if not data.strip():
        raise SecurityConfigError(f"{what} {path} is empty")
    return data


@contextlib.contextmanager
def _as_path(data: bytes) -> Iterator[str]:
    """A path holding exactly ``data`` (a memory file): ``ssl`` checks the bytes gRPC is given, not
    what the file holds a moment later."""
    fd = os.memfd_create("perfd-tls", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _no_password() -> bytes:
    raise SecurityConfigError("encrypted")


def _certificates(data: bytes, path: str, what: str) -> None:
    """Refuse ``data`` unless it holds PEM certificates OpenSSL parses."""
    try:
        ssl.create_default_context(cadata=data.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
        why = getattr(exc, "reason", None) or str(exc).split(" (_ssl")[0]
        raise SecurityConfigError(f"{what} {path} is not a PEM certificate (-----BEGIN CERTIFICATE-----): "
                                  f"{why}") from None


def check_tls_files(cert: str | None, key: str | None, ca: str | None, ca_what: str) -> tuple[
        bytes | None, bytes | None, bytes | None]:
    """(cert, key, CA) as read, each checked with Python's ``ssl`` (OpenSSL): certificates that parse,
    a private key that does and matches the certificate. gRPC takes any bytes and fails only when it
    binds or connects, with no word of which file is wrong. Raises SecurityConfigError naming the
    file and what is wrong with it."""
    ca_data = _read(ca, ca_what) if ca else None
    if ca and ca_data is not None:
        _certificates(ca_data, ca, ca_what)
    if not (cert and key):
        return None, None, ca_data
    cert_data, key_data = _read(cert, "TLS certificate"), _read(key, "TLS key")
    _certificates(cert_data, cert, "TLS certificate")
    with _as_path(cert_data) as cert_path, _as_path(key_data) as key_path:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_path, key_path, _no_password)
        except SecurityConfigError:
            raise SecurityConfigError(f"TLS key {key} is encrypted with a passphrase: gRPC takes an "
                                      "unencrypted key (openssl pkey -in KEY -out KEY.plain)") from None
        except ssl.SSLError as exc:
            if exc.reason == "KEY_VALUES_MISMATCH":
                raise SecurityConfigError(f"TLS key {key} does not match the certificate {cert} (another "
                                          "key pair's)") from None
            raise SecurityConfigError(f"TLS key {key} is not a PEM private key (-----BEGIN ... PRIVATE "
                                      f"KEY-----): {exc.reason or 'OpenSSL cannot read it'}") from None
    return cert_data, key_data, ca_data


def _mtimes(paths: tuple[str, ...]) -> tuple[float, ...]:
    out = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append(st.st_mtime_ns + st.st_ino + st.st_size)  # a replaced file changes inode too
        except OSError:
            out.append(-1)
    return tuple(out)


_GROUP_READ_WARNED: set[str] = set()  # token files already warned about (once per process and path)


def check_secret_file_mode(path: str, what: str = "token file") -> None:
    """Refuse a secret file (a bearer token) other users may read or write: SecurityConfigError with
    its path, mode and ``chmod 600``. A file a group may read is refused unless this process is in that
    group; if it is, the file is taken with one warning: a Kubernetes Secret a non-root pod reads is
    root's, mode 0440, group the pod's fsGroup (deploy/k8s), and cannot be the process's own 0600
    file. Used for ``--auth-token-file`` (agent, aggregator, clients) and the engine's token file."""
    try:
        st = os.stat(path)  # a Secret's file is a link into ..data/: its target's mode is what counts
    except OSError:
        return  # the read that follows says why
    if st.st_uid not in (os.geteuid(), 0):  # root's: a Secret mounted by the kubelet
        raise SecurityConfigError(f"{what} {path} belongs to uid {st.st_uid}, not to this user (uid "
                                  f"{os.geteuid()}) or root: its owner chose the token (and may read it)")
    granted = acl_grants(path)
    if granted:
        raise SecurityConfigError(f"{what} {path} has an access control list giving {granted} access: "
                                  f"setfacl -b {path}")
    mode = stat.S_IMODE(st.st_mode)
    others = mode & (stat.S_IROTH | stat.S_IWOTH)
    group = mode & (stat.S_IRGRP | stat.S_IWGRP)
    ours = st.st_gid == os.getegid() or st.st_gid in os.getgroups()
    if others or (group and not ours):
        who = "other users" if others else f"group {st.st_gid}, which this process is not in,"
        raise SecurityConfigError(f"{what} {path} may be read or written by {who} (mode {mode:04o}): "
                                  f"chmod 600 {path}")
    if group and path not in _GROUP_READ_WARNED:
        _GROUP_READ_WARNED.add(path)
        log.warning("%s %s may be read by group %d (mode %04o): expected for a Kubernetes Secret mounted "
                    "for the pod's fsGroup; elsewhere chmod 600 %s", what, path, st.st_gid, mode, path)


# POSIX ACL entries as Linux stores them in the system.posix_acl_access attribute: a 4-byte version,
# then (tag u16, permissions u16, id u32) each; the tags of a named user and a named group. The mode's
# group bits are then the ACL's mask, so a mode check alone misses them.
_ACL_ENTRY = struct.Struct("<HHI")
_ACL_USER, _ACL_GROUP = 0x02, 0x08


def acl_grants(path: str) -> str:
    """Whom an access ACL on ``path`` gives read or write access beyond its owner, the process's own
    groups and root ("uid 999, gid 50"); "" when none (or no ACL, or no way to read one here)."""
    try:
        raw = os.getxattr(path, "system.posix_acl_access")
    except OSError:  # ENODATA: no ACL; ENOTSUP: a filesystem without them
        return ""
    mine = {os.getegid(), *os.getgroups()}
    out = []
    for off in range(4, len(raw) - _ACL_ENTRY.size + 1, _ACL_ENTRY.size):
        tag, perm, who = _ACL_ENTRY.unpack_from(raw, off)
        if not perm & 0o6:
            continue
        if tag == _ACL_USER and who not in (os.geteuid(), 0):
            out.append(f"uid {who}")
        elif tag == _ACL_GROUP and who not in mine:
            out.append(f"gid {who}")
    return ", ".join(out)


class TokenFile:
    """A bearer token read from a file (first line, surrounding blanks stripped), re-read when the
    file changes. ``check()`` compares in constant time. ``generation`` counts the token's changes:
    a stream that authenticated with an older generation is closed by the server (a rotated token
    must not leave streams open on the old one)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp = _mtimes((path,))
        check_secret_file_mode(path)
        self._token = self._load()
        self.generation = 0

    def _load(self) -> bytes:
        token = _read(self.path, "token file").strip().splitlines()[0].strip()
        if len(token) < 16:
            raise SecurityConfigError(f"token in {self.path} is shorter than 16 characters")
        return token

    def token(self) -> bytes:
        return self.current()[0]

    def current(self) -> tuple[bytes, int]:
        """(the token, its generation), re-read first when the file changed."""
        with self._lock:
            stamp = _mtimes((self.path,))
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    token = self._load()
                    try:  # said, not refused: refusing would lock out every agent that read the new token
                        check_secret_file_mode(self.path)
                    except SecurityConfigError as exc:
                        log.error("%s", exc)
                    if not hmac.compare_digest(token, self._token):
                        self._token = token
                        self.generation += 1
                    log.info("token file %s re-read", self.path)
                except SecurityConfigError as exc:
                    log.error("%s; keeping the previous token", exc)
            return self._token, self.generation

    def check(self, header: str | bytes | None) -> bool:
        """True when ``header`` is ``Bearer <token>`` with the current token."""
        return self.check_generation(header) is not None

    def check_generation(self, header: str | bytes | None) -> int | None:
        """The generation of the current token when ``header`` carries it, else None."""
        if header is None:
            return None
        raw = header.encode() if isinstance(header, str) else header
        scheme, _, value = raw.partition(b" ")
        if scheme.lower() != b"bearer":
            return None
        token, gen = self.current()
        return gen if hmac.compare_digest(value.strip(), token) else None

    def header(self) -> str:
        return "Bearer " + self.token().decode()


@dataclass(frozen=True)
class ServerTls:
    """The aggregator's certificate and key; ``client_ca`` set = mutual TLS (clients must present
    a certificate that CA signed)."""

    cert: str
    key: str
    client_ca: str | None = None

    def __post_init__(self) -> None:
        self._config()  # a file gRPC cannot use refused at start-up, named, before any port is bound

    def _config(self) -> grpc.ServerCertificateConfiguration:
        cert, key, ca = check_tls_files(self.cert, self.key, self.client_ca, "client CA")
        assert cert is not None and key is not None
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def credentials(self) -> grpc.ServerCredentials:
        paths = tuple(p for p in (self.cert, self.key, self.client_ca) if p)
        lock = threading.Lock()
        state = {"stamp": _mtimes(paths)}
        initial = self._config()

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            # Called by gRPC before every new handshake: cheap when nothing changed (three stats).
            with lock:
                stamp = _mtimes(paths)
                if stamp == state["stamp"]:
                    return None
                state["stamp"] = stamp
                try:
                    cfg = self._config()
                except SecurityConfigError as exc:
                    log.error("TLS files changed but cannot be used (%s); keeping the previous ones", exc)
                    return None
                log.info("TLS certificate re-read from %s", self.cert)
                return cfg

        return grpc.dynamic_ssl_server_credentials(initial, fetch,
                                                   require_client_authentication=self.client_ca is not None)


@dataclass(frozen=True)
class ClientTls:
    """The agent's trust root (``ca``) and, for mutual TLS, its certificate and key. Read again for
    every new channel, so renewed files apply at the next reconnect."""

    ca: str
    cert: str | None = None
    key: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise SecurityConfigError("--tls-cert and --tls-key go together")
        self.credentials()  # fail at start-up, not at the first connection

    def credentials(self) -> grpc.ChannelCredentials:
        cert, key, ca = check_tls_files(self.cert, self.key, self.ca, "TLS CA")
        return grpc.ssl_channel_credentials(ca, key, cert)


# Every holder of the shared bearer token is this one identity: it tells no client from another.
SHARED_TOKEN_IDENTITY = "token"


def peer_identity(context: ServicerContext, token_ok: bool) -> str:
    """What an agent id is bound to, from a gRPC servicer context (see the module docstring)."""
    auth = context.auth_context() or {}
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        vals = auth.get(key)
        if vals:
            v = vals[0]
            return CERT_PREFIX + (v.decode(errors="replace") if isinstance(v, bytes) else str(v))
    if token_ok:
        return SHARED_TOKEN_IDENTITY
    peer = str(context.peer())  # "ipv4:127.0.0.1:54321" / "ipv6:[::1]:54321"
    host = peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer
    return UNAUTHENTICATED_PREFIX + host



@dataclass(frozen=True)
class _PolicyEntry:
    pattern: str  # a certificate identity, or an fnmatch pattern of them
    agents: tuple[str, ...]  # agent id patterns ("{identity}" stands for the certificate's name)
    jobs: tuple[str, ...]  # job name patterns


class IdentityPolicy:
    """Which agent ids and jobs each client certificate may use (``perfd aggregator
    --identity-policy FILE``, with mutual TLS). Without it a certificate may claim any unbound
    agent id and name any job in its Hello; with it, a certificate matching no entry is refused,
    and one that does may use only the agent ids and write only the jobs its entry names.

    The file (YAML or JSON)::

        identities:
          node-017.example.com:             # a client certificate's common name (else first SAN)
            agents: [node-017]               # agent ids it may use (fnmatch patterns)
            jobs: ["llama-*"]                # jobs it may host and write (default: any)
          "*.gpu.example.com":               # a pattern: the first entry matching, in file order,
            agents: ["{identity}"]           # after an exact name; {identity} = the name itself

    Re-read when the file changes (a broken file keeps the last good one, logged)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp = _mtimes((path,))
        self._entries = self._load()

    def _load(self) -> list[_PolicyEntry]:
        import yaml

        try:
            doc = yaml.safe_load(_read(self.path, "identity policy"))
        except yaml.YAMLError as exc:
            raise SecurityConfigError(f"identity policy {self.path}: not YAML/JSON: {exc}") from exc
        ids = doc.get("identities") if isinstance(doc, dict) else None
        if not isinstance(ids, dict) or not ids:
            raise SecurityConfigError(f"identity policy {self.path}: wants a non-empty mapping "
                                      "'identities: {NAME: {agents: [...], jobs: [...]}}'")
        out = []
        for name, spec in ids.items():
            spec = spec if spec is not None else {}
            if not isinstance(spec, dict) or set(spec) - {"agents", "jobs"}:
                raise SecurityConfigError(f"identity policy {self.path}: entry {name!r} takes only "
                                          "'agents' and 'jobs' lists")
            lists = []
            for key in ("agents", "jobs"):
                v = spec.get(key, ["*"])
                if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
                    raise SecurityConfigError(f"identity policy {self.path}: {name!r}.{key} must be a "
                                              "list of names or patterns")
                lists.append(tuple(v))
            out.append(_PolicyEntry(str(name), lists[0], lists[1]))
        return out

    def _current(self) -> list[_PolicyEntry]:
        with self._lock:
            stamp = _mtimes((self.path,))
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self._entries = self._load()
                    log.info("identity policy %s re-read", self.path)
                except SecurityConfigError as exc:
                    log.error("%s; keeping the previous policy", exc)
            return self._entries

    def entry(self, identity: str | None) -> tuple[str, _PolicyEntry] | None:
        """(certificate name, its entry) for a stream identity (peer_identity); None when no entry
        applies — a stream without a client certificate included."""
        if identity is None or not identity.startswith(CERT_PREFIX):
            return None
        name = identity[len(CERT_PREFIX):]
        entries = self._current()
        for e in entries:
            if e.pattern == name:
                return name, e
        for e in entries:
            if fnmatch.fnmatchcase(name, e.pattern):
                return name, e
        return None

    def may_use_agent_id(self, identity: str, agent_id: str) -> bool:
        got = self.entry(identity)
        return got is not None and any(
            fnmatch.fnmatchcase(agent_id, p.replace(IDENTITY_PLACEHOLDER, glob.escape(got[0])))
            for p in got[1].agents)

    def may_write_job(self, identity: str | None, job: str) -> bool:
        got = self.entry(identity)
        return got is not None and any(fnmatch.fnmatchcase(job, p) for p in got[1].jobs)
