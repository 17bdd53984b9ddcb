"""A plain Python training loop timed by the step hook (host timing, no torch needed): the job of the
host-evidence tests (tests/host). Each step does ``--step-ms`` of pure-Python CPU work, after a
``--data-ms`` sleep as its data wait; the process can be pinned to CPUs (``--cpus 0``) so that other
processes pinned there contend with it. ``--pause-at STEP --pause-s S``: after STEP, the loop pauses
S seconds, announced as a checkpoint save (``StepHook.phase``) with ``--announce``, silently without.

    PERFD_HOOK_SOCKET=... python tests/host/hook_loop.py --cpus 0 --step-ms 15 --duration 60

Prints ``step N`` every 50 steps and ``pause begins``/``pause ends`` (flushed) so a test can follow.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from perfd.hook import StepHook


def burn(ms: float) -> None:
    """``ms`` of CPU time in this thread (thread_time, not wall time: contention stretches the step)."""
    end = time.thread_time() + ms / 1e3
    x = 0
    while time.thread_time() < end:
        for i in range(200):
            x += i * i


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpus", default="", help="comma-separated CPUs to pin to (sched_setaffinity)")
    ap.add_argument("--step-ms", type=float, default=15.0)
    ap.add_argument("--data-ms", type=float, default=1.0)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--pause-at", type=int, action="append", default=[])
    ap.add_argument("--pause-s", type=float, default=0.0)
    ap.add_argument("--announce", action="append", default=[], help="'yes' or 'no' per --pause-at")
    a = ap.parse_args()
    if a.cpus:
        os.sched_setaffinity(0, {int(c) for c in a.cpus.split(",")})
    hook = StepHook(cuda=False, warmup_steps=5, layout={"world_size": 1}, flush_interval_s=0.1)
    pauses = dict(zip(a.pause_at, [x == "yes" for x in a.announce] + [False] * len(a.pause_at), strict=False))
    end = time.monotonic() + a.duration
    step = 0
    while time.monotonic() < end:
        step += 1
        hook.step_begin(step)
        time.sleep(a.data_ms / 1e3)
        hook.data_ready()
        burn(a.step_ms)
        hook.step_end()
        if step % 50 == 0:
            print(f"step {step}", flush=True)
        if step in pauses:
            announced = pauses[step]
            print(f"pause begins after step {step} ({'announced' if announced else 'silent'})", flush=True)
            if announced:
                with hook.phase("checkpoint"):
                    time.sleep(a.pause_s)
            else:
                hook.flush()
                time.sleep(a.pause_s)
            print(f"pause ends after step {step}", flush=True)
    hook.close(timeout_s=2.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
