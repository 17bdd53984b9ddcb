"""Authentication and TLS with real gRPC and HTTP servers on loopback and real certificates made in
the test: who may send batches, ask for captures, read the API, and claim an agent id."""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.aggregator.snapshot import overview_of
from perfd.core import limits as L
from perfd.core.model import StepRecord
from perfd.transport.client import AgentClient
from perfd.transport.codec import Command
from perfd.transport.gen import perfd_pb2 as pb
from perfd.transport.security import ClientTls, TokenFile
from tests.security.certs import CA

TOKEN = "s3cret-token-for-the-tests-0123456789"


def _http(url: str, method: str = "GET", body: bytes | None = None,
          headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _steps(job: str, its: range) -> list[StepRecord]:
    return [StepRecord(job=job, iteration=i, rank="last", step_time_ms=100.0) for i in its]


async def _until(pred: Callable[[], bool], timeout: float = 10.0) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if pred():
            return True
        await asyncio.sleep(0.05)
    return pred()


def _run(cfg: AggregatorConfig, body: Callable[[Aggregator], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        agg = Aggregator(cfg)
        await agg.start()
        try:
            return await body(agg)
        finally:
            await agg.stop()
    return asyncio.run(main())


async def _client_run(c: AgentClient, seconds: float) -> None:
    task = asyncio.create_task(c.run())
    try:
        await asyncio.sleep(seconds)
    finally:
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass


def _cfg(**kw: Any) -> AggregatorConfig:
    return AggregatorConfig(grpc_port=0, http_port=0, rules_files=[], **kw)


def _token_file(tmp_path: Path, text: str = TOKEN) -> str:
    p = tmp_path / "token"
    p.write_text(text + "\n")
    p.chmod(0o600)  # a token others may read is refused
    return str(p)


# ---------------------------------------------------------------------------------------- token

@pytest.mark.slow
def test_unauthenticated_batch_is_refused_and_the_token_lets_it_in(tmp_path: Path) -> None:
    tok = _token_file(tmp_path)

    async def body(agg: Aggregator) -> None:
        target = f"127.0.0.1:{agg.grpc_port}"
        intruder = AgentClient(target, "intruder", jobs=["victim"], backoff_initial_s=0.05)
        intruder.submit(steps=_steps("victim", range(1, 121)))
        await _client_run(intruder, 1.5)
        assert overview_of(agg.state.snapshot("victim")) is None  # nothing of the batch arrived
        assert agg.refusals.get(L.REFUSED_UNAUTHENTICATED) >= 1
        assert intruder.batches_acked == 0 and intruder.connected is False
        wrong = AgentClient(target, "intruder2", jobs=["victim"], backoff_initial_s=0.05,
                            token=TokenFile(_token_file(tmp_path / "..", "another-token-of-enough-length")))
        wrong.submit(steps=_steps("victim", range(1, 3)))
        await _client_run(wrong, 1.0)
        assert overview_of(agg.state.snapshot("victim")) is None
        good = AgentClient(target, "node-a", jobs=["victim"], token=TokenFile(tok))
        good.submit(steps=_steps("victim", range(1, 121)))
        task = asyncio.create_task(good.run())
        assert await good.flush(10)
        task.cancel()
        ov = overview_of(agg.state.snapshot("victim"))
        assert ov is not None and ov["iterations_seen"] == 120

    _run(_cfg(auth_token_file=tok), body)


def test_an_agent_without_the_token_is_told_it_is_unauthenticated(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Every stream end the agent logs says UNAUTHENTICATED and what to do; before, about half
    said "INTERNAL: Internal error from Core" or "RPC already finished" (the server ended the
    stream under the agent's Hello and gRPC lost the status)."""
    tok = _token_file(tmp_path)

    async def body(agg: Aggregator) -> None:
        c = AgentClient(f"127.0.0.1:{agg.grpc_port}", "tokenless", jobs=["j"], backoff_initial_s=0.02,
                        backoff_max_s=0.05)
        c.submit(steps=_steps("j", range(1, 3)))
        task = asyncio.create_task(c.run())
        try:
            assert await _until(lambda: c.stream_errors >= 10, 30)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    with caplog.at_level(logging.WARNING, logger="perfd.transport.client"):
        _run(_cfg(auth_token_file=tok), body)
    ended = [r.getMessage() for r in caplog.records if "stream to" in r.getMessage()]
    assert all("UNAUTHENTICATED" in m and "--auth-token-file" in m for m in ended), ended
    assert len(ended) >= 10  # the peer's port differs each time, so each is logged


def test_http_needs_the_token_except_metrics_and_healthz(tmp_path: Path) -> None:
    tok = _token_file(tmp_path)

    async def body(agg: Aggregator) -> None:
        assert agg.http is not None
        base = f"http://127.0.0.1:{agg.http.port}"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        capture = json.dumps({"job": "j", "steps": 2}).encode()
        alert = json.dumps({"alerts": [{"status": "firing",
                                        "labels": {"job_name": "j", "perfd_capture": "true"}}]}).encode()
        calls = [
            ("/api/jobs", "GET", None), ("/api/stats", "GET", None), ("/api/captures", "GET", None),
            ("/api/events", "GET", None), ("/api/jobs/j/iterations", "GET", None),
            ("/api/captures", "POST", capture), ("/api/alertmanager", "POST", alert),
        ]
        for path, method, data in calls:
            code, _ = await asyncio.to_thread(_http, base + path, method, data)
            assert code == 401, (path, code)  # unauthenticated: refused, capture requests included
            code, _ = await asyncio.to_thread(_http, base + path, method, data,
                                              {"Authorization": "Bearer wrong-token-wrong-token"})
            assert code == 401, (path, code)
        assert not agg.captures.captures  # no capture record was made by the refused requests
        for path in ("/metrics", "/healthz"):
            code, _ = await asyncio.to_thread(_http, base + path)
            assert code == 200, path
        code, _ = await asyncio.to_thread(_http, base + "/api/jobs", "GET", None, auth)
        assert code == 200
        code, body_ = await asyncio.to_thread(_http, base + "/api/captures", "POST", capture, auth)
        assert code == 202, body_  # accepted (undeliverable: no agent), not refused for auth
        _, metrics = await asyncio.to_thread(_http, base + "/metrics")
        line = f'perfd_aggregator_refused_total{{reason="{L.REFUSED_UNAUTHENTICATED}"}} 14.0'
        assert line in metrics.decode()

    _run(_cfg(auth_token_file=tok), body)


def test_token_file_is_re_read_when_it_changes(tmp_path: Path) -> None:
    path = _token_file(tmp_path)
    tf = TokenFile(path)
    assert tf.check(f"Bearer {TOKEN}") and not tf.check("Bearer nope") and not tf.check(None)
    Path(path).write_text("a-brand-new-token-0123456789\n")
    assert tf.check("Bearer a-brand-new-token-0123456789") and not tf.check(f"Bearer {TOKEN}")


# ---------------------------------------------------------------------------------------- TLS

def _tls_files(tmp_path: Path) -> dict[str, str]:
    ca, other = CA("perfd test CA"), CA("someone else's CA")
    out = {"ca": ca.write_ca(tmp_path, "ca"), "other_ca": other.write_ca(tmp_path, "other-ca")}
    out["server_cert"], out["server_key"] = ca.write(tmp_path, "server", "perfd-aggregator", server=True)
    out["a_cert"], out["a_key"] = ca.write(tmp_path, "agent-a", "agent-a", server=False)
    out["b_cert"], out["b_key"] = ca.write(tmp_path, "agent-b", "agent-b", server=False)
    out["evil_cert"], out["evil_key"] = other.write(tmp_path, "evil", "agent-a", server=False)
    # A server certificate from the other CA, for the reload test.
    out["other_server_cert"], out["other_server_key"] = other.write(tmp_path, "other-server", "x", True)
    return out


@pytest.mark.slow
def test_mutual_tls_admits_the_right_client_certificate_only(tmp_path: Path) -> None:
    f = _tls_files(tmp_path)

    async def body(agg: Aggregator) -> None:
        target = f"localhost:{agg.grpc_port}"
        cases: dict[str, ClientTls | None] = {
            "plaintext": None,
            "no client cert": ClientTls(f["ca"]),
            "cert of another CA": ClientTls(f["ca"], f["evil_cert"], f["evil_key"]),
        }
        for i, (name, tls) in enumerate(cases.items()):
            c = AgentClient(target, f"bad-{i}", jobs=[f"job-{i}"], backoff_initial_s=0.05, tls=tls)
            c.submit(steps=_steps(f"job-{i}", range(1, 3)))
            await _client_run(c, 1.0)
            assert c.batches_acked == 0, name
            assert overview_of(agg.state.snapshot(f"job-{i}")) is None, name
        good = AgentClient(target, "node-a", jobs=["j"], tls=ClientTls(f["ca"], f["a_cert"], f["a_key"]))
        good.submit(steps=_steps("j", range(1, 11)))
        task = asyncio.create_task(good.run())
        assert await good.flush(10)
        task.cancel()
        assert overview_of(agg.state.snapshot("j"))["iterations_seen"] == 10  # type: ignore[index]

    _run(_cfg(tls_cert=f["server_cert"], tls_key=f["server_key"], tls_client_ca=f["ca"]), body)


@pytest.mark.slow
def test_server_certificate_is_re_read_without_a_restart(tmp_path: Path) -> None:
    f = _tls_files(tmp_path)
    cert, key = tmp_path / "live.crt", tmp_path / "live.key"
    cert.write_bytes(Path(f["server_cert"]).read_bytes())
    key.write_bytes(Path(f["server_key"]).read_bytes())

    async def body(agg: Aggregator) -> None:
        target = f"localhost:{agg.grpc_port}"
        first = AgentClient(target, "node-a", jobs=["j1"], tls=ClientTls(f["ca"]))
        first.submit(steps=_steps("j1", range(1, 3)))
        t = asyncio.create_task(first.run())
        assert await first.flush(10)
        t.cancel()
        # A client that trusts only the other CA cannot connect to the certificate in use ...
        other = AgentClient(target, "node-b", jobs=["j2"], tls=ClientTls(f["other_ca"]),
                            backoff_initial_s=0.05)
        other.submit(steps=_steps("j2", range(1, 3)))
        await _client_run(other, 1.0)
        assert other.batches_acked == 0
        # ... until the files are replaced by a certificate of that CA: the next handshake uses it.
        cert.write_bytes(Path(f["other_server_cert"]).read_bytes())
        key.write_bytes(Path(f["other_server_key"]).read_bytes())
        t = asyncio.create_task(other.run())
        assert await other.flush(10)
        t.cancel()
        assert overview_of(agg.state.snapshot("j2"))["iterations_seen"] == 2  # type: ignore[index]

    _run(_cfg(tls_cert=str(cert), tls_key=str(key)), body)


# ------------------------------------------------------------------------- identity and hosts

def test_agent_id_is_bound_to_its_certificate_and_commands_go_to_its_holder(tmp_path: Path) -> None:
    f = _tls_files(tmp_path)

    async def body(agg: Aggregator) -> None:
        target = f"localhost:{agg.grpc_port}"
        got_a: list[Command] = []
        got_b: list[Command] = []
        a = AgentClient(target, "node-1", jobs=["train"], tls=ClientTls(f["ca"], f["a_cert"], f["a_key"]),
                        on_command=got_a.append)
        a.submit(steps=_steps("train", range(1, 6)))
        ta = asyncio.create_task(a.run())
        assert await a.flush(10)
        # Another valid certificate claims the same id (the attack of the issue: connect with an
        # agent's default id, take its capture commands).
        b = AgentClient(target, "node-1", jobs=["train"], tls=ClientTls(f["ca"], f["b_cert"], f["b_key"]),
                        on_command=got_b.append, backoff_initial_s=0.05)
        b.submit(steps=_steps("train", range(1, 6)))
        tb = asyncio.create_task(b.run())
        assert await _until(lambda: agg.refusals.get(L.REFUSED_IDENTITY) >= 1)
        assert b.batches_acked == 0
        assert agg.server.send_command("node-1", Command(kind="capture", job="train", id="c1"))
        refused = agg.refusals.get(L.REFUSED_IDENTITY)
        assert await _until(lambda: bool(got_a))
        # b refused once more since: any session of its that was open when c1 went out has ended, and
        # a command on it would have been read first
        assert await _until(lambda: agg.refusals.get(L.REFUSED_IDENTITY) > refused)
        assert [c.id for c in got_a] == ["c1"] and got_b == []
        for t in (ta, tb):
            t.cancel()

    _run(_cfg(tls_cert=f["server_cert"], tls_key=f["server_key"], tls_client_ca=f["ca"]), body)


def test_step_records_are_accepted_only_from_the_jobs_hosts() -> None:
    async def body(agg: Aggregator) -> None:
        target = f"127.0.0.1:{agg.grpc_port}"
        host = AgentClient(target, "node-a", jobs=["victim"])
        host.submit(steps=_steps("victim", range(1, 121)))
        th = asyncio.create_task(host.run())
        assert await host.flush(10)
        before = {(r.iteration, str(r.rank)): r.step_time_ms for r in agg.state.step_records("victim")}
        other = AgentClient(target, "node-b", jobs=["mine"])
        other.submit(steps=[StepRecord(job="victim", iteration=i, step_time_ms=1e6) for i in range(1, 121)])
        to = asyncio.create_task(other.run())
        assert await other.flush(10)  # acknowledged (resending would be refused again) ...
        after = {(r.iteration, str(r.rank)): r.step_time_ms for r in agg.state.step_records("victim")}
        assert after == before  # ... and not one iteration overwritten
        assert agg.refusals.get(L.REFUSED_NOT_HOST) == 120
        assert agg.guard.hosts("victim") == {"node-a"}
        for t in (th, to):
            t.cancel()

    _run(_cfg(), body)


def test_without_credentials_a_reconnect_supersedes_the_old_stream() -> None:
    """No credentials: the id is bound to the address of its live stream; a reconnect of the same
    agent (same address) replaces its old stream at once, and commands go to the new one."""
    async def body(agg: Aggregator) -> None:
        srv = agg.server
        target = f"127.0.0.1:{agg.grpc_port}"
        old_got: list[Command] = []
        new_got: list[Command] = []
        a = AgentClient(target, "node-1", jobs=["j"])
        ta = asyncio.create_task(a.run())
        assert await _until(lambda: srv.connected_agents() == ["node-1"])
        # The same address again (a reconnect): supersedes.
        a2 = AgentClient(target, "node-1", jobs=["j"])
        ta2 = asyncio.create_task(a2.run())
        assert await _until(lambda: srv.streams_superseded == 1)
        ta.cancel()  # the old agent is gone (else it would reconnect and supersede in turn)
        assert await _until(lambda: a2.connected)
        a.on_command = old_got.append
        a2.on_command = new_got.append
        assert srv.send_command("node-1", Command(kind="capture", job="j", id="c2"))
        assert await _until(lambda: bool(new_got))
        assert old_got == []
        for t in (ta, ta2):
            t.cancel()

    _run(_cfg(), body)


# ------------------------------------------------------------------------------------- limits

def test_jobs_past_the_cap_are_refused_and_counted() -> None:
    async def body(agg: Aggregator) -> None:
        c = AgentClient(f"127.0.0.1:{agg.grpc_port}", "node-a", jobs=[])
        for i in range(50):
            c.submit(steps=_steps(f"job-{i}", range(1, 3)))
        t = asyncio.create_task(c.run())
        assert await c.flush(10)
        t.cancel()
        assert len(agg.state.job_names()) == 5
        assert agg.refusals.get(L.REFUSED_JOBS) == 45

    _run(_cfg(limits=L.Limits(max_jobs=5)), body)


@pytest.mark.slow
def test_http_body_limits_and_capture_caps(tmp_path: Path) -> None:
    import socket

    async def body(agg: Aggregator) -> None:
        assert agg.http is not None
        port = agg.http.port

        def raw(request: bytes) -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(request)
                return s.recv(4096)

        for cl in ("-1", "10000000000", "abc"):
            # Answered at once: the body is never awaited (no body is sent at all here).
            reply = await asyncio.to_thread(raw, f"POST /api/captures HTTP/1.1\r\nHost: x\r\n"
                                            f"Content-Length: {cl}\r\n\r\n".encode())
            assert reply.split(b" ")[1] in (b"400", b"413"), (cl, reply[:80])
        assert agg.refusals.get(L.REFUSED_HTTP_BODY) == 3
        base = f"http://127.0.0.1:{port}"
        code, _ = await asyncio.to_thread(_http, base + "/api/captures", "POST",
                                          json.dumps({"job": "j", "steps": 10_000}).encode())
        assert code == 400 and agg.refusals.get(L.REFUSED_CAPTURE_STEPS) == 1
        codes = []
        for _ in range(L.CAPTURE_REQUESTS_PER_JOB + 3):
            code, _ = await asyncio.to_thread(_http, base + "/api/captures", "POST",
                                              json.dumps({"job": "j", "steps": 2}).encode())
            codes.append(code)
        assert codes.count(429) == 3 and agg.refusals.get(L.REFUSED_CAPTURE_RATE) == 3
        alerts = {"alerts": [{"status": "firing", "labels": {"job_name": "k", "alertname": f"a{i}",
                                                             "perfd_capture": "true"}}
                             for i in range(5_000)]}
        code, reply = await asyncio.to_thread(_http, base + "/api/alertmanager", "POST",
                                              json.dumps(alerts).encode())
        assert code == 200
        out = json.loads(reply)
        assert len(out["captures"]) == L.CAPTURE_REQUESTS_PER_JOB  # the webhook is rate-limited too
        assert out["ignored_alerts"] == 5_000 - L.MAX_ALERTS_PER_WEBHOOK
        assert len(agg.captures.captures) <= 2 * L.CAPTURE_REQUESTS_PER_JOB

    _run(_cfg(), body)


def test_capture_records_are_pruned() -> None:
    async def body(agg: Aggregator) -> None:
        for i in range(40):
            agg.captures.request(f"job-{i}", None, "auto", 2, "manual")
        assert len(agg.captures.captures) == 10

    _run(_cfg(limits=L.Limits(max_capture_records=10)), body)


@pytest.mark.slow
def test_idle_and_trickling_http_connections_are_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection that sends nothing is closed at the idle deadline; one that sends part of its
    head is answered 408 at the header deadline and closed; both counted (http_deadline)."""
    import socket

    monkeypatch.setattr(L, "HTTP_HEADER_TIMEOUT_S", 0.5)
    monkeypatch.setattr(L, "HTTP_IDLE_TIMEOUT_S", 0.5)

    async def body(agg: Aggregator) -> None:
        assert agg.http is not None

        def talk(first: bytes) -> bytes:
            with socket.create_connection(("127.0.0.1", agg.http.port), timeout=10) as s:  # type: ignore[union-attr]
                s.sendall(first)  # and then nothing
                got = b""
                while chunk := s.recv(4096):  # until the server closes it
                    got += chunk
                return got

        assert await asyncio.to_thread(talk, b"") == b""
        assert (await asyncio.to_thread(talk, b"GET /api/st")).startswith(b"HTTP/1.0 408 ")
        assert agg.refusals.get(L.REFUSED_HTTP_DEADLINE) == 2

    _run(_cfg(), body)


def test_oversized_event_is_refused_and_counted() -> None:
    async def body(agg: Aggregator) -> None:
        c = AgentClient(f"127.0.0.1:{agg.grpc_port}", "node-a", jobs=["j"])
        c.submit(events=[{"kind": "note", "text": "x" * (L.MAX_EVENT_BYTES + 1), "job": "j"},
                         {"kind": "note", "text": "small", "job": "j"}])
        t = asyncio.create_task(c.run())
        assert await c.flush(10)
        t.cancel()
        assert [e["text"] for e in agg.state.recent_events()] == ["small"]
        assert agg.refusals.get(L.REFUSED_EVENT_BYTES) == 1

    _run(_cfg(), body)


def test_message_size_cap() -> None:
    assert pb  # the cap is a gRPC option on both sides
    from perfd.transport.client import channel_options
    from perfd.transport.grpc_bind import server_options

    assert ("grpc.max_receive_message_length", L.MAX_MESSAGE_BYTES) in server_options()
    assert ("grpc.so_reuseport", 0) in server_options()
    assert ("grpc.max_send_message_length", L.MAX_MESSAGE_BYTES) in channel_options()
