"""Runs the real `perfd agent --nvml real` under GPU load and compares its /metrics with
nvidia-smi read at the same moments. Needs a GPU, torch (for the load) and nvidia-smi.

    python3 tests/gpu/agent_vs_smi.py OUT_DIR [--phase-s 4]

Writes OUT_DIR/agent_vs_smi.json (every paired reading) and OUT_DIR/agent_vs_smi.md (a table).
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

# agent metric -> (nvidia-smi field, scale from smi unit to the metric's unit, tolerance, kind)
PAIRS = {
    "perfd_gpu_utilization_ratio": ("utilization.gpu", 0.01, 0.10, "abs"),
    "perfd_gpu_memory_used_bytes": ("memory.used", 1024 * 1024, 0.01, "rel"),
    "perfd_gpu_power_watts": ("power.draw", 1.0, 0.10, "rel"),
    "perfd_gpu_temperature_celsius": ("temperature.gpu", 1.0, 2.0, "abs"),
    "perfd_gpu_sm_clock_hertz": ("clocks.sm", 1e6, 30e6, "abs"),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def smi() -> dict[str, float]:
    fields = [f for f, *_ in PAIRS.values()]
    out = subprocess.run(["nvidia-smi", "-i", "0", f"--query-gpu={','.join(fields)}",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True,
                         timeout=10).stdout.strip().split(",")
    return {f: float(v) for f, v in zip(fields, out, strict=True)}


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    vals: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("perfd_gpu_") and s.labels.get("gpu") == "0" and "reason" not in s.labels:
                vals[s.name] = s.value
    return vals


# The agent samples every 1 s and publishes every 0.5 s, so its /metrics trails a load change by
# up to ~1.5 s: readings that close to a phase change compare two different loads.
SETTLE_S = 2.0


def summarize(rows: list[dict[str, Any]], timeline: dict[str, Any]) -> tuple[list[str], bool]:
    starts = [p["start"] for p in timeline.get("phases", [])]
    good = [r for r in rows if "agent" in r]
    settled = [r for r in good if r["phase"] in {p["name"] for p in timeline.get("phases", [])}
               and all(not (0 <= r["time"] - t0 < SETTLE_S) for t0 in starts)]
    lines = [f"{len(good)} paired readings, {len(settled)} of them at least {SETTLE_S:g} s after a load "
             "change (the comparison below uses those).", "",
             "| metric | nvidia-smi field | readings | within tolerance | median diff | tolerance |",
             "|---|---|---|---|---|---|"]
    ok_all = True
    for metric, (field, scale, tol, kind) in PAIRS.items():
        diffs: list[float] = []
        for r in settled:
            if metric in r["agent"]:
                ref = r["smi"][field] * scale
                d = abs(r["agent"][metric] - ref)
                diffs.append(d / ref if kind == "rel" and ref else d)
        within = sum(d <= tol for d in diffs)
        ok_all &= bool(diffs) and within >= 0.9 * len(diffs)
        med = statistics.median(diffs) if diffs else float("nan")
        rel = " (rel)" if kind == "rel" else ""
        lines.append(f"| `{metric}` | {field} | {len(diffs)} | {within} | {med:.4g}{rel} | {tol:g}{rel} |")
    lines += ["", "Per phase, medians (agent / nvidia-smi):", "",
              "| phase | n | util % | power W | SM clock MHz | temperature C |", "|---|---|---|---|---|---|"]
    for ph in [p["name"] for p in timeline.get("phases", [])]:
        rs = [r for r in settled if r["phase"] == ph]
        if not rs:
            continue
        def pair(metric: str, field: str, scale: float, rs: list[dict[str, Any]] = rs) -> str:
            a = statistics.median(r["agent"][metric] for r in rs if metric in r["agent"]) / scale
            b = statistics.median(r["smi"][field] for r in rs)
            return f"{a:.0f} / {b:.0f}"
        lines.append(f"| {ph} | {len(rs)} | {pair('perfd_gpu_utilization_ratio', 'utilization.gpu', 0.01)} | "
                     f"{pair('perfd_gpu_power_watts', 'power.draw', 1)} | "
                     f"{pair('perfd_gpu_sm_clock_hertz', 'clocks.sm', 1e6)} | "
                     f"{pair('perfd_gpu_temperature_celsius', 'temperature.gpu', 1)} |")
    phases: dict[str, list[dict[str, float]]] = {}
    for r in settled:
        phases.setdefault(r["phase"], []).append(r["agent"])
    gpm = ["perfd_gpu_utilization_ratio", "perfd_gpu_sm_util_ratio", "perfd_gpu_sm_occupancy_ratio",
           "perfd_gpu_tensor_util_ratio", "perfd_gpu_dram_bw_util_ratio"]
    lines += ["", "GPM medians seen on the agent's /metrics, by phase:", "",
              "| phase | n | NVML util | SM util | SM occupancy | tensor util | DRAM bw util |",
              "|---|---|---|---|---|---|---|"]
    for ph, vals in phases.items():
        cells = []
        for k in gpm:
            xs = [v[k] for v in vals if k in v]
            cells.append(f"{100 * statistics.median(xs):.1f}%" if xs else "absent")
        lines.append(f"| {ph} | {len(vals)} | " + " | ".join(cells) + " |")
    return lines, ok_all


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--phase-s", type=float, default=4.0)
    ap.add_argument("--analyze-only", action="store_true",
                    help="re-read OUT/agent_vs_smi.json and the timeline; write the table again")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.analyze_only:
        lines, ok = summarize(json.loads((out / "agent_vs_smi.json").read_text()),
                              json.loads((out / "agent_vs_smi_timeline.json").read_text()))
        (out / "agent_vs_smi.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        return 0 if ok else 1
    port = free_port()
    marker = out / "agent_phase_marker"
    agent = subprocess.Popen([sys.executable, "-m", "perfd.app.cli", "agent", "--nvml", "real", "--host",
                              "off", "--job", "gpu-check", "--metrics-port", str(port)], cwd=ROOT,
                             stdout=(out / "agent_vs_smi_agent.log").open("w"), stderr=subprocess.STDOUT)
    load = subprocess.Popen([sys.executable, str(ROOT / "tests/gpu/nvml_phases.py"), "--marker",
                             str(marker), "--timeline", str(out / "agent_vs_smi_timeline.json"),
                             "--phase-s", str(args.phase_s), "--phases", "idle,matmul,copy,launch"],
                            cwd=ROOT)
    rows: list[dict[str, Any]] = []
    try:
        time.sleep(3)  # agent start-up, first GPM window
        while load.poll() is None:
            t0 = time.time()
            try:
                a = scrape(port)
                s = smi()
            except Exception as exc:  # keep going: a missed reading is reported, not fatal
                rows.append({"time": t0, "error": repr(exc)})
                time.sleep(0.5)
                continue
            phase = marker.read_text().strip() if marker.exists() else "?"
            rows.append({"time": t0, "phase": phase, "agent": a, "smi": s})
            time.sleep(max(0.0, 0.5 - (time.time() - t0)))
    finally:
        agent.send_signal(signal.SIGTERM)
        agent_rc = agent.wait(timeout=20)
    (out / "agent_vs_smi.json").write_text(json.dumps(rows, indent=1))
    timeline = json.loads((out / "agent_vs_smi_timeline.json").read_text())
    lines, ok_all = summarize(rows, timeline)
    lines.append(f"\nagent exit code after SIGTERM: {agent_rc}; load exit code: {load.returncode}")
    (out / "agent_vs_smi.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok_all and agent_rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
