"""End to end over a real grpc.aio server on 127.0.0.1 (ephemeral ports) with real AgentClients.

Every test runs inside asyncio.wait_for and under pytest-timeout; nothing leaves loopback.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

import pytest

from perfd.core.model import Sample, StepRecord, TimerValue
from perfd.transport import AgentClient, Command, DecodedBatch, IngestServer, SeqTracker, Spool
from perfd.transport.gen import perfd_pb2 as pb

pytestmark = pytest.mark.timeout(90)
HOST = "127.0.0.1"


_live: list[IngestServer] = []


async def serve(srv: IngestServer, port: int = 0) -> int:
    """Start ``srv`` on loopback; run() stops it whatever happens (a grpc.aio server left
    running when its loop ends keeps the interpreter from exiting)."""
    _live.append(srv)
    return await srv.start(HOST, port)


def run(coro: Coroutine[Any, Any, None], timeout: float = 60.0) -> None:
    async def guarded() -> None:
        try:
            await asyncio.wait_for(coro, timeout)
        finally:
            while _live:
                await _live.pop().stop(None)

    asyncio.run(guarded())


async def wait_until(pred: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


class Sink:
    """A counting on_batch that also resolves every sample's series, as an aggregator would."""

    def __init__(self) -> None:
        self.seqs: list[tuple[str, int]] = []
        self.samples: list[tuple[str, dict[str, str], int, float]] = []
        self.steps: list[StepRecord] = []
        self.events: list[dict[str, Any]] = []
        self.job_info: dict[str, str] = {}

    def __call__(self, agent: str, b: DecodedBatch) -> None:
        self.seqs.append((agent, b.seq))
        for sid, ts, v in zip(b.series_ids, b.timestamps_ns, b.values, strict=True):
            s = b.series[sid]  # KeyError here would mean a series the stream never defined
            self.samples.append((s.name, dict(s.labels), ts, v))
        self.steps.extend(b.steps)
        self.events.extend(dict(e) for e in b.events)
        self.job_info.update(b.job_info_json)

    def multiplicity(self, agent: str = "a1") -> Counter[int]:
        return Counter(seq for a, seq in self.seqs if a == agent)


def client(port: int, agent: str = "a1", **kw: Any) -> AgentClient:
    kw.setdefault("backoff_initial_s", 0.05)
    kw.setdefault("backoff_max_s", 0.3)
    return AgentClient(f"{HOST}:{port}", agent, node="n1", jobs=["llama"], **kw)


def _connected(c: AgentClient) -> bool:
    return c.counters()["connected"] == 1


async def stop_task(t: asyncio.Task[None]) -> None:
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t


def test_end_to_end_samples_steps_events():
    async def body() -> None:
        sink = Sink()
        hellos: list[Any] = []
        srv = IngestServer(sink, on_hello=hellos.append)
        port = await serve(srv, 0)
        c = client(port, capabilities={"gpm": "1"})
        task = asyncio.create_task(c.run())
        t0 = 1_763_700_000.0
        step = StepRecord(job="llama", iteration=10, rank="all", step_time_ms=630.0, lm_loss=None,
                          timers={"forward-backward": TimerValue(min_ms=500.0, max_ms=600.0,
                                                                 per_rank={0: 500.0, 1: 600.0})})
        c.submit([Sample("gpu_power_watts", 300.0, t0, {"gpu": "0"}),
                  Sample("gpu_power_watts", 310.0, t0, {"gpu": "1"})], [step],
                 [{"time": t0, "kind": "xid", "severity": "critical", "text": "XID 79",
                   "labels": {"gpu": "1"}}],
                 job_info_json={"llama": "{}"})
        sid = c.series_id("host_cpu_ratio")
        c.submit(columns=([sid, sid], [1, 2], [0.25, 0.5]))
        assert c.submit() == 0  # nothing to send: no batch
        assert await c.flush(10)
        assert sink.seqs == [("a1", 1), ("a1", 2)]
        assert sink.samples == [("gpu_power_watts", {"gpu": "0"}, int(t0 * 1e9), 300.0),
                                ("gpu_power_watts", {"gpu": "1"}, int(t0 * 1e9), 310.0),
                                ("host_cpu_ratio", {}, 1, 0.25), ("host_cpu_ratio", {}, 2, 0.5)]
        assert sink.steps == [step] and sink.steps[0].lm_loss is None
        assert sink.events[0]["kind"] == "xid" and sink.events[0]["labels"] == {"gpu": "1"}
        assert sink.job_info == {"llama": "{}"}
        assert hellos[0].agent_id == "a1" and hellos[0].node == "n1"
        assert hellos[0].capabilities == {"gpm": "1"}
        sc = srv.counters()
        assert (sc["batches"], sc["samples"], sc["steps"], sc["events"], sc["duplicates"]) == (2, 4, 1, 1, 0)
        assert sc["agents_connected"] == 1
        cc = c.counters()
        assert cc["connected"] == 1 and cc["batches_sent"] == 2 and cc["batches_acked"] == 2
        assert cc["spool_pending_batches"] == 0
        await stop_task(task)
        await srv.stop(None)

    run(body())


def test_cumulative_acks_drain_the_disk_spool(tmp_path):
    async def body() -> None:
        sink = Sink()
        srv = IngestServer(sink)
        port = await serve(srv, 0)
        spool = Spool(tmp_path / "spool", segment_bytes=64 << 10)
        c = client(port, spool=spool, window=4)
        for i in range(60):
            c.submit([Sample("m", float(i), 1.0 + i, {"gpu": "0"})] * 500)  # ~7 KB per batch
        assert len(list((tmp_path / "spool").glob("*.seg"))) > 3
        task = asyncio.create_task(c.run())
        assert await c.flush(20)
        assert sorted(sink.multiplicity()) == list(range(1, 61))
        assert len(list((tmp_path / "spool").glob("*.seg"))) == 1  # only the active segment is left
        assert c.counters()["batches_acked"] == 60 and spool.acked_seq == 60
        await stop_task(task)
        c.close()
        await srv.stop(None)

    run(body())


def test_acks_coalesce_per_interval_and_arrive_without_a_flush():
    """A busy stream gets far fewer Acks than batches, and they still come on their own (the
    server's timer, not the agent's 5 s heartbeat and not flush())."""
    async def body() -> None:
        sink = Sink()
        srv = IngestServer(sink, ack_interval_s=0.3)
        port = await serve(srv, 0)
        c = client(port, window=1000)
        task = asyncio.create_task(c.run())
        await wait_until(lambda: _connected(c))
        for i in range(50):
            c.submit([Sample("m", float(i), 1.0 + i, {"gpu": "0"})])
            await asyncio.sleep(0.01)
        await wait_until(lambda: c.counters()["spool_pending_batches"] == 0)  # no flush(): nothing asks
        assert sorted(sink.multiplicity()) == list(range(1, 51))
        assert c.counters()["heartbeats_sent"] == 0
        assert 2 <= srv.acks_sent < 20  # the Hello's, then about one per 0.3 s, not one per batch
        await stop_task(task)
        await srv.stop(None)

    run(body())


def test_flush_and_a_full_window_get_their_ack_at_once_whatever_the_interval():
    """With an ack interval no test would wait out, a flush (a Heartbeat) and a replay through a
    window of 4 (an ask per full window) are still acknowledged: nothing waits on the timer."""
    async def body() -> None:
        sink = Sink()
        srv = IngestServer(sink, ack_interval_s=3600.0)
        port = await serve(srv, 0)
        c = client(port, window=4)
        for i in range(40):  # spooled before the stream opens: replayed a window at a time
            c.submit([Sample("m", float(i), 1.0 + i, {"gpu": "0"})])
        task = asyncio.create_task(c.run())
        await wait_until(lambda: c.counters()["spool_pending_batches"] == 0)
        assert sorted(sink.multiplicity()) == list(range(1, 41))
        c.submit([Sample("m", 1.0, 100.0, {"gpu": "0"})])
        assert await c.flush(10)
        assert c.counters()["batches_acked"] == 41
        await stop_task(task)
        await srv.stop(None)

    run(body())


async def _produce(c: AgentClient, stop: asyncio.Event, every_s: float = 0.004) -> None:
    i = 0
    while not stop.is_set():
        c.submit([Sample("m", float(i), float(i), {"gpu": str(i % 4)})])
        i += 1
        await asyncio.sleep(every_s)


async def _restart_mid_stream(keep_seq_state: bool) -> tuple[Sink, IngestServer, AgentClient]:
    sink = Sink()
    state = SeqTracker()
    srv1 = IngestServer(sink, seq_state=state)
    port = await serve(srv1, 0)
    c = client(port, window=8)
    task = asyncio.create_task(c.run())
    stop = asyncio.Event()
    producer = asyncio.create_task(_produce(c, stop))
    await wait_until(lambda: len(sink.seqs) >= 40)
    await srv1.stop(None)  # killed mid-stream: streams cancelled, whatever was in flight is cut
    await asyncio.sleep(0.3)  # the agent keeps producing into its spool meanwhile
    srv2 = IngestServer(sink, seq_state=state if keep_seq_state else None)
    assert await serve(srv2, port) == port  # the same port
    await wait_until(lambda: c.counters()["connected"] == 1)
    await asyncio.sleep(0.2)
    stop.set()
    await producer
    assert await c.flush(15)
    await stop_task(task)
    await srv2.stop(None)
    return sink, srv2, c


def test_server_restart_same_port_exactly_once_with_kept_seq_state():
    async def body() -> None:
        sink, _, c = await _restart_mid_stream(keep_seq_state=True)
        seen = sink.multiplicity()
        last = c.spool.last_seq
        assert sorted(seen) == list(range(1, last + 1))  # nothing lost
        assert max(seen.values()) == 1  # nothing twice
        assert c.counters()["reconnects"] >= 1
        # Samples of batches resent to the new server resolve through the Hello's series table.
        assert len(sink.samples) == last

    run(body())


def test_server_restart_without_seq_state_redelivers_only_unacked():
    async def body() -> None:
        sink, _, c = await _restart_mid_stream(keep_seq_state=False)
        seen = sink.multiplicity()
        assert sorted(seen) == list(range(1, c.spool.last_seq + 1))  # nothing lost
        twice = [s for s, n in seen.items() if n > 1]
        # Only batches delivered but not yet acknowledged when the aggregator died come again:
        # at most the agent's window of them, and only once more.
        assert len(twice) <= c.window and all(seen[s] == 2 for s in twice)

    run(body())


def test_dead_aggregator_spool_hits_its_cap_drops_oldest_and_counts():
    async def body() -> None:
        sink = Sink()
        state = SeqTracker()
        srv1 = IngestServer(sink, seq_state=state)
        port = await serve(srv1, 0)
        c = client(port, spool=Spool(None, max_bytes=64 << 10))
        task = asyncio.create_task(c.run())
        for i in range(3):
            c.submit([Sample("m", 1.0, float(i))])
        assert await c.flush(10)
        await srv1.stop(None)
        for _ in range(100):  # ~4 KB each into a 64 KiB spool while nobody listens
            c.submit([Sample("m", float(j), float(j), {"i": str(j % 3)}) for j in range(250)])
            await asyncio.sleep(0)
        cc = c.counters()
        assert cc["spool_bytes"] <= 64 << 10
        dropped = cc["dropped_batches"]
        assert dropped > 50 and cc["dropped_samples"] == 250 * dropped
        assert cc["connected"] == 0 and cc["stream_errors"] >= 1
        srv2 = IngestServer(sink, seq_state=state)
        await serve(srv2, port)
        assert await c.flush(15)
        seen = sink.multiplicity()
        assert sorted(seen) == [1, 2, 3, *range(4 + dropped, 104)]  # the oldest went first
        sc = srv2.counters()
        assert sc["gaps"] == 1 and sc["gap_batches"] == dropped  # the aggregator sees the hole too
        assert 0 < sc["agent_dropped_batches"] <= dropped  # and the agent's own loss report
        await stop_task(task)
        await srv2.stop(None)

    run(body())


def test_seq_continues_after_client_restart(tmp_path):
    async def body() -> None:
        sink = Sink()
        srv = IngestServer(sink)
        port = await serve(srv, 0)
        c1 = client(port, spool=Spool(tmp_path / "spool"))
        t1 = asyncio.create_task(c1.run())
        for i in range(3):
            c1.submit([Sample("m", float(i), float(i), {"gpu": "0"})])
        assert await c1.flush(10)
        await stop_task(t1)
        c1.submit([Sample("m", 3.0, 3.0, {"gpu": "0"})])  # spooled, never sent: the agent stops
        c1.submit([Sample("m2", 4.0, 4.0)])
        c1.close()

        c2 = client(port, spool=Spool(tmp_path / "spool"))
        assert c2.submit([Sample("m2", 5.0, 5.0), Sample("m3", 6.0, 6.0)]) == 6
        t2 = asyncio.create_task(c2.run())
        assert await c2.flush(10)
        assert sink.seqs == [("a1", s) for s in range(1, 7)]
        assert [x[0] for x in sink.samples] == ["m", "m", "m", "m", "m2", "m2", "m3"]
        sc = srv.counters()
        assert sc["duplicates"] == 0 and sc["gaps"] == 0
        assert c2.table.id_for("m", {"gpu": "0"}) == 0  # ids stable across the restart
        await stop_task(t2)
        c2.close()
        await srv.stop(None)

    run(body())


def test_agent_with_a_new_spool_epoch_is_not_mistaken_for_duplicates():
    async def body() -> None:
        sink = Sink()
        srv = IngestServer(sink)
        port = await serve(srv, 0)
        for _ in range(2):  # the same agent id twice, its spool lost in between
            c = client(port)
            t = asyncio.create_task(c.run())
            for i in range(3):
                c.submit([Sample("m", float(i), float(i))])
            assert await c.flush(10)
            await stop_task(t)
        assert sink.seqs == [("a1", s) for s in (1, 2, 3, 1, 2, 3)]
        assert srv.counters()["duplicates"] == 0
        await srv.stop(None)

    run(body())


def test_commands_reach_the_client_callback():
    async def body() -> None:
        srv = IngestServer(Sink())
        port = await serve(srv, 0)
        got: list[Command] = []
        got_async: list[Command] = []

        async def handler(cmd: Command) -> None:
            await asyncio.sleep(0)
            got_async.append(cmd)

        c1 = client(port, "a1", on_command=got.append)
        c2 = client(port, "a2", on_command=handler)
        tasks = [asyncio.create_task(c1.run()), asyncio.create_task(c2.run())]
        await wait_until(lambda: srv.connected_agents() == ["a1", "a2"])
        cmd = Command(kind="capture", job="llama", ranks=(0, 1), args={"tool": "kineto", "iterations": "3"})
        assert srv.send_command("a1", cmd)
        assert srv.send_command("a2", Command(kind="dump_flight_recorder", job="llama"))
        assert not srv.send_command("nobody", cmd)
        await wait_until(lambda: bool(got) and bool(got_async))
        assert got[0].kind == "capture" and got[0].ranks == (0, 1) and got[0].args["tool"] == "kineto"
        assert got[0].id  # the server gives every command an id
        assert got_async[0].kind == "dump_flight_recorder"
        sc = srv.counters()
        assert sc["commands_sent"] == 2 and sc["commands_undeliverable"] == 1
        for t in tasks:
            await stop_task(t)
        await srv.stop(None)

    run(body())


def test_bad_batch_is_counted_and_acknowledged_not_resent_forever():
    async def body() -> None:
        sink = Sink()
        srv = IngestServer(sink)
        port = await serve(srv, 0)
        c = client(port)
        bad = pb.Batch(agent_id="a1", seq=1, series_ids=[0, 0], timestamps_ns=[1, 2], values=[1.0])
        c.spool.append(1, bad.SerializeToString(), 2)
        c.submit([Sample("m", 1.0, 1.0)])
        t = asyncio.create_task(c.run())
        assert await c.flush(10)
        sc = srv.counters()
        assert sc["decode_errors"] == 1 and sc["batches"] == 1 and sink.seqs == [("a1", 2)]
        await stop_task(t)
        await srv.stop(None)

    run(body())


def test_on_batch_failure_is_counted_and_acknowledged():
    async def body() -> None:
        calls: list[int] = []

        def flaky(agent: str, b: DecodedBatch) -> None:
            calls.append(b.seq)
            if b.seq == 2:
                raise RuntimeError("downstream bug")

        srv = IngestServer(flaky)
        port = await serve(srv, 0)
        c = client(port)
        t = asyncio.create_task(c.run())
        for i in range(3):
            c.submit([Sample("m", 1.0, float(i))])
        assert await c.flush(10)
        assert calls == [1, 2, 3] and srv.counters()["deliver_errors"] == 1
        await stop_task(t)
        await srv.stop(None)

    run(body())


def test_many_agents_at_once_each_batch_exactly_once():
    async def body() -> None:
        sink = Sink()
        srv = IngestServer(sink)
        port = await serve(srv, 0)
        clients = [client(port, f"agent{i:02d}", window=4) for i in range(20)]
        tasks = [asyncio.create_task(c.run()) for c in clients]
        for k in range(20):
            for c in clients:
                c.submit([Sample("m", float(k), float(k), {"gpu": str(g)}) for g in range(8)])
            await asyncio.sleep(0.001)
        results = await asyncio.gather(*(c.flush(20) for c in clients))
        assert all(results)
        for c in clients:
            assert sink.multiplicity(c.agent_id) == Counter(range(1, 21))
        assert srv.counters()["samples"] == 20 * 20 * 8
        for t in tasks:
            await stop_task(t)
        await srv.stop(None)

    run(body())


def test_run_never_raises_while_the_aggregator_is_absent():
    async def body() -> None:
        srv = IngestServer(Sink())
        port = await serve(srv, 0)
        await srv.stop(None)  # a port that refuses connections
        c = client(port)
        t = asyncio.create_task(c.run())
        c.submit([Sample("m", 1.0, 1.0)])
        await wait_until(lambda: c.counters()["reconnects"] >= 3)
        assert not t.done()  # still retrying, no exception escaped
        assert c.counters()["spool_pending_batches"] == 1
        await stop_task(t)

    run(body())


def test_first_batch_of_a_stream_reports_the_hello_series_as_new():
    async def body() -> None:
        new: list[list[int]] = []
        srv = IngestServer(lambda agent, b: new.append(list(b.new_series)))
        port = await serve(srv, 0)
        for name in ("other", "another"):  # the same agent id twice, with a fresh spool
            c = client(port)
            c.series_id(name)  # id 0 names another series each time, defined by the Hello only
            t = asyncio.create_task(c.run())
            await wait_until(partial(_connected, c))
            c.submit([Sample("m", 1.0, 1.0)])
            c.submit([Sample("m", 2.0, 2.0), Sample("m3", 1.0, 1.0)])
            assert await c.flush(10)
            await stop_task(t)
        assert new == [[0, 1], [2], [0, 1], [2]]

    run(body())


def test_a_reconnect_reports_only_the_series_it_redefines():
    """The same agent on a new stream: ids whose definition the aggregator already holds are not
    reported as redefined (nothing downstream resolves them again); a Hello byte for byte the last
    one is not even decoded; a series added meanwhile, or an id that now means another series
    (a new spool), is reported. Every sample still resolves."""
    async def body() -> None:
        new: list[list[int]] = []
        sink = Sink()

        def on_batch(agent: str, b: DecodedBatch) -> None:
            new.append(list(b.new_series))
            sink(agent, b)

        srv = IngestServer(on_batch)
        port = await serve(srv, 0)
        c = client(port)

        async def session(value: float) -> None:
            t = asyncio.create_task(c.run())
            await wait_until(partial(_connected, c))
            c.submit([Sample("m", value, value)])
            assert await c.flush(10)
            await stop_task(t)

        await session(1.0)  # the Hello defines nothing; the batch defines "m" as id 0
        await session(2.0)  # the Hello defines id 0 as the aggregator holds it
        assert (new, srv.hellos_reused) == ([[0], []], 0)
        await session(3.0)  # the same Hello again: taken over
        assert (new[-1], srv.hellos_reused) == ([], 1)
        c.series_id("added")  # id 1: the next Hello differs in that one
        await session(4.0)
        assert (new[-1], srv.hellos_reused) == ([1], 1)
        c2 = client(port, spool=Spool(None))  # a fresh spool: id 0 now means another series
        c2.series_id("other")
        t = asyncio.create_task(c2.run())
        await wait_until(partial(_connected, c2))
        c2.submit([Sample("m", 5.0, 5.0)])
        assert await c2.flush(10)
        await stop_task(t)
        assert new[-1] == [0, 1]
        got = [(name, v) for name, _lab, _ts, v in sink.samples]
        assert got == [("m", v) for v in (1.0, 2.0, 3.0, 4.0, 5.0)]

    run(body())


@pytest.mark.slow
def test_new_streams_are_refused_while_the_event_loop_lags_and_let_in_after():
    """Overload: while the aggregator's event loop runs later than max_loop_lag_s, a new stream
    is refused (UNAVAILABLE, counted as overloaded) before its Hello, and an open one keeps its
    Acks; once the loop catches up the refused agent gets in on its own (backoff)."""
    import threading

    from perfd.core import limits as L

    srv_loop = asyncio.new_event_loop()
    started = threading.Event()
    limits = L.Limits(agent_silence_s=1.0, hello_timeout_s=1.0)  # a liveness tick of 0.25 s
    limits.max_loop_lag_s = 0.3
    srv = IngestServer(lambda agent, b: None, limits=limits, ack_interval_s=0.1)
    port_box: list[int] = []

    def serve_thread() -> None:
        asyncio.set_event_loop(srv_loop)
        port_box.append(srv_loop.run_until_complete(srv.start(HOST, 0)))
        started.set()
        srv_loop.run_forever()

    th = threading.Thread(target=serve_thread, daemon=True)
    th.start()
    assert started.wait(10)
    blocking = threading.Event()

    def block() -> None:  # the loop busy for 0.6 s at a time: its ticks wake ~0.6 s late
        if blocking.is_set():
            time.sleep(0.6)
            srv_loop.call_later(0.01, block)

    async def body() -> None:
        port = port_box[0]
        early = client(port, "early", heartbeat_s=0.2)
        t1 = asyncio.create_task(early.run())
        await wait_until(partial(_connected, early))
        blocking.set()
        srv_loop.call_soon_threadsafe(block)
        await wait_until(lambda: srv.loop_lag_s > limits.max_loop_lag_s)
        late = client(port, "late")
        t2 = asyncio.create_task(late.run())
        await wait_until(lambda: srv.refusals.snapshot().get(L.REFUSED_OVERLOADED, 0) >= 2)
        assert not _connected(late)
        assert _connected(early)  # its Heartbeats are still answered
        blocking.clear()
        await wait_until(partial(_connected, late))
        await stop_task(t1)
        await stop_task(t2)

    try:
        run(body())
    finally:
        blocking.clear()
        asyncio.run_coroutine_threadsafe(srv.stop(None), srv_loop).result(10)
        srv_loop.call_soon_threadsafe(srv_loop.stop)
        th.join(10)


class _OwnedDict(dict):  # type: ignore[type-arg]
    """A dict that fails the test when a thread other than its owner's iterates it: what the
    event loop changes must reach the HTTP thread only through a snapshot the loop publishes."""

    def __init__(self, owner: int, *args: Any) -> None:
        super().__init__(*args)
        self.owner = owner
        self.foreign_reads: list[str] = []

    def _check(self, how: str) -> None:
        import threading

        if threading.get_ident() != self.owner:
            self.foreign_reads.append(how)
            raise RuntimeError(f"{how} from another thread (dictionary changed size during iteration)")

    def __iter__(self) -> Any:
        self._check("__iter__")
        return super().__iter__()

    def items(self) -> Any:
        self._check("items")
        return super().items()

    def values(self) -> Any:
        self._check("values")
        return super().values()

    def keys(self) -> Any:
        self._check("keys")
        return super().keys()


@pytest.mark.slow
def test_other_threads_read_the_streams_only_through_the_published_view():
    """counters() and connected_agents() from the HTTP thread never iterate the stream table
    the event loop changes (issue: /metrics answered 500 under stream churn)."""
    import threading

    async def body() -> None:
        srv = IngestServer(Sink())
        port = await serve(srv, 0)
        c = client(port, "a1")
        task = asyncio.create_task(c.run())
        c.submit([Sample("perfd_gpu_utilization_ratio", 0.5, 1.0, {"gpu": "0"})])
        assert await c.flush(15)
        me = threading.get_ident()
        srv._streams = streams = _OwnedDict(me, srv._streams)
        srv._agent_losses = losses = _OwnedDict(me, {"a1": (2, 30)})
        assert srv.connected_agents() == ["a1"]  # on the loop: the tables themselves
        # Off the loop: the view the loop published at its last liveness tick (a second at most).
        deadline = time.monotonic() + 15
        while (counters := await asyncio.to_thread(srv.counters))["agent_dropped_samples"] != 30:
            assert time.monotonic() < deadline, counters
            await asyncio.sleep(0.05)
        assert await asyncio.to_thread(srv.connected_agents) == ["a1"]
        assert counters["agents_connected"] == 1
        assert (counters["agent_dropped_batches"], counters["agent_dropped_samples"]) == (2, 30)
        assert streams.foreign_reads == [] and losses.foreign_reads == []
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    run(body())


@pytest.mark.slow
def test_a_command_from_another_thread_never_waits_on_a_busy_loop():
    """The rules tick sends capture commands from an executor thread. Under load the event loop can
    be busy for seconds: the send must hand the command over and return at once (it waited 5 s and
    raised TimeoutError out of the tick, losing a rule's capture), and the command still arrives."""
    async def body() -> None:
        srv = IngestServer(Sink())
        port = await serve(srv, 0)
        got: list[Command] = []
        c = client(port, "a1", on_command=got.append)
        task = asyncio.create_task(c.run())
        await wait_until(lambda: srv.connected_agents() == ["a1"])
        sent: list[bool] = []
        nobody: list[bool] = []

        def from_thread() -> None:
            sent.append(srv.send_command("a1", Command(kind="capture", job="llama")))
            nobody.append(srv.send_command("nobody", Command(kind="capture", job="llama")))

        worker = threading.Thread(target=from_thread)
        worker.start()
        # The loop blocked (this coroutine holds it) until both sends return: a send that waited on the
        # loop would never return (the old one gave up after 5 s and raised, the command lost)
        worker.join(60.0)
        assert not worker.is_alive() and sent == [True] and nobody == [False]
        await wait_until(lambda: bool(got))
        assert got[0].kind == "capture"
        assert srv.counters()["commands_undeliverable"] == 1
        await stop_task(task)
        await srv.stop(None)

    run(body())
