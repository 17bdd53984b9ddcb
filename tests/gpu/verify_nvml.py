"""Verify the nvml collector on a real GPU against nvidia-smi and docs/design.md §2's GPM table.

Runs tests/gpu/nvml_phases.py (known loads, one phase after another) in a subprocess, records NVML
with perfd.collectors.nvml.record at 0.5 s meanwhile, and polls nvidia-smi in parallel. Then writes, under
the output directory:

  summary.json, summary.md   per phase: perfd medians vs nvidia-smi at the nearest time (memory 1 %,
                             power 10 %, util ±10 points, SM clock ±30 MHz, temperature ±2 C), GPM
                             medians (docs/design.md §2 table) and their checks, whether the second
                             process was named, NVML µs per call, collect() cost
  recording_raw.jsonl        the whole recording (set-up included)
  <gpu>_phases.jsonl         the recording trimmed to the load phases: commit it as
                             collectors/nvml/tests/data/<gpu>_phases.jsonl (replay test data, demo)
  smi.jsonl, timeline.json, phases.log

Needs only python3 with torch (for the load), nvidia-ml-py and psutil; imports perfd from the repo.

    python3 tests/gpu/verify_nvml.py "$OUT"            # from the repository root
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from perfd.collectors.nvml.collector import NvmlCollector  # noqa: E402
from perfd.collectors.nvml.expectations import evaluate  # noqa: E402
from perfd.collectors.nvml.gpm import GpmSampler  # noqa: E402
from perfd.collectors.nvml.record import read_phase, record, trim_recording  # noqa: E402
from perfd.collectors.nvml.replay import ReplaySource  # noqa: E402
from perfd.collectors.nvml.wrapper import Nvml  # noqa: E402

LOAD_PHASES = ("idle", "matmul", "copy", "launch", "h2d", "second_process")
SETTLE_S = 1.0  # ignore the first second of each phase: NVML and GPM average over windows
MIB = 2**20

# (name, perfd metric, nvidia-smi field, perfd value -> smi unit, tolerance(smi value) -> allowed diff)
AGREEMENT: tuple[tuple[str, str, str, Any, Any], ...] = (
    ("memory_used_mib", "perfd_gpu_memory_used_bytes", "memory.used", lambda v: v / MIB,
     lambda s: max(0.01 * s, 2.0)),  # 1 %, and nvidia-smi rounds to whole MiB
    ("power_w", "perfd_gpu_power_watts", "power.draw", lambda v: v, lambda s: max(0.10 * s, 2.0)),
    ("util_pct", "perfd_gpu_utilization_ratio", "utilization.gpu", lambda v: v * 100, lambda s: 10.0),
    ("sm_clock_mhz", "perfd_gpu_sm_clock_hertz", "clocks.sm", lambda v: v / 1e6, lambda s: 30.0),
    ("temperature_c", "perfd_gpu_temperature_celsius", "temperature.gpu", lambda v: v, lambda s: 2.0),
)
SMI_GPU_FIELDS = ("utilization.gpu", "memory.used", "power.draw", "temperature.gpu", "clocks.sm")
GPM_COLUMNS = (
    ("NVML util %", "perfd_gpu_utilization_ratio", 100.0), ("SM_UTIL %", "perfd_gpu_sm_util_ratio", 100.0),
    ("SM_OCCUPANCY %", "perfd_gpu_sm_occupancy_ratio", 100.0),
    ("ANY_TENSOR_UTIL %", "perfd_gpu_tensor_util_ratio", 100.0),
    ("DRAM_BW_UTIL %", "perfd_gpu_dram_bw_util_ratio", 100.0),
    ("FP16 %", "perfd_gpu_fp16_util_ratio", 100.0), ("FP32 %", "perfd_gpu_fp32_util_ratio", 100.0),
    ("FP64 %", "perfd_gpu_fp64_util_ratio", 100.0),
    ("PCIe rx MB/s", "perfd_gpu_pcie_rx_bytes_per_second", 1e-6),
    ("PCIe tx MB/s", "perfd_gpu_pcie_tx_bytes_per_second", 1e-6),
    ("NVLink rx MB/s", "perfd_gpu_nvlink_rx_bytes_per_second", 1e-6),
    ("NVLink tx MB/s", "perfd_gpu_nvlink_tx_bytes_per_second", 1e-6),
)


# --- nvidia-smi ------------------------------------------------------------------------------
def parse_number(text: str) -> float | None:
    """nvidia-smi cell -> number; None for [N/A], [Not Supported], empty."""
    try:
        return float(text.strip())
    except ValueError:
        return None


def parse_smi_gpu(line: str) -> dict[str, float | None]:
    cells = [c.strip() for c in line.split(",")]
    return {f: parse_number(c) for f, c in zip(SMI_GPU_FIELDS, cells, strict=False)}


def parse_smi_apps(text: str) -> list[dict[str, Any]]:
    apps = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 3 or not cells[0].isdigit():
            continue
        apps.append({"pid": int(cells[0]), "name": cells[1], "used_memory_mib": parse_number(cells[2])})
    return apps


def poll_smi(device: int, marker: Path, stop: threading.Event, rows: list[dict[str, Any]],
             interval_s: float = 0.5) -> None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return
    while not stop.is_set():
        t0 = time.time()
        try:
            g = subprocess.run([smi, "-i", str(device), f"--query-gpu={','.join(SMI_GPU_FIELDS)}",
                                "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
            t1 = time.time()
            a = subprocess.run([smi, "-i", str(device), "--query-compute-apps=pid,process_name,used_memory",
                                "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired) as exc:
            rows.append({"time": t0, "error": repr(exc)})
            stop.wait(interval_s)
            continue
        lines = g.stdout.strip().splitlines()
        rows.append({"time": (t0 + t1) / 2, "phase": read_phase(marker),
                     "gpu": parse_smi_gpu(lines[0]) if lines else {}, "apps": parse_smi_apps(a.stdout),
                     "rc": [g.returncode, a.returncode]})
        stop.wait(max(0.0, interval_s - (time.time() - t0)))


# --- analysis (pure: unit-tested without a GPU) -------------------------------------------------
def phase_windows(timeline: dict[str, Any]) -> dict[str, tuple[float, float]]:
    return {p["name"]: (float(p["start"]), float(p["end"])) for p in timeline.get("phases", [])}


def settled_phase(t: float, windows: dict[str, tuple[float, float]]) -> str | None:
    """The phase running at epoch ``t``, if ``t`` is past its settling time; else None."""
    for name, (start, end) in windows.items():
        if start + SETTLE_S <= t <= end:
            return name
    return None


def compare_with_smi(src: ReplaySource, smi_rows: list[dict[str, Any]],
                     windows: dict[str, tuple[float, float]], gpu: str) -> dict[str, dict[str, Any]]:
    """Per phase and quantity: pairs (nvidia-smi reading, nearest perfd frame), how many agree."""
    frames = [f for f in src.frames if f.time is not None]
    out: dict[str, dict[str, Any]] = {}
    for row in smi_rows:
        phase = settled_phase(float(row.get("time", 0)), windows)
        if phase is None or not row.get("gpu") or not frames:
            continue
        frame = min(frames, key=lambda f: abs(float(f.time or 0) - row["time"]))
        for qty, metric, field, to_smi, tol in AGREEMENT:
            s = row["gpu"].get(field)
            v = frame.value(metric, gpu=gpu)
            if s is None or v is None:
                continue
            p = to_smi(v)
            cell = out.setdefault(phase, {}).setdefault(qty, {"pairs": 0, "agree": 0, "perfd": [], "smi": [],
                                                              "max_dt_s": 0.0})
            cell["pairs"] += 1
            cell["agree"] += int(abs(p - s) <= tol(s))
            cell["perfd"].append(p)
            cell["smi"].append(s)
            cell["max_dt_s"] = max(cell["max_dt_s"], abs(float(frame.time or 0) - row["time"]))
    for per in out.values():
        for cell in per.values():
            cell["perfd_median"] = round(statistics.median(cell.pop("perfd")), 3)
            cell["smi_median"] = round(statistics.median(cell.pop("smi")), 3)
            cell["agree_ratio"] = round(cell["agree"] / cell["pairs"], 3)
            cell["max_dt_s"] = round(cell["max_dt_s"], 3)
            cell["ok"] = cell["agree_ratio"] >= 0.8
    return out


def process_check(src: ReplaySource, timeline: dict[str, Any], smi_rows: list[dict[str, Any]],
                  gpu: str) -> dict[str, Any]:
    """Did perfd list the load generator, and name the second ("foreign") process?"""
    seen: dict[int, dict[str, Any]] = {}
    for f in src.frames:
        events: list[dict[str, Any]] = list(f.events)  # the recorded JSON, read as the script expects it
        for ev in events:
            if ev.get("kind") == "gpu_processes" and ev.get("labels", {}).get("gpu") == gpu:
                for p in ev.get("payload") or []:
                    entry = seen.setdefault(int(p["pid"]), {"name": None, "cmdline": None, "phases": []})
                    entry["name"] = entry["name"] or p.get("name")
                    entry["cmdline"] = entry["cmdline"] or p.get("cmdline")
                    if f.phase not in entry["phases"]:
                        entry["phases"].append(f.phase)
    smi_pids = sorted({a["pid"] for r in smi_rows for a in r.get("apps", [])})
    parent, child = timeline.get("pid"), timeline.get("child_pid")
    child_entry = seen.get(int(child)) if child is not None else None
    result = {
        "load_pid": parent, "second_pid": child, "nvml_pids": sorted(seen), "smi_pids": smi_pids,
        "load_listed": parent in seen,
        "second_listed": child_entry is not None,
        "second_named": bool(child_entry and child_entry["name"]),
        "second_cmdline_has_child_flag": bool(child_entry and "--child" in (child_entry["cmdline"] or "")),
        "processes": {str(k): v for k, v in seen.items()},
    }
    if seen and parent not in seen and child not in seen:
        result["note"] = ("NVML pids match neither process: the agent is probably in another pid "
                          "namespace than the load (run it with the host's pid namespace)")
    return result


def gpm_table(medians: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    rows = []
    for phase in LOAD_PHASES:
        if phase not in medians:
            continue
        row: dict[str, Any] = {"phase": phase}
        for col, metric, scale in GPM_COLUMNS:
            v = medians[phase].get(metric)
            row[col] = None if v is None else round(v * scale, 2)
        rows.append(row)
    return rows


def pcie_check(medians: dict[str, dict[str, float]], timeline: dict[str, Any]) -> dict[str, Any]:
    """GPM PCIe RX during h2d vs the rate the load generator achieved (checks MiB/s -> bytes/s)."""
    achieved = next((p["stats"].get("h2d_bytes_per_s") for p in timeline.get("phases", [])
                     if p["name"] == "h2d"), None)
    gpm = medians.get("h2d", {}).get("perfd_gpu_pcie_rx_bytes_per_second")
    ratio = gpm / achieved if gpm and achieved else None
    return {"achieved_h2d_bytes_per_s": achieved, "gpm_pcie_rx_bytes_per_s": gpm,
            "ratio": round(ratio, 3) if ratio else None}


# --- NVML call cost ---------------------------------------------------------------------------
def _time_us(fn: Any, n: int, pause_s: float = 0.0) -> list[float]:
    times = []
    for _ in range(n):
        if pause_s:
            time.sleep(pause_s)
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) / 1000.0)
    return times


def cost_benchmark(device: int) -> dict[str, Any]:
    """µs per call of each NVML function perfd uses (and of the slow ones it avoids), through the
    wrapper, on an otherwise idle GPU; plus the cost of one whole collect() of one GPU."""
    nv = Nvml()
    if nv.init() is not None:
        return {"error": nv.reason}
    h = nv.call("nvmlDeviceGetHandleByIndex", device)
    c = nv.const
    es = nv.call("nvmlEventSetCreate")
    if es is not None:
        nv.call("nvmlDeviceRegisterEvents", h, c("nvmlEventTypeXidCriticalError", 8), es)
    fields = [c("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", 138),
              c("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", 139)]
    cases: list[tuple[str, str, tuple[Any, ...], dict[str, Any], int]] = [
        ("utilization", "nvmlDeviceGetUtilizationRates", (h,), {}, 200),
        ("memory_v2", "nvmlDeviceGetMemoryInfo", (h,), {"version": c("nvmlMemory_v2", None)}, 200),
        ("power", "nvmlDeviceGetPowerUsage", (h,), {}, 200),
        ("temperature_v", "nvmlDeviceGetTemperatureV", (h, 0), {}, 200),
        ("temperature", "nvmlDeviceGetTemperature", (h, 0), {}, 200),
        ("sm_clock", "nvmlDeviceGetClockInfo", (h, c("NVML_CLOCK_SM", 1)), {}, 200),
        ("throttle_reasons", "nvmlDeviceGetCurrentClocksEventReasons", (h,), {}, 200),
        ("running_processes_v3", "nvmlDeviceGetComputeRunningProcesses_v3", (h,), {}, 200),
        ("ecc_volatile", "nvmlDeviceGetTotalEccErrors", (h, 1, 0), {}, 100),
        ("power_limit", "nvmlDeviceGetEnforcedPowerLimit", (h,), {}, 100),
        ("xid_poll", "nvmlEventSetWait_v2", (es, 0), {}, 200),
        ("nvlink_field_values", "nvmlDeviceGetFieldValues", (h, fields), {}, 20),
        ("total_energy", "nvmlDeviceGetTotalEnergyConsumption", (h,), {}, 10),
        ("pcie_throughput", "nvmlDeviceGetPcieThroughput", (h, c("NVML_PCIE_UTIL_TX_BYTES", 0)), {}, 5),
    ]
    out: dict[str, Any] = {}
    for label, fn, args, kwargs, n in cases:
        if es is None and label == "xid_poll":
            continue
        errors: list[str] = []

        def one(fn: str = fn, args: tuple[Any, ...] = args, kwargs: dict[str, Any] = kwargs,
                errors: list[str] = errors) -> None:
            nv.call_quiet(fn, ("Timeout",), *args, **kwargs)  # Timeout: "no XID pending"
            if nv.last_error not in (None, "Timeout"):
                errors.append(str(nv.last_error))

        times = _time_us(one, n)
        out[label] = {"function": fn, "calls": n, "median_us": round(statistics.median(times), 2),
                      "p90_us": round(sorted(times)[int(0.9 * (n - 1))], 2),
                      "error": errors[-1] if errors else None}
    support = nv.call("nvmlGpmQueryDeviceSupport", h)
    sampler = GpmSampler(nv, h)
    gpm_ok = support is not None and bool(getattr(support, "isSupportedDevice", False))
    if gpm_ok and sampler.start():
        times = _time_us(sampler.step, 50, pause_s=0.01)
        out["gpm_step"] = {"function": "nvmlGpmSampleGet + nvmlGpmMetricsGet", "calls": 50,
                           "median_us": round(statistics.median(times), 2),
                           "p90_us": round(sorted(times)[44], 2), "error": None}
        sampler.close()
    if es is not None:
        nv.call("nvmlEventSetFree", es)
    col = NvmlCollector({"devices": [device], "slow_interval_s": 1e9})
    if col.probe().available:
        col.start()
        col.collect(time.time())  # the first collect also takes the slow path: not measured
        times = _time_us(lambda: col.collect(time.time()), 50, pause_s=0.02)
        col.stop()
        out["collect_one_gpu_fast_path_ms"] = round(statistics.median(times) / 1000.0, 3)
    nv.shutdown()
    return out


# --- report -----------------------------------------------------------------------------------
def _md_table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    def cell(v: Any) -> str:
        return "—" if v is None else str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def render_markdown(summary: dict[str, Any]) -> str:
    parts = [f"# NVML collector verification — {summary.get('gpu_name')} "
             f"(driver {summary.get('driver')})", ""]
    parts.append(f"Overall: **{'PASS' if summary.get('ok') else 'CHECK'}** — {summary.get('verdict', '')}")
    parts += ["", "## perfd vs nvidia-smi (medians over settled samples; agree = share within tolerance)", ""]
    rows = []
    for phase, per in summary.get("agreement", {}).items():
        for qty, cell in per.items():
            rows.append({"phase": phase, "quantity": qty, "perfd": cell["perfd_median"],
                         "nvidia-smi": cell["smi_median"], "pairs": cell["pairs"],
                         "agree": cell["agree_ratio"], "ok": cell["ok"]})
    parts.append(_md_table(rows, ["phase", "quantity", "perfd", "nvidia-smi", "pairs", "agree", "ok"]))
    parts += ["", "## GPM medians per phase (the table in collectors/nvml/README.md)", ""]
    parts.append(_md_table(summary.get("gpm_table", []), ["phase"] + [c for c, _, _ in GPM_COLUMNS]))
    parts += ["", "### Checks", ""]
    parts.append(_md_table(summary.get("checks", []), ["phase", "metric", "op", "bound", "median", "status"]))
    proc = summary.get("processes", {})
    parts += ["", "## Processes", "",
              f"load pid {proc.get('load_pid')} listed: {proc.get('load_listed')}; "
              f"second pid {proc.get('second_pid')} listed: {proc.get('second_listed')}, "
              f"named: {proc.get('second_named')}; NVML pids {proc.get('nvml_pids')}, "
              f"nvidia-smi pids {proc.get('smi_pids')}. {proc.get('note', '')}"]
    parts += ["", "## PCIe (h2d phase)", "", json.dumps(summary.get("pcie"))]
    cost = summary.get("cost", {})
    rows = [{"call": k, **v} for k, v in cost.items() if isinstance(v, dict)]
    parts += ["", "## NVML call cost (µs per call, idle GPU)", ""]
    parts.append(_md_table(rows, ["call", "function", "calls", "median_us", "p90_us", "error"]))
    in_run = summary.get("recording", {}).get("collect_ms_median")
    parts.append(f"\ncollect() of one GPU, fast path: {cost.get('collect_one_gpu_fast_path_ms')} ms; "
                 f"during the recording (load running, slow path included): median {in_run} ms")
    parts += ["", "## Recording", "", json.dumps(summary.get("recording"), indent=1)]
    if summary.get("errors"):
        parts += ["", "## Errors", "", *[f"- {e}" for e in summary["errors"]]]
    return "\n".join(parts) + "\n"


def gpu_tag(name: str) -> str:
    m = re.search(r"\b([A-Z]+\d+[A-Z]?)\b", name.replace("NVIDIA ", ""))
    return (m.group(1) if m else re.sub(r"[^a-z0-9]+", "_", name.lower())).lower()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="output directory")
    ap.add_argument("--device", type=int, default=0, help="NVML index of the GPU to load (default 0)")
    ap.add_argument("--phase-s", type=float, default=4.0)
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--phases", default=",".join(LOAD_PHASES))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"errors": [], "device": args.device, "started": time.time()}
    nv = Nvml()
    if nv.init() is not None:
        summary["errors"].append(nv.reason)
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        print(nv.reason)
        return 2
    summary["driver"], summary["nvml"] = nv.driver_version(), nv.nvml_version()
    nv.shutdown()

    marker, timeline_path, raw = out / "phase", out / "timeline.json", out / "recording_raw.jsonl"
    marker.write_text("start\n")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(args.device), CUDA_DEVICE_ORDER="PCI_BUS_ID",
               PYTHONUNBUFFERED="1")
    with open(out / "phases.log", "w") as log:
        load = subprocess.Popen([sys.executable, str(ROOT / "tests/gpu/nvml_phases.py"),
                                 "--marker", str(marker), "--timeline", str(timeline_path),
                                 "--phase-s", str(args.phase_s), "--phases", args.phases],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
        stop = threading.Event()
        smi_rows: list[dict[str, Any]] = []
        footer: dict[str, Any] = {}

        def rec() -> None:
            try:
                footer.update(record(raw, duration_s=600, interval_s=args.interval, devices=[args.device],
                                     phase_marker_file=marker, stop=stop))
            except Exception as exc:  # reported in the summary; the load still finishes
                summary["errors"].append(f"record failed: {exc!r}")

        threads = [threading.Thread(target=rec), threading.Thread(
            target=poll_smi, args=(args.device, marker, stop, smi_rows, args.interval))]
        for t in threads:
            t.start()
        try:
            rc = load.wait(timeout=300)
        except subprocess.TimeoutExpired:
            load.kill()
            rc = -9
        time.sleep(args.interval * 2)  # one more frame after "done"
        stop.set()
        for t in threads:
            t.join(timeout=30)
    summary["load_rc"] = rc
    if rc != 0:
        summary["errors"].append(f"nvml_phases.py exited {rc}: see phases.log")
    with open(out / "smi.jsonl", "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in smi_rows)
    if not smi_rows:
        summary["errors"].append("no nvidia-smi readings (not on PATH?)")

    timeline = json.loads(timeline_path.read_text()) if timeline_path.exists() else {}
    gpu = str(args.device)
    try:
        src = ReplaySource.load(raw)
        dev = src.devices[0] if src.devices else {}
        summary["gpu_name"] = dev.get("name")
        windows = phase_windows(timeline)
        medians = src.medians_by_phase(gpu=gpu, skip_first_s=SETTLE_S)
        summary["medians"] = medians
        summary["agreement"] = compare_with_smi(src, smi_rows, windows, gpu)
        summary["gpm_table"] = gpm_table(medians)
        summary["checks"] = evaluate(medians)
        summary["processes"] = process_check(src, timeline, smi_rows, gpu)
        summary["pcie"] = pcie_check(medians, timeline)
        name = f"{gpu_tag(str(dev.get('name', 'gpu')))}_phases.jsonl"
        kept = trim_recording(raw, out / name, [p for p in LOAD_PHASES if p in windows])
        summary["recording"] = {
            "raw": raw.name, "trimmed": name, "frames_kept": kept, "bytes": (out / name).stat().st_size,
            "gpm_supported": dev.get("gpm_supported"), "collect_ms_median": footer.get("collect_ms_median"),
            "collect_ms_max": footer.get("collect_ms_max"), "nvml_errors": footer.get("nvml_errors"),
            "cost_us_in_run": footer.get("cost_us")}
    except Exception as exc:
        summary["errors"].append(f"analysis failed: {exc!r}")
    try:
        summary["cost"] = cost_benchmark(args.device)
    except Exception as exc:
        summary["errors"].append(f"cost benchmark failed: {exc!r}")
    summary["timeline"] = timeline

    failed_checks = [c for c in summary.get("checks", []) if c["status"] == "fail"]
    bad_agree = [f"{p}/{q}" for p, per in summary.get("agreement", {}).items()
                 for q, c in per.items() if not c["ok"]]
    proc = summary.get("processes", {})
    summary["ok"] = not (failed_checks or bad_agree or summary["errors"]) and bool(proc.get("second_named"))
    summary["verdict"] = (f"{len(failed_checks)} GPM check(s) failed, {len(bad_agree)} nvidia-smi "
                          f"disagreement(s) {bad_agree}, second process named: {proc.get('second_named')}, "
                          f"{len(summary['errors'])} error(s)")
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    md = render_markdown(summary)
    (out / "summary.md").write_text(md)
    print(md)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
