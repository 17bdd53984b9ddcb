"""Prometheus remote-write of the aggregator's series: the cluster-wide view past one process.

Each aggregator (sharded by job, perfd/transport/shard_routing.py) holds only its jobs; a horizontally
scalable store that takes remote-write — Prometheus with ``--web.enable-remote-write-receiver``,
VictoriaMetrics, Grafana Mimir, Thanos Receive — puts every shard's jobs in one place. Every
``interval_s`` the writer takes what the aggregator's /metrics shows (the same collector, so the
same names and labels), stamps it with one timestamp and POSTs it to each target.

The protocol is remote-write 1.0: a protobuf ``WriteRequest`` (perfd/exporters/prompb), compressed
with snappy's block format (cramjam), ``Content-Encoding: snappy``,
``X-Prometheus-Remote-Write-Version: 0.1.0``. Written here because prometheus-client serves and
pushes to a Pushgateway but has no remote-write client. As the spec asks: a 5xx or 429 answer is
retried (the payload waits, oldest first, bounded by bytes: past the bound the oldest is dropped and
counted), any other 4xx is dropped and counted — the receiver will never take it.

Multi-tenant stores and gateways want more than the protocol's headers (:class:`Credentials`): a tenant
(``X-Scope-OrgID``: Grafana Mimir and Cortex; Thanos Receive reads it with
``--receive.tenant-header=X-Scope-OrgID``, or takes its own ``THANOS-TENANT`` as an extra header), a
bearer token or basic auth read from files at every request (a rotated secret is used at the next
round, never logged), and a CA to verify an https receiver against. Prometheus' own remote_write
section (``headers``, ``authorization``, ``basic_auth``, ``tls_config.ca_file``) is the model.
"""

from __future__ import annotations

import base64
import ipaddress
import logging
import re
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:  # the CLI reads this module's defaults: what sending needs is imported when used
    from prometheus_client.core import Metric

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 15.0  # Prometheus' default scrape interval: the same resolution as a scrape
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_PENDING_BYTES = 32 << 20  # per target: a few minutes of a large aggregator's series


TENANT_HEADER = "X-Scope-OrgID"  # Mimir / Cortex; Thanos Receive with --receive.tenant-header=X-Scope-OrgID
# The protocol's own headers and the transport's: set by the writer, never by an option.
RESERVED_HEADERS = frozenset({"content-encoding", "content-type", "content-length", "host",
                              "x-prometheus-remote-write-version", "user-agent", "authorization"})
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP header name (RFC 9110 token)


class CredentialsError(ValueError):
    """An option the writer cannot use: said at start, where a person can fix it."""


def _secret(path: str, what: str) -> str:
    """A secret's first line, read now (so a rotated file is used at the next request)."""
    try:
        with open(path, encoding="utf-8") as f:
            line = f.readline().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise CredentialsError(f"cannot read the {what} file {path}: {type(e).__name__}") from e
    if not line:
        raise CredentialsError(f"the {what} file {path} is empty")
    return line


@dataclass(frozen=True)
class Credentials:
    """What every request carries past the protocol's own headers: extra headers (the tenant among
    them), at most one of a bearer token or basic auth (each read from a file at every request), and a
    CA file to verify an https receiver against (the system's CAs without one)."""

    headers: tuple[tuple[str, str], ...] = ()
    bearer_token_file: str | None = None
    basic_user: str | None = None
    basic_password_file: str | None = None
    ca_file: str | None = None

    @classmethod
    def of(cls, tenant: str | None = None, headers: Iterable[str] = (), bearer_token_file: str | None = None,
           basic_user: str | None = None, basic_password_file: str | None = None,
           ca_file: str | None = None) -> Credentials:
        """From the command line's options (``headers``: ``NAME=VALUE``), checked: a bad one raises
        :class:`CredentialsError` naming it, and every file is read once here."""
        pairs: list[tuple[str, str]] = []
        for item in headers:
            name, sep, value = item.partition("=")
            name = name.strip()
            if not sep or not _TOKEN.match(name):
                raise CredentialsError(
                    f"a remote-write header wants NAME=VALUE with a header name, got {item!r}")
            pairs.append((name, value))
        if tenant is not None:
            pairs.append((TENANT_HEADER, tenant))
        seen: set[str] = set()
        for name, value in pairs:
            if name.lower() in RESERVED_HEADERS:
                raise CredentialsError(f"the remote-write header {name} is the writer's own"
                                       + (" (use the bearer-token or basic-auth options)"
                                          if name.lower() == "authorization" else ""))
            if name.lower() in seen:
                raise CredentialsError(f"the remote-write header {name} is given twice")
            if any(c in value for c in "\r\n\0") or not value.strip():
                raise CredentialsError(f"the remote-write header {name} has an empty value or a line break")
            seen.add(name.lower())
        if bearer_token_file and (basic_user or basic_password_file):
            raise CredentialsError("remote-write takes a bearer token or basic auth, not both")
        if bool(basic_user) != bool(basic_password_file):
            raise CredentialsError("remote-write basic auth needs both the user and the password file")
        c = cls(tuple(pairs), bearer_token_file, basic_user, basic_password_file, ca_file)
        c.authorization()  # the files are readable now, or the writer is not started
        c.ssl_context()
        return c

    @property
    def secret(self) -> bool:
        return bool(self.bearer_token_file or self.basic_user)

    def authorization(self) -> str | None:
        """The ``Authorization`` header's value from the files as they are now (None: no auth)."""
        if self.bearer_token_file:
            return f"Bearer {_secret(self.bearer_token_file, 'remote-write bearer token')}"
        if self.basic_user and self.basic_password_file:
            pw = _secret(self.basic_password_file, "remote-write password")
            return "Basic " + base64.b64encode(f"{self.basic_user}:{pw}".encode()).decode("ascii")
        return None

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.ca_file:
            return None
        try:
            return ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as e:
            raise CredentialsError(f"cannot use the remote-write CA file {self.ca_file}: {e}") from e


def in_the_clear(url: str) -> bool:
    """True when ``url`` is http:// to a host other than loopback: a secret sent there can be read."""
    u = urlsplit(url)
    if u.scheme != "http":
        return False
    host = u.hostname or ""
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True


def target_name(url: str) -> str:
    """A URL as a label value: scheme, host and path only (never credentials or a query)."""
    u = urlsplit(url)
    return f"{u.scheme}://{u.hostname or ''}{f':{u.port}' if u.port else ''}{u.path}"


def encode(families: Iterable[Metric], ts_ms: int, external: Mapping[str, str]) -> tuple[bytes, int]:
    """One WriteRequest (uncompressed protobuf bytes) holding every sample of ``families`` at
    ``ts_ms``, with ``external`` labels added (a sample's own label wins), and its sample count.
    Labels are sorted by name, as the protocol requires; a NaN sample is sent as Prometheus' NaN
    (what a scrape of the same family would give)."""
    from perfd.exporters.prompb.gen import remote_pb2 as pb

    req = pb.WriteRequest()
    n = 0
    for fam in families:
        for s in fam.samples:
            labels = {**external, **s.labels, "__name__": s.name}
            ts = req.timeseries.add()
            for k in sorted(labels):
                ts.labels.add(name=k, value=labels[k])
            ts.samples.add(value=float(s.value), timestamp=ts_ms)
            n += 1
    return req.SerializeToString(), n


@dataclass
class TargetStats:
    samples_sent: int = 0
    requests_failed: int = 0
    samples_dropped: int = 0
    last_error: str | None = None


@dataclass
class _Target:
    url: str
    pending: deque[tuple[bytes, int]] = field(default_factory=deque)  # (snappy payload, samples)
    pending_bytes: int = 0
    stats: TargetStats = field(default_factory=TargetStats)


class RemoteWriter:
    """Writes ``source()``'s families to every URL every ``interval_s`` on its own thread
    (``start``/``stop``), or once per ``tick()`` (tests, `perfd` commands)."""

    def __init__(self, urls: Iterable[str], source: Callable[[], Iterable[Metric]],
                 external_labels: Mapping[str, str] | None = None, interval_s: float = DEFAULT_INTERVAL_S,
                 timeout_s: float = DEFAULT_TIMEOUT_S, max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
                 credentials: Credentials | None = None, clock: Callable[[], float] = time.time) -> None:
        import cramjam  # an optional dependency (perfd[remote-write]): imported when configured

        self._compress: Callable[[bytes], bytes] = lambda b: bytes(cramjam.snappy.compress_raw(b))
        self.targets = [_Target(u) for u in urls]
        if not self.targets:
            raise ValueError("remote-write needs at least one URL")
        for t in self.targets:
            if urlsplit(t.url).scheme not in ("http", "https"):
                raise ValueError(f"remote-write URL must be http:// or https://, got {t.url!r}")
        self.source = source
        self.external = dict(external_labels or {})
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.max_pending_bytes = max_pending_bytes
        self.credentials = credentials or Credentials()
        self._ssl = self.credentials.ssl_context()
        self.clock = clock
        if self.credentials.secret:
            for t in self.targets:
                if in_the_clear(t.url):
                    log.warning("remote-write to %s sends its credentials over plain http: anyone on the "
                                "path can read them (use https://)", target_name(t.url))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # ---- one round -------------------------------------------------------------------------
    def tick(self) -> None:
        """Take the series now, queue them for every target, send what waits (oldest first)."""
        raw, n = encode(self.source(), int(self.clock() * 1000), self.external)
        payload = self._compress(raw)
        with self._lock:
            for t in self.targets:
                t.pending.append((payload, n))
                t.pending_bytes += len(payload)
                while t.pending_bytes > self.max_pending_bytes and len(t.pending) > 1:
                    old, k = t.pending.popleft()
                    t.pending_bytes -= len(old)
                    t.stats.samples_dropped += k
        for t in self.targets:
            self._send_pending(t)

    def _send_pending(self, t: _Target) -> None:
        while True:
            with self._lock:
                if not t.pending:
                    return
                payload, n = t.pending[0]
            outcome = self._post(t, payload)
            with self._lock:
                if outcome == "retry":
                    t.stats.requests_failed += 1
                    return  # keep it; the next tick tries again
                t.pending.popleft()
                t.pending_bytes -= len(payload)
                if outcome == "sent":
                    t.stats.samples_sent += n
                else:  # refused for good (a 4xx): it would never be taken
                    t.stats.requests_failed += 1
                    t.stats.samples_dropped += n

    def _post(self, t: _Target, payload: bytes) -> str:
        import urllib.error
        import urllib.request

        headers = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf",
                   "X-Prometheus-Remote-Write-Version": "0.1.0", "User-Agent": "perfd-remote-write"}
        headers.update(self.credentials.headers)
        try:
            auth = self.credentials.authorization()
        except CredentialsError as e:  # a secret file gone or emptied: kept until it is readable again
            self._note(t, str(e))
            return "retry"
        if auth is not None:
            headers["Authorization"] = auth
        req = urllib.request.Request(t.url, data=payload, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s, context=self._ssl) as resp:
                resp.read()
            t.stats.last_error = None
            return "sent"
        except urllib.error.HTTPError as e:
            body = e.read(200).decode(errors="replace").strip()
            self._note(t, f"HTTP {e.code}: {body}")
            return "retry" if e.code >= 500 or e.code == 429 else "drop"
        except (OSError, ValueError) as e:  # refused, unreachable, timed out
            self._note(t, f"{type(e).__name__}: {e}")
            return "retry"

    def _note(self, t: _Target, msg: str) -> None:
        if msg != t.stats.last_error:  # one line per change of error, not one per retry
            log.warning("remote-write to %s failed (%s); will retry what the receiver may take",
                        target_name(t.url), msg)
        t.stats.last_error = msg

    # ---- the thread ------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="perfd-remote-write", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.tick()
            except Exception:  # a collector that raised: logged, the next round goes on
                log.exception("remote-write round failed")

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def stats(self) -> dict[str, TargetStats]:
        with self._lock:
            return {target_name(t.url): TargetStats(**vars(t.stats)) for t in self.targets}
