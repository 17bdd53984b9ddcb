"""`perfd bench engine-storm`: thousands of agents on the distributed path lose their engine under CPU
contention and come back by themselves, nothing lost and nothing doubled.

    perfd bench engine-storm --agents 2000 --procs 4 --burners 2 --down-s 10 [--json]

Every part is a real process on this machine, the shipped code: one nats-server with JetStream and a
token, one ``perfd shard``, one ``perfd aggregator --engine`` (the job's root), ``--burners``
processes that spin (the contention: as many as the machine has cores leaves the rest a share of
them), and ``--procs`` load processes holding ``--agents`` real :class:`perfd.engine.publisher.
EngineClient` objects — each its own connection to the engine, its own spool and its own jittered
backoff, as each node's ``perfd agent --engine`` — each submitting its node's 8 ranks' step-hook
records every ``--iteration-s``.

The run: every agent connects (``initial_connect_s``: the first connect storm), the job steps
``--before-s``, the nats-server is killed (SIGKILL) and started again ``--down-s`` later on the same
store, and the job steps ``--after-s`` more. Meanwhile the agents keep submitting: their messages
wait in their spools. Measured: when each agent was connected again after the restart
(``storm.all_connected_after_s``, and the count each second, ``storm.connected``), the reconnects
and failed publishes counted by the agents, the most messages waiting in their spools, and — once the
load stops at a common iteration and drains — whether the root folded every message the agents
published exactly once (``final.every_message_once``: its ``node_messages`` equal to the distinct
messages, nats-server's duplicate window dropping the copies the agents re-published) and counted
every iteration whole but the first.

``--json`` prints one object: machine, config, initial_connect_s, storm, final, load, shard, root.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import secrets
import shutil
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.engine_bench import (  # noqa: E402
    JOB,
    RANKS_PER_NODE,
    Children,
    _rank_records,
    _read_json,
    _wait,
    node_name,
)
from perfd.engine import subjects as S  # noqa: E402

STATUS_S = 0.5  # how often a load process reports its agents


@dataclass
class AgentsArgs:
    index: int
    servers: tuple[str, ...]
    token: str
    partitions: int
    first: int
    n: int
    world: int
    iteration_s: float


def _agents(a: AgentsArgs, t0: Any, last: Any, status: Any, ready: Any) -> None:
    """One load process: agents a.first .. a.first + a.n - 1, each a real EngineClient."""
    import asyncio

    from perfd.engine.publisher import EngineClient

    cfg = S.EngineConfig(a.servers, token=a.token, partitions=a.partitions)

    async def main() -> None:
        clients = [EngineClient(cfg, f"{node_name(i)}/{JOB}", node=node_name(i))
                   for i in range(a.first, a.first + a.n)]
        tasks = [asyncio.create_task(c.run()) for c in clients]
        ready.put(a.index)
        while t0.value == 0.0:
            await asyncio.sleep(0.05)
        it, next_status = 0, 0.0

        def report(final: bool) -> None:
            status.put({"index": a.index, "final": final, "t": time.time(), "iteration": it,
                        "connected": sum(c.connected for c in clients),
                        "submitted": sum(c.batches_submitted for c in clients),
                        "published": sum(c.distinct_published for c in clients),
                        "duplicates": sum(c.duplicates for c in clients),
                        "pending": sum(c.spool.pending_count() for c in clients),
                        "reconnects": sum(c.reconnects for c in clients),
                        "close_timeouts": sum(c.close_timeouts for c in clients),
                        "publish_errors": sum(c.publish_errors for c in clients)})

        while True:
            due = t0.value + it * a.iteration_s
            if last.value and it >= last.value:
                break
            now = time.time()
            if now >= due:
                it += 1
                end = time.time()
                for i, c in enumerate(clients):
                    c.submit(steps=_rank_records(JOB, a.first + i, a.world, it, end))
            if now >= next_status:
                next_status = now + STATUS_S
                report(False)
            await asyncio.sleep(min(0.05, max(0.0, due - time.time())))
        deadline = time.monotonic() + 120
        while any(c.spool.pending_count() for c in clients) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        report(True)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())


def _burn(stop: Any) -> None:
    while not stop.is_set():
        for _ in range(100_000):
            pass


class Budget:
    """The run's one deadline: each wait takes the lesser of its own bound and what is left, and the
    first that runs out is named (``ran_out_in``) instead of the run being killed from outside with
    nothing said (a test's subprocess timeout)."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds
        self.ran_out_in: str | None = None

    def bound(self, seconds: float) -> float:
        """A monotonic deadline: ``seconds`` from now, or the run's end if sooner."""
        return min(time.monotonic() + seconds, self.end)

    def check(self, phase: str, done: bool) -> None:
        """Call after a phase's wait: not done at the run's end names the phase."""
        if not done and self.ran_out_in is None and time.monotonic() >= self.end:
            self.ran_out_in = phase


def run_storm(agents: int, procs: int, burners: int, down_s: float, before_s: float, after_s: float,
              iteration_s: float = 2.0, partitions: int = S.DEFAULT_PARTITIONS, keep: bool = False,
              budget_s: float = 900.0) -> dict[str, Any]:
    from perfd.engine.natsd import NatsCluster

    tmp = Path(tempfile.mkdtemp(prefix="perfd-engine-storm-"))
    token = secrets.token_urlsafe(24)
    cluster = NatsCluster(tmp / "nats", 1, token=token)
    kids = Children(tmp)
    spawn, children = kids.spawn, kids.procs
    ctx = mp.get_context("spawn")
    stop_burn = ctx.Event()
    workers: list[Any] = []
    ok = False
    budget = Budget(budget_s)

    try:
        cluster.start()
        (tmp / "token").write_text(token)
        (tmp / "token").chmod(0o600)
        eng = ["--engine", ",".join(cluster.urls), "--engine-partitions", str(partitions),
               "--engine-token-file", str(tmp / "token")]
        ready_file = tmp / "root.ready"
        spawn("root", ["aggregator", *eng, "--no-rules", "--grpc-port", "0", "--http-port", "0",
                       "--ready-file", str(ready_file), "--engine-root-id", "storm-root"])
        shard_stats = tmp / "shard.json"
        spawn("shard", ["shard", *eng, "--id", "storm-shard", "--stats-file", str(shard_stats),
                        "--stats-interval", "0.5"])
        _wait("the root's ready file", lambda: ready_file.read_text().strip(), 60, children)
        base = f"http://127.0.0.1:{int(ready_file.read_text().split()[1])}"

        def engine_stats() -> dict[str, Any]:
            with urllib.request.urlopen(f"{base}/api/stats", timeout=30) as r:
                return dict(json.loads(r.read()).get("engine") or {})

        _wait("the root's lease", lambda: engine_stats().get("leader"), 60, children)
        _wait("the shard's partitions",
              lambda: len(_read_json(shard_stats).get("partitions") or []) == partitions, 60, children)
        for _ in range(burners):
            b = ctx.Process(target=_burn, args=(stop_burn,), daemon=True)
            b.start()
            workers.append(b)

        t0v, lastv = ctx.Value("d", 0.0), ctx.Value("q", 0)
        status, ready = ctx.Queue(), ctx.Queue()
        per = [agents // procs + (1 if i < agents % procs else 0) for i in range(procs)]
        first = 0
        for i, n in enumerate(per):
            aa = AgentsArgs(i, tuple(cluster.urls), token, partitions, first, n, agents * RANKS_PER_NODE,
                            iteration_s)
            p = ctx.Process(target=_agents, args=(aa, t0v, lastv, status, ready), daemon=True)
            p.start()
            workers.append(p)
            first += n
        for _ in range(procs):
            ready.get(timeout=120)
        latest: dict[int, dict[str, Any]] = {}

        def drain_status() -> None:
            while True:
                try:
                    s = status.get_nowait()
                except Exception:
                    return
                if not latest.get(s["index"], {}).get("final"):
                    latest[s["index"]] = s

        def total(key: str) -> int:
            return sum(int(s[key]) for s in latest.values())

        t_start = time.time()
        t0v.value = t_start
        connected_at = None
        deadline = budget.bound(300)
        while connected_at is None and time.monotonic() < deadline:
            time.sleep(0.25)
            drain_status()
            if len(latest) == procs and total("connected") == agents:
                connected_at = time.time() - t_start
        budget.check("first connect", connected_at is not None)
        time.sleep(max(0.0, t_start + before_s - time.time()))
        drain_status()
        before = {k: total(k) for k in ("reconnects", "publish_errors", "published")}

        cluster.kill(0)
        t_kill = time.time()
        time.sleep(down_s)
        cluster.restart(0)
        t_up = time.time()
        timeline: list[tuple[float, int, int]] = []  # (s after the restart, connected, pending)
        all_after = None
        pending_max = 0
        end = t_up + after_s
        deadline = budget.bound(after_s + 120)
        while (time.time() < end or all_after is None) and time.monotonic() < deadline:
            time.sleep(0.25)
            drain_status()
            conn, pend = total("connected"), total("pending")
            pending_max = max(pending_max, pend)
            timeline.append((round(time.time() - t_up, 2), conn, pend))
            if all_after is None and conn == agents:
                all_after = time.time() - t_up
        budget.check("reconnect", all_after is not None)

        lastv.value = max(int(s["iteration"]) for s in latest.values()) + 1
        finals: dict[int, dict[str, Any]] = {}
        deadline = budget.bound(180)
        while len(finals) < procs and time.monotonic() < deadline:
            try:
                s = status.get(timeout=1.0)
            except Exception:
                continue
            if s["final"]:
                finals[s["index"]] = s
        budget.check("load drain", len(finals) == procs)
        distinct = sum(int(s["submitted"]) for s in finals.values())
        published = sum(int(s["published"]) for s in finals.values())
        iterations = int(lastv.value)
        ef = engine_stats()
        deadline = budget.bound(60)

        def root_short() -> bool:
            return bool(ef.get("node_messages", 0) < distinct or ef.get("complete", 0) < iterations - 1)

        while time.monotonic() < deadline and root_short():
            time.sleep(0.25)
            ef = engine_stats()
        budget.check("root drain", not root_short())
        shard = _read_json(shard_stats)
        per_second = [(t, c) for t, c, _ in timeline if abs(t - round(t)) < 0.13]
        out: dict[str, Any] = {
            "machine": {"cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()],
                        "python": sys.version.split()[0]},
            "config": {"agents": agents, "procs": procs, "burners": burners, "down_s": down_s,
                       "before_s": before_s, "after_s": after_s, "iteration_s": iteration_s,
                       "partitions": partitions, "auth": "token", "budget_s": budget_s},
            "ran_out_in": budget.ran_out_in,
            "initial_connect_s": None if connected_at is None else round(connected_at, 2),
            "storm": {"killed_at_s": round(t_kill - t_start, 2), "down_s": round(t_up - t_kill, 2),
                      "all_connected_after_s": None if all_after is None else round(all_after, 2),
                      "connected": per_second[:120], "pending_max": pending_max,
                      "reconnects": total("reconnects") - before["reconnects"],
                      "close_timeouts": total("close_timeouts"),
                      "publish_errors": total("publish_errors") - before["publish_errors"]},
            "final": {"iterations": iterations, "distinct_messages": distinct, "published": published,
                      "duplicates_dropped_by_engine": sum(int(s["duplicates"]) for s in finals.values()),
                      "pending": sum(int(s["pending"]) for s in finals.values()),
                      "root_node_messages": ef.get("node_messages"),
                      "root_redelivered": ef.get("redelivered"),
                      "root_complete": ef.get("complete"), "root_late": ef.get("late"),
                      "every_message_once": ef.get("node_messages") == distinct == published,
                      "every_iteration_whole": ef.get("complete", 0) >= iterations - 1},
            "shard": {k: shard.get(k) for k in ("node_messages", "publish_errors", "leases_lost",
                                                 "consumer_restarts")},
            "root": {k: ef.get(k) for k in ("leader", "batches", "undecodable", "lag_s")},
            "load": {"finals": len(finals)},
        }
        ok = bool(out["final"]["every_message_once"])
        return out
    finally:
        stop_burn.set()
        for p in workers:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
        kids.close()
        cluster.stop()
        if ok and not keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"engine storm: logs kept in {tmp}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="perfd bench engine-storm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=2000,
                    help="agents, each its own connection (default: %(default)s)")
    ap.add_argument("--procs", type=int, default=4, help="load processes holding them (default: %(default)s)")
    ap.add_argument("--burners", type=int, default=os.cpu_count() or 1,
                    help="processes spinning for the whole run: the contention (default: one per core)")
    ap.add_argument("--down-s", type=float, default=10.0,
                    help="how long the engine is down (default: %(default)s)")
    ap.add_argument("--before-s", type=float, default=20.0,
                    help="steps before the kill (default: %(default)s)")
    ap.add_argument("--after-s", type=float, default=60.0,
                    help="steps after the restart (default: %(default)s)")
    ap.add_argument("--iteration-s", type=float, default=2.0,
                    help="the job's iteration (default: %(default)s)")
    ap.add_argument("--budget-s", type=float, default=900.0,
                    help="the whole run's bound: the first wait still short at its end is named in "
                         "ran_out_in and the run fails (default: %(default)s)")
    ap.add_argument("--keep", action="store_true", help="keep the run's folder (logs, store)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    if min(a.agents, a.procs) < 1 or a.burners < 0 or min(a.down_s, a.iteration_s) <= 0:
        print("perfd bench engine-storm: --agents and --procs >= 1, --burners >= 0, --down-s and "
              "--iteration-s > 0", file=sys.stderr)
        return 2
    res = run_storm(a.agents, a.procs, a.burners, a.down_s, a.before_s, a.after_s, a.iteration_s, keep=a.keep,
                    budget_s=a.budget_s)
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        st, fin = res["storm"], res["final"]
        print(f"{a.agents} agents, {a.burners} burners on {res['machine']['cpus']} cores: connected in "
              f"{res['initial_connect_s']} s; engine down {st['down_s']} s; all connected again "
              f"{st['all_connected_after_s']} s after its restart ({st['reconnects']} reconnects, "
              f"{st['publish_errors']} failed publishes, {st['pending_max']} messages waiting at most); "
              f"{fin['root_node_messages']} of {fin['distinct_messages']} messages folded once: "
              f"{fin['every_message_once']}; iterations whole: {fin['every_iteration_whole']}")
    if res["ran_out_in"]:
        print(f"perfd bench engine-storm: the run's {a.budget_s:.0f} s ran out waiting for: "
              f"{res['ran_out_in']}", file=sys.stderr)
    ok = res["final"]["every_message_once"] and res["final"]["every_iteration_whole"]
    return 0 if ok and not res["ran_out_in"] else 1


if __name__ == "__main__":
    sys.exit(main())
