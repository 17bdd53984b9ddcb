"""`perfd launch`: real child processes (python -c ...), exit codes, signals, tee, manifest, env."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from perfd.agent.config import AgentConfig, ConfigError, apply_overrides
from perfd.app.launcher import LaunchError, LaunchOptions, plan_launch, run_launch
from perfd.core.manifest import load_manifest

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
pytestmark = pytest.mark.timeout(60)


def _run(tmp: Path, code: str, **kw: object) -> tuple[int, bytes, str, Path]:
    term, err = io.BytesIO(), io.StringIO()
    opts = LaunchOptions(command=["--", PY, "-c", textwrap.dedent(code)], job="t1", run_dir=str(tmp / "run"),
                         **kw)  # type: ignore[arg-type]
    rc = run_launch(opts, terminal=term, err=err)
    return rc, term.getvalue(), err.getvalue(), tmp / "run"


def test_exit_code_output_env_and_manifest(tmp_path: Path) -> None:
    rc, out, err, run = _run(tmp_path, """
        import json, os, sys
        keys = ["PERFD_JOB", "PERFD_HOOK_SOCKET", "TORCH_FR_DUMP_TEMP_FILE",
                "TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "TORCH_NCCL_ENABLE_TIMING", "TORCH_FR_BUFFER_SIZE",
                "PERFD_LAUNCH_MANIFEST"]
        print(json.dumps({k: os.environ.get(k) for k in keys}))
        print("to stderr", file=sys.stderr)
        sys.exit(3)
        """, flight_recorder=str(tmp_path / "fr"), fr_timing=True, agent_socket=str(tmp_path / "h.sock"),
        fr_buffer=5000)
    assert rc == 3
    env = json.loads(out.decode().splitlines()[0])
    assert env["PERFD_JOB"] == "t1" and env["PERFD_HOOK_SOCKET"] == str(tmp_path / "h.sock")
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == str(tmp_path / "fr" / "fr_dump_")
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == str(tmp_path / "fr" / "frp_")
    assert env["TORCH_NCCL_ENABLE_TIMING"] == "1" and env["TORCH_FR_BUFFER_SIZE"] == "5000"
    assert b"to stderr" in out  # stderr goes through the same pipe
    assert (run / "output.log").read_bytes() == out
    assert "143890" in err  # the timing cost note
    m = load_manifest(run / "launch.json")
    assert env["PERFD_LAUNCH_MANIFEST"] == str((run / "launch.json").resolve())
    assert m["status"] == "exited" and m["exit_code"] == 3 and m["job"] == "t1" and m["pid"] > 0
    assert m["flight_recorder"]["timing"] is True and "TORCH_NCCL_ENABLE_TIMING" in m["env_keys"]
    assert m["collectors"]["nccl"]["flight_recorder"]["dump_prefix"] == str(tmp_path / "fr" / "fr_dump_")
    assert m["collectors"]["hook"] == {"socket_path": str(tmp_path / "h.sock")}
    assert m["collectors"]["megatron"]["path"] == str(run / "output.log")


def test_timing_is_off_unless_asked(tmp_path: Path) -> None:
    plan = plan_launch(LaunchOptions(["true"], flight_recorder=str(tmp_path), run_dir=str(tmp_path / "r")))
    assert "TORCH_NCCL_ENABLE_TIMING" not in plan.env_set
    assert not any("TORCH_NCCL_ENABLE_TIMING" in n for n in plan.notes)


def test_framework_defaulted_fr_variables_are_set_unless_the_user_set_them(tmp_path: Path) -> None:
    """Megatron-LM fills every Flight Recorder variable it finds unset once a dump path is set,
    TORCH_INCLUDE_ONLY_ACTIVE=1 among them: perfd launch sets them first, and keeps the user's."""
    plan = plan_launch(LaunchOptions(["true"], flight_recorder=str(tmp_path), run_dir=str(tmp_path / "r"),
                                     fr_buffer=20000), environ={"TORCH_INCLUDE_STACK_TRACE": "0"})
    env = plan.env_set
    assert env["TORCH_INCLUDE_ONLY_ACTIVE"] == "0"
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == env["TORCH_FR_BUFFER_SIZE"] == "20000"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and env["TORCH_NCCL_EXTRA_DUMP_ON_EXEC"] == "0"
    assert "TORCH_INCLUDE_STACK_TRACE" not in env  # the user's value stays
    notes = "\n".join(plan.notes)
    assert "set TORCH_INCLUDE_ONLY_ACTIVE=0: Megatron-LM defaults it to 1" in notes
    assert "kept TORCH_INCLUDE_STACK_TRACE=0 from the environment" in notes
    assert plan.collectors("j")["nccl"]["flight_recorder"]["buffer_entries"] == 20000


TITAN = ["torchrun", "--nproc_per_node", "8", "-m", "torchtitan.train", "--model.name", "llama3"]


def test_torchtitan_dumps_where_perfd_reads_them(tmp_path: Path) -> None:
    """torchtitan overrides TORCH_FR_DUMP_TEMP_FILE with os.path.join(dump_folder, folder) + prefix
    and TORCH_FR_BUFFER_SIZE with its ring size (seen on the H100: the dumps went to
    dump/comm_traces/rank_0): launch appends its --comm.* flags so both are perfd's, and names the
    torchtitan collector for the log."""
    fr = tmp_path / "fr"
    plan = plan_launch(LaunchOptions(TITAN, flight_recorder=str(fr), run_dir=str(tmp_path / "r"),
                                     fr_buffer=3000))
    assert plan.argv[: len(TITAN)] == TITAN
    extra = dict(zip(plan.argv[len(TITAN)::2], plan.argv[len(TITAN) + 1 :: 2], strict=True))
    assert extra == {"--comm.save_traces_folder": str(fr.resolve()),
                     "--comm.save_traces_file_prefix": "fr_dump_", "--comm.trace_buf_size": "3000"}
    # what torchtitan does with them is what perfd's reader expects
    titan_dump = os.path.join("/any/dump_folder", extra["--comm.save_traces_folder"]) + "/" + \
        extra["--comm.save_traces_file_prefix"]
    collectors = plan.collectors("j")
    assert titan_dump == collectors["nccl"]["flight_recorder"]["dump_prefix"]
    assert "megatron" not in collectors and collectors["torchtitan"]["path"] == str(plan.log_path)
    assert any("torchtitan: appended --comm.save_traces_folder" in n for n in plan.notes)


def test_torchtitan_flags_the_user_gave_are_kept(tmp_path: Path) -> None:
    cmd = ["python", "/src/torchtitan/train.py", "--comm.save-traces-folder=traces"]
    plan = plan_launch(LaunchOptions(cmd, flight_recorder=str(tmp_path / "fr"), run_dir=str(tmp_path / "r")))
    assert plan.argv == [*cmd, "--comm.save_traces_file_prefix", "fr_dump_", "--comm.trace_buf_size", "2000"]
    assert any("kept the command's --comm.save_traces_folder" in n for n in plan.notes)
    # without --flight-recorder nothing is appended; any other command keeps Megatron-LM's collector
    plain = plan_launch(LaunchOptions(TITAN, run_dir=str(tmp_path / "p")))
    assert plain.argv == TITAN and "torchtitan" in plain.collectors("j")
    other = plan_launch(LaunchOptions(["python", "pretrain_gpt.py"], flight_recorder=str(tmp_path / "f2"),
                                      run_dir=str(tmp_path / "o")))
    assert other.argv == ["python", "pretrain_gpt.py"] and "megatron" in other.collectors("j")


def test_agent_reads_a_torchtitan_launch(tmp_path: Path) -> None:
    """The manifest of a torchtitan launch configures the agent's torchtitan collector; the model
    and dtype still come from the agent's own config."""
    from perfd.app.launcher import manifest_data
    from perfd.core.manifest import write_manifest

    opts = LaunchOptions(TITAN, job="tt", flight_recorder=str(tmp_path / "fr"), run_dir=str(tmp_path / "r"))
    plan = plan_launch(opts)
    write_manifest(plan.manifest_path, manifest_data(plan, opts, None, "starting", time.time()))
    cfg = AgentConfig(collectors={"torchtitan": {"dtype": "bf16", "model": {"num_layers": 2}}})
    cfg = apply_overrides(cfg, launch_manifest=str(plan.manifest_path), nvml="off", host=False)
    assert cfg.collectors["torchtitan"] == {"dtype": "bf16", "model": {"num_layers": 2},
                                            "path": str(plan.log_path),
                                            "line_times": str(plan.log_path) + ".times"}


def test_killed_by_sigterm_exits_143(tmp_path: Path) -> None:
    rc, out, _, run = _run(tmp_path, """
        import os, signal
        print("bye", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        """)
    assert rc == 128 + signal.SIGTERM
    assert out == b"bye\n"
    assert json.loads((run / "launch.json").read_text())["exit_code"] == 143


def test_tee_keeps_partial_lines_and_order(tmp_path: Path) -> None:
    rc, out, _, run = _run(tmp_path, r"""
        import sys, time
        w = sys.stdout.buffer
        w.write(b"iteration 1 | loss: "); w.flush(); time.sleep(0.3)
        w.write(b"2.5 |\n"); w.flush()
        sys.stderr.write("warn: partial "); sys.stderr.flush(); time.sleep(0.2)
        w.write(b"\xff\x00binary ok\n"); w.flush()
        w.write(b"x" * 200000); w.write(b"\nlast line without newline"); w.flush()
        """)
    assert rc == 0
    expected = (b"iteration 1 | loss: 2.5 |\nwarn: partial \xff\x00binary ok\n" + b"x" * 200000
                + b"\nlast line without newline")
    assert out == expected
    assert (run / "output.log").read_bytes() == expected


@pytest.mark.slow
def test_the_log_grows_while_the_command_runs(tmp_path: Path) -> None:
    log = tmp_path / "live.log"
    p = subprocess.Popen([PY, "-m", "perfd.app.cli", "launch", "--job", "t2", "--run-dir",
                          str(tmp_path / "r"),
                          "--log", str(log), "--", PY, "-c",
                          "import time,sys\nprint('first', flush=True)\ntime.sleep(3)\nprint('second')"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        # the whole line: a read between the copier's writes of "first" and its newline saw b"first"
        while time.monotonic() < deadline and not (log.exists() and b"first\n" in log.read_bytes()):
            time.sleep(0.05)
        assert log.read_bytes() == b"first\n" and p.poll() is None  # tailable before the end
    finally:
        out, _ = p.communicate(timeout=30)
    assert p.returncode == 0 and out == b"first\nsecond\n" and log.read_bytes() == out


@pytest.mark.slow
def test_signals_reach_the_command_and_its_process_group(tmp_path: Path) -> None:
    marker = tmp_path / "got"
    gfile = str(marker) + ".g"
    grand = (f"import signal, sys, time\n"
             f"signal.signal(signal.SIGTERM, lambda *a: (open({gfile!r}, 'w').write('g'), sys.exit(0)))\n"
             f"print('armed', flush=True)\n"
             f"time.sleep(60)")
    # The child says "ready" only once its grandchild said its handler is in place: a fixed pause for
    # that (0.3 s) once let SIGTERM reach a grandchild still starting under a loaded machine.
    child = textwrap.dedent(f"""
        import os, signal, subprocess, sys, time
        # a grandchild in the same process group, as torchrun's workers are
        g = subprocess.Popen([sys.executable, "-c", {grand!r}], stdout=subprocess.PIPE, text=True)
        assert g.stdout.readline() == "armed\\n"
        def on_term(signum, frame):
            open({str(marker)!r}, "w").write(str(signum))
            g.wait(10)
            sys.exit(7)
        signal.signal(signal.SIGTERM, on_term)
        print("ready", flush=True)
        time.sleep(60)
        """)
    p = subprocess.Popen([PY, "-m", "perfd.app.cli", "launch", "--job", "t3", "--run-dir",
                          str(tmp_path / "r"),
                          "--", PY, "-c", child], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout is not None
        assert p.stdout.readline() == b"ready\n"
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == 7
    assert marker.read_text() == str(int(signal.SIGTERM))
    assert Path(str(marker) + ".g").read_text() == "g"


@pytest.mark.slow
def test_sigint_is_passed_once_to_the_command(tmp_path: Path) -> None:
    counter = tmp_path / "n"
    child = textwrap.dedent(f"""
        import signal, sys, time
        n = 0
        def on_int(*a):
            global n
            n += 1
            open({str(counter)!r}, "w").write(str(n))
        signal.signal(signal.SIGINT, on_int)
        print("ready", flush=True)
        # the first, however late the launch forwards it (the bound is a failure's only); then a second
        # would come as soon: a quiet second past the first tells once from twice
        deadline = time.monotonic() + 20  # under the test's own wait for the launch
        while n == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        sys.exit(0 if n == 1 else 10 + n)
        """)
    p = subprocess.Popen([PY, "-m", "perfd.app.cli", "launch", "--run-dir", str(tmp_path / "r"), "--", PY,
                          "-c",
                          child], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline() == b"ready\n"
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=30) == 0
    assert counter.read_text() == "1"


def test_command_not_found_and_usage_errors(tmp_path: Path) -> None:
    err = io.StringIO()
    rc = run_launch(LaunchOptions(["/nonexistent/train"], run_dir=str(tmp_path)), io.BytesIO(), err)
    assert rc == 127 and "not found" in err.getvalue()
    rc = run_launch(LaunchOptions([], run_dir=str(tmp_path)), io.BytesIO(), err)
    assert rc == 2 and "no command" in err.getvalue()
    rc = run_launch(LaunchOptions(["true"], fr_timing=True, run_dir=str(tmp_path)), io.BytesIO(), err)
    assert rc == 2 and "--flight-recorder" in err.getvalue()


def test_missing_nsys_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERFD_NSYS", str(tmp_path / "no-nsys"))
    err = io.StringIO()
    rc = run_launch(LaunchOptions(["true"], nsys_session="s1", run_dir=str(tmp_path)), io.BytesIO(), err)
    assert rc == 2 and "PERFD_NSYS" in err.getvalue()


def test_nsys_wraps_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in nsys records its arguments and runs the command after its options."""
    fake = tmp_path / "nsys"
    fake.write_text(textwrap.dedent(f"""\
        #!{PY}
        import json, os, sys
        open({str(tmp_path / "argv.json")!r}, "w").write(json.dumps(sys.argv[1:]))
        rest = [a for a in sys.argv[1:] if not a.startswith("--") and a != "launch"]
        os.execvp(rest[0], rest)
        """))
    fake.chmod(0o755)
    monkeypatch.setenv("PERFD_NSYS", str(fake))
    rc, out, _, run = _run(tmp_path, "print('under nsys')", nsys_session="perfd-t1")
    assert rc == 0 and out == b"under nsys\n"
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[:2] == ["launch", "--session-new=perfd-t1"] and "--trace=cuda,nvtx,osrt" in argv
    m = load_manifest(run / "launch.json")
    assert m["nsys"]["session"] == "perfd-t1" and m["command"][0] == str(fake)


def test_kineto_daemon_mode(tmp_path: Path) -> None:
    plan = plan_launch(LaunchOptions(["true"], kineto=True, run_dir=str(tmp_path)))
    assert plan.env_set["KINETO_USE_DAEMON"] == "1"
    conf = Path(plan.env_set["KINETO_CONFIG"])
    assert "ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS=1" in conf.read_text()
    # CUPTI let go after each on-demand trace, or the job keeps paying for it on every launch
    assert plan.env_set["TEARDOWN_CUPTI"] == "1" and not any("TEARDOWN_CUPTI" in n for n in plan.notes)


def test_kineto_teardown_left_to_the_user_who_set_it(tmp_path: Path) -> None:
    plan = plan_launch(LaunchOptions(["true"], kineto=True, run_dir=str(tmp_path)),
                       environ={"TEARDOWN_CUPTI": "0"})
    assert "TEARDOWN_CUPTI" not in plan.env_set  # the inherited 0 reaches the job
    assert any("TEARDOWN_CUPTI=0 kept" in n for n in plan.notes)


def test_agent_configured_from_the_manifest(tmp_path: Path) -> None:
    _run(tmp_path, "pass", flight_recorder=str(tmp_path / "fr"), agent_socket=str(tmp_path / "h.sock"))
    cfg = AgentConfig(collectors={"nccl": {"flight_recorder": {"interval_s": 1, "hang_threshold_s": 5,
                                                               "pipe_prefix": "/stale/frp_"}}})
    cfg = apply_overrides(cfg, launch_manifest=str(tmp_path / "run" / "launch.json"), nvml="off", host=False)
    assert cfg.job == "t1"
    fr_cfg = cfg.collectors["nccl"]["flight_recorder"]
    assert fr_cfg == {"interval_s": 1, "hang_threshold_s": 5, "pipe_prefix": str(tmp_path / "fr" / "frp_"),
                      "dump_prefix": str(tmp_path / "fr" / "fr_dump_"), "buffer_entries": 2000}
    # the launch's processes carry PERFD_JOB: a hooked process without it is no part of this job
    assert cfg.collectors["hook"] == {"socket_path": str(tmp_path / "h.sock"), "require_declared_job": True}
    renamed = apply_overrides(AgentConfig(), job="other", nvml="off",
                              launch_manifest=str(tmp_path / "run" / "launch.json"))
    assert renamed.job == "other"  # its processes still declare t1: taken
    assert renamed.collectors["hook"]["require_declared_job"] is False
    assert renamed.collectors["hook"]["refuse_other_jobs"] is False
    # An agent told its job, with no launch, listens for its hooks (where they send by default).
    told = apply_overrides(AgentConfig(), job="solo", nvml="off")
    assert told.collectors["hook"] == {} and told.job == "solo"
    assert "hook" not in apply_overrides(AgentConfig(), nvml="off").collectors  # a node agent: no job
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match="launch manifest"):
        apply_overrides(AgentConfig(), launch_manifest=str(tmp_path / "bad.json"))
    with pytest.raises(ConfigError, match="cannot read"):
        apply_overrides(AgentConfig(), launch_manifest=str(tmp_path / "missing.json"))


@pytest.mark.slow
def test_manifest_is_written_while_running(tmp_path: Path) -> None:
    man = tmp_path / "m.json"
    p = subprocess.Popen([PY, "-m", "perfd.app.cli", "launch", "--job", "t4", "--manifest", str(man),
                          "--run-dir", str(tmp_path / "r"), "--", PY, "-c", "import time; time.sleep(2)"],
                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ})
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not man.exists():
            time.sleep(0.05)
        m = load_manifest(man)
        assert m["status"] == "running" and m["exit_code"] is None
        os.kill(m["pid"], 0)  # the command's own pid
    finally:
        assert p.wait(timeout=30) == 0
    assert load_manifest(man)["status"] == "exited"


def test_wandb_run_id_reaches_the_job_and_the_agents_collector(tmp_path: Path) -> None:
    plan = plan_launch(LaunchOptions(["true"], run_dir=str(tmp_path / "a"), wandb_run_id="auto"), environ={})
    rid = plan.env_set["WANDB_RUN_ID"]
    assert len(rid) == 12 and plan.env_set["WANDB_RESUME"] == "allow"
    assert plan.collectors("j")["megatron"]["wandb_run_id"] == rid == plan.wandb_run_id
    # The job's own WANDB_RUN_ID wins (and is not set again); a run id W&B would refuse is an error.
    own = plan_launch(LaunchOptions(["true"], run_dir=str(tmp_path / "b"), wandb_run_id="other"),
                      environ={"WANDB_RUN_ID": "mine"})
    assert own.wandb_run_id == "mine" and "WANDB_RUN_ID" not in own.env_set
    assert any("ignored" in n for n in own.notes)
    with pytest.raises(LaunchError, match="wandb-run-id"):
        plan_launch(LaunchOptions(["true"], run_dir=str(tmp_path / "c"), wandb_run_id="a b"), environ={})
    assert "WANDB_RUN_ID" not in plan_launch(LaunchOptions(["true"], run_dir=str(tmp_path / "d")),
                                             environ={}).env_set
