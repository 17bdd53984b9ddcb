"""Record and replay: file format, timing, looping, speed-up, the replay label, bad files, and the
real GPU recordings (checked against the GPM table of docs/design.md §2) once they exist."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from perfd.collectors.collector import Collected
from perfd.collectors.nvml import NvmlCollector, ReplaySource
from perfd.collectors.nvml.expectations import evaluate
from perfd.collectors.nvml.record import read_phase, record
from perfd.collectors.nvml.tests.fake_nvml import FakeDevice, FakePynvml
from perfd.collectors.nvml.wrapper import Nvml

DATA = Path(__file__).parent / "data"
SYNTHETIC = DATA / "synthetic_example.jsonl"
# Real recordings (tests/gpu/verify_nvml.py), kept as package data because the demo replays them.
REAL = sorted((Path(__file__).parents[1] / "data").glob("*_phases.jsonl"))
ALLOWED_LABELS = {"gpu", "uuid", "model", "pci_bus_id", "reason", "type", "replay"}


def replay(path: Path, **cfg: Any) -> NvmlCollector:
    col = NvmlCollector({"source": f"replay:{path}", **cfg})
    assert col.mode == "replay"
    return col


def frames_at(col: NvmlCollector, now: float) -> Collected:
    return col.collect(now)


def test_synthetic_loads() -> None:
    src = ReplaySource.load(SYNTHETIC)
    assert src.header["synthetic"] is True
    assert src.interval_s == 0.5 and len(src.frames) == 10 and src.duration_s == 4.5
    assert src.phases() == ["idle", "matmul", "copy", "launch", "second_process"]
    assert src.devices[0]["gpm_supported"] is True
    assert src.footer is not None


def test_synthetic_reproduces_design_table() -> None:
    rows = evaluate(ReplaySource.load(SYNTHETIC).medians_by_phase(gpu="0"))
    assert {r["status"] for r in rows} == {"pass"}, [r for r in rows if r["status"] != "pass"]


def test_replay_timing_label_and_end() -> None:
    col = replay(SYNTHETIC)
    caps = col.probe()
    assert caps.available and caps.features == {"replay": True, "gpm": True}
    c0 = col.collect(1000.0)
    assert {s.time for s in c0.samples} == {1000.0}  # only the t=0 frame is due
    assert all(s.labels["replay"] == "1" for s in c0.samples)
    assert all(set(s.labels) <= ALLOWED_LABELS for s in c0.samples)
    assert c0.events and c0.events[0]["labels"]["replay"] == "1" and c0.events[0]["time"] == 1000.0
    assert col.replay is not None and col.replay.current_phase == "idle"
    assert col.collect(1000.4).samples == []
    c1 = col.collect(1001.0)  # frames at t=0.5 and t=1.0, stamped with their own replay times
    assert sorted({s.time for s in c1.samples}) == [1000.5, 1001.0]
    assert col.replay.current_phase == "matmul"
    rest = col.collect(1010.0)
    assert len({s.time for s in rest.samples}) == 7
    assert [e["kind"] for e in rest.events][-1] == "replay_finished"
    assert col.collect(1020.0) == Collected()


def test_replay_speed_and_loop() -> None:
    col = replay(SYNTHETIC, speed=2.0, loop=True)
    col.collect(0.0)
    c = col.collect(1.0)  # 2 s of recording in 1 s
    assert sorted({s.time for s in c.samples}) == [0.25, 0.5, 0.75, 1.0]
    c = col.collect(3.0)  # recording time 6 s: past the end (4.5 s) -> loop (period 5 s)
    times = sorted({s.time for s in c.samples})
    assert times[-1] == 3.0  # the second cycle's t=1.0 frame at (5 + 1) / 2
    assert not [e for e in c.events if e["kind"] == "replay_finished"]
    assert col.replay is not None and col.replay.current_phase == "matmul"


def test_replay_after_a_long_stall_skips_old_frames() -> None:
    col = replay(SYNTHETIC, loop=True)
    col.collect(0.0)
    c = col.collect(100.0)
    assert len({s.time for s in c.samples}) == 10  # at most one recording's worth
    assert max(s.time for s in c.samples) == 100.0
    assert col.errors["replay-frames-skipped"] == 1


@pytest.mark.parametrize(("text", "words"), [
    ("", "no header"),
    ('{"type": "collect", "t": 0}\n', "first line must be the header"),
    ('{"type": "header", "version": 99}\n', "unsupported recording version"),
    ('{"type": "header", "version": 1}\nnot json\n', "line 2: not JSON"),
    ('{"type": "header", "version": 1}\n{"type": "collect"}\n', "line 2: bad collect record"),
    ('{"type": "header", "version": 1}\n', "no frames"),
])
def test_bad_recordings_make_probe_unavailable(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    caps = replay(path).probe()
    assert not caps.available and words in caps.reason and str(path) in caps.reason


def test_missing_recording(tmp_path: Path) -> None:
    caps = replay(tmp_path / "nope.jsonl").probe()
    assert not caps.available and "nope.jsonl" in caps.reason


def test_read_phase(tmp_path: Path) -> None:
    marker = tmp_path / "phase"
    assert read_phase(marker) is None and read_phase(None) is None
    marker.write_text("matmul\n")
    assert read_phase(marker) == "matmul"
    marker.write_text("x" * 300)
    assert read_phase(marker) == "x" * 64


def test_record_then_replay_roundtrip(tmp_path: Path) -> None:
    out, marker = tmp_path / "rec.jsonl", tmp_path / "phase"
    marker.write_text("warmup")
    dev = FakeDevice(gpm={2: 50.0, 5: 25.0}, procs=[(7, 1 << 30)])
    nvml = Nvml(module=FakePynvml([dev]))
    timer = threading.Timer(0.25, lambda: marker.write_text("busy"))
    timer.start()
    footer = record(out, duration_s=0.6, interval_s=0.1, devices=[0], phase_marker_file=marker, nvml=nvml)
    timer.join()
    assert footer["frames"] >= 4 and footer["calls"]["nvmlDeviceGetUtilizationRates"] >= 4
    assert footer["collect_ms_median"] is not None
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines[0]["type"] == "header" and lines[-1]["type"] == "footer"
    assert lines[0]["devices"] == [{"index": 0, "uuid": dev.uuid, "name": "NVIDIA H200",
                                    "memory_total": dev.mem_total, "gpm_supported": True}]
    assert lines[0]["driver"] == "580.159.fake" and lines[0]["interval_s"] == 0.1
    src = ReplaySource.load(out)
    assert src.phases() == ["warmup", "busy"]
    assert src.frames[0].events[0]["kind"] == "gpu_processes"
    med = src.medians_by_phase(gpu="0")
    assert med["busy"]["perfd_gpu_tensor_util_ratio"] == 0.25
    assert med["busy"]["perfd_gpu_throttle_active{gpu_idle}"] == 0.0
    col = replay(out)
    c = col.collect(50.0)
    assert c.samples and all(s.labels["replay"] == "1" for s in c.samples)


def test_record_stops_on_event_and_raises_without_nvml(tmp_path: Path) -> None:
    stop = threading.Event()
    stop.set()
    footer = record(tmp_path / "r.jsonl", 60.0, 0.5, "all", stop=stop, nvml=Nvml(module=FakePynvml()))
    assert footer["frames"] == 0
    with pytest.raises(RuntimeError, match="no NVIDIA GPU"):
        record(tmp_path / "r2.jsonl", 1.0, 0.5, nvml=Nvml(module=FakePynvml(devices=[])))


@pytest.mark.skipif(not REAL, reason="no real GPU recording yet (run tests/gpu/verify_nvml.py on a GPU)")
@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_real_recording(path: Path) -> None:
    src = ReplaySource.load(path)
    assert not src.header.get("synthetic")
    assert {"idle", "matmul", "copy", "launch"} <= set(src.phases())
    rows = evaluate(src.medians_by_phase(gpu=str(src.devices[0]["index"]), skip_first_s=1.0))
    if src.devices[0].get("gpm_supported"):
        assert {r["status"] for r in rows} == {"pass"}, [r for r in rows if r["status"] != "pass"]
    col = replay(path)
    assert col.probe().available
    c = col.collect(0.0)
    assert c.samples and all(set(s.labels) <= ALLOWED_LABELS for s in c.samples)


def test_trim_recording(tmp_path: Path) -> None:
    from perfd.collectors.nvml.record import trim_recording

    out = tmp_path / "trim.jsonl"
    assert trim_recording(SYNTHETIC, out, ["matmul", "copy"]) == 4
    src = ReplaySource.load(out)
    assert src.phases() == ["matmul", "copy"]
    assert [f.t for f in src.frames] == [0.0, 0.5, 1.0, 1.5]
    assert src.footer is not None and src.footer["frames_kept"] == 4


def test_trim_carries_the_process_list_of_dropped_frames(tmp_path: Path) -> None:
    from perfd.collectors.nvml.record import trim_recording

    out = tmp_path / "trim.jsonl"
    # the idle frames hold the first process event (empty list), matmul's frame 1 holds pid 4001
    trim_recording(SYNTHETIC, out, ["copy"])
    first = ReplaySource.load(out).frames[0]
    evs = [e for e in first.events if e["kind"] == "gpu_processes"]
    payload = evs[0]["payload"] if len(evs) == 1 else None
    assert isinstance(payload, list) and [p["pid"] for p in payload] == [4001]
