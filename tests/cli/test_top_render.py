"""`perfd top`'s screen from what the aggregator's API answers (the JSON shapes of /api/jobs,
/summary and /gpus, as tests/e2e/test_top.py checks against a real aggregator): every job's MFU and
step percentiles, incidents read by their real keys and only the open ones counted, the focus
that stays put, the nvitop-like GPU, process and host tables, and --once output not cut at 80
columns when written to a file."""

from __future__ import annotations

import argparse
import io
import json
import urllib.parse
from collections.abc import Callable
from typing import Any

import pytest
from rich.console import Console

from perfd.app.commands import top_screen as top


def _summary(mfu: float, p50: float, incidents: list[dict[str, Any]], bottleneck: str) -> dict[str, Any]:
    return {"summary": {"medians": {"mfu": mfu}, "bottleneck": bottleneck, "step_time_cv": 0.05,
                        "step_time_distribution_ms": {"p50": p50, "p90": p50 * 1.1, "max": p50 * 1.5,
                                                      "n": 20}},
            "latest": {"straggler_rank_compute_ratio": {"0": 1.0, "1": 1.31}},
            "report": {"summary": {"headline": f"{bottleneck}, MFU {100 * mfu:.1f}%"}},
            "ranks": [{"rank": 0, "node": "n1", "gpu": "0"}, {"rank": 1, "node": "n1", "gpu": "1"}],
            "incidents": incidents,
            "goodput": {"ratio": 0.9, "wall_s": 100.0, "restarts": 1,
                        "parts_s": {"training": 90.0, "restart": 6.0, "checkpoint": 4.0, "stall": 0.0}}}


CLOSED = {"id": "i1", "open": False, "first_iteration": 3, "last_iteration": 5, "ranks": [1],
          "kinds": ["data_stall"], "cost_s": 2.0, "cause": "rank 1 waited on data"}
OPEN = {"id": "i2", "open": True, "first_iteration": 40, "last_iteration": 44, "ranks": [1],
        "kinds": ["straggler", "thermal"], "cost_s": 12.5,
        "cause": "rank 1 slow: GPU 1 at 87°C, clocks throttled (hw_thermal)"}
GPUS = {"gpus": [
    {"node": "n1", "gpu": "0", "model": "NVIDIA H200", "replay": False, "values": {
        "perfd_gpu_utilization_ratio": 0.98, "perfd_gpu_memory_used_bytes": 70 * 2**30,
        "perfd_gpu_memory_total_bytes": 140 * 2**30, "perfd_gpu_power_watts": 612.0,
        "perfd_gpu_power_limit_watts": 700.0, "perfd_gpu_temperature_celsius": 66.0},
     "processes": [{"pid": 4242, "user": "alice", "rank": 0, "used_memory_bytes": 69 * 2**30,
                    "cmdline": "python pretrain_gpt.py --tensor-model-parallel-size 1", "name": "python"}]},
    {"node": "n1", "gpu": "1", "model": "NVIDIA H200", "replay": False, "values": {
        "perfd_gpu_utilization_ratio": 0.99, "perfd_gpu_power_watts": 700.0},
     "processes": [{"pid": 4243, "user": "alice", "rank": 1, "used_memory_bytes": None, "cmdline": None,
                    "name": None},
                   {"pid": 777, "user": "bob", "rank": None, "used_memory_bytes": 8 * 2**30,
                    "cmdline": "python stress.py", "name": "python"}]}],
    "hosts": [{"node": "n1", "values": {"perfd_host_cpu_util_ratio": 0.37, "perfd_host_load1": 11.5,
                                        "perfd_host_memory_used_bytes": 200 * 2**30,
                                        "perfd_host_memory_total_bytes": 2000 * 2**30}}]}


def _api(ages: dict[str, float], summaries: dict[str, dict[str, Any]]) -> Callable[[str], Any]:
    def get(path: str) -> Any:
        if path == "/api/jobs":
            return {"jobs": [{"job": j, "last_iteration": 44, "last_step_age_s": a} for j, a in ages.items()]}
        _, _, job, what = path.split("/", 4)[1:]
        job = urllib.parse.unquote(job)
        return summaries[job] if what == "summary" else GPUS
    return get


def _screen(snap: top.Snapshot) -> str:
    console = Console(width=250, file=io.StringIO(), color_system=None)
    console.print(top.render(snap))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


SUMS = {"alpha": _summary(0.412, 800.0, [CLOSED], "compute-bound"),
        "beta": _summary(0.087, 380.0, [CLOSED, OPEN], "straggler")}


def test_every_job_has_its_mfu_step_percentiles_and_open_incidents() -> None:
    snap = top.fetch("http://agg", None, get=_api({"alpha": 1.0, "beta": 3.0}, SUMS))
    out = _screen(snap)
    rows = {ln.split("│")[1].strip().rstrip(" *"): [c.strip() for c in ln.split("│")[2:-1]]
            for ln in out.splitlines() if ln.startswith("│") and ("alpha" in ln or "beta" in ln)}
    # iter, last step, MFU, goodput, p50, p90, max, cv, bottleneck, open incidents
    assert rows["alpha"][2:7] == ["41.2%", "90.0%", "800 ms", "880 ms", "1200 ms"]
    assert rows["beta"][2:7] == ["8.7%", "90.0%", "380 ms", "418 ms", "570 ms"]
    # the job in focus: where its wall time went, largest first
    assert "goodput 90.0% of 100 s: training 90 s, restart 6 s, checkpoint 4 s; 1 restart(s)" in out
    assert rows["alpha"][-1] == "0" and rows["beta"][-1] == "1"  # a closed incident is not open


def test_incidents_read_their_real_keys_and_closed_ones_are_only_counted() -> None:
    text = top.incidents_text([CLOSED, OPEN]).plain
    assert text.startswith("incidents: 1 open (1 closed)")
    assert ("iterations 40–44, ranks 1 [straggler, thermal], 12.5 s lost so far: rank 1 slow: GPU 1 at "
            "87°C, clocks throttled (hw_thermal)") in text
    assert "{" not in text and "rank 1 waited on data" not in text  # no raw JSON, no closed cause
    assert top.incidents_text([CLOSED]).plain == "incidents: none open (1 closed)"
    assert top.incidents_text([]).plain == "incidents: none open"


def test_focus_stays_on_its_job_while_another_steps_later() -> None:
    first = top.fetch("http://agg", None, get=_api({"alpha": 1.0, "beta": 3.0}, SUMS))
    assert first.focus == "alpha"  # newest step at start
    # beta now has the newest step: the view stays on alpha
    again = top.fetch("http://agg", None, first.focus, get=_api({"alpha": 4.0, "beta": 0.5}, SUMS))
    assert again.focus == "alpha"
    gone = top.fetch("http://agg", None, "gamma", get=_api({"alpha": 4.0, "beta": 0.5}, SUMS))
    assert gone.focus == "beta"  # the job shown before is gone: the newest again
    assert top.step_focus(again.jobs, "alpha", 1) == "beta"
    assert top.step_focus(again.jobs, "beta", 1) == "alpha"
    assert top.step_focus(again.jobs, "alpha", -1) == "beta"


def test_gpu_process_and_host_tables_are_dense() -> None:
    out = _screen(top.fetch("http://agg", "beta", get=_api({"alpha": 1.0, "beta": 3.0}, SUMS)))
    assert "70.0/140.0 50%" in out  # memory used/total GiB and share
    assert "612/700 87%" in out and "700/–" in out  # power / limit, a limit not reported
    proc = next(ln for ln in out.splitlines() if "4242" in ln)
    assert "alice" in proc and "69.0 GiB" in proc
    assert "python pretrain_gpt.py --tensor-model-parallel-size 1" in proc
    foreign = next(ln for ln in out.splitlines() if " 777 " in ln)
    assert "bob" in foreign and "8.0 GiB" in foreign and "python stress.py" in foreign
    assert "not visible to the agent" in next(ln for ln in out.splitlines() if "4243" in ln)
    host = next(ln for ln in out.splitlines() if ln.startswith("│ n1 ") and "11.5" in ln)
    assert "37%" in host and "200.0/2000.0 10%" in host


@pytest.mark.slow
def test_once_to_a_file_is_not_cut_at_80_columns(monkeypatch: Any,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`perfd top --once > file`: rich's default width for a non-terminal is 80; the long command
    line and the full GPU table must reach the file whole. The command's run in this process, its
    stdout capsys's (no terminal, as a file is), no COLUMNS or LINES set."""

    def get(path: str) -> Any:
        if path == "/api/jobs":
            return {"jobs": [{"job": "beta", "last_iteration": 44, "last_step_age_s": 1.0}]}
        # the answers as JSON gives them back (the subprocess this was read them from a file)
        return json.loads(json.dumps(SUMS["beta"] if path.endswith("/summary") else GPUS))

    monkeypatch.setattr(top, "http_getter", lambda base, token=None, timeout=5.0: get)
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)
    capsys.readouterr()
    rc = top.run(argparse.Namespace(aggregator="agg", job=None, interval=2.0, once=True))
    r = capsys.readouterr()
    assert rc == 0, r.err
    assert "python pretrain_gpt.py --tensor-model-parallel-size 1" in r.out
    assert max(len(ln) for ln in r.out.splitlines()) > 80
    assert "…" not in r.out


def test_refuses_bad_interval() -> None:
    assert top.run(argparse.Namespace(aggregator="x", job=None, interval=0.0, once=True)) == 2


def _narrow_screen(snap: top.Snapshot, width: int = 80) -> str:
    console = Console(width=width, file=io.StringIO(), color_system=None)
    console.print(top.render(snap, width=width))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


def test_80_columns_read_whole_and_an_ended_job_is_marked() -> None:
    """A terminal of 80 columns (the job's name once read "dem…", the bottleneck head "bott…",
    and nothing said a job had ended): the compact tables keep every job name, head and value whole,
    within 80 columns; the last-step column says ended / stalled (the aggregator's liveness), and the
    job in focus says it too."""
    sums = {"demo-gpt-8b-pretrain": _summary(0.412, 800.0, [CLOSED], "communication-bound"),
            "beta": _summary(0.087, 380.0, [CLOSED, OPEN], "launch-overhead"), "gamma": SUMS["alpha"]}
    base = _api({"demo-gpt-8b-pretrain": 1.0, "beta": 500.0, "gamma": 95.0}, sums)
    states = {"demo-gpt-8b-pretrain": "running", "beta": "ended", "gamma": "stalled"}

    def get(path: str) -> Any:
        got = base(path)
        if path == "/api/jobs":
            for j in got["jobs"]:
                j["state"] = states[j["job"]]
        return got

    out = _narrow_screen(top.fetch("http://agg", None, get=get))
    lines = out.splitlines()
    tables = out.split("\nprocesses")[0]  # (a long command line gives way there, by design)
    assert max(len(ln) for ln in lines) <= 80 and "…" not in tables, out
    row = {name: next(ln for ln in lines if ln.startswith(name)) for name in states}
    assert row["demo-gpt-8b-pretrain"].split()[:4] == ["demo-gpt-8b-pretrain", "*", "1s", "41.2%"]
    assert "800/880/1200" in row["demo-gpt-8b-pretrain"] and "communication" in row["demo-gpt-8b-pretrain"]
    assert row["beta"].split()[1:3] == ["ended", "8m"] and row["beta"].split()[-2:] == ["launch", "1"]
    assert row["gamma"].split()[1:3] == ["stalled", "95s"]
    heads = next(ln for ln in lines if ln.startswith("job "))
    assert heads.split() == ["job", "last", "step", "MFU", "goodput", "step", "ms", "bound", "by", "inc"]
    assert "step ms: p50/p90/max" in out
    # The GPU table: the one model in its title, every value whole.
    assert "GPUs (H200)" in out and "70/140" in out and "612/700" in out and "66°C" in out
    # The job in focus, once ended, says so.
    ended = _narrow_screen(top.fetch("http://agg", "beta", get=get))
    assert "beta * [ended]: launch-overhead, MFU 8.7%" in ended
    # Wide (a file, a wide terminal): the full tables, with the same marks.
    wide = _screen(top.fetch("http://agg", "beta", get=get))
    assert "ended 8m" in wide and "stalled 95s" in wide and "70.0/140.0 50%" in wide


def test_a_hook_job_is_told_in_its_own_terms() -> None:
    """A step-hook job's screen once named a Megatron flag and "no timed step yet" after 85 steps."""
    def text(t: Any) -> str:
        return str(t.plain)

    hook_job = {"framework": "pytorch", "layout": {"world_size": 1}}
    assert "one rank" in top.per_rank_missing(hook_job)
    assert "--timing-log-option" not in top.per_rank_missing({**hook_job, "layout": {"world_size": 4}})
    assert "step hook on every rank" in top.per_rank_missing({**hook_job, "layout": {"world_size": 4}})
    assert "--timing-log-option all" in top.per_rank_missing({"framework": "megatron",
                                                              "layout": {"world_size": 8}})
    line = text(top.heat_line({}, None, top.per_rank_missing(hook_job)))
    assert "--timing-log-option" not in line and "one rank" in line
    timed = {"summary": {"medians": {"step_time_ms": 120.0, "data_share": 0.33}, "step_budget": None}}
    said = text(top.budget_text(timed))
    assert "no timed step yet" not in said and "no communication timed" in said
    assert "no timed step yet" in text(top.budget_text({"summary": {}}))


# What GET /api/jobs/<job>/gpus answers for a rank process (collectors/ranks, as rank_hosts): the shape
# once seen cut at 80 columns ("268…" for its pid, "sta…" for the state's head).
RANK_HOSTS = [{"rank": r, "node": "gpu-node-017", "pid": 2681234 + r, "state": "disk_sleep",
               "cpu_cores": 1.234, "wait_ratio": 0.81, "allowed_cpus": [0, 1, 2, 3, 8, 9],
               "allowed_busy_ratio": 0.97, "others_ratio": 0.62, "throttled_ratio": 0.25,
               "others": [{"pid": 29591, "user": "mallory", "cpu_ratio": 0.78, "own": False,
                           "cmdline": "python -c 'while True: pass'  # a CPU hog beside the job"}]}
              for r in range(2)]
H100 = {"node": "gpu-node-017", "gpu": "0", "model": "NVIDIA H100 80GB HBM3", "replay": True, "values": {
    "perfd_gpu_utilization_ratio": 1.0, "perfd_gpu_sm_util_ratio": 0.963,
    "perfd_gpu_tensor_util_ratio": 0.935,
    "perfd_gpu_dram_bw_util_ratio": 0.176, "perfd_gpu_memory_used_bytes": 79.1 * 2**30,
    "perfd_gpu_memory_total_bytes": 79.6 * 2**30, "perfd_gpu_power_watts": 698.0,
    "perfd_gpu_power_limit_watts": 700.0, "perfd_gpu_sm_clock_hertz": 1.98e9,
    "perfd_gpu_mem_clock_hertz": 2.619e9,
    "perfd_gpu_temperature_celsius": 71.0}, "processes": []}


def _gpus_api(gpus: list[dict[str, Any]], sources: list[dict[str, Any]]) -> top.Getter:
    base = _api({"gpt": 1.0}, {"gpt": _summary(0.412, 800.0, [], "compute-bound")})

    def get(path: str) -> Any:
        if path.endswith("/gpus"):
            return {"gpus": gpus, "hosts": GPUS["hosts"], "rank_hosts": RANK_HOSTS, "gpu_sources": sources}
        return base(path)
    return get


def _tables(out: str) -> list[str]:
    """The lines of the GPU and rank tables (the processes' command column gives way, by design)."""
    lines = out.splitlines()
    keep, on = [], False
    for ln in lines:
        if ln.startswith(("GPUs", "rank processes", "hosts")):
            on = True
        elif ln.startswith(("processes", "top other", "incidents")):
            on = False
        if on:
            keep.append(ln)
    return keep


def test_rank_processes_and_gpu_rows_whole_at_80_and_120_columns() -> None:
    """At 80 columns the rank processes table once cut its pid and state, at 120 a GPU row
    wrapped onto three lines. Every table now takes the widest form that fits whole."""
    snap = top.fetch("http://agg", None, get=_gpus_api([H100, {**H100, "gpu": "1"}], []))
    for width in (80, 120):
        out = _narrow_screen(snap, width)
        tables = _tables(out)
        assert max(len(ln) for ln in out.splitlines()) <= width, out
        assert tables and not any("…" in ln for ln in tables), "\n".join(tables)
        for r in RANK_HOSTS:  # one line a rank, every value whole
            (row,) = [ln for ln in tables if f" {r['pid']} " in ln]
            assert "disk_sleep" in row and "1.23" in row and "81%" in row and "0–3, 8–9" in row, row
            assert "97%" in row and "62%" in row and "25%" in row, row
        heads = next(ln for ln in tables if ln.lstrip("┃ ").startswith("rank ") and "pid" in ln)
        assert "state" in heads and "CPU" in heads, heads
        # Each GPU on one line, with its clocks and temperature.
        gpu_rows = [ln for ln in tables if "71°C" in ln]
        assert len(gpu_rows) == 2
        assert all("1980" in ln and ("79/80" in ln or "79.1/79.6" in ln) for ln in gpu_rows), gpu_rows
        assert "H100 80GB HBM3 (replay)" in out
        # Who else ran on a rank's CPUs: below the table, whole (wrapped where needed).
        assert "pid 29591 (mallory) took 78% of its" in out.replace("\n", " ")
    wide = _screen(snap)  # no width (a file): the full forms
    assert "CPU wait" in wide and "throttled" in wide and "SM MHz" in wide


def test_a_job_without_gpu_rows_says_why() -> None:
    """With no NVML on the job's agent the GPU panel was once empty, the reason only in that
    agent's log. The aggregator keeps what each agent's Hello said of its collectors."""
    why = "unavailable: NVML not found: libnvidia-ml.so.1 could not be loaded (no NVIDIA driver?)"
    sources: list[dict[str, Any]] = [{"agent": "n7/gpt", "node": "n7", "nvml": why},
                                     {"agent": "side-1", "node": "n7", "nvml": None},
                                     {"agent": "n7/node", "node": "n7", "nvml": "ok"}]
    out = _narrow_screen(top.fetch("http://agg", None, get=_gpus_api([], sources)), 400)
    line = next(ln for ln in out.splitlines() if ln.startswith("GPUs"))
    assert line.startswith("GPUs: – (agent n7/gpt: NVML " + why), line
    assert "agent side-1 on n7 runs no NVML collector (--nvml off)" in line
    assert "agent n7/node reads NVML, and none of its GPUs runs this job's processes" in line
    assert "processes" not in [ln.split()[0] for ln in out.splitlines() if ln.strip()]
    # An aggregator of an older version (no gpu_sources): the panel still says something.
    old = _narrow_screen(top.fetch("http://agg", None, get=_gpus_api([], None)), 200)  # type: ignore[arg-type]
    assert "GPUs: – (no GPU series from the agents yet)" in old


LONG = "train-llama3-70b-pretrain-bf16-fsdp-tp8-pp4-zero1-run3"


def test_a_long_job_name_gives_way_before_any_other_column_at_80_columns() -> None:
    """A job's name of 54 characters at 80 columns: rich cut every column ("last …", "M…", "4…") and
    dropped the bottleneck and incidents; the name is cut first now, in its middle (its start and end
    kept), and every other head and value reads whole; the line of the job in focus names it whole."""
    assert len(LONG) == 54
    sums = {LONG: _summary(0.412, 800.0, [CLOSED, OPEN], "communication-bound"), "beta": SUMS["beta"]}
    out = _narrow_screen(top.fetch("http://agg", None, get=_api({LONG: 1.0, "beta": 3.0}, sums)))
    lines = out.splitlines()
    assert max(len(ln) for ln in lines) <= 80, out
    heads = next(ln for ln in lines if ln.startswith("job "))
    assert heads.split() == ["job", "last", "step", "MFU", "goodput", "step", "ms", "bound", "by", "inc"]
    row = next(ln for ln in lines if ln.startswith("train-llama3") and "1s" in ln)
    name, rest = row.split(" * ")
    assert name.startswith("train-llama3-70b") and name.endswith("…-run3") and len(name) < len(LONG)
    assert rest.split() == ["1s", "41.2%", "90.0%", "800/880/1200", "communication", "1"]
    beta = next(ln for ln in lines if ln.startswith("beta "))
    assert beta.split() == ["beta", "3s", "8.7%", "90.0%", "380/418/570", "straggler", "1"]
    assert f"{LONG} *: communication-bound, " in out


def test_short_job_keeps_the_start_and_the_end() -> None:
    from perfd.app.commands.top_jobs import short_job

    assert short_job("train-llama3-70b-run3", 30) == "train-llama3-70b-run3"
    assert short_job("train-llama3-70b-pretrain-run3", 17) == "train-llama…-run3"
    assert len(short_job(LONG, 12)) == 12 and short_job(LONG, 12).startswith("train")


def test_sort_keys_and_the_help() -> None:
    """m / g / i sort the jobs by MFU, goodput, open incidents (worst first, again best first, a third
    time the aggregator's order, a job without the value last); ? shows the keys and hides them."""
    from perfd.app.commands.top_jobs import HELP, SORT_KEYS, SortBy, View, ordered

    assert not set(SORT_KEYS) & {"n", "p", "q", "\t", "?"}
    sums = {"alpha": SUMS["alpha"], "beta": SUMS["beta"],
            "gamma": _summary(0.3, 500.0, [OPEN, dict(OPEN, id="i3")], "compute-bound"),
            "delta": {"summary": {}}}
    sums["gamma"]["goodput"] = {"ratio": 0.5, "wall_s": 10.0, "parts_s": {"training": 5.0}}
    ages = {"alpha": 1.0, "beta": 2.0, "gamma": 3.0, "delta": 4.0}
    snap = top.fetch("http://agg", None, get=_api(ages, sums))

    def order(view: View) -> list[str]:
        return [str(j["job"]) for j in ordered(snap.jobs, snap.summaries, view)]

    assert order(View()) == ["alpha", "beta", "gamma", "delta"]
    mfu = View().press("m")
    assert mfu.sort is SortBy.MFU and order(mfu) == ["beta", "gamma", "alpha", "delta"]
    assert order(mfu.press("m")) == ["alpha", "gamma", "beta", "delta"]
    assert mfu.press("m").press("m") == View()
    assert order(View().press("g")) == ["gamma", "alpha", "beta", "delta"]
    assert order(View().press("i")) == ["gamma", "beta", "alpha", "delta"]
    assert order(View().press("i").press("i")) == ["alpha", "beta", "gamma", "delta"]  # delta: none said
    screen = _screen_of(snap, mfu)
    rows = [ln.split("│")[1].strip().rstrip(" *") for ln in screen.splitlines()
            if ln.startswith("│") and ln.split("│")[1].strip().rstrip(" *") in ages]
    assert rows == ["beta", "gamma", "alpha", "delta"]
    assert "jobs sorted by MFU, lowest first" in screen
    assert "keys" not in screen.split("\n", 1)[0]  # no terminal: no keys said
    helped = _screen_of(snap, mfu.press("?"))
    for keys, what in HELP:
        assert keys in helped and what in helped
    assert "sort by MFU, lowest first" not in _screen_of(snap, mfu.press("?").press("?"))


def _screen_of(snap: top.Snapshot, view: Any) -> str:
    console = Console(width=250, file=io.StringIO(), color_system=None)
    console.print(top.render(snap, view=view))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out
