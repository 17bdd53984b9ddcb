"""The GPU verification scripts (tests/gpu/nvml_phases.py, verify_nvml.py), in the pieces that run
without a GPU: phase orchestration (dry run), nvidia-smi parsing, pairing and agreement, the
process check, report rendering."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from perfd.collectors.nvml import ReplaySource

ROOT = Path(__file__).resolve().parents[4]
SYNTHETIC = Path(__file__).parent / "data" / "synthetic_example.jsonl"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "gpu" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


verify = load("verify_nvml")


def test_phases_dry_run(tmp_path: Path) -> None:
    marker, timeline = tmp_path / "phase", tmp_path / "timeline.json"
    rc = subprocess.run([sys.executable, str(ROOT / "tests/gpu/nvml_phases.py"), "--dry-run", "--marker",
                         str(marker), "--timeline", str(timeline), "--phase-s", "0.2",
                         "--phases", "idle,matmul,second_process"], timeout=60).returncode
    assert rc == 0
    tl = json.loads(timeline.read_text())
    assert [p["name"] for p in tl["phases"]] == ["idle", "matmul", "second_process"]
    for p in tl["phases"]:
        assert p["end"] - p["start"] >= 0.19
    stats = tl["phases"][2]["stats"]
    assert tl["child_pid"] == stats["child_pid"] and stats["child_rc"] == 0
    assert marker.read_text().strip() == "done"


def test_phases_rejects_unknown_phase(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "tests/gpu/nvml_phases.py"), "--dry-run", "--marker",
                        str(tmp_path / "m"), "--timeline", str(tmp_path / "t"), "--phases", "idle,dance"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "dance" in r.stderr


def test_parse_smi() -> None:
    g = verify.parse_smi_gpu("100, 81234, 690.55, 55, 1980")
    assert g == {"utilization.gpu": 100.0, "memory.used": 81234.0, "power.draw": 690.55,
                 "temperature.gpu": 55.0, "clocks.sm": 1980.0}
    assert verify.parse_smi_gpu("0, 1, [N/A], 30, [Not Supported]")["power.draw"] is None
    apps = verify.parse_smi_apps(
        "4001, python3, 3072\n4002, /usr/bin/python3, [N/A]\nNo running processes found\n")
    assert apps == [{"pid": 4001, "name": "python3", "used_memory_mib": 3072.0},
                    {"pid": 4002, "name": "/usr/bin/python3", "used_memory_mib": None}]


def _timeline() -> dict[str, Any]:
    # the synthetic recording: 2 frames of 0.5 s per phase from epoch 1767225600
    names = ["idle", "matmul", "copy", "launch", "second_process"]
    t0 = 1767225600.0
    return {"pid": 4001, "child_pid": 4002,
            "phases": [{"name": n, "start": t0 + i - 1.0, "end": t0 + i + 1.0, "stats": {}}
                       for i, n in enumerate(names)]}


def test_compare_with_smi() -> None:
    src = ReplaySource.load(SYNTHETIC)
    tl = _timeline()
    windows = verify.phase_windows(tl)
    t_matmul = 1767225600.0 + 1.0 + 0.05  # nearest frame: the matmul frame at t=1.0 (phase settled)
    rows = [
        {"time": t_matmul, "gpu": {"utilization.gpu": 100.0, "memory.used": 3072.0, "power.draw": 700.0,
                                   "temperature.gpu": 47.0, "clocks.sm": 1995.0}},
        {"time": t_matmul + 0.01, "gpu": {"utilization.gpu": 80.0, "memory.used": 3200.0, "power.draw": 800.0,
                                          "temperature.gpu": 50.0, "clocks.sm": 1900.0}},
        {"time": 1767225600.0 - 0.5, "gpu": {"utilization.gpu": 0.0}},  # before settling: ignored
    ]
    out = verify.compare_with_smi(src, rows, windows, "0")
    assert set(out) == {"matmul"}
    m = out["matmul"]
    assert m["util_pct"]["pairs"] == 2 and m["util_pct"]["agree"] == 1 and not m["util_pct"]["ok"]
    assert m["memory_used_mib"]["agree"] == 1  # 3072 vs 3072 agrees, 3200 does not (> 1 %)
    assert m["power_w"]["agree"] == 1  # 690 vs 700 within 10 %, vs 800 not
    assert m["sm_clock_mhz"]["agree"] == 1 and m["temperature_c"]["agree"] == 1
    assert m["util_pct"]["perfd_median"] == 100.0 and m["util_pct"]["max_dt_s"] < 0.1


def test_process_check_and_report() -> None:
    src = ReplaySource.load(SYNTHETIC)
    proc = verify.process_check(src, _timeline(), [{"apps": [{"pid": 4002}]}], "0")
    assert proc["load_listed"] and proc["second_listed"] and proc["second_named"]
    assert proc["nvml_pids"] == [4001, 4002] and proc["smi_pids"] == [4002]
    foreign = verify.process_check(src, {"pid": 1, "child_pid": 2}, [], "0")
    assert not foreign["second_named"] and "pid namespace" in foreign["note"]
    medians = src.medians_by_phase(gpu="0")
    table = verify.gpm_table(medians)
    assert table[1]["phase"] == "matmul" and table[1]["ANY_TENSOR_UTIL %"] == 93.5
    summary = {"gpu_name": "NVIDIA H200 (synthetic)", "driver": "x", "ok": True, "verdict": "v",
               "agreement": verify.compare_with_smi(src, [], {}, "0"), "gpm_table": table,
               "checks": [], "processes": proc, "pcie": verify.pcie_check(medians, _timeline()),
               "cost": {"power": {"function": "nvmlDeviceGetPowerUsage", "calls": 1, "median_us": 10.0}},
               "recording": {}, "errors": ["e1"]}
    md = verify.render_markdown(summary)
    assert "## GPM medians per phase" in md and "| matmul |" in md and "- e1" in md


@pytest.mark.parametrize(("name", "tag"), [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA GH200 480GB", "gh200"), ("Tesla T4", "t4"),
])
def test_gpu_tag(name: str, tag: str) -> None:
    assert verify.gpu_tag(name) == tag
