"""Record real NVML samples to a JSON-lines file that ``source: replay:FILE`` plays back.

A recording is what lets everything downstream of the nvml collector (analytics, rules, the demo)
be developed and tested on machines without a GPU, on numbers a real GPU produced. A load
generator may write the name of the phase it is running into a marker file; each frame then says
which phase was running (see tests/gpu/nvml_phases.py).

    python -m perfd.collectors.nvml.record OUT.jsonl --duration 30 --interval 0.5 --devices 0 \
        --phase-marker /tmp/phase

The format is described in ``collectors/nvml/replay.py``; the footer line holds NVML call counts,
mean µs per call and errors, so a recording also documents what sampling cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypedDict

from perfd.collectors.config_values import as_float
from perfd.collectors.nvml.collector import NvmlCollector
from perfd.collectors.nvml.replay import FORMAT_VERSION, entries
from perfd.collectors.nvml.wrapper import Nvml
from perfd.core.events import GPU_PROCESSES

_PHASE_MAX = 64


def read_phase(marker: str | Path | None) -> str | None:
    """The phase name in the marker file, or None (no file, empty, unreadable)."""
    if marker is None:
        return None
    try:
        with open(marker, encoding="utf-8", errors="replace") as fh:
            text = fh.read(256).strip()
    except OSError:
        return None
    return text[:_PHASE_MAX] or None


class Footer(TypedDict):
    """A recording's last line: what the recording cost and met."""

    type: str  # "footer"
    frames: int
    calls: dict[str, int]  # NVML function -> calls
    cost_us: dict[str, float]  # NVML function -> mean µs per call
    nvml_errors: dict[str, int]  # "function:error" -> count
    collector_errors: dict[str, int]
    collect_ms_median: float | None
    collect_ms_max: float | None


def _sample_json(name: str, labels: dict[str, str], value: float) -> dict[str, object]:
    # Six decimals keep ratios exact enough and the file small.
    return {"name": name, "labels": labels, "value": round(value, 6)}


def record(out_path: str | Path, duration_s: float, interval_s: float = 0.5,
           devices: Sequence[int] | str = "all", phase_marker_file: str | Path | None = None, *,
           stop: threading.Event | None = None, nvml: Nvml | None = None,
           config: Mapping[str, object] | None = None) -> Footer:
    """Sample NVML every ``interval_s`` for ``duration_s`` (or until ``stop`` is set) into
    ``out_path``. Returns the footer (call costs, errors, collect durations). Raises RuntimeError
    when NVML is not usable here, with the probe's reason."""
    cfg: dict[str, object] = {"source": "real", "interval_s": interval_s,
                           "devices": list(devices) if not isinstance(devices, str) else devices}
    cfg.update(config or {})
    collector = NvmlCollector(cfg, nvml=nvml)
    caps = collector.probe()
    if not caps.available or collector.real is None:
        raise RuntimeError(f"cannot record: {caps.reason}")
    real = collector.real
    collector.start()
    header = {
        "type": "header", "version": FORMAT_VERSION, "driver": real.nvml.driver_version(),
        "nvml": real.nvml.nvml_version(), "interval_s": interval_s, "recorded_at": time.time(),
        "devices": [{"index": d.index, "uuid": d.uuid, "name": d.name, "memory_total": d.memory_total,
                     "gpm_supported": d.gpm_supported} for d in real.devices],
        "features": caps.features,
    }
    durations_ms: list[float] = []
    frames = 0
    stop = stop or threading.Event()
    t0 = time.monotonic()
    next_tick = t0
    with open(out_path, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(header) + "\n")
        try:
            while time.monotonic() - t0 < duration_s and not stop.is_set():
                now = time.time()
                t_rel = time.monotonic() - t0  # when this collect began, relative to the start
                c0 = time.perf_counter()
                got = collector.collect(now)
                durations_ms.append((time.perf_counter() - c0) * 1000.0)
                line: dict[str, object] = {"type": "collect", "t": round(t_rel, 4),
                                        "time": now}
                phase = read_phase(phase_marker_file)
                if phase is not None:
                    line["phase"] = phase
                line["samples"] = [_sample_json(s.name, s.labels, s.value) for s in got.samples]
                line["events"] = got.events
                fh.write(json.dumps(line, default=str) + "\n")
                fh.flush()
                frames += 1
                # Absolute schedule: no drift; when a collect overran, skip the missed ticks.
                next_tick += interval_s
                now_m = time.monotonic()
                if next_tick < now_m:
                    next_tick = now_m + interval_s - ((now_m - t0) % interval_s)
                stop.wait(max(0.0, next_tick - time.monotonic()))
        finally:
            footer: Footer = {
                "type": "footer", "frames": frames, "calls": dict(real.nvml.calls),
                "cost_us": {k: round(v, 2) for k, v in real.nvml.cost_us().items()},
                "nvml_errors": {f"{fn}:{err}": n for (fn, err), n in real.nvml.errors.items()},
                "collector_errors": dict(collector.errors),
                "collect_ms_median": round(statistics.median(durations_ms), 3) if durations_ms else None,
                "collect_ms_max": round(max(durations_ms), 3) if durations_ms else None,
            }
            fh.write(json.dumps(footer) + "\n")
            collector.stop()
    return footer


def trim_recording(src: str | Path, dst: str | Path, phases: Sequence[str]) -> int:
    """Copy ``src`` to ``dst`` keeping only frames whose phase is in ``phases`` (header and footer
    kept, times re-based to the first kept frame), e.g. to drop a load generator's set-up time
    before committing a recording as test data. Returns the number of frames kept.

    Process lists are events sent only on change: the latest ``gpu_processes`` event of a dropped
    frame is carried into the next kept frame, so the trimmed file still says who is on each GPU."""
    keep = set(phases)
    out: list[str] = []
    t_first: float | None = None
    kept = 0
    pending: dict[str, dict[str, object]] = {}  # gpu -> latest process event from a dropped frame
    with open(src, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise ValueError(f"{src}: not a recording's line: {line.strip()[:40]!r}")
            if rec.get("type") == "collect":
                events = entries(rec.get("events"))
                procs = {_gpu(e): e for e in events
                         if isinstance(e, dict) and e.get("kind") == GPU_PROCESSES.name}
                if rec.get("phase") not in keep:
                    pending.update(procs)
                    continue
                carried = [e for gpu, e in pending.items() if gpu not in procs]
                rec["events"] = [*carried, *events]
                pending.clear()
                if t_first is None:
                    t_first = as_float(rec["t"])
                rec["t"] = round(as_float(rec["t"]) - t_first, 4)
                kept += 1
            elif rec.get("type") == "footer":
                rec["trimmed_to_phases"] = list(phases)
                rec["frames_kept"] = kept
            out.append(json.dumps(rec, default=str))
    Path(dst).write_text("\n".join(out) + "\n", encoding="utf-8")
    return kept


def _gpu(event: dict[str, object]) -> str:
    labels = event.get("labels", {})
    if not isinstance(labels, dict):
        raise TypeError(f"an event's labels are a mapping, not {type(labels).__name__}")
    return str(labels.get("gpu"))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Record NVML samples for replay (source: replay:FILE).")
    ap.add_argument("out", help="output JSON-lines file")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds (default 30)")
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between collects (default 0.5)")
    ap.add_argument("--devices", default="all", help="'all' or comma-separated indices, e.g. 0,1")
    ap.add_argument("--phase-marker", default=None, help="file holding the current phase name")
    ap.add_argument("--slow-interval", type=float, default=10.0, help="slow-path interval (energy, ECC)")
    args = ap.parse_args(argv)
    devices: list[int] | str = "all" if args.devices == "all" else [int(x) for x in args.devices.split(",")]
    try:
        footer = record(args.out, args.duration, args.interval, devices, args.phase_marker,
                        config={"slow_interval_s": args.slow_interval})
    except RuntimeError as exc:
        print(exc)
        return 2
    print(json.dumps(footer, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
