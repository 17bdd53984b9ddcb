"""`perfd demo`: the whole live pipeline on one machine, fed with recorded real data.

Starts a real `perfd aggregator` and a real `perfd agent` (separate processes, loopback gRPC),
writes a real Megatron-LM log into a file at the pace of its own timestamps (the agent tails it
as it grows), has the agent replay a real NVML recording, shows live progress, and ends with the
job report as the aggregator computed it. Everything replayed is labelled so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import FrameType

from rich.console import Console
from rich.live import Live
from rich.table import Table

from perfd.analytics.breakdown.advice_registry import PART, Grade
from perfd.analytics.breakdown.job_budget import budget_comm
from perfd.analytics.breakdown.step_parts import Part
from perfd.analytics.run.run_grade import explain_grade
from perfd.core.typed import obj, objs
from perfd.report import render_text
from perfd.report.training_report import Report
from perfd.report.units import tflops

DATA = Path(__file__).resolve().parent / "data"
DEMO_LOG = DATA / "megatron_h200x2_tp1_pp2.log"
JOB = "demo-gpt-pp2"
_TS = re.compile(r"^ \[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)\] iteration")


def default_nvml_recording() -> Path | None:
    """The real NVML recording shipped with the nvml collector (package data)."""
    import perfd.collectors.nvml

    rec_dir = Path(perfd.collectors.nvml.__file__).resolve().parent / "data"
    found = sorted(rec_dir.glob("*.jsonl")) if rec_dir.is_dir() else []
    return found[0] if found else None


def gpu_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        n = int(pynvml.nvmlDeviceGetCount())
        pynvml.nvmlShutdown()
        return n > 0
    except Exception:  # no library, no driver, no GPU: all mean "no"
        return False


def paced_chunks(lines: list[str], speed: float) -> Iterator[tuple[float, str]]:
    """(delay before writing, text) chunks: everything up to an iteration line, written when the
    original log printed that line (its timestamp), sped up ``speed`` times."""
    prev: datetime | None = None
    buf: list[str] = []
    for line in lines:
        m = _TS.match(line)
        if m:
            ts = datetime.fromisoformat(m.group(1))
            delay = 0.0 if prev is None else max(0.0, (ts - prev).total_seconds()) / speed
            prev = ts
            yield delay, "".join(buf)
            buf = []
        buf.append(line)
    yield 0.0, "".join(buf)


def _get_json(url: str) -> Mapping[str, object]:
    """The aggregator's JSON object at ``url`` (ValueError: not JSON, or not an object)."""
    with urllib.request.urlopen(url, timeout=3) as r:
        got = json.loads(r.read())
    if not isinstance(got, Mapping):
        raise ValueError(f"{url}: a JSON {type(got).__name__}, not an object")
    return got


def _spawn(args: list[str], out: Path) -> subprocess.Popen[bytes]:
    """A daemon of the demo, run in the demo's own folder: ``python -m`` puts its working directory
    first on sys.path, and a folder holding a ``perfd/`` directory that is not the package (the
    folder above a clone named perfd: the clone's root) made ``import perfd`` find that instead
    (an ImportError traceback, and no demo). Every path in ``args`` is absolute."""
    return subprocess.Popen([sys.executable, "-m", "perfd.app.cli", *args], cwd=out.parent,
                            stdout=out.open("wb"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _pct(v: object) -> str:
    return f"{100 * v:.1f}%" if isinstance(v, int | float) else "—"


def _num(v: object, fmt: str = "{:.1f}") -> str:
    return "—" if v is None else fmt.format(v)


def _tflops(it: Mapping[str, object], key: str) -> str:
    v = _share(it, key)
    return "—" if v is None else tflops(v)


# Rows of the live table: the newest iterations (every one reaches the plain output and the report).
TABLE_ROWS = 10


def warmup_note(it: Mapping[str, object]) -> str:
    """Why an iteration is left out of the steady-state figures (warm-up, a capture), or "" (its
    code said with the legend's words: :func:`_iterations`)."""
    why = it.get("excluded_text") or it.get("excluded")
    if why:
        return f"{why}: left out of the steady-state figures"
    return "" if it.get("steady_state", True) else "not steady yet: left out of the steady-state figures"


def _share(it: Mapping[str, object], key: str) -> float | None:
    v = it.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def staged(it: Mapping[str, object]) -> bool:
    """Whether an iteration's job has pipeline stages (its rows time a bubble or p2p waits)."""
    return bool(_share(it, "pp_bubble_analytic")) or _share(it, "comm_exposed_pp_share") is not None


def exposed_comm(it: Mapping[str, object]) -> float | None:
    """An iteration's exposed communication as the step budget books it (job_budget.budget_comm): with
    pipeline stages its p2p waits are the pipeline's wait, not communication."""
    return budget_comm(_share(it, "comm_exposed_share"), _share(it, "comm_exposed_dp_share"),
                       _share(it, "comm_exposed_pp_share"), staged(it))


# The budget's names of its parts, for the same figures an iteration shows
COMM, PIPELINE = PART[Part.COMM_EXPOSED].name, PART[Part.PIPELINE].name


def iteration_line(it: Mapping[str, object]) -> str:
    note = warmup_note(it)
    pipe = f"{PIPELINE} {_pct(it.get('pp_idle_max'))}, " if staged(it) else ""
    return (f"iteration {it['iteration']}: step {_num(it.get('step_time_ms'))} ms, "
            f"MFU {_pct(it.get('mfu'))}, {COMM} {_pct(exposed_comm(it))}, {pipe}"
            f"bottleneck {it.get('bottleneck')}"
            + (f"  [{note}]" if note else ""))


def gpu_caption(gpus: list[dict[str, str]], nvml: str) -> str:
    """The GPU line, saying plainly when it is a recording of another run and not this job's GPUs."""
    if not gpus:
        return ""
    if nvml.startswith("replay:"):
        head = (f"GPU panel: a RECORDING of another run ({Path(nvml[7:]).name}: an NVIDIA GPU running test "
                "kernels), replayed beside this job's log to show the GPU view; it is not this job's GPUs")
    else:
        head = "GPU panel: this machine's GPUs, live"
    return head + "".join(f"\n  GPU {g['gpu']} {g.get('model', '')}: {g['text']}" for g in gpus)


def nvml_used(nvml: str, sources: Sequence[Mapping[str, object]], gpus: Sequence[Mapping[str, str]]) -> str:
    """What the GPU panel was, for the demo's last line: the recording, off, or with ``--nvml real``
    what the agent's NVML said in its Hello (the aggregator's ``gpu_sources``): this machine's GPUs, or
    NVML unavailable (and why), and so no GPU counters at all."""
    if nvml.startswith("replay:"):
        return f"a recording of another run ({Path(nvml[7:]).name})"
    if nvml != "real":
        return "off"
    said = [str(x) for src in sources if (x := src.get("nvml"))]
    down = next((x for x in said if x.startswith("unavailable")), None)
    if down is not None and not gpus:
        why = down.removeprefix("unavailable").lstrip(": ")
        return (f"unavailable ({why or 'no reason given'}): no GPU counters were read, nor a recording "
                "replayed; the report is from the log alone")
    if gpus:
        return "this machine's GPUs, live"
    return "real asked for, but no GPU series reached the aggregator: the report is from the log alone"


def _progress_table(iterations: Sequence[Mapping[str, object]], stats: Mapping[str, object] | None,
                    gpus: list[dict[str, str]], nvml: str) -> Table:
    t = Table(title=f"perfd demo — job {JOB} (REPLAY of a recorded 2×H200 Megatron-LM run; the newest "
              f"{TABLE_ROWS} iterations)", title_justify="left")
    for col in ("iteration", "step ms", "TFLOP/s/GPU (perfd | logged)", "MFU", COMM,
                f"{PIPELINE} (stage idle max | analytic bubble)", "data wait", "bottleneck", "note"):
        t.add_column(col)
    for it in iterations[-TABLE_ROWS:]:
        t.add_row(str(it.get("iteration")), _num(it.get("step_time_ms")),
                  f"{_tflops(it, 'model_tflops_per_gpu')} | {_tflops(it, 'logged_tflops_per_gpu')}",
                  _pct(it.get("mfu")), _pct(exposed_comm(it)),
                  f"{_pct(it.get('pp_idle_max'))} | {_pct(it.get('pp_bubble_analytic'))}",
                  _pct(it.get("data_share")), str(it.get("bottleneck")), warmup_note(it))
    if not iterations:
        t.add_row("waiting for the first iteration…", *[""] * 8)
    if stats:
        t.caption = (f"aggregator: {stats.get('samples_ingested', 0)} samples, "
                     f"{stats.get('step_records_ingested', 0)} step records ingested, "
                     f"{obj(stats.get('transport')).get('agents_connected', 0)} agent(s) connected"
                     + (f"\n{gpu_caption(gpus, nvml)}" if gpus else ""))
        t.caption_justify = "left"
    return t


def reading_notes(summary: Mapping[str, object], nvml: str) -> list[str]:
    """What a first reader of the demo's report needs beside it, each from what the report printed: its
    status line's MFU band set against the step budget's data wait and exposed communication, where the
    matmul ceiling comes from, what the GPU panel was."""
    s = obj(summary.get("summary"))
    med = obj(s.get("medians"))
    report = obj(summary.get("report"))
    budget = obj(report.get("step_budget"))
    status = obj(report.get("summary")).get("status_text")
    shares = {str(p.get("part")): _share(p, "share") for p in objs(budget.get("parts"))}
    data, comm = shares.get(Part.DATA.value), shares.get(Part.COMM_EXPOSED.value)
    said = explain_grade(_share(med, "mfu"), data, comm)
    notes: list[str] = []
    if status and said.grade is Grade.SEVERE and said.small_data and said.small_comm:
        notes.append(
            f"The status line (\"{status}\") grades the MFU by its band. The step budget puts the "
            f"{PART[Part.DATA].name} at {_pct(data)} and the {COMM} at {_pct(comm)} of the step: neither "
            f"explains it here. What does: {s.get('bottleneck') or 'unknown'} — "
            f"{s.get('bottleneck_reason') or 'no reason given'}.")
    ceiling, peak = _share(budget, "ceiling_tflops"), _share(budget, "peak_tflops")
    if med.get("mfu_vs_measured_ceiling") is not None and ceiling and peak:
        notes.append(f"The {ceiling:g} TFLOP/s matmul ceiling is measured, not a datasheet figure: an 8192³ "
                     "bf16 matmul loop on the H200 and H100 SXM of the machines perfd is tested on "
                     f"(perfd/analytics/steps/gpus.py); MFU itself is against the {peak:g} TFLOP/s peak.")
    first = s.get("steady_first_iteration")
    if s.get("warmup_records"):
        notes.append(f"Iterations before {first} are warm-up (the first one includes start-up, compilation "
                     "and the first communicator set-up): shown, but left out of every steady-state figure.")
    if nvml.startswith("replay:"):
        notes.append("The GPU panel replayed a recording of another run (an NVIDIA GPU running test "
                     "kernels): it shows what the GPU view looks like, not this job's GPUs. "
                     "`perfd demo --nvml real` on a GPU machine shows its live counters.")
    return notes


def _iterations(base: str) -> list[dict[str, object]]:
    """The rows, each excluded one with its code in the legend's words (``excluded_text``)."""
    got = _get_json(f"{base}/api/jobs/{JOB}/iterations?sources=0")
    said = obj(obj(got.get("iteration_codes")).get("excluded"))
    rows = [dict(r) for r in objs(got.get("iterations"))]
    for r in rows:
        code = r.get("excluded")
        if isinstance(code, str) and code in said:  # (a JSON object's keys are strings)
            r["excluded_text"] = said[code]
    return rows


def _gpu_sources(gpus_json: Mapping[str, object]) -> list[Mapping[str, object]]:
    """What each agent's NVML said at start (the aggregator's ``gpu_sources``)."""
    got = gpus_json.get("gpu_sources")
    return objs(got) if isinstance(got, list) else []


def _gpu_rows(gpus_json: Mapping[str, object]) -> list[dict[str, str]]:
    """One line per GPU from the aggregator's /api/jobs/<job>/gpus."""
    want = {"perfd_gpu_utilization_ratio": "util", "perfd_gpu_sm_util_ratio": "SM",
            "perfd_gpu_tensor_util_ratio": "tensor", "perfd_gpu_dram_bw_util_ratio": "DRAM bw",
            "perfd_gpu_power_watts": "W"}
    rows: list[dict[str, str]] = []
    for g in objs(gpus_json.get("gpus")):
        vals = obj(g.get("values"))
        text = ", ".join(f"{v:.0f} W" if short == "W" else f"{short} {100 * v:.0f}%"
                         for n, short in want.items() if isinstance(v := vals.get(n), (int, float)))
        rows.append({"gpu": str(g.get("gpu", "?")), "model": str(g.get("model") or ""), "text": text})
    return rows


REPORT_QUIET_S = 15.0  # the report's wait: this long without a new iteration at the aggregator ...
REPORT_CAP_S = 120.0  # ... or this long in all


class Stopped(Exception):
    """SIGTERM or SIGHUP reached the demo: stop its aggregator and agent and remove its folder, as
    Ctrl-C does (without it `perfd demo --keep-running` killed by SIGTERM left both running and its
    /tmp folder behind: Python's default for SIGTERM ends the process without a `finally`)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum: int, _frame: FrameType | None) -> None:
    for s in (signal.SIGTERM, signal.SIGHUP):  # a second signal must not cut the clean-up short
        signal.signal(s, signal.SIG_IGN)
    raise Stopped(signum)


def run_demo(args: argparse.Namespace) -> int:
    handled = (signal.SIGTERM, signal.SIGHUP)
    before = {s: signal.signal(s, _raise_stopped) for s in handled}
    try:
        return _run_demo(args)
    except (Stopped, KeyboardInterrupt) as exc:  # cleaned up by _run_demo's finally on the way here
        signum = exc.signum if isinstance(exc, Stopped) else signal.SIGINT
        print(f"perfd demo: stopped ({signal.Signals(signum).name})", file=sys.stderr, flush=True)
        return 128 + int(signum)
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def _run_demo(args: argparse.Namespace) -> int:
    console = Console()
    speed = float(args.speed)
    nvml = args.nvml
    if nvml is not None and nvml.startswith("replay:"):  # the agent runs in the demo's folder
        nvml = "replay:" + str(Path(nvml[len("replay:"):]).expanduser().resolve())
    if nvml is None:
        rec = default_nvml_recording()
        nvml = f"replay:{rec}" if rec else "off"
    present = gpu_present()
    if nvml != "real" and present:
        console.print("[cyan]A GPU is present: `perfd demo --nvml real` shows its live NVML/GPM "
                      "counters instead of the recording.[/cyan]")
    if nvml == "real" and not present:
        console.print("[yellow]--nvml real: NVML reads no GPU here, so the demo runs without GPU counters "
                      "(without --nvml it replays a recording of a GPU instead).[/yellow]")
    work = Path(tempfile.mkdtemp(prefix="perfd-demo-"))
    ready = work / "aggregator.ready"
    agg = _spawn(["aggregator", "--grpc-host", "127.0.0.1", "--grpc-port", "0", "--http-host",
                  "127.0.0.1", "--http-port", "0", "--gpu", "NVIDIA H200", "--ready-file",
                  str(ready)], work / "aggregator.out")
    agent: subprocess.Popen[bytes] | None = None
    ok = False  # False: something failed, the folder is kept to show what
    try:
        deadline = time.monotonic() + 30
        while not (ready.exists() and ready.read_text().strip()):
            if agg.poll() is not None or time.monotonic() > deadline:
                console.print((work / "aggregator.out").read_text()[-2000:])
                console.print("[red]the aggregator did not start[/red]")
                return 1
            time.sleep(0.1)
        grpc_port, http_port = map(int, ready.read_text().split())
        base = f"http://127.0.0.1:{http_port}"
        log = work / "train.log"
        log.touch()
        # Captures (none is asked for, but the agent makes its folder) live in the demo's folder too.
        (work / "agent.yaml").write_text(json.dumps({"capture_dir": str(work / "captures")}))
        # Port 0 and a ready file, as for the aggregator: a port picked free here could be taken by
        # another program before the agent binds it.
        agent_ready = work / "agent.ready"
        agent = _spawn(["agent", "--config", str(work / "agent.yaml"), "--aggregator",
                        f"127.0.0.1:{grpc_port}", "--job", JOB, "--megatron-log", str(log), "--nvml", nvml,
                        "--metrics-port", "0", "--ready-file", str(agent_ready), "--node", "demo-node"],
                       work / "agent.out")
        deadline = time.monotonic() + 60
        while not agent_ready.exists():
            if agent.poll() is not None or time.monotonic() > deadline:
                console.print((work / "agent.out").read_text()[-2000:])
                console.print("[red]the agent did not start[/red]")
                return 1
            time.sleep(0.1)
        agent_port = int(agent_ready.read_text())
        console.print(f"aggregator: {base}/metrics and {base}/api/jobs   agent: "
                      f"http://127.0.0.1:{agent_port}/metrics   (while the demo runs"
                      f"{'' if args.keep_running else '; --keep-running keeps them up after'})")
        lines = DEMO_LOG.read_text().splitlines(keepends=True)
        summary: Mapping[str, object] | None = None
        stats: Mapping[str, object] | None = None
        gpus: list[dict[str, str]] = []
        sources: list[Mapping[str, object]] = []
        iterations: list[dict[str, object]] = []
        live_ok = console.is_terminal and not args.plain
        printed = 0  # plain mode: iterations printed so far (every one, in order)
        gpu_said = False

        def refresh() -> None:
            nonlocal summary, stats, gpus, sources, iterations
            with contextlib.suppress(OSError, ValueError):
                stats = _get_json(f"{base}/api/stats")
                summary = _get_json(f"{base}/api/jobs/{JOB}/summary")
                iterations = _iterations(base)
            with contextlib.suppress(OSError, ValueError):
                got = _get_json(f"{base}/api/jobs/{JOB}/gpus")
                gpus, sources = _gpu_rows(got), _gpu_sources(got)

        def show(live: Live | None) -> None:
            nonlocal printed, gpu_said
            if live is not None:
                live.update(_progress_table(iterations, stats, gpus, nvml))
                return
            if gpus and not gpu_said:
                print(gpu_caption(gpus, nvml), flush=True)
                gpu_said = True
            # Every iteration the aggregator holds, once, in order: several can arrive between two
            # refreshes (the log writes them in a burst), and none is skipped.
            for it in iterations[printed:]:
                print(iteration_line(it), flush=True)
            printed = max(printed, len(iterations))

        with Live(_progress_table([], None, [], nvml), console=console,
                  refresh_per_second=4, transient=False) if live_ok else contextlib.nullcontext() as live:
            for delay, chunk in paced_chunks(lines, speed):
                end = time.monotonic() + delay
                while time.monotonic() < end:
                    time.sleep(min(0.25, max(0.0, end - time.monotonic())))
                with log.open("a") as f:
                    f.write(chunk)
                refresh()
                show(live)
            # The last iteration is emitted once the log has been quiet for a moment. Waited for while
            # the aggregator moves (a loaded machine is slower, not stuck): QUIET_S without a new
            # iteration there, or CAP_S in all, and the demo says what it has.
            want_last = max(int(m.group(1)) for m in re.finditer(r"iteration\s+(\d+)/", "".join(lines)))
            start = time.monotonic()
            deadline, seen = start + REPORT_QUIET_S, None
            while time.monotonic() < deadline:
                refresh()
                show(live)
                last = obj(summary.get("overview")).get("last_iteration") if summary else None
                if last == want_last and iterations and iterations[-1].get("iteration") == want_last:
                    break
                if last != seen:
                    seen, deadline = last, min(start + REPORT_CAP_S, time.monotonic() + REPORT_QUIET_S)
                time.sleep(0.5)
        report = summary.get("report") if summary else None
        if not summary or not report or not isinstance(report, Mapping):
            console.print("[red]no report from the aggregator[/red]; agent output:")
            console.print((work / "agent.out").read_text()[-3000:])
            return 1
        # Plain print: the report is already wrapped, and rich would re-wrap it to the console.
        print()
        print(render_text(Report.from_json(report)), flush=True)
        notes = reading_notes(summary, nvml)
        if notes:
            print("\nReading this report:")
            for n in notes:
                print(f"- {n}")
        seen_n = obj(summary.get("overview")).get("iterations_seen")
        print(f"\n(replayed {seen_n} iterations through agent → gRPC → aggregator; NVML: "
              f"{nvml_used(nvml, sources, gpus)})",
              flush=True)
        if args.keep_running:
            console.print(f"aggregator and agent keep running: perfd top --aggregator {base}   "
                          f"(files in {work}); Ctrl-C (or SIGTERM) stops them and removes the files")
            with contextlib.suppress(KeyboardInterrupt, Stopped):
                while agg.poll() is None:
                    time.sleep(1)
        else:
            print("The aggregator and agent have stopped (their URLs above are closed). Next step, on your "
                  "own job: perfd analyze megatron train.log --gpu \"NVIDIA H200\" (a finished log), or "
                  "perfd aggregator + perfd agent --megatron-log train.log (live; README \"Using it\").",
                  flush=True)
        ok = True
        return 0
    except (Stopped, KeyboardInterrupt):
        ok = True  # stopped by the user, not failed: nothing to keep for a diagnosis
        raise
    finally:
        for p in (agent, agg):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in (agent, agg):
            if p is not None:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)
        # The run's files (log, process output) are the demo's own: gone with it, unless kept or
        # needed to see what failed.
        if getattr(args, "keep_files", False) or not ok:
            print(f"(files kept in {work})", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
