"""`perfd bench stall`: how long after a SIGSTOP a real aggregator shows the stopped job as stalled,
and its rank's state read as stopped (the target: a stall seen within 10 s of the stop).

    perfd bench stall [--rounds 3] [--steady 200] [--json]

Each round: a ``perfd aggregator`` and a ``perfd agent`` (its hook socket, the ranks collector at 1 Hz,
batches every 0.5 s) on loopback, and a plain Python loop timed by the step hook (2 ms of CPU and an
8 ms data wait a step). Once the job has ``--steady`` iterations and a steady median, the loop is
stopped (SIGSTOP) and ``/api/jobs`` polled every 0.25 s: the seconds from the signal to the job's state
``stalled``, and to its rank's state read as ``stopped`` (the agent's read of /proc, which can come a
collect or two after the silence has opened the stall). The stall watch's own limit (the silence after
which it opens one) is reported beside them.

Wall-clock figures of real processes: the load beside the run moves them. The suite asserts the stall's
order and content (tests/host/test_host_live.py), and that the watch's limit is within the target.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.soak_bench import Aggregator  # noqa: E402

JOB = "stalljob"
TARGET_S = 10.0
LOOP = """\
import time
from perfd.hook import StepHook
hook = StepHook(cuda=False, warmup_steps=5, layout={"world_size": 1}, flush_interval_s=0.1)
step = 0
while True:
    step += 1
    hook.step_begin(step)
    time.sleep(0.008)
    hook.data_ready()
    end = time.thread_time() + 0.002
    while time.thread_time() < end:
        pass
    hook.step_end()
"""


def _get(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return json.loads(r.read())


def _job(port: int) -> dict[str, Any] | None:
    return next((j for j in _get(port, "/api/jobs")["jobs"] if j and j.get("job") == JOB), None)


def _wait(ok: Callable[[], Any], timeout_s: float, what: str, interval: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if got := ok():
                return got
        except OSError:
            pass
        time.sleep(interval)
    raise RuntimeError(f"not within {timeout_s:.0f} s: {what}")


def one_round(d: Path, steady: int) -> dict[str, Any]:
    d.mkdir(parents=True, exist_ok=True)
    sock = d / "hook.sock"
    cfg = d / "agent.yaml"
    cfg.write_text(f"batch_interval_s: 0.5\ncollectors:\n  hook: {{socket_path: {sock}}}\n"
                   "  ranks: {interval_s: 1.0}\n")
    agg = Aggregator(d, ["--rules-interval", "1"])
    agg.start()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "perfd.app.cli", "agent", "--aggregator", f"127.0.0.1:{agg.grpc_port}",
             "--nvml", "off", "--metrics-port", "-1", "--config", str(cfg), "--job", JOB, "--host", "off",
             "--node", "node-a"], cwd=ROOT, env=env, stdout=(d / "agent.out").open("wb"),
            stderr=subprocess.STDOUT))
        _wait(sock.exists, 60, "the agent's hook socket")
        loop = subprocess.Popen([sys.executable, "-c", LOOP], cwd=ROOT,
                                env={**env, "PERFD_HOOK_SOCKET": str(sock)},
                                stdout=(d / "loop.out").open("wb"), stderr=subprocess.STDOUT)
        procs.append(loop)

        def is_steady() -> bool:
            j = _job(agg.http_port)
            if not j or (j.get("iterations_seen") or 0) < steady:
                return False
            s = _get(agg.http_port, f"/api/jobs/{JOB}/summary").get("summary") or {}
            return bool((s.get("medians") or {}).get("step_time_ms"))

        _wait(is_steady, 180, f"{steady} iterations and a steady median", interval=0.5)
        os.kill(loop.pid, signal.SIGSTOP)
        t_stop = time.monotonic()
        try:
            job = _wait(lambda: (j := _job(agg.http_port)) and j["state"] == "stalled" and j, 60, "stalled")
            seen = time.monotonic() - t_stop
            _wait(lambda: (j := _job(agg.http_port)) and j["state"] == "stalled"
                  and j["stall"]["ranks"]["0"]["state"] == "stopped", 60, "the rank read as stopped")
            state = time.monotonic() - t_stop
        finally:
            os.kill(loop.pid, signal.SIGCONT)
        return {"stalled_after_s": round(seen, 2), "stopped_state_after_s": round(state, 2),
                "limit_s": job["stall"].get("limit_s"), "cadence_s": job["stall"].get("cadence_s")}
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        agg.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="perfd bench stall", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3,
                    help="stops, each on fresh processes (default %(default)s)")
    ap.add_argument("--steady", type=int, default=200,
                    help="iterations before the stop (default %(default)s)")
    ap.add_argument("--out", help="folder for the processes' output (default: a temp dir)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.steady < 1:
        ap.error("--rounds and --steady must be positive")
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="perfd-stall-"))
    rounds = []
    for r in range(a.rounds):
        rounds.append(one_round(out / f"round{r}", a.steady))
        if not a.json:
            print(f"round {r + 1}: " + ", ".join(f"{k} {v}" for k, v in rounds[-1].items()), flush=True)
    seen = [x["stalled_after_s"] for x in rounds]
    res = {"rounds": rounds, "target_s": TARGET_S,
           "stalled_after_s_median": round(statistics.median(seen), 2), "stalled_after_s_max": max(seen),
           "within_target": sum(s <= TARGET_S for s in seen)}
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        print(f"stalled after the stop: median {res['stalled_after_s_median']} s, "
              f"max {res['stalled_after_s_max']} s; {res['within_target']} of {len(seen)} "
              f"within {TARGET_S:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
