"""How fast a reader takes an ordered consumer's messages beside other work on its event loop: the
engine root's shape (perfd.engine.root reads three streams in one loop, beside its fold of the
shards' partials). A real nats-server on loopback; a stream of ``--messages`` 1,000-byte messages;
then for each way of reading and each ``--busy-ms`` (a coroutine of the same loop busy that long a
turn, as the root's fold is), the messages read a second:

- ``next_msg``: nats-py's ``next_msg`` a message at a time, 256 at most a read (the root's): nats-py
  makes a task for each, so each message costs a turn of the loop, and each turn runs whatever else
  is ready;
- ``inbox``: a callback filling a queue (:class:`Inbox`, here only), taken 256 at most at a time.

Why the root does not read so (docs/evidence/entries/48-scale-history.md, "The store's share held at the
agents"): with its
records stream read through an inbox, a 4,000-node job on the 2-core VM had every records message
read and its partials then fell behind, the root's core not full.

    perfd bench inbox [--messages 30000] [--busy-ms 0,20] [--rounds 2] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

MESSAGE = b"x" * 1000
MOST = 256  # a read takes at most this many (the root's)
LIMIT_S = 60.0  # a point stops reading after this long (its rate is what it read by then)


class Inbox:
    """``cb=inbox.put`` on the subscription (nats-py calls it in order, one at a time, from a task of
    its own); ``await inbox.take(...)`` in the reader."""

    def __init__(self) -> None:
        self._msgs: deque[Any] = deque()
        self._ready = asyncio.Event()

    async def put(self, msg: Any) -> None:
        self._msgs.append(msg)
        self._ready.set()

    async def take(self, wait_s: float, most: int) -> list[Any]:
        if not self._msgs:
            self._ready.clear()
            try:
                await asyncio.wait_for(self._ready.wait(), wait_s)
            except asyncio.TimeoutError:
                return []
        return [self._msgs.popleft() for _ in range(min(most, len(self._msgs)))]


async def _point(js: Any, stream: str, n: int, mode: str, busy_ms: float) -> float:
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.api import DeliverPolicy

    stop = asyncio.Event()

    async def busy() -> None:  # another reader's fold: busy_ms of CPU a turn of the loop
        while not stop.is_set():
            t = time.perf_counter()
            while time.perf_counter() - t < busy_ms / 1000:
                pass
            await asyncio.sleep(0.001)

    b = asyncio.create_task(busy())
    got, t0 = 0, time.perf_counter()
    if mode == "next_msg":
        sub = await js.subscribe(f"{stream}.>", stream=stream, ordered_consumer=True,
                                 deliver_policy=DeliverPolicy.ALL)
        while got < n and time.perf_counter() - t0 < LIMIT_S:
            msgs = []
            try:
                msgs.append(await sub.next_msg(timeout=0.5))
                while len(msgs) < MOST:
                    msgs.append(await sub.next_msg(timeout=0.001))
            except NatsTimeout:
                pass
            got += len(msgs)
    else:
        inbox = Inbox()
        sub = await js.subscribe(f"{stream}.>", stream=stream, ordered_consumer=True,
                                 deliver_policy=DeliverPolicy.ALL, cb=inbox.put)
        while got < n and time.perf_counter() - t0 < LIMIT_S:
            got += len(await inbox.take(0.5, MOST))
    rate = got / (time.perf_counter() - t0)
    stop.set()
    await b
    await sub.unsubscribe()
    return rate


async def _run(url: str, n: int, busy: list[float], rounds: int) -> list[dict[str, Any]]:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    out = []
    k = 0
    for r in range(rounds):
        for busy_ms in busy:
            for mode in ("next_msg", "inbox"):
                k += 1
                stream = f"B{k}"
                await js.add_stream(name=stream, subjects=[f"{stream}.>"])
                for i in range(0, n, 1000):
                    await asyncio.gather(*(js.publish(f"{stream}.m", MESSAGE)
                                           for _ in range(min(1000, n - i))))
                rate = await _point(js, stream, n, mode, busy_ms)
                await js.delete_stream(stream)
                out.append({"round": r, "busy_ms": busy_ms, "mode": mode, "msgs_per_s": round(rate)})
                print(json.dumps(out[-1]), file=sys.stderr)
    await nc.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="perfd bench inbox", description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=30_000)
    ap.add_argument("--busy-ms", default="0,20",
                    help="comma-separated ms of CPU a loop turn beside the reader")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args(argv)
    try:
        busy = [float(x) for x in ns.busy_ms.split(",") if x]
    except ValueError:
        busy = []
    if ns.messages < 1 or ns.rounds < 1 or not busy or min(busy) < 0:
        print("perfd bench inbox: --messages and --rounds >= 1, --busy-ms a list of ms >= 0", file=sys.stderr)
        return 2
    from perfd.engine.natsd import NatsCluster, NatsUnavailable

    try:
        with NatsCluster(Path(tempfile.mkdtemp(prefix="perfd-inbox-bench-")), 1) as c:
            import uvloop

            runs = uvloop.run(_run(c.urls[0], ns.messages, busy, ns.rounds))
    except NatsUnavailable as exc:
        print(f"perfd bench inbox: {exc}", file=sys.stderr)
        return 2
    summary = {f"{m}@{b:g}ms": statistics.median(x["msgs_per_s"] for x in runs
                                                  if x["mode"] == m and x["busy_ms"] == b)
               for b in busy for m in ("next_msg", "inbox")}
    res = {"messages": ns.messages, "rounds": ns.rounds, "median_msgs_per_s": summary, "runs": runs,
           "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
           "python": sys.version.split()[0]}
    if ns.json:
        print(json.dumps(res))
    else:
        for k, v in summary.items():
            print(f"{k:>20}: {v:,.0f} messages/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
