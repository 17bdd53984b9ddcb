"""The ncu commands as a person runs them: `perfd analyze ncu` on the recorded exports (tests/data/ncu),
`perfd ncu-prefix` / `perfd ncu-exec` putting only the chosen rank under ncu (a stand-in ncu binary that
records its argv and runs the command, as ncu does while profiling is off), and `perfd launch --ncu`.

What a command prints and its exit status come from the CLI's main() in the test's process
(tests/cli_main.py; the environment it is given set by monkeypatch). A command that reads a recorded
Kineto trace runs in the test's process too, the trace read and analysed once a session
(tests/trace_cache.perfd_cli): what it concludes from the trace is the same, 5-10 s of CPU a run less.
Processes stay where the process is the subject: `perfd ncu-exec` execs ncu (the rank's process becomes
ncu, then the command: the pid said is the command's), what ncu-prefix printed run as torchrun runs it,
a real shell's splitting and globbing of it, and `perfd launch --ncu` starting its job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from perfd.capture.ncu_exec import (
    NCU_ARMED_US_PER_LAUNCH,
    NCU_ARMED_US_PER_LAUNCH_HIGH,
    SECTIONS,
    read_target,
)
from perfd.capture.store import CaptureStore
from perfd.core.armed import ARMED_ENV, armed_rank
from tests.capture.test_ncu_capture import calls, make_fake_ncu, megatron_device
from tests.cli_main import Ran
from tests.cli_main import perfd as run_perfd
from tests.trace_cache import perfd_cli

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
MLP = DATA / "ncu" / "h100_mlp_sol_details_5.csv"
BIG = DATA / "captures" / "kineto_h100_megatron" / "big_rank0.json.gz"
PP2 = DATA / "captures" / "megatron_pp2_nsys_h200x2.analysis.json"
PY_PID = [sys.executable, "-c", "import os; print('pid', os.getpid())"]


def perfd_process(*args: str | Path, env: dict[str, str] | None = None,
                  **extra: str) -> subprocess.CompletedProcess[str]:
    """``perfd ARGS`` as a process of its own: for the commands that exec or start one."""
    e = {**(env if env is not None else os.environ), "PYTHONPATH": str(ROOT), **extra}
    return subprocess.run([sys.executable, "-m", "perfd.app.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env=e)


@pytest.fixture
def perfd(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    """``perfd ARGS`` by the CLI's main() in this process, ``extra`` set in its environment for the run
    (monkeypatch's context puts the environment back after it)."""
    def run(*args: str | Path, **extra: str) -> Ran:
        with monkeypatch.context() as m:
            for k, v in extra.items():
                m.setenv(k, v)
            return run_perfd(capsys, *args)
    return run


def no_ncu_env(tmp: Path) -> dict[str, str]:
    """An environment where ncu cannot be found (no PERFD_NCU; a PATH without ncu; and the machines here
    have no /opt/nvidia/nsight-compute)."""
    env = {k: v for k, v in os.environ.items() if k != "PERFD_NCU"}
    env["PATH"] = str(Path(sys.executable).parent)
    return env


def no_ncu(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's environment as no_ncu_env makes one, until the test ends."""
    monkeypatch.delenv("PERFD_NCU", raising=False)
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))


@pytest.mark.slow
def test_analyze_ncu_text_and_json(perfd):
    r = perfd("analyze", "ncu", MLP)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("5 kernels, 5 launches profiled (pages: details); SM clock while profiled "
                               "1.58 GHz")
    assert "memory-bound" in r.stdout
    assert "[normalization] void at::<unnamed>::vectorized_layer_norm" in r.stdout
    j = perfd("analyze", "ncu", MLP, "--json")
    out = json.loads(j.stdout)
    assert len(out["kernels"]) == 5 and out["pages"] == ["details"] and out["truncated"] is False
    assert {c["category"] for c in out["categories"]} >= {"gemm", "normalization"}
    assert all(k["match"] == "none" and k["captured_share"] is None for k in out["kernels"])


def test_analyze_ncu_reads_a_compressed_export_as_the_plain_one(tmp_path):
    """Exports are kept compressed (tests/data/ncu's are gzipped): `analyze ncu` reads gzip and xz by their
    first bytes, whatever the file is called, and concludes what it does from the plain text."""
    import gzip
    import lzma

    gz = DATA / "ncu" / "h100_workflow_run2_rank0_details.csv.gz"
    plain, xz = tmp_path / "details.csv", tmp_path / "details.export"
    plain.write_bytes(gzip.decompress(gz.read_bytes()))
    xz.write_bytes(lzma.compress(plain.read_bytes()))
    runs = [perfd_cli("analyze", "ncu", f, "--json") for f in (plain, gz, xz)]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    assert runs[0].stdout == runs[1].stdout == runs[2].stdout
    assert json.loads(runs[0].stdout)["launches"] == 72  # the range as recorded (tests/data/ncu/README.md)


@pytest.mark.slow
def test_analyze_ncu_joined_to_a_capture():
    """The ncu rows of the MLP loop against the real Megatron-LM Kineto capture: the GELU, the bf16 add
    and the layer norm are kernels both ran; the shares come from the capture."""
    j = perfd_cli("analyze", "ncu", MLP, "--capture", BIG, "--json")
    assert j.returncode == 0, j.stderr
    out = json.loads(j.stdout)
    matched = [k for k in out["kernels"] if k["match"] != "none"]
    assert matched and all(k["captured_share"] is not None for k in matched)
    gemm = next(c for c in out["categories"] if c["category"] == "gemm")
    assert gemm["captured_share"] == pytest.approx(megatron_device()["categories"]["gemm"])
    t = perfd_cli("analyze", "ncu", MLP, "--capture", BIG)
    assert "% of the captured time" in t.stdout and "(joined to big_rank0.json.gz)" in t.stdout


@pytest.mark.slow
@pytest.mark.parametrize(("make", "code", "why"), [
    (lambda d: d / "missing.csv", 2, "no such file"),
    (lambda d: DATA / "ncu" / "h100_probe_console.txt", 1, "no ncu CSV header"),
    (lambda d: (d / "empty.csv", (d / "empty.csv").write_text(""))[0], 1, "empty input"),
    (lambda d: (d / "r.ncu-rep", (d / "r.ncu-rep").write_bytes(b"\x00NCU"))[0], 1,
     "is an ncu report and reading it needs the ncu binary: ncu not found"),
    (lambda d: (d / "cut.csv.gz", (d / "cut.csv.gz").write_bytes(
        (DATA / "ncu" / "h100_workflow_run2_rank0_details.csv.gz").read_bytes()[:100]))[0], 1,
     "Compressed file ended before the end-of-stream marker"),  # a cut archive: gzip's own words
])
def test_analyze_ncu_refuses_what_it_cannot_read(tmp_path, make, code, why, perfd, monkeypatch):
    no_ncu(monkeypatch)
    r = perfd("analyze", "ncu", make(tmp_path))
    assert r.returncode == code and why in r.stderr and r.stdout == ""
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_analyze_ncu_report_through_the_ncu_binary(tmp_path, perfd):
    exe, state = make_fake_ncu(tmp_path)
    rep = tmp_path / "rank0.ncu-rep"
    rep.write_text(json.dumps({"details": str(MLP), "raw": str(MLP)}))  # the stand-in report
    r = perfd("analyze", "ncu", rep, "--json", PERFD_NCU=str(exe))
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["kernels"]) == 5
    assert [c[-1] for c in calls(state)] == ["details", "raw"]
    bad = perfd("analyze", "ncu", MLP, "--capture", tmp_path / "nope.json")
    assert bad.returncode == 1 and "cannot read the capture" in bad.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_ncu_exec_puts_only_the_chosen_rank_under_ncu(tmp_path, perfd, monkeypatch):
    exe, state = make_fake_ncu(tmp_path)
    caps = tmp_path / "caps"
    args = ("ncu-exec", "--job", "j1", "--ranks", "1,3", "--capture-dir", caps, "--", *PY_PID)
    r = perfd_process(*args, RANK="1", PERFD_NCU=str(exe))
    assert r.returncode == 0, r.stderr
    pid = int(r.stdout.split()[-1])
    t = read_target(caps, "j1", 1)
    assert t is not None and t.pid == pid  # exec: the command is the process ncu-exec was
    # the line it leaves on the job's standard error reads back as the rank it armed (perfd.core.armed)
    assert [n for n in map(armed_rank, r.stderr.splitlines()) if n is not None] == [1]
    (argv,) = calls(state)
    assert argv[:4] == ["--profile-from-start", "off", "--target-processes", "all"]
    assert argv[argv.index("--launch-count") + 1] == "40"
    assert argv[argv.index("--kernel-name") + 1] == "regex:^([^n]|n[^c]|nc[^c]|ncc[^l])"
    assert argv[argv.index("--clock-control") + 1] == "none"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--section"] == list(SECTIONS)
    assert argv[argv.index("-o") + 1] == str(caps / "ncu" / "perfd-j1" / "rank1") and argv[-3:] == PY_PID
    # not chosen: the command itself, nothing recorded
    r = perfd_process(*args, RANK="2", PERFD_NCU=str(exe))
    assert r.returncode == 0 and len(calls(state)) == 1 and read_target(caps, "j1", 2) is None
    # The refusals come before any exec: in this process. The chosen rank's run sets the armed variable
    # in the environment it execs with; monkeypatch takes it back should a refusal come after it.
    monkeypatch.delenv(ARMED_ENV, raising=False)
    assert perfd(*args, RANK="x", PERFD_NCU=str(exe)).returncode == 2
    r = perfd("ncu-exec", "--job", "j1", "--ranks", "1", RANK="1", PERFD_NCU=str(exe))
    assert r.returncode == 2 and "no command" in r.stderr
    no_ncu(monkeypatch)
    r = perfd(*args, RANK="1")
    assert r.returncode == 2 and "ncu not found" in r.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_ncu_prefix_with_a_filter_from_the_latest_capture(tmp_path, perfd):
    exe, state = make_fake_ncu(tmp_path)
    caps = tmp_path / "caps"
    plain = perfd("ncu-prefix", "--job", "j1", "--ranks", "1", "--capture-dir", caps, PERFD_NCU=str(exe))
    assert plain.returncode == 0, plain.stderr
    words = plain.stdout.split()
    assert words[words.index("--ranks") + 1] == "1" and words[-1] == "--" and "--kernel-filter" not in words
    store = CaptureStore(caps, 10**8)
    m = store.new_capture("j1", (0,), "kineto")
    dev = megatron_device()
    m["analysis"] = {"0": {"devices": [dev]}}
    m["steps"] = {"start": 10, "count": 3}
    store.finish(m, "ok")
    r = perfd("ncu-prefix", "--job", "j1", "--ranks", "1", "--capture-dir", caps, "--kernels-from", "latest",
              "--top", "4", PERFD_NCU=str(exe))
    assert r.returncode == 0, r.stderr
    assert f"kernel filter from capture {m['id']}" in r.stderr
    # What arming ncu will cost, from the capture's kernel launches per step (measured per launch).
    per_step = int(dev["kernel_count"]) / 3
    assert f"launched ~{per_step:.0f} kernels a step" in r.stderr
    low, high = per_step * NCU_ARMED_US_PER_LAUNCH / 1e3, per_step * NCU_ARMED_US_PER_LAUNCH_HIGH / 1e3
    assert f"+{low:.0f} to +{high:.0f} ms of host time per step" in r.stderr
    flt = bytes.fromhex(r.stdout.split()[r.stdout.split().index("--kernel-filter-hex") + 1]).decode()
    assert flt == ("regex:^(nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT|nvjet_sm90_tst_256x128_64x4_1x2_"
                   "h_bz_coopA_NNT|nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NTT|elementwise_kernel)$")
    # what it printed runs: rank 1 goes under ncu with that filter
    run = subprocess.run([*r.stdout.split(), *PY_PID], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "RANK": "1", "PERFD_NCU": str(exe)})
    assert run.returncode == 0, run.stderr
    argv = calls(state)[-1]
    assert argv[argv.index("--kernel-name") + 1] == flt
    f = perfd("ncu-prefix", "--job", "j1", "--kernels-from", PP2, "--capture-dir", caps, PERFD_NCU=str(exe))
    flt = bytes.fromhex(f.stdout.split()[f.stdout.split().index("--kernel-filter-hex") + 1]).decode()
    assert "nccl" not in flt.lower() and "vectorized_elementwise_kernel" in flt  # the PP=2 nsys analysis
    none = perfd("ncu-prefix", "--job", "other", "--kernels-from", "latest", "--capture-dir", caps,
                 PERFD_NCU=str(exe))
    assert none.returncode == 0 and "no Kineto/nsys capture of job other" in none.stderr
    # an empty trace (the profiler recorded nothing) names no kernel: no filter, said, the prefix printed
    empty = ROOT / "tests" / "data" / "captures" / "kineto_empty_cpu" / "trace.json"
    bare = perfd("ncu-prefix", "--job", "j1", "--kernels-from", empty, "--capture-dir", caps,
                 PERFD_NCU=str(exe))
    assert bare.returncode == 0 and f"{empty} holds no kernel" in bare.stderr, bare.stderr
    assert "--kernel-filter-hex" not in bare.stdout.split() and bare.stdout.split()[-1] == "--"


@pytest.mark.e2e
@pytest.mark.slow
def test_ncu_prefix_output_is_neither_split_nor_globbed_by_the_shell(tmp_path):
    """The filter was once printed as it is, and ``regex:.*`` under $(...) became the file
    names of the folder the job started in. A real shell runs what ncu-prefix printed, in a folder of
    files, for a job whose name has a space and a slash: the chosen rank gets the filter and the name
    as they were given."""
    exe, state = make_fake_ncu(tmp_path)
    caps, work = tmp_path / "caps", tmp_path / "work"
    work.mkdir()
    for name in ("a.txt", "regex:.my_gemm.cu"):  # what regex:.*gemm.* globs to, unquoted
        (work / name).write_text("")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": "1", "PERFD_NCU": str(exe)}
    prefix = (f'$({sys.executable} -m perfd.app.cli ncu-prefix --job "team a/b" --ranks 1 '
              f'--kernel-filter "regex:.*gemm.*" --capture-dir {caps})')
    shown = subprocess.run(["sh", "-c", f'cd {work} && for w in {prefix}; do echo "$w"; done'],
                           capture_output=True, text=True, timeout=120, env=env)
    words = shown.stdout.split("\n")
    assert shown.returncode == 0 and "regex:.my_gemm.cu" not in words, shown.stdout
    assert bytes.fromhex(words[words.index("--kernel-filter-hex") + 1]).decode() == "regex:.*gemm.*"
    run = subprocess.run(["sh", "-c", f"cd {work} && {prefix} {' '.join(PY_PID[:2])} "
                          "'import os; print(\"pid\", os.getpid())'"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr
    argv = calls(state)[-1]
    assert argv[argv.index("--kernel-name") + 1] == "regex:.*gemm.*"
    t = read_target(caps, "team a/b", 1)
    assert t is not None and t.job == "team a/b"


@pytest.mark.slow
@pytest.mark.parametrize(("args", "why"), [
    (("--launch-count", "500", "--time-budget", "60"), "500 kernels take about 455 s"),
    (("--ranks", "a"), "comma-separated integers"),
    (("--kernel-filter", "regex:a b"), "one word"),
])
def test_ncu_prefix_refuses_a_budget_out_of_bounds(tmp_path, args, why, perfd):
    exe, _ = make_fake_ncu(tmp_path)
    r = perfd("ncu-prefix", "--job", "j1", *args, PERFD_NCU=str(exe))
    assert r.returncode == 2 and why in r.stderr and r.stdout == ""


@pytest.mark.e2e
@pytest.mark.slow
def test_launch_ncu_wraps_one_process_and_refuses_torchrun(tmp_path, perfd):
    exe, state = make_fake_ncu(tmp_path)
    caps = tmp_path / "caps"
    r = perfd_process("launch", "--job", "j1", "--run-dir", tmp_path / "run", "--agent-socket",
                      tmp_path / "h.sock", "--ncu", "0", "--ncu-launch-count", "12", "--ncu-capture-dir",
                      caps, "--", *PY_PID, PERFD_NCU=str(exe))
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "run" / "launch.json").read_text())
    assert manifest["ncu"]["ranks"] == [0] and manifest["ncu"]["launch_count"] == 12
    assert manifest["command"][3:5] == ["ncu-exec", "--job"]
    (argv,) = calls(state)
    assert argv[argv.index("--launch-count") + 1] == "12" and argv[-3:] == PY_PID
    t = read_target(caps, "j1", 0)
    assert t is not None and t.options.launch_count == 12 and f"pid {t.pid}" in r.stdout
    sock = tmp_path / "h.sock"
    bad = perfd("launch", "--job", "j1", "--run-dir", tmp_path / "run2", "--agent-socket", sock,
                "--ncu", "0", "--", "torchrun", "--nproc-per-node", "2", "train.py", PERFD_NCU=str(exe))
    assert bad.returncode == 2 and "after torchrun --no-python" in bad.stderr
    both = perfd("launch", "--job", "j1", "--run-dir", tmp_path / "run3", "--agent-socket", sock,
                 "--ncu", "0", "--nsys", "s", "--", *PY_PID, PERFD_NCU=str(exe), PERFD_NSYS=str(exe))
    assert both.returncode == 2 and "one CUPTI client per process" in both.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_ncu_prefix_chooses_the_kernels_by_time_by_default_and_says_which_way(tmp_path, perfd):
    """With no filter given, ncu-prefix takes the job's latest timeline (any rank's)
    and names the top kernels by time; the chosen rank's target and its captures say how they were
    chosen. Without a timeline it says the kernels are the first launched, not chosen by time."""
    exe, _ = make_fake_ncu(tmp_path)
    caps = tmp_path / "caps"
    first = perfd("ncu-prefix", "--job", "j1", "--ranks", "1", "--capture-dir", caps, PERFD_NCU=str(exe))
    assert first.returncode == 0 and "the first kernels launched, not by time" in first.stderr
    assert "--kernels-chosen-from" not in first.stdout.split()
    store = CaptureStore(caps, 10**8)
    m = store.new_capture("j1", (0,), "kineto")  # rank 0's timeline: rank 1 is the one armed
    m["analysis"] = {"0": {"devices": [megatron_device()]}}
    m["steps"] = {"start": 10, "count": 3}
    store.finish(m, "ok")
    r = perfd("ncu-prefix", "--job", "j1", "--ranks", "1", "--capture-dir", caps, "--top", "4",
              PERFD_NCU=str(exe))
    assert r.returncode == 0, r.stderr
    assert f"kernel filter from capture {m['id']}" in r.stderr and "(the top kernels by time)" in r.stderr
    words = r.stdout.split()
    assert words[words.index("--kernels-chosen-from") + 1] == m["id"]
    run = subprocess.run([*words, *PY_PID], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "RANK": "1", "PERFD_NCU": str(exe)})
    assert run.returncode == 0, run.stderr
    t = read_target(caps, "j1", 1)
    assert t is not None and t.options.kernels_from == m["id"]
    choice = t.options.choice_json()
    assert choice["how"] == "timeline" and choice["text"].startswith("by time")
    opt_out = perfd("ncu-prefix", "--job", "j1", "--ranks", "1", "--capture-dir", caps,
                    "--kernels-from", "none", PERFD_NCU=str(exe))
    assert opt_out.returncode == 0 and "--kernel-filter-hex" not in opt_out.stdout.split()


@pytest.mark.e2e
@pytest.mark.slow
def test_ncu_prefix_chooses_a_window_over_one_layers_forward_and_backward(tmp_path):
    """With the capture's trace on disk, the filter by time and a launch window (ncu's
    --launch-skip and --launch-count) that covers the forward and backward of the stage's last layer
    (they run back to back around the loss), said on stderr and carried to ncu and the target."""
    import shutil

    from tests.trace_cache import analyze_chrome_trace

    exe, state = make_fake_ncu(tmp_path)
    caps = tmp_path / "caps"
    store = CaptureStore(caps, 10**9)
    m = store.new_capture("j1", (0,), "kineto")
    trace = store.capture_dir(m["id"]) / "rank0_504.json.gz"
    shutil.copyfile(DATA / "captures" / "kineto_h100_megatron" / "ops_default_rank0.json.gz", trace)
    store.add_artifact(m, trace, "kineto_trace", 0, 504)
    m["analysis"] = {"0": analyze_chrome_trace(trace).to_json()}
    m["steps"] = {"start": 14, "count": 3}
    store.finish(m, "ok")
    r = perfd_cli("ncu-prefix", "--job", "j1", "--ranks", "0", "--capture-dir", caps, PERFD_NCU=str(exe))
    assert r.returncode == 0, r.stderr
    assert "launch window: skip" in r.stderr and "the forward and backward of layer 12 of 12" in r.stderr
    words = r.stdout.split()
    skip, count = int(words[words.index("--launch-skip") + 1]), int(words[words.index("--launch-count") + 1])
    assert skip > 0 and 40 < count < 120 and words[words.index("--window-layer") + 1] == "12"
    run = subprocess.run([*words, *PY_PID], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "RANK": "0", "PERFD_NCU": str(exe)})
    assert run.returncode == 0, run.stderr
    argv = calls(state)[-1]
    assert argv[argv.index("--launch-skip") + 1] == str(skip)
    assert argv[argv.index("--launch-count") + 1] == str(count)
    t = read_target(caps, "j1", 0)
    assert t is not None and (t.options.launch_skip, t.options.window_layer) == (skip, 12)
    assert "the forward and backward of layer 12 of 12" in t.options.choice_json()["text"]


@pytest.mark.slow
def test_analyze_ncu_with_a_trace_of_another_run_says_its_launches_are_unmatched():
    details = DATA / "ncu" / "h100_megatron_rank0_details.csv"
    r = perfd_cli("analyze", "ncu", details, "--csv", DATA / "ncu" / "h100_megatron_rank0_raw.csv",
              "--capture", DATA / "captures" / "kineto_h100_megatron" / "ops_default_rank0.json.gz", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["coverage"]["how"] == "none" and out["coverage"]["launches"] == 40
    assert all(k["match"] != "launch" for k in out["kernels"])  # the name join, as before


def test_a_trace_given_is_read_once_for_its_kernels_and_its_launches(tmp_path, monkeypatch, capsys):
    """`ncu-prefix --kernels-from TRACE` chooses the kernels from the trace's analysis and the launch
    window from its launches; `analyze ncu --capture TRACE` joins by time and by launch: each reads (and
    parses) the trace once. Run in this process on a small recorded trace, the reads counted."""
    from perfd.app.cli import main
    from perfd.capture import chrome_trace

    parsed: list[str] = []
    parse = chrome_trace.parse_chrome_trace

    def counted(doc: object, source: str = "") -> object:
        parsed.append(source)
        return parse(doc, source)

    monkeypatch.setattr(chrome_trace, "parse_chrome_trace", counted)
    tiny = DATA / "captures" / "kineto_h100_megatron" / "tiny_rank0.json.gz"
    exe, _ = make_fake_ncu(tmp_path)
    monkeypatch.setenv("PERFD_NCU", str(exe))
    code = main(["ncu-prefix", "--job", "j1", "--ranks", "0", "--capture-dir", str(tmp_path / "caps"),
                 "--kernels-from", str(tiny)])
    r = capsys.readouterr()
    assert code == 0, r.err
    assert "ncu-exec" in r.out and "--kernels-chosen-from tiny_rank0.json" in r.out
    assert "launch window" in r.err  # chosen, or why none: from the launches of the events read
    assert parsed == [str(tiny)], r.err
    parsed.clear()
    code = main(["analyze", "ncu", str(MLP), "--capture", str(tiny), "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert json.loads(out.out)["coverage"] is not None  # the launch join ran (on the events read)
    assert parsed == [str(tiny)]
