"""Remote-write to multi-tenant and authenticated stores (perfd/exporters/remote_write.Credentials).

- Against real receivers that enforce auth over TLS: Prometheus 2.42 (``--web.config.file``: bcrypt
  basic auth and a server certificate) and VictoriaMetrics 1.79 (``-httpAuth.*``, ``-tls``): written
  without credentials is refused (401) and counted; with them, every sample is there, read back through
  the same auth.
- Against the reference sender: a real Prometheus remote-writing with ``basic_auth`` to a recording
  receiver; perfd sends the same Authorization and protocol headers. The tenant headers are checked
  on the wire here, and ``X-Scope-OrgID`` against a real Grafana Mimir and Cortex in
  test_remote_write_tenants.py (where their binaries are given): Thanos Receive is not installable here
  (no package, no vendored source), and Debian's Prometheus 2.42 drops remote_write ``headers``
  (prometheus/prometheus#13030), so it cannot be the reference for its header.
- The options' refusals, a rotated secret, a secret file gone (the payload kept, not dropped).
"""

from __future__ import annotations

import base64
import functools
import json
import ssl
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from prometheus_client.core import GaugeMetricFamily, Metric

from perfd.app.cli import main
from perfd.exporters.remote_write import TENANT_HEADER, Credentials, CredentialsError, RemoteWriter
from tests.integrations.integrations_helpers import free_port, need, stop, wait_for
from tests.security.certs import CA

USER, PASSWORD = "perfd", "perfd-remote-write-pw-7"
# bcrypt of PASSWORD (cost 4: a test's), for Prometheus' web config; made once with crypt.crypt
BCRYPT = "$2b$04$K0a0sqsJxCMIHUcd2ycW0uior5Ih4gn4g1AjymyCyzTJ7f/V4lCy2"
METRIC = "perfd_job_step_time_seconds"


def _families(prefix: str = "auth") -> list[Metric]:
    g = GaugeMetricFamily(METRIC, "step", labels=["job_name"])
    g.add_metric([f"{prefix}-a"], 1.5)
    g.add_metric([f"{prefix}-b"], 2.5)
    return [g]


# ---- the options --------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, says", [
    ({"headers": ["Authorization=Bearer x"]}, "writer's own (use the bearer-token"),
    ({"headers": ["Content-Encoding=gzip"]}, "writer's own"),
    ({"headers": ["no equals"]}, "NAME=VALUE"),
    ({"headers": ["bad name=x"]}, "NAME=VALUE"),
    ({"headers": ["X-A=1\r\nX-B: 2"]}, "line break"),
    ({"headers": ["X-A="]}, "empty value"),
    ({"tenant": "a", "headers": ["x-scope-orgid=b"]}, "given twice"),
    ({"bearer_token_file": "/t", "basic_user": "u", "basic_password_file": "/p"}, "not both"),
    ({"basic_user": "u"}, "both the user and the password file"),
    ({"bearer_token_file": "/nonexistent/token"}, "cannot read the remote-write bearer token file"),
    ({"ca_file": "/nonexistent/ca.pem"}, "cannot use the remote-write CA file"),
])
def test_an_option_the_writer_cannot_use_is_refused_with_the_reason(kwargs: dict[str, Any],
                                                                    says: str) -> None:
    with pytest.raises(CredentialsError, match=None) as e:
        Credentials.of(**kwargs)
    assert says in str(e.value)


@pytest.mark.timeout(60)  # an aggregator that took them would run on, in process
def test_the_aggregator_refuses_them_before_starting(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Each `perfd aggregator` through the CLI's main() in this process: its return value the exit
    status, its stderr capsys's."""
    token = tmp_path / "token"
    token.write_text("\n")
    cases = [
        (["--remote-write-tenant", "a"], "need a --remote-write URL"),
        (["--remote-write", "http://127.0.0.1:9/api/v1/write",
          "--remote-write-bearer-token-file", str(token)],
         f"the remote-write bearer token file {token} is empty"),
        (["--remote-write", "http://127.0.0.1:9/api/v1/write", "--remote-write-header", "Authorization=x"],
         "writer's own"),
    ]
    for extra, says in cases:
        capsys.readouterr()
        rc = main(["aggregator", "--grpc-port", "0", "--http-port", "0", *extra])
        err = capsys.readouterr().err
        assert rc == 2 and says in err, (extra, rc, err[-600:])


# ---- a recording receiver -------------------------------------------------------------------------
class _Recorder:
    """Keeps each request's headers; answers 204."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.seen.append({k.lower(): v for k, v in self.headers.items()})
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a: Any) -> None:
                pass

        self.srv = HTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/api/v1/push"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()


@pytest.fixture
def recorder() -> Iterator[_Recorder]:
    r = _Recorder()
    yield r
    r.srv.shutdown()


def test_tenant_headers_and_a_rotated_token_reach_the_receiver(recorder: _Recorder, tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    token = tmp_path / "token"
    token.write_text("first-token-0123456789\n")
    creds = Credentials.of(tenant="team-a", headers=["THANOS-TENANT=team-a"], bearer_token_file=str(token))
    w = RemoteWriter([recorder.url], _families, credentials=creds)
    w.tick()
    h = recorder.seen[-1]
    assert (h["x-scope-orgid"], h["thanos-tenant"], h["authorization"]) == (
        "team-a", "team-a", "Bearer first-token-0123456789")
    assert h["content-encoding"] == "snappy" and h["x-prometheus-remote-write-version"] == "0.1.0"
    token.write_text("second-token-0123456789\n")  # rotated: the next write uses it
    w.tick()
    assert recorder.seen[-1]["authorization"] == "Bearer second-token-0123456789"
    token.unlink()  # gone: the payload waits (retried, counted), nothing is dropped
    w.tick()
    (s,) = w.stats().values()
    assert len(recorder.seen) == 2 and s.requests_failed == 1 and s.samples_dropped == 0
    assert s.last_error is not None and str(token) in s.last_error
    token.write_text("third-token-0123456789\n")
    w.tick()  # the kept payload first, then this round's
    (s,) = w.stats().values()
    assert len(recorder.seen) == 4 and s.samples_sent == 8 and s.samples_dropped == 0
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "token-0123456789" not in logged  # a secret is never logged


def test_credentials_over_plain_http_off_loopback_are_warned_about(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    pw = tmp_path / "pw"
    pw.write_text(PASSWORD)
    creds = Credentials.of(basic_user=USER, basic_password_file=str(pw))
    RemoteWriter(["http://127.0.0.1:9/api/v1/write"], _families, credentials=creds)
    assert "plain http" not in caplog.text
    RemoteWriter(["http://mimir.example:8080/api/v1/push"], _families, credentials=creds)
    assert "sends its credentials over plain http" in caplog.text and PASSWORD not in caplog.text


# ---- real stores, auth over TLS --------------------------------------------------------------------
def _ctx(ca: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=ca)


def _get(url: str, ca: str, auth: bool = True) -> bytes:
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode())
    with urllib.request.urlopen(req, timeout=10, context=_ctx(ca)) as r:
        return bytes(r.read())


def _rows(base: str, ca: str) -> list[dict[str, Any]] | None:
    got = json.loads(_get(f"{base}/api/v1/query?query={quote(METRIC)}", ca))
    rows = list(got["data"]["result"])
    return rows if len(rows) >= 2 else None


def _start(store: str, tmp: Path, cert: str, key: str, port: int) -> subprocess.Popen[bytes]:
    if store == "prometheus":
        (tmp / "prometheus.yml").write_text("global: {}\n")
        (tmp / "web.yml").write_text(
            f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
            f"basic_auth_users:\n  {USER}: '{BCRYPT}'\n")
        argv = [need("prometheus"), f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}", "--web.enable-remote-write-receiver",
                f"--web.config.file={tmp / 'web.yml'}"]
    else:
        argv = [need("victoria-metrics"), f"-storageDataPath={tmp / 'vm'}",
                f"-httpListenAddr=127.0.0.1:{port}",
                "-search.latencyOffset=0s", "-tls", f"-tlsCertFile={cert}", f"-tlsKeyFile={key}",
                f"-httpAuth.username={USER}", f"-httpAuth.password={PASSWORD}"]
    return subprocess.Popen(argv, stdout=(tmp / f"{store}.out").open("wb"), stderr=subprocess.STDOUT)


@pytest.mark.slow
@pytest.mark.parametrize("store", ["prometheus", "victoria-metrics"])
def test_an_authenticated_store_over_tls_takes_only_the_authenticated_write(store: str,
                                                                             tmp_path: Path) -> None:
    ca = CA("perfd-test-ca")
    ca_file = ca.write_ca(tmp_path, "ca")
    cert, key = ca.write(tmp_path, "store", "localhost", server=True)
    port = free_port()
    p = _start(store, tmp_path, cert, key, port)
    base = f"https://127.0.0.1:{port}"
    ready = f"{base}/-/ready" if store == "prometheus" else f"{base}/health"
    try:
        wait_for(lambda: _get(ready, ca_file), 60, f"{store} ready over TLS with auth")
        url = f"{base}/api/v1/write"
        # Its own series: were any of it taken, the query below, once the authenticated write that
        # follows is seen, would show it beside that write's.
        anonymous = RemoteWriter([url], functools.partial(_families, "anonymous"),
                                 credentials=Credentials.of(ca_file=ca_file))
        anonymous.tick()
        (s,) = anonymous.stats().values()
        assert s.samples_sent == 0 and s.samples_dropped == 2 and s.requests_failed == 1
        assert s.last_error is not None and "HTTP 401" in s.last_error, s.last_error
        pw = tmp_path / "password"
        pw.write_text(PASSWORD + "\n")
        writer = RemoteWriter([url], _families, credentials=Credentials.of(
            basic_user=USER, basic_password_file=str(pw), ca_file=ca_file, tenant="team-a"))
        writer.tick()
        (s,) = writer.stats().values()
        assert s.samples_sent == 2 and s.samples_dropped == 0, s
        rows = wait_for(functools.partial(_rows, base, ca_file), 60, f"both series in {store}")
        assert sorted((r["metric"]["job_name"], float(r["value"][1])) for r in rows) == [
            ("auth-a", 1.5), ("auth-b", 2.5)]  # and nothing of the anonymous write
        no_ca = RemoteWriter([url], _families, credentials=Credentials.of(basic_user=USER,
                                                                          basic_password_file=str(pw)))
        no_ca.tick()  # the store's certificate is not one the system trusts: kept, retried, counted
        (s,) = no_ca.stats().values()
        assert s.samples_sent == 0 and s.requests_failed == 1 and s.samples_dropped == 0
        assert s.last_error is not None and "CERTIFICATE_VERIFY_FAILED" in s.last_error, s.last_error
    finally:
        stop(p)


# ---- the reference sender -------------------------------------------------------------------------
@pytest.mark.slow
def test_perfd_authenticates_as_prometheus_itself_does(recorder: _Recorder, tmp_path: Path) -> None:
    """A store behind basic auth reads what Prometheus' own remote_write sends with ``basic_auth``:
    the same Authorization and protocol headers from perfd. (The tenant header cannot be held to it
    here: Debian's Prometheus 2.42 drops remote_write ``headers``, prometheus/prometheus#13030; it is
    checked on the wire above.)"""
    pw = tmp_path / "password"
    pw.write_text(PASSWORD + "\n")
    port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\n"
        f"scrape_configs: [{{job_name: self, static_configs: [{{targets: ['127.0.0.1:{port}']}}]}}]\n"
        "remote_write:\n"
        f"  - url: {recorder.url}\n"
        f"    basic_auth: {{username: {USER}, password_file: {pw}}}\n"
        "    queue_config: {batch_send_deadline: 1s}\n")
    p = subprocess.Popen([need("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
                          f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                          f"--web.listen-address=127.0.0.1:{port}"],
                         stdout=(tmp_path / "prometheus.out").open("wb"), stderr=subprocess.STDOUT)
    try:
        theirs = wait_for(lambda: recorder.seen[-1] if recorder.seen else None, 90, "Prometheus' first write")
    finally:
        stop(p)
    w = RemoteWriter([recorder.url], _families, credentials=Credentials.of(
        basic_user=USER, basic_password_file=str(pw)))
    w.tick()
    ours = recorder.seen[-1]
    keys = ("authorization", "content-encoding", "content-type", "x-prometheus-remote-write-version")
    assert {k: ours.get(k) for k in keys} == {k: theirs.get(k) for k in keys}
    assert theirs["authorization"].startswith("Basic ") and TENANT_HEADER.lower() not in ours
