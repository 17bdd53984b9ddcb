"""Helpers for tests that run perfd's real processes on loopback."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
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


def wait_for(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll ``pred`` until it returns something truthy; connection errors count as "not yet"."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = pred()
            if last:
                return last
        except OSError:
            pass
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}; last={last!r}")


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
