"""Where a perfd process's CPU goes, by thread, where no outside profiler can attach: every thread's
CPU time (Linux's per-thread counters, /proc/self/task/TID/stat) and its Python stack sampled every
10 ms from inside the process.

Written by hand because py-spy, the usual tool, reads another process's memory (ptrace), which the GPU
machine's containers refuse (py-spy got one sample and one error there, 2026-11-27); cProfile sees one
thread and slows what it measures. This sampler costs the process one thread walking the others'
frames 100 times a second (it names itself, so its own CPU is shown apart).

    python -m benchmarks.frame_sampler OUT.json MODULE [ARGS...]   # run MODULE as __main__, sampled
    python -m benchmarks.frame_sampler --show OUT.json              # the summary, as text

``perfd bench engine --profile-root OUT.json`` runs the engine's root so. OUT.json is rewritten every
2 s and at exit: per thread name, its CPU seconds and its samples' innermost frames and callers.
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import runpy
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

INTERVAL_S = 0.01
WRITE_EVERY_S = 2.0
CPU_EVERY = 10  # samples between reads of each thread's CPU (0.1 s)
TOP = 40
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _thread_cpu_s(native_id: int) -> float | None:
    """The thread's user + system CPU seconds (None where /proc has no such task: gone, or not Linux)."""
    try:
        stat = Path(f"/proc/self/task/{native_id}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / _TICK


class Sampler:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.t0 = time.monotonic()
        self.samples: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.cpu_s: dict[str, float] = {}
        self._lock = threading.Lock()

    def start(self) -> None:
        threading.Thread(target=self._run, name="frame-sampler", daemon=True).start()
        atexit.register(self.write)

    def _run(self) -> None:
        me = threading.get_ident()
        last = time.monotonic()
        ticks = 0
        while True:
            time.sleep(INTERVAL_S)
            names = {t.ident: t.name for t in threading.enumerate()}
            with self._lock:
                for ident, frame in sys._current_frames().items():
                    if ident == me:
                        continue
                    stack: list[str] = []
                    f: FrameType | None = frame
                    while f is not None and len(stack) < 64:
                        c = f.f_code
                        stack.append(f"{c.co_name} ({Path(c.co_filename).name}:{f.f_lineno})")
                        f = f.f_back
                    self.samples[names.get(ident, str(ident))][";".join(reversed(stack))] += 1
            ticks += 1
            if ticks % CPU_EVERY == 0:  # each thread's CPU as it goes: a thread that ends keeps its last
                self._read_cpu()
            if time.monotonic() - last >= WRITE_EVERY_S:
                last = time.monotonic()
                self.write()

    def _read_cpu(self) -> None:
        with self._lock:
            for t in threading.enumerate():
                cpu = _thread_cpu_s(t.native_id) if t.native_id is not None else None
                if cpu is not None:
                    self.cpu_s[t.name] = cpu

    def write(self) -> None:
        self._read_cpu()
        with self._lock:
            doc = summary(self.samples, self.cpu_s, time.monotonic() - self.t0)
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, self.out)


def summary(samples: dict[str, collections.Counter[str]], cpu_s: dict[str, float],
            wall_s: float) -> dict[str, Any]:
    """Per thread: its CPU seconds and cores over the run, its samples, and the innermost frames and
    the callers (each frame once a sample) its samples were in, most first."""
    threads: list[dict[str, Any]] = []
    for name in {*samples, *cpu_s}:
        stacks = samples.get(name, collections.Counter())
        n = sum(stacks.values()) or 1
        inner: collections.Counter[str] = collections.Counter()
        callers: collections.Counter[str] = collections.Counter()
        for st, k in stacks.items():
            frames = st.split(";")
            inner[frames[-1]] += k
            for fr in set(frames):
                callers[fr] += k
        cpu = cpu_s.get(name)
        cores = round(cpu / wall_s, 3) if cpu is not None and wall_s else None
        threads.append({"thread": name, "cpu_s": cpu, "cores": cores, "samples": sum(stacks.values()),
                        "innermost": [[round(k / n, 4), fr] for fr, k in inner.most_common(TOP)],
                        "within": [[round(k / n, 4), fr] for fr, k in callers.most_common(TOP)]})
    threads.sort(key=lambda t: -(t["cpu_s"] or 0))
    return {"wall_s": round(wall_s, 1), "interval_s": INTERVAL_S, "process_cpu_s": round(sum(
        v for v in cpu_s.values()), 2), "threads": threads}


def show(doc: dict[str, Any], lines: int = 25) -> str:
    out = [f"wall {doc['wall_s']} s, threads' CPU {doc['process_cpu_s']} s (as last written)"]
    for t in doc["threads"]:
        out.append(f"\n== {t['thread']}: {t['cpu_s']} s of CPU ({t['cores']} core), {t['samples']} samples")
        out += [f"  {share:6.1%} in   {fr}" for share, fr in t["within"][:lines]]
        out += [f"  {share:6.1%} at   {fr}" for share, fr in t["innermost"][:lines // 2]]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--show"] and len(argv) == 2:
        print(show(json.loads(Path(argv[1]).read_text())))
        return 0
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out, module, *rest = argv
    threading.current_thread().name = "main"
    Sampler(Path(out)).start()
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
