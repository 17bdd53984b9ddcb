"""A rig for fault tests of the distributed path (perfd.engine) with real processes on loopback: real
nats-server processes (perfd.engine.natsd), real ``perfd shard`` and ``perfd aggregator --engine``
subprocesses (tests/procs.py), and a load driver in the test process: simulated nodes of 8 ranks, one
:class:`perfd.engine.publisher.EngineClient` each, publishing one iteration's records every period.

Every rank's step time in an iteration is distinct, and so are its end time and data wait, so each
iteration's slowest rank, step time, end and data share are known in advance (:class:`Plan`): an
iteration row that shows them shows that the ranks that carry them were folded in. The counters say
the rest: the root's distinct node messages against what the clients published, the node stream's
sequence against the same, and the stream empty at the end (every message acknowledged).

:class:`Rig` owns everything it starts (servers, processes, the load thread, a proxy handed to it)
and ``close()`` ends all of it whatever happened; ``tails()`` is what each process logged last.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from perfd.core.model import HOOK_DATA_WAIT, Provenance, StepRecord, TimerValue
from perfd.engine import subjects as S
from perfd.engine.natsd import NatsCluster
from perfd.engine.publisher import EngineClient, PublisherStats
from tests.engine.test_natsd import _need_nats_server
from tests.procs import NOT_YET, Procs, WaitTimeout, get_json, run_env, start_aggregator, tail, wait_for

T = TypeVar("T")

JOB = "engine faults/job.1 *"  # dots, a space and a wildcard: subject syntax, carried as a token
RANKS_PER_NODE = 8
PARTITIONS = 8


async def until(what: str, pred: Callable[[], bool], timeout: float, interval: float = 0.1) -> float:
    """Wait in the event loop until ``pred()``; the seconds it took (AssertionError past ``timeout``)."""
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(interval)
    return time.monotonic() - t0



def split_settled(held: Sequence[Sequence[int]], partitions: int) -> bool:
    """Whether shards holding ``held`` (each shard's partitions) have split ``partitions`` for good:
    every partition held, none by a shard over its fair share (ceil(partitions / shards)). Shards
    started together race for the leases: one may take seven of eight before it counts the other
    (the other then one), and both hold some; at their next balance the first gives three back, and
    a partition moved while a test's records were folded has two holders, its messages out at the
    former delivered again (both seen under load). A split like this one moves nothing at the next
    balance (barring a lost lease)."""
    share = math.ceil(partitions / max(1, len(held)))
    return (all(0 < len(h) <= share for h in held)
            and sorted(q for h in held for q in h) == list(range(partitions)))

def need_nats_server() -> str:
    """The nats-server binary, or skip (fail with PERFD_REQUIRE_SYSTEM_DEPS=1): test_natsd's rule."""
    return _need_nats_server()


def rig_under(tmp: Path, **kw: Any) -> Iterator[Rig]:
    """A :class:`Rig` under ``tmp`` (``kw``: Rig's), ended after the test whatever happened: the
    engine tests' ``rig`` fixture (tests/engine/conftest.py), or a module's own with other timers."""
    need_nats_server()
    r = Rig(tmp / "rig", **kw)
    try:
        yield r
    finally:
        r.close()


# ---- the load: what is sent, and what each iteration must then show ----------------------------


@dataclass(frozen=True)
class Expected:
    slowest: int  # the rank whose step is the iteration's
    step_time_ms: float
    end_offset_s: float  # the latest rank end after the iteration's submit time
    data_share: float  # max data wait (another rank's) / max step time


@dataclass(frozen=True)
class Plan:
    """``nodes`` × 8 ranks, ``iterations`` iterations one ``period_s`` apart. Three permutations of the
    ranks (multipliers prime to the world) pick, per iteration, which rank is slowest, which ends last
    and which waits longest for data: three ranks, usually on three nodes, that move every iteration."""

    nodes: int
    iterations: int
    period_s: float = 0.3
    job: str = JOB

    @property
    def world(self) -> int:
        return self.nodes * RANKS_PER_NODE

    def _perm(self, a: int, b: int, rank: int, it: int) -> int:
        return (a * rank + b * it) % self.world

    def step_ms(self, rank: int, it: int) -> float:
        return 100.0 + 0.5 * self._perm(self._prime(7), 13, rank, it) + 0.01 * it

    def end_offset_s(self, rank: int, it: int) -> float:
        return 0.001 * self._perm(self._prime(11), 5, rank, it)

    @property
    def max_end_offset_s(self) -> float:
        """Past every rank's end_offset_s (a permutation of the world's ranks, a millisecond each)."""
        return 0.001 * self.world

    def wait_ms(self, rank: int, it: int) -> float:
        return 10.0 + 0.1 * self._perm(self._prime(5), 17, rank, it)

    def _prime(self, a: int) -> int:
        """The first multiplier from ``a`` up that is prime to the world (a permutation of ranks)."""
        while math.gcd(a, self.world) != 1:
            a += 1
        return a

    def records(self, node: int, it: int, t: float) -> list[StepRecord]:
        """The hook-shaped records of ``node``'s ranks for iteration ``it`` submitted at ``t``."""
        out = []
        for lr in range(RANKS_PER_NODE):
            r = node * RANKS_PER_NODE + lr
            wait = self.wait_ms(r, it)
            out.append(StepRecord(
                job=self.job, iteration=it, rank=r, end_time=t + self.end_offset_s(r, it),
                step_time_ms=self.step_ms(r, it), interval=1,
                fields={"pid": str(1000 + r), "timing": "cuda", "step_time": "period"},
                timers={HOOK_DATA_WAIT: TimerValue(wait, wait, {r: wait})},
                source=Provenance("hook", f"rank{r}:pid{1000 + r}")))
        return out

    def expected(self, it: int) -> Expected:
        ranks = range(self.world)
        slow = max(ranks, key=lambda r: self.step_ms(r, it))
        step = self.step_ms(slow, it)
        return Expected(slow, step, max(self.end_offset_s(r, it) for r in ranks),
                        max(self.wait_ms(r, it) for r in ranks) / step)


Feed = Callable[[int, int, float], dict[str, Any]]


# Iterations go out at least this many periods apart (Load), however late the load's thread runs, and
# at least MIN_ROOM_S past the ranks' end offsets (a feed's operations go between a rank's two ends)
MIN_GAP = 0.25
MIN_ROOM_S = 0.02


class Load:
    """The simulated nodes, in a thread of their own with its own event loop: ``start()``, then
    iterations go out every ``plan.period_s``; ``finish()`` waits until the engine acknowledged every
    message; ``close()`` stops the clients and the thread."""

    def __init__(self, cfg: S.EngineConfig, plan: Plan, feed: Feed | None = None,
                 fold_at_agents: bool = False) -> None:
        self.cfg, self.plan = cfg, plan
        # each client folds its ranks' collective windows itself (perfd agent's default), or sends the
        # operations to its shard (EngineClient's)
        self.fold_at_agents = fold_at_agents
        # what node n submits for iteration it at time t (default: the plan's step records)
        self.feed: Feed = feed or (lambda n, it, t: {"steps": plan.records(n, it, t)})
        self.submitted = 0  # iterations submitted so far
        self.submit_wall: dict[int, float] = {}  # iteration -> time.time() of its submit
        self.submit_mono: dict[int, float] = {}
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._clients: list[EngineClient] = []
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-load", daemon=True)

    def start(self) -> Load:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the load thread did not start")
        return self

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # shown by the test that waits on it
            self.error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        fold = None
        if self.fold_at_agents:
            from perfd.analytics.collectives.shardfold import ShardCollectives

            fold = ShardCollectives
        self._clients = [EngineClient(self.cfg, f"agent-{n}", node=f"node-{n}",
                                      window_fold=fold() if fold is not None else None)
                         for n in range(self.plan.nodes)]
        tasks = [asyncio.create_task(c.run()) for c in self._clients]
        self._ready.set()
        try:
            t0 = time.monotonic()
            last: float | None = None
            for it in range(1, self.plan.iterations + 1):
                # On schedule, and never within MIN_GAP periods of the last iteration: a thread held
                # back (the machine loaded, the test's thread holding the interpreter) caught up by
                # submitting iterations back to back, their step ends milliseconds apart, which no job
                # does (a step takes its time); a feed's operations "between a rank's ends" then fell
                # outside its window, and a window fold (any: the root's, one aggregator's) settles
                # windows before operations enqueued in them come (test_engine_collectives_faults.py)
                now = time.monotonic()
                due = t0 + (it - 1) * self.plan.period_s
                if last is not None:  # (and past the ranks' end offsets, with room between)
                    due = max(due, last + max(MIN_GAP * self.plan.period_s,
                                              self.plan.max_end_offset_s + MIN_ROOM_S))
                await asyncio.sleep(max(0.0, due - now))
                if self._stop.is_set():
                    break
                t = time.time()
                for n, c in enumerate(self._clients):
                    c.submit(**self.feed(n, it, t))
                self.submit_wall[it], self.submit_mono[it] = t, time.monotonic()
                last = self.submit_mono[it]
                self.submitted = it
            await self._stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for c in self._clients:
                c.close()

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """``coro`` on the load's loop (the clients are not thread-safe), its result here."""
        if self._loop is None or not self._thread.is_alive():
            coro.close()
            raise RuntimeError(f"the load thread is not running ({self.error!r})")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def wait_submitted(self, n: int, timeout: float = 60.0) -> float:
        """Wait until iteration ``n`` was submitted; returns when (time.monotonic())."""
        wait_for(lambda: self.submitted >= n or self.error, timeout, f"iteration {n} submitted",
                 interval=0.01)
        if self.error is not None:
            raise self.error
        return self.submit_mono[n]

    def finish(self, timeout: float) -> None:
        """Wait until every iteration was submitted and every message acknowledged by the engine."""
        self.wait_submitted(self.plan.iterations, timeout)

        async def flushed() -> bool:
            oks = await asyncio.gather(*(c.flush(timeout) for c in self._clients))
            return all(oks)

        assert self._call(flushed(), timeout + 5), f"clients not flushed in {timeout}s: {self.stats()}"

    def stats(self) -> list[PublisherStats]:
        async def read() -> list[PublisherStats]:
            return [c.stats() for c in self._clients]

        return self._call(read(), 10)

    def distinct_published(self) -> int:
        """Messages the engine stored: published (acknowledged) less those it had already, but for
        the resends of a publish whose answer was lost (it had landed: stored once, sent once)."""
        return sum(s["distinct_published"] for s in self.stats())

    def close(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(20)


# ---- the engine, through nats-py, from the test ---------------------------------------------------


async def _quiet(_: Exception) -> None:
    """nats-py's default error_cb logs every failed (re)connect with a traceback."""


def js_call(urls: Sequence[str], fn: Callable[[Any], Awaitable[T]], timeout: float = 20.0) -> T:
    """``fn(js)`` on a connection of its own; retried until ``timeout`` while the engine answers with
    a timeout or no responders (a leader being elected)."""
    return nc_call(urls, lambda nc: fn(nc.jetstream(timeout=1.0)), timeout)


def nc_call(urls: Sequence[str], fn: Callable[[Any], Awaitable[T]], timeout: float = 20.0) -> T:
    """``fn(nc)`` on a connection of its own, retried as :func:`js_call`."""
    import nats
    import nats.errors
    import nats.js.errors

    async def main() -> T:
        deadline = time.monotonic() + timeout
        while True:
            nc = None
            try:
                nc = await asyncio.wait_for(
                    nats.connect(list(urls), error_cb=_quiet, connect_timeout=2, max_reconnect_attempts=2,
                                 reconnect_time_wait=0.2), 10)
                return await asyncio.wait_for(fn(nc), 10)
            except (TimeoutError, OSError, nats.errors.Error, nats.js.errors.Error):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
            finally:
                if nc is not None:
                    try:
                        await asyncio.wait_for(nc.close(), 5)
                    except Exception:  # a broken connection: nothing to keep
                        pass

    return asyncio.run(main())


def stream_state(urls: Sequence[str], stream: str, subject: str | None = None) -> dict[str, Any]:
    """messages (of ``subject`` alone where given), first_seq, last_seq, leader of ``stream``."""

    async def fn(js: Any) -> dict[str, Any]:
        si = await js.stream_info(stream, subjects_filter=subject)
        leader = si.cluster.leader if si.cluster is not None else None
        messages = si.state.messages if subject is None else (si.state.subjects or {}).get(subject, 0)
        return {"messages": messages, "first_seq": si.state.first_seq,
                "last_seq": si.state.last_seq, "leader": leader}

    return js_call(urls, fn)


def consumers(urls: Sequence[str], partitions: Sequence[int]) -> dict[int, dict[str, Any]]:
    """Each partition's durable consumer: ack_pending (delivered, not acknowledged), redelivered,
    pending (not delivered yet), deliveries made (each redelivery one more). Absent when the consumer
    does not exist yet."""
    import nats.js.errors

    async def fn(js: Any) -> dict[int, dict[str, Any]]:
        out = {}
        for p in partitions:
            try:
                ci = await js.consumer_info(S.NODES_STREAM, S.shard_consumer(p))
            except nats.js.errors.NotFoundError:
                continue
            out[p] = {"ack_pending": ci.num_ack_pending, "redelivered": ci.num_redelivered,
                      "pending": ci.num_pending, "waiting": ci.num_waiting,
                      "delivered": ci.delivered.stream_seq if ci.delivered else None,
                      "deliveries": ci.delivered.consumer_seq if ci.delivered else None,  # redeliveries too
                      "ack_floor": ci.ack_floor.stream_seq if ci.ack_floor else None,
                      "leader": ci.cluster.leader if ci.cluster else None}
        return out

    return js_call(urls, fn)


# ---- the processes --------------------------------------------------------------------------------


def _kill9(p: Any) -> None:
    """SIGKILL to the process's group (its session: tests/procs.py), then reaped."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(10)


@dataclass
class ShardProc:
    name: str  # the log's name (a restart gets a new one, the id stays)
    shard_id: str
    stats_file: Path
    proc: Any


@dataclass
class Watch:
    """The root's engine counters, read every ``interval`` in a thread: (time.monotonic(), counters)."""

    read: Callable[[], dict[str, Any]]
    interval: float = 0.1
    samples: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Watch:
        self._thread = threading.Thread(target=self._run, name="engine-watch", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic(), self.read()))
            except NOT_YET:
                pass
            self._stop.wait(self.interval)

    def first(self, pred: Callable[[dict[str, Any]], bool], after: float = 0.0) -> float | None:
        """When a sample at or after ``after`` first met ``pred``."""
        return next((t for t, s in list(self.samples) if t >= after and pred(s)), None)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


class Rig:
    """Servers, processes and load of one test; ``close()`` ends everything it started."""

    def __init__(self, tmp: Path, servers: int = 1, partitions: int = PARTITIONS,
                 lease_ttl_s: float = S.LEASE_TTL_S, ack_wait_s: float = S.ACK_WAIT_S) -> None:
        """``lease_ttl_s``, ``ack_wait_s``: the engine's timers, as a deployment sets them
        (--engine-lease-ttl, --engine-ack-wait on every shard and root, and :meth:`cfg`)."""
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.partitions = partitions
        self.lease_ttl_s, self.ack_wait_s = lease_ttl_s, ack_wait_s
        self.replicas = 3 if servers == 3 else 1
        self.cluster = NatsCluster(tmp / "nats", size=servers)
        self.procs = Procs(tmp, env=run_env())
        self.shards: dict[str, ShardProc] = {}  # shard id -> its newest process
        self.base = ""  # the first root aggregator's HTTP
        self.roots: dict[str, str] = {}  # root id -> its HTTP (a second one stands by)
        self.load: Load | None = None
        self.watch: Watch | None = None
        self.closers: list[Callable[[], None]] = []  # e.g. a fault proxy's close
        self._names: dict[str, int] = {}
        self._root_names: dict[str, str] = {}  # root id -> its newest process's name
        self.shard_flags: tuple[str, ...] = ()  # more flags of every shard started (e.g. --comm-summaries)

    @property
    def urls(self) -> list[str]:
        return self.cluster.urls

    def cfg(self) -> S.EngineConfig:
        return S.EngineConfig(tuple(self.urls), partitions=self.partitions, lease_ttl_s=self.lease_ttl_s,
                              ack_wait_s=self.ack_wait_s)

    def engine_args(self, urls: Sequence[str] | None = None) -> list[str]:
        """A shard's or a root's engine flags (an agent's are the first four)."""
        return ["--engine", ",".join(urls or self.urls), "--engine-partitions", str(self.partitions),
                "--engine-replicas", str(self.replicas), "--engine-lease-ttl", str(self.lease_ttl_s),
                "--engine-ack-wait", str(self.ack_wait_s)]

    def _name(self, base: str) -> str:
        k = self._names[base] = self._names.get(base, 0) + 1
        return base if k == 1 else f"{base}.{k}"

    # ---- starting
    def start_cluster(self) -> None:
        need_nats_server()
        if not all(s.running for s in self.cluster.servers):
            self.cluster.start(timeout_s=30)

    def start_shard(self, shard_id: str, urls: Sequence[str] | None = None) -> ShardProc:
        """``perfd shard --id shard_id`` (again: the same id, a new log)."""
        name = self._name(shard_id)
        stats = self.tmp / f"{name}.stats.json"  # each process its own: a killed one's last stays
        p = self.procs.perfd(name, "-v", "shard", "--id", shard_id, "--stats-file", str(stats),
                             "--stats-interval", "0.2", *self.shard_flags, *self.engine_args(urls))
        sp = self.shards[shard_id] = ShardProc(name, shard_id, stats, p)
        return sp

    def start_root(self, root_id: str = "root-a", *flags: str) -> str:
        """``perfd aggregator --engine --engine-root-id root_id FLAGS``; returns its HTTP base URL (the
        first one started is ``base``, the one the checks read)."""
        name = self._root_names[root_id] = self._name(f"aggregator-{root_id}")
        _, _, url = start_aggregator(self.procs, "--no-rules", *self.engine_args(), "--engine-root-id",
                                     root_id, *flags, ready=self.tmp / f"{root_id}.ready", name=name,
                                     timeout=60)
        self.roots[root_id] = url
        self.base = self.base or url
        return url

    def start_load(self, plan: Plan, feed: Feed | None = None, fold_at_agents: bool = False) -> Load:
        self.load = Load(self.cfg(), plan, feed, fold_at_agents).start()
        return self.load

    def start_watch(self) -> Watch:
        self.watch = Watch(self.engine_stats).start()
        return self.watch

    def up(self, shard_ids: Sequence[str] = ("shard-a", "shard-b"),
           shard_urls: dict[str, Sequence[str]] | None = None, root_flags: Sequence[str] = ()) -> None:
        """Servers, shards and the root (``root-a``, with ``root_flags``) started; the root leads, the
        streams exist and the shards hold the partitions between them (none twice)."""
        self.start_cluster()
        for sid in shard_ids:
            self.start_shard(sid, (shard_urls or {}).get(sid))
        self.start_root("root-a", *root_flags)
        wait_for(lambda: self.engine_stats()["leader"], 60, "the root to lead", ignore=NOT_YET)
        wait_for(lambda: stream_state(self.urls, S.NODES_STREAM), 30, "the node stream")
        wait_for(lambda: self.split(shard_ids), 60, "the shards to split the partitions",
                 ignore=NOT_YET)
        self.start_watch()

    # ---- faults
    def kill(self, shard_id: str) -> None:
        """SIGKILL: a crash, nothing flushed, nothing acknowledged, no lease given back."""
        _kill9(self.shards[shard_id].proc)

    def kill_root(self, root_id: str) -> None:
        """SIGKILL the root ``root_id``'s newest process, as :meth:`kill` a shard: its lease is not given
        back, so a standby leads only once it lapses."""
        name = self._root_names[root_id]
        _kill9(next(p for n, _, p in reversed(self.procs.procs) if n == name))

    # ---- reading
    def shard_stats(self, shard_id: str) -> dict[str, Any]:
        """The shard's stats file (raises while it is not written yet: NOT_YET)."""
        sp = self.shards[shard_id]
        if sp.proc.poll() is not None:
            log = tail(self.tmp / f"{sp.name}.out")
            raise RuntimeError(f"{shard_id} exited ({sp.proc.returncode}): {log}")
        return dict(json.loads(sp.stats_file.read_text()))

    def shard_folds(self) -> int:
        """Node messages every shard process ever started folded (a killed one's as it last wrote
        them): more than the messages stored when the engine delivered some again."""
        total = 0
        for f in self.tmp.glob("*.stats.json"):
            try:
                total += int(json.loads(f.read_text())["node_messages"])
            except (OSError, ValueError, KeyError):
                continue
        return total

    def partitions_of(self, shard_id: str) -> list[int]:
        return list(self.shard_stats(shard_id)["partitions"])

    def split(self, shard_ids: Sequence[str]) -> bool:
        held = [self.partitions_of(s) for s in shard_ids]
        flat = [p for h in held for p in h]
        return all(held) and sorted(flat) == list(range(self.partitions))

    def engine_stats(self) -> dict[str, Any]:
        return dict(get_json(f"{self.base}/api/stats", timeout=5)["engine"])

    def rows(self, job: str = JOB) -> list[dict[str, Any]]:
        q = urllib.parse.quote(job, safe="")
        return list(get_json(f"{self.base}/api/jobs/{q}/iterations?sources=0", timeout=10)["iterations"])

    def node_partitions(self, plan: Plan) -> dict[int, list[int]]:
        """partition -> the nodes whose records go there."""
        out: dict[int, list[int]] = {}
        for n in range(plan.nodes):
            out.setdefault(S.partition_of(plan.job, f"node-{n}", self.partitions), []).append(n)
        return out

    @contextmanager
    def explained(self) -> Iterator[None]:
        """On an exception, print the end of every log (pytest shows it with the failure)."""
        try:
            yield
        except BaseException:
            print(self.tails())
            raise

    def describe(self, plan: Plan) -> str:
        """Where everything stands (for a failure's message)."""
        out = []
        for what, read in (
                ("root", self.engine_stats),
                ("node stream", lambda: stream_state(self.urls, S.NODES_STREAM)),
                ("partials stream", lambda: stream_state(self.urls, S.PARTIALS_STREAM)),
                ("consumers", lambda: consumers(self.urls, range(self.partitions))),
                ("clients", lambda: self.load.stats() if self.load is not None else None),
                ("rows", lambda: None if self.load is None else row_problems(plan, self.load, self.rows())),
                *((f"shard {sid}", lambda sid=sid: self.shard_stats(sid)) for sid in self.shards)):
            try:
                out.append(f"{what}: {read()}")
            except Exception as exc:  # a description of a failure must not fail itself
                out.append(f"{what}: ({type(exc).__name__}: {exc})")
        return "\n".join(out)

    def tails(self, n: int = 3000) -> str:
        parts = [f"---- {name}.out\n{tail(self.tmp / f'{name}.out', n)}" for name, _, _ in self.procs.procs]
        parts += [f"---- {s.log_path}\n{s.log_tail(n)}" for s in self.cluster.servers]
        return "\n".join(parts)

    def close(self) -> None:
        """Everything this rig started, ended (each step whatever the others did)."""
        steps: list[Callable[[], None]] = []
        if self.watch is not None:
            steps.append(self.watch.stop)
        if self.load is not None:
            steps.append(self.load.close)
        steps.append(lambda: self.procs.stop(grace_s=10))
        steps += self.closers
        steps.append(self.cluster.stop)
        errors = []
        for step in steps:
            try:
                step()
            except Exception as exc:  # the next ones still run
                errors.append(exc)
        still = [n for n, _, p in self.procs.procs if p.poll() is None]
        still += [s.name for s in self.cluster.servers if s.running]
        if errors or still:
            raise RuntimeError(f"teardown: errors {errors!r}, still running {still}")


# ---- the verdict ----------------------------------------------------------------------------------


def row_problems(plan: Plan, load: Load, rows: list[dict[str, Any]]) -> list[str]:
    """What the iteration rows get wrong against the plan ([] when every iteration is there once,
    with its slowest rank's step, its latest end and its longest data wait)."""
    its = [int(r["iteration"]) for r in rows]
    bad = []
    if its != list(range(1, plan.iterations + 1)):
        missing = sorted(set(range(1, plan.iterations + 1)) - set(its))
        doubled = sorted({i for i in its if its.count(i) > 1})
        bad.append(f"iterations: {len(its)} rows, missing {missing}, doubled {doubled}")
    for r in rows:
        it = int(r["iteration"])
        if it not in load.submit_wall:
            continue
        e = plan.expected(it)
        want_src = f"hook:rank{e.slowest}:pid{1000 + e.slowest}"
        if r.get("step_time_ms") != pytest.approx(e.step_time_ms, abs=1e-6) or r.get("source") != want_src:
            bad.append(f"{it}: step {r.get('step_time_ms')} from {r.get('source')}, want {e.step_time_ms} "
                       f"from {want_src}")
        if r.get("end_time") != pytest.approx(load.submit_wall[it] + e.end_offset_s, abs=2e-4):
            bad.append(f"{it}: end {r.get('end_time')}, want {load.submit_wall[it] + e.end_offset_s}")
        if r.get("data_share") != pytest.approx(e.data_share, rel=1e-9):
            bad.append(f"{it}: data share {r.get('data_share')}, want {e.data_share}")
    return bad


@dataclass
class Figures:
    published: int  # what the clients had acknowledged, duplicates included
    duplicates: int  # of those, the ones the engine already had
    duplicates_unanswered: int  # of those, resends of a publish whose answer was lost (it had landed)
    distinct: int
    stream_last_seq: int  # node messages the engine ever stored
    node_messages: int  # distinct node messages the root folded
    redelivered: int
    complete: int
    batches: int
    partials_stream: int
    lag: Any
    publish_errors: int
    shard_folds: int  # node messages folded by the shards, a message delivered again counted again

    def line(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.__dict__.items())


def settle_and_check(rig: Rig, plan: Plan, timeout: float = 60.0, late: bool | None = False,
                     others: int = 0) -> Figures:
    """Wait until the engine is at rest — every message published and acknowledged by the engine,
    the node stream empty (every message acknowledged by a shard after its partial was stored),
    every partial read by the root — then assert nothing lost and nothing doubled:

    - the node stream stored exactly the clients' distinct messages (no message stored twice);
    - the root folded exactly that many distinct node messages (none lost; one delivered twice is
      ``redelivered``, folded once);
    - every iteration's row shows the plan's figures (its slowest rank, latest end, longest data
      wait), and the root counted every iteration whole (``complete``; the first may not count).

    Of the clients' messages, those that went to the records stream (the store's share of a feed's
    collective records, held and sent as the agent does: perfd.engine.shares) are not node messages.
    ``others``: the node messages other jobs' loads published (the stream holds them too); the root read
    (``rig.base``) may lead ``plan.job`` alone, so its partials are counted on the job's subject."""
    load = rig.load
    assert load is not None
    load.finish(timeout)
    distinct = load.distinct_published() - sum(s["collective_shares_sent"] for s in load.stats())

    def at_rest() -> bool:
        nodes = stream_state(rig.urls, S.NODES_STREAM)
        parts = stream_state(rig.urls, S.PARTIALS_STREAM, S.partials_subject(plan.job))
        st = rig.engine_stats()
        return bool(nodes["messages"] == 0 and st["batches"] + st["undecodable"] >= parts["messages"]
                    and st["node_messages"] >= distinct)

    try:
        wait_for(at_rest, timeout, "the engine at rest (node stream empty, every partial read, every "
                 "node message folded)", interval=0.25, ignore=NOT_YET)
        wait_for(lambda: not row_problems(plan, load, rig.rows(plan.job)), 30, "every iteration row right",
                 interval=0.25, ignore=NOT_YET)
    except WaitTimeout as exc:
        raise WaitTimeout(f"{exc}\n{rig.describe(plan)}") from None
    st = rig.engine_stats()
    nodes = stream_state(rig.urls, S.NODES_STREAM)
    parts = stream_state(rig.urls, S.PARTIALS_STREAM, S.partials_subject(plan.job))
    cs = load.stats()
    f = Figures(published=sum(s["published"] for s in cs), duplicates=sum(s["duplicates"] for s in cs),
                duplicates_unanswered=sum(s["duplicates_unanswered"] for s in cs),
                distinct=distinct, stream_last_seq=nodes["last_seq"], node_messages=st["node_messages"],
                redelivered=st["redelivered"], complete=st["complete"], batches=st["batches"],
                partials_stream=parts["messages"], lag=st["lag_s"],
                publish_errors=sum(s["publish_errors"] for s in cs), shard_folds=rig.shard_folds())
    assert not row_problems(plan, load, rig.rows(plan.job))
    assert distinct == plan.nodes * plan.iterations, f"clients' distinct messages: {f.line()}"
    assert f.stream_last_seq == distinct + others, \
        f"the node stream stored a message twice or lost one: {f.line()}"
    assert f.node_messages == distinct, f"root folded {f.node_messages} node messages: {f.line()}"
    # Whole: every rank in. The root holds an iteration to the world the job has shown, and not the
    # job's first while it is the only one it has seen (perfd.engine.rootfold.RootFold.add): the first
    # counts only when a partial of it comes after the second iteration's first.
    assert plan.iterations - 1 <= f.complete <= plan.iterations, f"iterations whole at the root: {f.line()}"
    # A root whose engine session ended (its lease renewal timed out while a server was lost) reads
    # the partials stream again from its start, and counts those batches (and their node messages, as
    # ``redelivered``) again: at least every partial stored was read.
    assert f.batches >= f.partials_stream and st["undecodable"] == 0, f"partials read: {f.line()} {st}"
    # ``late``: the plan's iterations are too fast for the fault, and partials come after their
    # iteration left the root's memory (perfd.engine.rootfold.GONE_ITERATIONS): counted all the same.
    # None: either (a fault whose delay in iterations depends on how fast the load's thread ran)
    if late is not None:
        assert (st["late"] > 0) == late, f"partials past the root's memory: {st}"
    assert all(s["pending"] == 0 and s["unreadable"] == 0 for s in cs), cs
    return f
