"""Helpers for tests that run perfd's real processes on loopback: the CPU tests under tests/ and the
live scripts in tests/gpu/ alike, so that the plumbing (start a process with its output in a file,
start an aggregator and read its ready file, wait for a launch manifest, start an agent, poll the
HTTP API, stop everything in a safe order) is written once. ``Procs`` is the part the GPU scripts
share; tests/test_procs.py runs it on CPU, so a GPU run does not find its bugs first."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from perfd.analytics import thresholds as th

ROOT = Path(__file__).resolve().parents[1]
PERFD = [sys.executable, "-m", "perfd.app.cli"]
# What a poll of a process still starting may raise: no answer yet, a half-written file, a key that
# is not there yet. ``wait_for(..., ignore=NOT_YET)`` counts them as "not yet".
NOT_YET: tuple[type[Exception], ...] = (OSError, ValueError, KeyError)


class WaitTimeout(AssertionError, TimeoutError):
    """``wait_for`` ran out of time: an AssertionError for pytest, a TimeoutError for the scripts."""


# The ports handed to the processes a test starts: below the kernel's ephemeral range, which bind(0)
# and every outgoing connection draw from, a slice per xdist worker, walked from an offset of this
# process's own (a script a test runs picks from its worker's slice too). A port from bind(0) was free
# when asked, but another test's process (an outgoing connection, a bind(0) of its own) could take it
# before the child bound it, which full runs hit: an agent that could not bind its /metrics port
# exited at start, and the test waited out its limit.
PORTS_FROM = 20_000
PORTS_PER_WORKER = 1_000
_ports = iter(range(10**9))


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def free_port() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    lo = PORTS_FROM + (int(worker) if worker.isdigit() else 0) * PORTS_PER_WORKER
    if lo + PORTS_PER_WORKER <= _ephemeral_low():
        start = os.getpid() * 7919
        for _ in range(PORTS_PER_WORKER):
            port = lo + (start + next(_ports)) % PORTS_PER_WORKER
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:  # bound by another process (or not yet free): the next
                    continue
                return port
    with socket.socket() as s:  # a range too low to leave room, or every port of the slice taken
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop(p: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL if it is still there after ``timeout`` seconds."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return bytes(r.read())


def get_json(url: str, timeout: float = 10.0) -> Any:
    return json.loads(http_get(url, timeout))


def tail(path: Path, n: int = 1500) -> str:
    """The last ``n`` characters of a log ('' when there is none)."""
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


PROGRESS_CAP = 4  # wait_for with progress: at most this many times its timeout in all

# The 1-minute load average per CPU over which processes a test pins to a CPU to contend with its job
# are no longer what contends with it: one suite on this 2-CPU machine runs at ~3 per CPU, two suites at
# once at 6-7, where every other test's processes share the job's CPU as much as each burner does.
BUSY_LOAD_PER_CPU = 4.5
# Rank 0's CPU wait before a test's six burners share its CPU, past which they cannot raise it by
# thresholds.STEADY_MARGIN (six burners on its CPU leave it ~6/7 of the time waiting at most): then the
# other tests' processes already contend with it as much, and the burners are not what is named.
STEADY_WAIT_TOO_HIGH = 0.85 - th.STEADY_MARGIN.value


def load_per_cpu() -> float:
    """The 1-minute load average per CPU this process may use."""
    return os.getloadavg()[0] / len(os.sched_getaffinity(0))


def wait_for(
    pred: Callable[[], Any],
    timeout: float,
    what: str,
    interval: float = 0.2,
    ignore: tuple[type[Exception], ...] = (OSError,),
    progress: Callable[[], Any] | None = None,
) -> Any:
    """Poll ``pred`` until it returns something truthy; the errors in ``ignore`` (by default
    connection errors) count as "not yet". Raises WaitTimeout.

    ``progress``: a reading of what the awaited thing moves through (a job's iteration count). While
    it changes the wait goes on, and ``timeout`` is the longest time without a change: on a loaded
    machine a job steps slower but steps, and a wait on it must not run out for that. It
    ends anyway ``PROGRESS_CAP`` × ``timeout`` after it began (a job that steps but never shows the
    awaited thing fails with the reason, not at the test runner's timeout)."""
    deadline = time.monotonic() + timeout
    cap = time.monotonic() + PROGRESS_CAP * timeout
    last: Any = None
    seen: Any = None
    while time.monotonic() < deadline:
        try:
            last = pred()
            if last:
                return last
            if progress is not None and (now := progress()) != seen:
                seen, deadline = now, min(cap, time.monotonic() + timeout)
        except ignore:
            pass
        time.sleep(interval)
    moved = f"; progress stood at {seen!r}" if progress is not None else ""
    raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}; last={last!r}{moved}")


def run_env(*paths: Path | str, drop: Sequence[str] = (), **extra: str) -> dict[str, str]:
    """This process's environment for a perfd process or a job: unbuffered Python, the repository
    (then ``paths``) ahead of PYTHONPATH, ``drop`` removed, ``extra`` set."""
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = ":".join([str(ROOT), *map(str, paths), os.environ.get("PYTHONPATH", "")])
    env.update(extra)
    return env


class Procs:
    """The processes one run starts, each in its own session (so a signal reaches its children: a
    torchrun and its ranks) with stdout and stderr in ``out/<name>.out``. ``stop()`` ends them all
    whatever happened, in a safe order: the agents first, waited for (they send what they still hold
    to the aggregator on SIGTERM), then the rest (the launch, the job, helpers) newest first, the
    aggregator last, so that no agent's stream is cut under it. A process still there ``grace_s``
    after SIGTERM gets SIGKILL (its whole group). Use as a context manager or call stop()."""

    def __init__(
        self,
        out: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path = ROOT,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.out, self.cwd, self.say = out, cwd, say
        self.env: dict[str, str] = dict(os.environ if env is None else env)
        self.procs: list[tuple[str, str, subprocess.Popen[bytes]]] = []  # (name, role, process)
        self.exited: dict[str, float] = {}  # name -> when stop() saw it gone (time.monotonic())
        self._logs: list[IO[bytes]] = []

    def __enter__(self) -> Procs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        role: str = "job",
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` with output in ``out/<name>.out``; ``env`` is added to the run's own.
        ``role``: "agent" and "aggregator" set the order stop() ends them in."""
        if self.say is not None:
            self.say(f"start {name}: {' '.join(argv)[:400]}")
        log = (self.out / f"{name}.out").open("wb")
        self._logs.append(log)
        p = subprocess.Popen(
            list(argv),
            cwd=cwd or self.cwd,
            env={**self.env, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append((name, role, p))
        return p

    def perfd(
        self,
        name: str,
        *args: str,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        role: str = "job",
    ) -> subprocess.Popen[bytes]:
        """``python -m perfd.app.cli ARGS`` as ``name``."""
        return self.start(name, [*PERFD, *args], cwd=cwd, env=env, role=role)

    def end(self, name: str, grace_s: float = 15.0) -> None:
        """Stop the process started as ``name`` (the newest of that name), now."""
        for n, _, p in reversed(self.procs):
            if n == name:
                self._end([(n, p)], grace_s)
                return

    def stop(self, grace_s: float = 15.0) -> None:
        """Stop every process still running: agents, then the rest newest first, aggregators last."""
        newest = list(reversed(self.procs))
        for tier in ("agent", "job", "aggregator"):
            self._end(
                [
                    (n, p)
                    for n, role, p in newest
                    if role == tier or (tier == "job" and role not in ("agent", "aggregator"))
                ],
                grace_s,
            )
        for log in self._logs:
            log.close()

    def _end(self, group: list[tuple[str, subprocess.Popen[bytes]]], grace_s: float) -> None:
        for _, p in group:
            if p.poll() is None:
                _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for name, p in group:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                if self.say is not None:
                    self.say(f"{name} still running {grace_s:.0f} s after SIGTERM: SIGKILL")
                _signal_group(p, signal.SIGKILL)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    continue
            self.exited.setdefault(name, time.monotonic())

    def tails(
        self, names: Sequence[str] = ("aggregator", "agent", "launch"), n: int = 1500
    ) -> dict[str, str]:
        """The end of each named log that exists."""
        return {
            name: tail(self.out / f"{name}.out", n) for name in names if (self.out / f"{name}.out").exists()
        }


def run_group(argv: Sequence[str], timeout: float, **kw: Any) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True, timeout=...)`` for a command that starts
    processes of its own (a bench's aggregator, shards, servers): it runs in a process group of its
    own, and whatever of that group is left when it ends — or when the timeout kills it, where
    subprocess.run would kill the command alone and leave its children running — is killed."""
    p = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, **kw)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _signal_group(p, signal.SIGKILL)
        p.communicate()
        raise
    finally:
        _signal_group(p, signal.SIGKILL)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def _signal_group(p: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def start_aggregator(
    procs: Procs,
    *args: str | Path,
    ready: Path | None = None,
    http_port: int = 0,
    timeout: float = 30.0,
    name: str = "aggregator",
    verbose: bool = False,
) -> tuple[int, int, str]:
    """``perfd aggregator`` on loopback, gRPC on a free port, ``args`` added (rules and such); waits
    for its ready file (``out/agg.ready`` unless given). Returns (gRPC port, HTTP port, base URL).
    ``verbose``: ``perfd -v`` (its INFO lines in the log, e.g. what a restart restored)."""
    ready = ready or procs.out / "agg.ready"
    ready.unlink(missing_ok=True)  # a folder used again: an earlier run's file names the old ports
    p = procs.perfd(
        name,
        *(["-v"] if verbose else []),
        "aggregator",
        "--grpc-host",
        "127.0.0.1",
        "--grpc-port",
        "0",
        "--http-host",
        "127.0.0.1",
        "--http-port",
        str(http_port),
        *map(str, args),
        "--ready-file",
        str(ready),
        role="aggregator",
    )

    def up() -> list[int] | None:
        if p.poll() is not None:
            raise RuntimeError(f"{name} exited ({p.returncode}): {tail(procs.out / f'{name}.out', 1000)}")
        words = ready.read_text().split() if ready.exists() else []
        return [int(w) for w in words] if len(words) >= 2 else None

    grpc_port, http = wait_for(up, timeout, f"{name} ready", interval=0.1, ignore=NOT_YET)[:2]
    return grpc_port, http, f"http://127.0.0.1:{http}"


def wait_manifest(
    manifest: Path, launch: subprocess.Popen[bytes] | None = None, timeout: float = 30.0
) -> Path:
    """Wait for ``perfd launch``'s manifest; fails at once if the launch has exited without one."""

    def there() -> bool:
        if manifest.exists():
            return True
        if launch is not None and launch.poll() is not None:
            raise RuntimeError(f"perfd launch exited ({launch.returncode}) before writing {manifest}")
        return False

    wait_for(there, timeout, "the launch manifest", interval=0.1)
    return manifest


def start_agent(
    procs: Procs,
    grpc_port: int,
    *args: str | Path,
    manifest: Path | None = None,
    nvml: str = "real",
    metrics_port: int = -1,
    config: Path | None = None,
    name: str = "agent",
) -> subprocess.Popen[bytes]:
    """``perfd agent`` streaming to the aggregator on loopback (``--launch-manifest`` when given,
    ``args`` added: --host off, --job, --node ...); stopped before everything else."""
    argv = ["agent"] + (["--launch-manifest", str(manifest)] if manifest is not None else [])
    argv += ["--aggregator", f"127.0.0.1:{grpc_port}", "--nvml", nvml, "--metrics-port", str(metrics_port)]
    argv += ["--config", str(config)] if config is not None else []
    return procs.perfd(name, *argv, *map(str, args), role="agent")


def placed_recording(src: Path, dst: Path, job: str, pci_bus_id: str) -> Path:
    """A copy of an NVML recording (collectors/nvml/data) as a node agent would record it on a node
    running ``job``: every process on the GPU declares the job (PERFD_JOB), the first one is rank 0,
    and the GPU has NVML's PCI bus id. Replayed, it feeds the real agent's placement path."""
    out = []
    for line in src.read_text().splitlines():
        rec = json.loads(line)
        for s in rec.get("samples", []):
            s["labels"]["pci_bus_id"] = pci_bus_id
        for ev in rec.get("events", []):
            ev.setdefault("labels", {})["pci_bus_id"] = pci_bus_id
            if ev.get("kind") == "gpu_processes":
                for i, p in enumerate(ev.get("payload") or []):
                    p.update(job=job, rank=0 if i == 0 else None)
        out.append(json.dumps(rec))
    dst.write_text("\n".join(out) + "\n")
    return dst
