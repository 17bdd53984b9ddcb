"""Prometheus remote-write of the aggregator's series: the cluster-wide view past one process.

Each aggregator (sharded by job, perfd/transport/shard.py) holds only its jobs; a horizontally
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
"""

from __future__ import annotations

import logging
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
                 token: Callable[[], str] | None = None, clock: Callable[[], float] = time.time) -> None:
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
        self.token = token
        self.clock = clock
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
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token()}"
        req = urllib.request.Request(t.url, data=payload, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
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
