"""The HTTP attacks of docs/reliability.md ("HTTP under attack"), against real daemons on loopback.

1. slow headers: CLIENTS connections each send ``GET / HTTP/1.1`` and then one header line every
   ``--trickle-s`` seconds (a closed one reconnects at once: a persistent attacker), while a probe
   asks ``/metrics`` of the aggregator every 0.5 s; prints how many probes answered 200.
2. idle connections: the time to open ``--idle`` connections to the aggregator that send nothing
   (bounded by ``--open-budget-s``: how many opened by then is printed otherwise).
3. the agent's ``/metrics`` with ``--idle`` idle connections: its threads and RSS before and after,
   and whether ``/metrics`` still answers.

    python benchmarks/http_attack_bench.py [--clients 64 --attack-s 75 --idle 2000]

Loopback only; every loop is bounded by the arguments. Raises the open-file limit of this process
to its hard limit (2,000 sockets).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _proc_status(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, val = line.partition(":")
        if key in ("Threads", "VmRSS"):
            out[key] = int(val.split()[0])
    return {"threads": out["Threads"], "rss_mb": out["VmRSS"] // 1024}


def _probe(url: str, timeout: float = 5.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            r.read()
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def _wait_up(url: str, budget_s: float = 60.0) -> None:
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        if _probe(url, 2.0) == 200:
            return
        time.sleep(0.2)
    raise SystemExit(f"{url} did not come up")


def slow_headers(port: int, clients: int, attack_s: float, trickle_s: float) -> dict[str, object]:
    stop = threading.Event()
    opened = [0]

    def attacker() -> None:
        socks: list[socket.socket | None] = [None] * clients
        next_line = 0.0
        n = 0
        while not stop.is_set():
            for i, s in enumerate(socks):
                if s is None:
                    try:
                        s = socket.create_connection(("127.0.0.1", port), timeout=2)
                        s.sendall(b"GET / HTTP/1.1\r\n")
                        s.setblocking(False)
                        socks[i] = s
                        opened[0] += 1
                    except OSError:
                        continue
                else:  # closed by the server (EOF or a 4xx/5xx answer): reconnect
                    try:
                        if s.recv(4096) == b"":
                            raise OSError("closed")
                        s.close()
                        socks[i] = None
                    except BlockingIOError:
                        pass
                    except OSError:
                        s.close()
                        socks[i] = None
            if time.monotonic() >= next_line:
                next_line = time.monotonic() + trickle_s
                for i, s in enumerate(socks):
                    if s is not None:
                        try:
                            s.send(f"X-Slow-{n}: {n}\r\n".encode())
                        except OSError:
                            s.close()
                            socks[i] = None
                n += 1
            stop.wait(0.1)
        for s in socks:
            if s is not None:
                s.close()

    t = threading.Thread(target=attacker, daemon=True)
    t.start()
    time.sleep(2.0)  # every attacker connected
    codes: dict[int, int] = {}
    end = time.monotonic() + attack_s
    while time.monotonic() < end:
        c = _probe(f"http://127.0.0.1:{port}/metrics")
        codes[c] = codes.get(c, 0) + 1
        time.sleep(0.5)
    stop.set()
    t.join(10)
    return {"probes": sum(codes.values()), "answered_200": codes.get(200, 0),
            "codes": {str(k): v for k, v in sorted(codes.items())}, "attacker_connections": opened[0]}


def open_idle(port: int, n: int, budget_s: float) -> tuple[list[socket.socket], dict[str, object]]:
    socks: list[socket.socket] = []
    failed = 0
    t0 = time.monotonic()
    while len(socks) + failed < n and time.monotonic() - t0 < budget_s:
        try:
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        except OSError:
            failed += 1
    return socks, {"asked": n, "opened": len(socks), "failed": failed,
                   "seconds": round(time.monotonic() - t0, 2)}


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "perfd.app.cli", *args], cwd=ROOT, env=env,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)


def _stop(p: subprocess.Popen[bytes]) -> None:
    p.terminate()
    try:
        p.wait(20)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--attack-s", type=float, default=75.0)
    ap.add_argument("--trickle-s", type=float, default=10.0)
    ap.add_argument("--idle", type=int, default=2000)
    ap.add_argument("--open-budget-s", type=float, default=120.0)
    ap.add_argument("--only", choices=("slow", "idle", "agent"), action="append")
    a = ap.parse_args(argv)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    out: dict[str, object] = {}
    only = set(a.only or ("slow", "idle", "agent"))
    with tempfile.TemporaryDirectory() as tmp:
        if only & {"slow", "idle"}:
            g, h = _free_port(), _free_port()
            agg = _start(["aggregator", "--grpc-port", str(g), "--http-port", str(h), "--no-rules"], env,
                         Path(tmp) / "agg.log")
            try:
                _wait_up(f"http://127.0.0.1:{h}/healthz")
                if "slow" in only:
                    out["slow_headers"] = slow_headers(h, a.clients, a.attack_s, a.trickle_s)
                    print(json.dumps({"slow_headers": out["slow_headers"]}), flush=True)
                if "idle" in only:
                    socks, res = open_idle(h, a.idle, a.open_budget_s)
                    res["metrics_while_held"] = _probe(f"http://127.0.0.1:{h}/metrics", 10.0)
                    res["aggregator"] = _proc_status(agg.pid)
                    for s in socks:
                        s.close()
                    out["aggregator_idle"] = res
                    print(json.dumps({"aggregator_idle": res}), flush=True)
            finally:
                _stop(agg)
        if "agent" in only:
            m = _free_port()
            agent = _start(["agent", "--metrics-port", str(m), "--nvml", "off", "--host", "off"], env,
                           Path(tmp) / "agent.log")
            try:
                _wait_up(f"http://127.0.0.1:{m}/metrics")
                before = _proc_status(agent.pid)
                socks, res = open_idle(m, a.idle, a.open_budget_s)
                time.sleep(2.0)
                res["before"], res["with_idle"] = before, _proc_status(agent.pid)
                res["metrics_while_held"] = _probe(f"http://127.0.0.1:{m}/metrics", 10.0)
                for s in socks:
                    s.close()
                out["agent_idle"] = res
                print(json.dumps({"agent_idle": res}), flush=True)
            finally:
                _stop(agent)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
