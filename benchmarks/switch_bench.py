"""What the interpreter's switch interval does to an event loop beside a CPU-bound thread: the shape
of an aggregator (its loop reading the network, its analyses in threads; perfd/aggregator/runtime.py).

An asyncio loop reads 1,000-byte messages from a socket that another process writes to as fast as
every 0.1 ms; with ``--cpu-thread`` a thread of the same process runs pure-Python work meanwhile (dict
stores, as an analysis does). For each switch interval: the messages the loop read a second, and
the CPU thread's rounds a second. Each point runs in a fresh process, the intervals alternating.

    perfd bench switch [--intervals-ms 5,1,0.5] [--seconds 4] [--rounds 2] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

MESSAGE = b"x" * 1000
ROUND = 100_000  # dict stores a round of the CPU thread


def point(interval_s: float, seconds: float, cpu_thread: bool) -> dict[str, float]:
    """One measurement in this process: the loop's messages a second and the CPU thread's rounds."""
    sys.setswitchinterval(interval_s)
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the writer: another process, as the network is
        ours.close()
        try:
            while True:
                theirs.send(MESSAGE)
                time.sleep(0.0001)
        except OSError:
            os._exit(0)
    theirs.close()
    stop = threading.Event()
    rounds = [0]

    def cpu() -> None:
        d: dict[int, list[int]] = {}
        while not stop.is_set():
            for i in range(ROUND):
                d[i % 1000] = [i, i * 2]
            rounds[0] += 1

    async def read() -> float:
        loop = asyncio.get_running_loop()
        ours.setblocking(False)
        got, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < seconds:
            got += len(await loop.sock_recv(ours, len(MESSAGE)))
        return got / len(MESSAGE) / (time.monotonic() - t0)

    if cpu_thread:
        threading.Thread(target=cpu, daemon=True).start()
    try:
        per_s = asyncio.run(read())
    finally:
        stop.set()
        ours.close()
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    return {"loop_msgs_per_s": round(per_s, 1), "cpu_rounds_per_s": round(rounds[0] / seconds, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="perfd bench switch", description=__doc__.splitlines()[0])
    ap.add_argument("--intervals-ms", default="5,1,0.5", help="switch intervals, ms (default %(default)s)")
    ap.add_argument("--seconds", type=float, default=4.0, help="seconds a point (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=2, help="points of each interval (default %(default)s)")
    ap.add_argument("--point", type=float, metavar="MS", help=argparse.SUPPRESS)  # one point, this process
    ap.add_argument("--cpu-thread", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    if a.point is not None:
        print(json.dumps(point(a.point / 1e3, a.seconds, a.cpu_thread)))
        return 0
    try:
        intervals = [float(x) for x in a.intervals_ms.split(",") if x.strip()]
    except ValueError:
        ap.error("--intervals-ms wants numbers, e.g. 5,1,0.5")
    if not intervals or min(intervals) <= 0 or a.seconds <= 0 or a.rounds < 1:
        ap.error("intervals > 0 ms, --seconds > 0, --rounds >= 1")
    runs: list[dict[str, Any]] = []
    for r in range(a.rounds):
        for cpu_thread in (False, True):
            for ms in intervals:
                cmd = [sys.executable, "-m", "benchmarks.switch_bench", "--point", str(ms),
                       "--seconds", str(a.seconds), *(["--cpu-thread"] if cpu_thread else [])]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True,
                                     cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
                runs.append({"round": r, "interval_ms": ms, "cpu_thread": cpu_thread,
                             **json.loads(out.stdout.strip().splitlines()[-1])})
                print(json.dumps(runs[-1]), file=sys.stderr)

    def med(ms: float, cpu_thread: bool, what: str) -> float:
        return round(float(statistics.median(x[what] for x in runs
                                             if x["interval_ms"] == ms and x["cpu_thread"] == cpu_thread)), 1)

    res = {"seconds": a.seconds, "rounds": a.rounds,
           "median": [{"interval_ms": ms, "loop_msgs_per_s_alone": med(ms, False, "loop_msgs_per_s"),
                       "loop_msgs_per_s_beside_cpu": med(ms, True, "loop_msgs_per_s"),
                       "cpu_rounds_per_s": med(ms, True, "cpu_rounds_per_s")} for ms in intervals],
           "runs": runs, "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
           "cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()],
           "python": platform.python_version()}
    print(json.dumps(res) if a.json else json.dumps(res["median"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
