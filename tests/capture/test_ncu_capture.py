"""ncu captures through the capture manager, end to end on one machine: a rank recorded as running
under ncu (what ``perfd ncu-exec`` writes), a stand-in step hook that opens and closes the range and,
like ncu, writes the report while the range runs, and a stand-in ``ncu`` binary whose ``--import``
replays the recorded H100 exports (tests/data/ncu). Checked: one step's range, the report copied and
imported as both CSV pages, rows joined to the job's earlier Kineto capture (the real Megatron-LM
trace), the spent kernel budget, the time budget that cancels an overrunning range, and the CUPTI
refusals both ways."""

from __future__ import annotations

import json
import shutil
import stat
import sys
import threading
import time
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from perfd.capture.manager import CaptureManager
from perfd.capture.ncu_exec import NcuExecutor, NcuOptions, rank_paths, report_file, write_target
from perfd.capture.nsys_exec import session_name
from perfd.capture.request import BUSY_REASON
from perfd.capture.store import CaptureStore, Manifest
from perfd.transport.codec import Command
from tests.analytics.test_ncu import TENSOR, raw_page

DATA = Path(__file__).resolve().parents[1] / "data"
DETAILS = DATA / "ncu" / "h100_mlp_sol_details_5.csv"
BIG = DATA / "captures" / "kineto_h100_megatron" / "big_rank0.json.gz"
# What ncu's HighPipeUtilization rule says of launch 3 of that export (the 256x128 GEMM): "Tensor is the
# highest-utilized pipeline (95.2%)"; the export has no warp-stall values (its rules quote none).
MLP_EXTRA = {3: {TENSOR: ("%", "95.2")}}
# How long a capture may take to finish: its worker thread reads and analyses the real Megatron-LM trace
# again for the join (~25 s on the loaded 2-core machine, 2026-11-26, where 30 s failed two tests on
# main and on this branch alike); what is awaited is the capture's end, not a speed.
CAPTURE_DONE_S = 120

FAKE_NCU = r'''#!{python}
import json, os, sys
STATE = {state!r}
args = sys.argv[1:]
with open(os.path.join(STATE, "calls.jsonl"), "a") as f:
    f.write(json.dumps(args) + "\n")
if "--import" in args:
    # the stand-in report names the recorded exports it stands for
    spec = json.load(open(args[args.index("--import") + 1]))
    sys.stdout.write(open(spec[args[args.index("--page") + 1]]).read())
elif "--version" in args:
    print("NVIDIA (R) Nsight Compute Command Line Profiler (stand-in)")
else:  # ncu [options] -o BASE CMD...: the command runs (profiling off until a range)
    i = args.index("-o")
    cmd = args[i + 2:]
    os.execvp(cmd[0], cmd)
'''


def make_fake_ncu(tmp: Path) -> tuple[Path, Path]:
    state = tmp / "ncu-state"
    state.mkdir(parents=True, exist_ok=True)
    exe = tmp / "ncu"
    exe.write_text(FAKE_NCU.format(python=sys.executable, state=str(state)))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe, state


def calls(state: Path) -> list[list[str]]:
    p = state / "calls.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


@cache
def megatron_device() -> dict[str, Any]:
    from tests.trace_cache import analyze_chrome_trace

    a = analyze_chrome_trace(DATA / "captures" / "kineto_h100_megatron" / "big_rank0.json.gz", top_n=80)
    dev = a.to_json()["devices"][0]  # type: ignore[index]
    assert isinstance(dev, dict)
    return dev


class Job:
    """A job whose rank 1 (pid 11) runs under ncu (pid 4242), with a stand-in step hook."""

    def __init__(self, tmp: Path, states: tuple[str, ...] = ("accepted", "started", "stopped"),
                 opts: NcuOptions | None = None, answer_cancel: bool = True) -> None:
        self.exe, self.state = make_fake_ncu(tmp)
        self.root = tmp / "caps"
        self.store = CaptureStore(self.root, 10**8)
        self.events: list[dict[str, Any]] = []
        self.asked: list[tuple[int, int, int]] = []
        self.cancels: list[int] = []
        self.states, self.answer_cancel = states, answer_cancel
        self.target = write_target(self.root, "job1", 1, opts or NcuOptions(), str(self.exe), pid=4242)
        raw = tmp / "raw.csv"
        raw.write_text(raw_page(DETAILS.read_text(), MLP_EXTRA))
        self.spec = json.dumps({"details": str(DETAILS), "raw": str(raw)})
        self.write_report = True
        self.mgr = CaptureManager(
            self.store, None, None, hook_requester=self.hook, pids_for_ranks=lambda j, r: {0: 10, 1: 11},
            emit=self.events.append, settle_s=0.2, hook_last_step=lambda r: 40,
            ncu=NcuExecutor(self.root, ncu=str(self.exe)), hook_canceller=self.cancel,
            under_check=lambda pid, ncu_pid: None if (pid, ncu_pid) == (11, 4242) else "not under that ncu")

    def kineto_capture(self, keep_trace: bool = True, steps: int | None = None) -> str:
        """A Kineto capture of rank 0 as the agent keeps one: the real trace as its artifact, the
        analysis with the top 10 kernels (``steps``: the steps the capture asked for)."""
        from tests.trace_cache import analyze_chrome_trace

        m = self.store.new_capture("job1", (0,), "kineto")
        if steps is not None:
            m["steps"] = {"start": 10, "count": steps}
        trace = self.store.capture_dir(m["id"]) / "rank0_123.json.gz"
        shutil.copyfile(BIG, trace)
        self.store.add_artifact(m, trace, "kineto_trace", 0, 123)
        m["analysis"] = {"0": analyze_chrome_trace(trace).to_json()}
        if not keep_trace:
            trace.unlink()
        return str(self.store.finish(m, "ok")["id"])

    def event(self, rid: int, state: str, step: int) -> None:
        self.mgr.on_hook_event({"kind": "hook_profile", "request_id": rid, "state": state, "step": step,
                                "rank": 1, "pid": 11, "time": time.time()})

    def hook(self, rank: int, start: int, n: int) -> tuple[int, int]:
        self.asked.append((rank, start, n))
        rid = 30 + len(self.asked)

        def training() -> None:  # the hook's answers; ncu writes its report while the range runs
            time.sleep(0.05)
            for st in self.states:
                if st == "stopped" and self.write_report:
                    self.target.report.write_text(self.spec + " " * len(self.asked))  # it grows each range
                self.event(rid, st, start + n - 1 if st == "stopped" else start)
            if "stopped" not in self.states and self.write_report:
                self.target.report.write_text(self.spec)

        threading.Thread(target=training, daemon=True).start()
        self.rid = rid
        return 11, rid  # (the pid it went to, the request id)

    def cancel(self, rank: int) -> tuple[int, int]:
        self.cancels.append(rank)
        if self.answer_cancel:  # the hook ends the range at its next step boundary
            threading.Timer(0.05, self.event, (self.rid, "cancelled", 42)).start()
        return 11, 99

    def capture(self, **args: str) -> Manifest:
        cid = self.mgr.handle(Command("capture", "job1", (1,), {"tool": "ncu", **args}, id="cmd-ncu"))
        assert cid and self.mgr.wait_idle(CAPTURE_DONE_S)
        return self.store.read(cid)


@pytest.mark.slow
def test_one_step_range_imported_parsed_and_joined(tmp_path):
    job = Job(tmp_path)
    kineto = job.kineto_capture()
    m = job.capture(steps="3")
    assert m["status"] == "ok", m["reason"]
    assert "ncu ranges are one step (asked for 3)" in (m["reason"] or "")
    assert m["tool"] == "ncu" and m["mode"] == "range" and m["steps"] == {"start": 42, "count": 1}
    assert job.asked == [(1, 42, 1)] and not job.cancels and m["range_overran"] is False
    assert m["range"]["1"]["state"] == "stopped"
    started = m["timings"]["started_at"]
    assert started is not None and m["timings"]["range_closed_at"] >= started
    # How long the range held the step: from the hook's start to its stop
    assert m["range_held_s"] == round(m["timings"]["range_closed_at"] - started, 3)
    assert [a["name"] for a in m["artifacts"]] == ["rank1.ncu-rep", "rank1_details.csv", "rank1_raw.csv"]
    copy = str(job.store.capture_dir(m["id"]) / "rank1.ncu-rep")  # imported from the copy, not ncu's file
    assert calls(job.state) == [["--import", copy, "--csv", "--page", "details"],
                                ["--import", copy, "--csv", "--page", "raw"]]
    a = m["analysis"]["1"]
    assert a["joined_to"] == kineto and a["clock_control"] == "none" and a["kernel_budget"] == 40
    # No filter chosen by time for this rank: the capture says its kernels are the first launched
    assert a["kernel_choice"]["how"] == "first" and "not by time" in a["kernel_choice"]["text"]
    assert len(a["kernels"]) == 5 and a["ncu"]["launches"] == 5 and a["ncu"]["pages"] == ["details", "raw"]
    gelu = next(k for k in a["kernels"] if "GeluCUDAKernelImpl" in k["name"])
    assert gelu["match"] == "template" and gelu["captured_share"] == pytest.approx(0.0107, abs=5e-4)
    assert gelu["timeline_steps"] is None  # the trace marks no steps, its capture asked for none: unknown
    gemm = next(k for k in a["kernels"] if k["name"].startswith("nvjet_sm90_tst_256x128"))
    assert gemm["tensor_pipe"] == pytest.approx(0.952) and gemm["bound"] == "compute-bound"
    assert gemm["stalls"] == [] and gemm["warp_cycles_per_issue"] is None  # not in that export: absent
    assert {c["category"] for c in a["categories"]} >= {"gemm", "normalization"}
    assert [e["kind"] for e in job.events] == ["capture_started", "capture_finished"]
    done = job.events[-1]["payload"]
    assert done["status"] == "ok" and done["range_overran"] is False
    assert done["range_held_s"] == m["range_held_s"]
    rows = done["ranks"]["1"]["ncu_kernels"]
    assert len(rows) == 5 and all(len(r["name"]) <= 200 and "ids" not in r for r in rows)
    assert done["ranks"]["1"]["ncu_joined_to"] == kineto and done["ranks"]["1"]["ncu_categories"]
    assert done["ranks"]["1"]["ncu_kernel_choice"]["how"] == "first"


@pytest.mark.slow
def test_the_rows_carry_the_steps_of_the_timeline_they_joined(tmp_path):
    """The trace marks no steps; the Kineto capture asked for 3: each joined row's time per step is
    its timeline kernel's time over those 3 (the budget's kernel rows read it); a row with no match
    has none."""
    job = Job(tmp_path)
    job.kineto_capture(steps=3)
    m = job.capture()
    assert m["status"] == "ok", m["reason"]
    rows = job.events[-1]["payload"]["ranks"]["1"]["ncu_kernels"]
    gelu = next(k for k in rows if "GeluCUDAKernelImpl" in k["name"])
    assert gelu["timeline_steps"] == 3
    assert all(k["timeline_steps"] is None for k in rows if k["match"] == "none")
    joined = [k for k in m["analysis"]["1"]["kernels"] if k["captured_ms"] is not None]
    assert joined and all(k["timeline_steps"] == 3 for k in joined)


@pytest.mark.slow
def test_without_the_trace_the_join_has_the_kept_top_kernels_only(tmp_path):
    """The earlier capture's trace was pruned: its top 10 hold no GELU (a multiply of the same
    function is there, and is not taken for it)."""
    job = Job(tmp_path)
    kineto = job.kineto_capture(keep_trace=False)
    a = job.capture()["analysis"]["1"]
    assert a["joined_to"] == kineto
    gelu = next(k for k in a["kernels"] if "GeluCUDAKernelImpl" in k["name"])
    assert gelu["match"] == "none" and gelu["captured_share"] is None and gelu["category"]


@pytest.mark.slow
def test_a_range_after_the_budget_is_spent_says_so(tmp_path):
    """ncu's kernel budget counts over the process: once spent, a range adds nothing to the report."""
    job = Job(tmp_path)
    assert job.capture()["status"] == "ok"
    job.write_report = False
    m = job.capture()
    assert m["status"] == "failed"
    assert "did not grow" in (m["reason"] or "") and "kernel budget of 40" in (m["reason"] or "")
    assert "5 launches reported here before" in (m["reason"] or "")


@pytest.mark.slow
def test_a_report_holding_only_earlier_ranges_is_no_result(tmp_path):
    job = Job(tmp_path)
    assert job.capture()["status"] == "ok"
    m = job.capture()  # the report grew (rewritten) but holds the same 5 launches
    assert m["status"] == "failed" and "no kernel profiled in this range" in (m["reason"] or "")


@pytest.mark.slow
def test_an_overrunning_range_is_cancelled_and_said(tmp_path):
    """Time budget 1 s, a range that does not close by itself: cancelled, closed at the next step
    boundary by the hook, the capture says it overran (rows kept)."""
    job = Job(tmp_path, states=("accepted", "started"), opts=NcuOptions(launch_count=1, time_budget_s=1.0))
    m = job.capture()
    assert job.cancels == [1]
    assert m["status"] == "ok" and m["range_overran"] is True
    assert "overran its time budget of 1 s: cancelled, closed at step(s) rank 1 42" in (m["reason"] or "")
    assert m["range"]["1"]["state"] == "cancelled" and len(m["analysis"]["1"]["kernels"]) == 5
    assert job.events[-1]["payload"]["range_overran"] is True


@pytest.mark.slow
def test_a_range_never_confirmed_closed_is_a_timeout_and_cancelled_again(tmp_path):
    job = Job(tmp_path, states=("accepted", "started"), opts=NcuOptions(launch_count=1, time_budget_s=1.0),
              answer_cancel=False)
    m = job.capture(timeout_s="4")
    assert job.cancels == [1, 1]  # at the budget, and again at the deadline
    assert m["status"] == "timeout" and m["range_overran"] is True
    assert "still open at the capture's timeout" in (m["reason"] or "")
    assert m["analysis"]["1"]["kernels"]  # what ncu wrote is kept


@pytest.mark.parametrize(("tool", "ranks", "why"), [
    ("kineto", (1,), f"{BUSY_REASON}: rank 1 runs under ncu (pid 4242)"),
    ("nsys", (1,), f"{BUSY_REASON}: rank 1 runs under ncu"),
    ("auto", (1,), f"{BUSY_REASON}: rank 1 runs under ncu"),
    ("ncu", (0,), "rank 0 of job job1 does not run under ncu"),
])
def test_one_cupti_client_per_process_both_ways(tmp_path, tool, ranks, why):
    job = Job(tmp_path)
    assert job.mgr.handle(Command("capture", "job1", ranks, {"tool": tool})) is None
    m = job.store.list("job1")[0]
    assert m["status"] == "skipped" and why in (m["reason"] or "")
    assert not job.asked and job.events[-1]["kind"] == "capture_failed"


def test_a_record_from_an_earlier_run_is_not_trusted(tmp_path):
    """The rank's process is not under the ncu the record names (a record left by an earlier run)."""
    job = Job(tmp_path)
    job.mgr._ncu_runs.check = lambda pid, ncu_pid: f"process {pid} is not under ncu (pid {ncu_pid})"
    assert job.mgr.handle(Command("capture", "job1", (1,), {"tool": "ncu"})) is None
    assert "rank 1: process 11 is not under ncu (pid 4242)" in (job.store.list("job1")[0]["reason"] or "")
    # ... so another tool may have it again (this agent has no Kineto: it fails later, for that reason)
    cid = job.mgr.handle(Command("capture", "job1", (1,), {"tool": "kineto"}))
    assert cid and job.mgr.wait_idle(CAPTURE_DONE_S)
    assert "Kineto daemon is off" in (job.store.read(cid)["reason"] or "")


def test_no_ncu_executor_refuses_ncu_and_leaves_the_others(tmp_path):
    store = CaptureStore(tmp_path / "caps", 10**6)
    mgr = CaptureManager(store, None, None, pids_for_ranks=lambda j, r: {1: 11})
    assert mgr.handle(Command("capture", "job1", (1,), {"tool": "ncu"})) is None
    assert "ncu captures are off in this agent" in (store.list("job1")[0]["reason"] or "")


def test_target_records_round_trip_and_bad_ones_are_refused(tmp_path):
    from perfd.capture.ncu_exec import read_target

    t = write_target(tmp_path, "my job/1", 3, NcuOptions(12, "regex:^(a|b)$", "base", 30.0), "/x/ncu", pid=77)
    base, path = rank_paths(tmp_path, "my job/1", 3)
    assert t.report == report_file(base) == tmp_path / "ncu" / session_name("my job/1") / "rank3.ncu-rep"
    got = read_target(tmp_path, "my job/1", 3)
    assert got == t
    assert read_target(tmp_path, "my job/1", 4) is None
    data = json.loads(path.read_text())
    data["report"] = "/etc/passwd"  # never read from the file: the path is perfd's own
    path.write_text(json.dumps(data))
    assert read_target(tmp_path, "my job/1", 3).report == t.report  # type: ignore[union-attr]
    data["options"]["launch_count"] = 10**6
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="launch count"):
        read_target(tmp_path, "my job/1", 3)
    path.write_text("{")
    with pytest.raises(ValueError, match="unreadable"):
        read_target(tmp_path, "my job/1", 3)


@pytest.mark.parametrize(("opts", "why"), [
    (NcuOptions(launch_count=0), "launch count 0"),
    (NcuOptions(launch_count=200, time_budget_s=60), "200 kernels take about 182 s"),
    (NcuOptions(time_budget_s=0.5), "time budget 0.5 s"),
    (NcuOptions(kernel_filter="regex:a b"), "one word"),
    (NcuOptions(clock_control="boost"), "clock control"),  # type: ignore[arg-type]
])
def test_budgets_out_of_bounds_are_refused(opts, why):
    with pytest.raises(ValueError, match=why):
        opts.check()


def test_event_rows_stay_bounded_over_many_ranks():
    from perfd.capture.ncu_capture import EVENT_KERNELS, event_rows

    row = {"name": "x" * 5000, "timeline_name": "y" * 5000, "ids": list(range(100)), "bound": "memory-bound"}
    part = {"kernels": [row] * 100, "categories": [{"category": "gemm"}], "joined_to": None}
    one = event_rows(part)
    assert len(one["ncu_kernels"]) == EVENT_KERNELS and one["ncu_kernels_total"] == 100
    assert all(len(r["name"]) == 200 and len(r["timeline_name"]) == 200 and "ids" not in r
               for r in one["ncu_kernels"])
    eight = [event_rows(part, 8) for _ in range(8)]
    assert sum(len(e["ncu_kernels"]) for e in eight) <= EVENT_KERNELS
    assert len(json.dumps(eight)) < 256 * 1024 / 2
    assert event_rows({"devices": []}) == {}  # a timeline capture's analysis adds nothing
