"""On 1 GPU: a wait for the batch inside the step that the GPU runs through is no data wait.

    PYTHONPATH=. python3 tests/gpu/async_fetch_live.py OUT.json

plain_loop_live.py's decoder stack (bf16 autocast, fused AdamW; ~52 ms steps on an H200) timed by the
step hook alone (its datagrams read here from the hook's socket: no agent), four loops of 160 steps:

- ``gpu_only``: no wait, no sync: the host runs ahead and the GPU never idles (the GPU's step time);
- ``fetch20``: the host waits 20 ms for its batch inside each step (``step_begin()`` -> ``data_ready()``,
  a loader the GPU's queue hides): the steps as long as ``gpu_only``'s, so the GPU never waited;
- ``fetch20_event``: the same with ``cuda_data_event=True`` (compute reported);
- ``fetch20_sync``: the same wait, the loop synchronising after each step: the GPU idles while the host
  waits, a data wait;
- ``loader20``, ``loader20_sync``: the wait in a fetch at the step's start through ``hook.loader`` (``with
  hook.step(): batch = next(it)``, no ``data_ready()``), asynchronous and synchronising.

Checks (exit 1 when one fails): ``fetch20``'s, ``fetch20_event``'s and ``loader20``'s data share under 2%
and their period within 2% of ``gpu_only``'s; ``fetch20_sync``'s and ``loader20_sync``'s data wait within
10% of 20 ms.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's tests

from perfd.hook import StepHook, wire
from tests.gpu.plain_loop_live import MODEL

B, S, N, WARM = 16, 1024, 160, 20
# (label, host wait ms, cuda_data_event, synchronise after each step, the wait in a hook.loader fetch)
LOOPS = (("gpu_only", 0.0, False, False, False), ("fetch20", 20.0, False, False, False),
         ("fetch20_event", 20.0, True, False, False), ("fetch20_sync", 20.0, False, True, False),
         ("loader20", 20.0, False, False, True), ("loader20_sync", 20.0, False, True, True))


def _drain(sock: socket.socket, into: list[wire.StepMsg]) -> None:
    while True:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return
        recs, _ = wire.split_records(data)
        into += [wire.unpack_step(d) for k, d in recs if k in wire.STEP_KINDS]


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def run_loop(ns: dict[str, Any], folder: str, label: str, fetch_ms: float, data_event: bool,
             sync: bool, in_loader: bool) -> dict[str, Any]:
    torch, gpt, train_step, vocab = ns["torch"], ns["GPT"], ns["train_step"], ns["V"]
    path = os.path.join(folder, f"{label}.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    torch.manual_seed(0)
    model = gpt().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randint(0, vocab, (B, S + 1), device="cuda")
    for _ in range(3):
        train_step(model, opt, x)
    torch.cuda.synchronize()
    hook = StepHook(path, warmup_steps=10, cuda_data_event=data_event)

    def batches() -> Any:
        while True:
            time.sleep(fetch_ms / 1e3)  # the loader's wait, on the host
            yield x

    it = iter(hook.loader(batches()))
    recs: list[wire.StepMsg] = []
    for i in range(1, N + 1):
        with hook.step(step=i):
            if in_loader:
                batch = next(it)
            else:
                time.sleep(fetch_ms / 1e3)
                hook.data_ready()
                batch = x
            train_step(model, opt, batch)
        if sync:
            torch.cuda.synchronize()
        _drain(sock, recs)
    torch.cuda.synchronize()
    hook.close(timeout_s=2.0)
    time.sleep(0.3)
    _drain(sock, recs)
    sock.close()
    steady = [m for m in recs if m.step > WARM and m.period_ns]
    period = _median([m.period_ns / 1e6 for m in steady if m.period_ns])
    data = _median([m.data_wait_ns / 1e6 for m in steady if m.data_wait_ns is not None])
    return {"period_ms": period, "in_step_ms": _median([m.step_ns / 1e6 for m in steady]),
            "data_wait_ms": data,
            "compute_ms": _median([m.compute_ns / 1e6 for m in steady if m.compute_ns is not None]),
            "outside_ms": _median([m.outside_ns / 1e6 for m in steady if m.outside_ns is not None]),
            "data_share": data / period if data is not None and period else None, "steps": len(steady)}


def checks(res: dict[str, dict[str, Any]]) -> list[str]:
    bad = []
    base = res["gpu_only"]["period_ms"]
    for label in ("fetch20", "fetch20_event", "loader20"):
        r = res[label]
        if r["data_share"] is None or r["data_share"] >= 0.02:
            bad.append(f"{label}: data share {r['data_share']} (the GPU never waited)")
        if base is None or r["period_ms"] is None or abs(r["period_ms"] / base - 1) > 0.02:
            bad.append(f"{label}: period {r['period_ms']} ms against {base} (the wait is not hidden)")
    for label in ("fetch20_sync", "loader20_sync"):
        wait = res[label]["data_wait_ms"]
        if wait is None or abs(wait / 20.0 - 1) > 0.10:
            bad.append(f"{label}: data wait {wait} ms against the 20 ms the GPU idled")
    return bad


def main() -> int:
    out = Path(sys.argv[1])
    ns: dict[str, Any] = {}
    exec(MODEL, ns)  # GPT, train_step, V (the loop's model: torch is imported there)
    res: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        for label, fetch_ms, data_event, sync, in_loader in LOOPS:
            res[label] = run_loop(ns, folder, label, fetch_ms, data_event, sync, in_loader)
            print(label, json.dumps(res[label]), flush=True)
    res["failed"] = checks(res)
    out.write_text(json.dumps(res, indent=1))
    print(json.dumps({"failed": res["failed"]}))
    return 1 if res["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
