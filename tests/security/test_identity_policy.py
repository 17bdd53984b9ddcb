"""With mutual TLS and an identity policy, a certificate uses only the agent ids and jobs its entry
gives it: any other valid certificate of the same CA can neither take a node's agent id (even
first) nor write its job (even with a Hello naming it). Real gRPC over TLS on loopback, with
certificates made in the test."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.aggregator.snapshot import overview_of
from perfd.app.cli import main
from perfd.core import limits as L
from perfd.core.model import StepRecord
from perfd.transport.client import AgentClient
from perfd.transport.security import ClientTls, IdentityPolicy
from tests.security.certs import CA

pytestmark = pytest.mark.slow

POLICY = """
identities:
  node-1.example.com:
    agents: [node-1]
    jobs: [train]
  "*.gpu.example.com":
    agents: ["{identity}"]
    jobs: ["eval-*"]
"""


def _steps(job: str, its: range, ms: float) -> list[StepRecord]:
    return [StepRecord(job=job, iteration=i, step_time_ms=ms) for i in its]


async def _send(target: str, tls: ClientTls, agent: str, jobs: list[str], steps: list[StepRecord],
                wait_s: float | None = None) -> AgentClient:
    c = AgentClient(target, agent, jobs=jobs, tls=tls, backoff_initial_s=0.05)
    c.submit(steps=steps)
    t = asyncio.create_task(c.run())
    try:
        if wait_s is None:
            assert await c.flush(20)
        else:
            await asyncio.sleep(wait_s)
    finally:
        t.cancel()
    return c


def test_identity_policy_binds_certificates_to_agent_ids_and_jobs(tmp_path: Path) -> None:
    ca = CA("cluster CA")
    d = tmp_path
    files = {"ca": ca.write_ca(d, "ca")}
    files["srv_cert"], files["srv_key"] = ca.write(d, "server", "perfd-aggregator", server=True)
    tls = {}
    for name, cn in (("n1", "node-1.example.com"), ("n2", "node-2.example.com"),
                     ("g7", "g7.gpu.example.com"), ("rogue", "laptop.example.com")):
        cert, key = ca.write(d, name, cn, server=False)
        tls[name] = ClientTls(files["ca"], cert, key)
    policy = d / "policy.yaml"
    policy.write_text(POLICY)

    async def main() -> None:
        agg = Aggregator(AggregatorConfig(grpc_port=0, http_port=0, rules_files=[],
                                          tls_cert=files["srv_cert"], tls_key=files["srv_key"],
                                          tls_client_ca=files["ca"],
                                          identity_policy=str(policy)))
        await agg.start()
        target = f"localhost:{agg.grpc_port}"
        try:
            # Another certificate of the same CA claims node-1's id before node-1 ever connected:
            # without a policy the first stream would bind it.
            c = await _send(target, tls["n2"], "node-1", ["train"], _steps("train", range(1, 6), 1e6), 1.5)
            assert c.batches_acked == 0 and agg.refusals.get(L.REFUSED_POLICY) >= 1
            assert overview_of(agg.state.snapshot("train")) is None
            # node-1 with its own certificate writes its job.
            await _send(target, tls["n1"], "node-1", ["train"], _steps("train", range(1, 11), 100.0))
            held = {r.iteration: r.step_time_ms for r in agg.state.step_records("train")}
            assert held == {i: 100.0 for i in range(1, 11)}
            # A certificate with an entry names the job in its Hello and sends records for it, old
            # and new: none is taken, and it hosts nothing of the job.
            refused = agg.refusals.get(L.REFUSED_POLICY)
            await _send(target, tls["g7"], "g7.gpu.example.com", ["train"],
                        _steps("train", range(1, 21), 1e6))
            held = {r.iteration: r.step_time_ms for r in agg.state.step_records("train")}
            assert held == {i: 100.0 for i in range(1, 11)}
            assert agg.guard.hosts("train") == {"node-1"}
            assert agg.refusals.get(L.REFUSED_POLICY) > refused
            # Its own jobs it writes ({identity} bound its agent id to its certificate's name).
            await _send(target, tls["g7"], "g7.gpu.example.com", ["eval-1"],
                        _steps("eval-1", range(1, 4), 5.0))
            assert len(agg.state.step_records("eval-1")) == 3
            # A certificate of the CA that the policy does not name is refused whatever it claims.
            c = await _send(target, tls["rogue"], "laptop", [], _steps("mine", range(1, 3), 1.0), 1.5)
            assert c.batches_acked == 0 and overview_of(agg.state.snapshot("mine")) is None
        finally:
            await agg.stop()

    asyncio.run(main())


@pytest.mark.timeout(60)  # an aggregator that took the policy would run on, in process
def test_identity_policy_file_errors_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    for text in ("identities: []", "identities:\n  a: {agents: node-1}", "identities:\n  a: {hosts: [x]}"):
        bad.write_text(text)
        try:
            IdentityPolicy(str(bad))
        except ValueError as exc:
            assert "identity policy" in str(exc)
        else:
            raise AssertionError(f"accepted {text!r}")
    ok = tmp_path / "ok.yaml"
    ok.write_text(POLICY)
    # `perfd aggregator` through the CLI's main() in this process: its return value the exit status,
    # what it printed capsys's (a traceback an exception here).
    capsys.readouterr()
    rc = main(["aggregator", "--grpc-port", "0", "--http-port", "0", "--no-rules",
               "--identity-policy", str(ok)])
    err = capsys.readouterr().err
    assert rc == 2 and "--tls-client-ca" in err and "Traceback" not in err
