"""tests/gpu/ncu_workflow_live.py on CPU: every part of it but the GPU. A stand-in Megatron-LM (its
real start-up lines from tests/data/megatron, an iteration line per step of the training loop that
``perfd.hook.megatron`` wraps, --save / --exit-interval / --load as Megatron-LM has them) and a stand-in
ncu that runs its command as a child, as ncu does, and makes it slower by ARMED (what a launch-heavy
step pays under ncu). The script's three phases, its aggregators over one state directory, its rules,
``perfd ncu-prefix`` and its checks run for real; what a CPU cannot give is the ncu capture itself (no
CUDA profiler: the range fails), so those two checks are left to the GPU."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import ROOT, run_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

SOURCE = ROOT / "tests" / "data" / "megatron" / "h100_resume_save_eval.log"
ARMED = 1.5
# The armed runs' ncu rule holds this long before it fires (the GPU script's 20 s): each armed run
# ~12 s shorter. The checks read the same steps: on a CPU the range's step is the run's first (the
# slowest), so the armed clock is the POST_STEPS logged after the capture ended (12 either way).
RULE_FOR_S = "8"

PRETRAIN = r'''
import datetime, os, re, sys, time
from megatron.training import training

args = sys.argv[1:]
def opt(name, default=None):
    return args[args.index(name) + 1] if name in args else default

step_s = 0.1 * float(os.environ.get("FAKE_NCU_SLOWDOWN", "1"))
train_iters = int(opt("--train-iters"))
exit_at = int(opt("--exit-interval", "0"))
save, load = opt("--save"), opt("--load")
start = 0
if load:
    start = int(open(os.path.join(load, "latest_checkpointed_iteration.txt")).read())
startup, template = open(os.environ["FAKE_MEGATRON_STARTUP"]).read().split("\n@@ITERATION@@\n")
now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")
sys.stdout.write(re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?", now, startup))  # its own start-up's time
sys.stdout.flush()
time.sleep(2.0)  # start-up
for it in range(start, train_iters):
    t = time.time()
    training.train_step(iteration=it)
    ms = (time.time() - t) * 1e3
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")
    head = f"[{stamp}] iteration {it + 1:8d}/{train_iters:8d}"
    line = re.sub(r"\[[^\]]+\] iteration +\d+/ +\d+", head, template)
    line = re.sub(r"elapsed time per iteration \(ms\): [0-9.]+", f"elapsed time per iteration (ms): {ms:.1f}",
                  line)
    print(line, flush=True)
    if exit_at and it + 1 >= exit_at:
        if save:
            os.makedirs(save, exist_ok=True)
            open(os.path.join(save, "latest_checkpointed_iteration.txt"), "w").write(str(it + 1))
        print(f"[exiting program at iteration {it + 1}] datetime: {stamp}", flush=True)
        break
'''

TRAINING = '''
import os, time
def train_step(*args, iteration=None, **kwargs):
    time.sleep(0.1 * float(os.environ.get("FAKE_NCU_SLOWDOWN", "1")))
'''

NCU = """#!{python}
import os, subprocess, sys
args = sys.argv[1:]
if "--version" in args:
    print("NVIDIA (R) Nsight Compute Command Line Profiler (stand-in)")
    sys.exit(0)
cmd = args[args.index("-o") + 2:]
child = subprocess.Popen(cmd, env={{**os.environ, "FAKE_NCU_SLOWDOWN": "{armed}"}})
print(f"==PROF== Connected to process {{child.pid}} ({{cmd[0]}})", file=sys.stderr, flush=True)
sys.exit(child.wait())
"""


@pytest.mark.e2e
def test_the_gpu_workflow_script_runs_its_phases_and_checks_on_cpu(tmp_path: Path) -> None:
    mega = tmp_path / "megatron-lm"
    (mega / "megatron" / "training").mkdir(parents=True)
    (mega / "megatron" / "__init__.py").write_text("")
    (mega / "megatron" / "training" / "__init__.py").write_text("")
    (mega / "megatron" / "training" / "training.py").write_text(TRAINING)
    (mega / "pretrain_gpt.py").write_text(PRETRAIN)
    lines = SOURCE.read_text().splitlines(keepends=True)
    first = next(i for i, ln in enumerate(lines) if " iteration        1/" in ln)
    startup = "".join(lines[:first]) + "\n@@ITERATION@@\n" + lines[first].rstrip("\n")
    (tmp_path / "startup.txt").write_text(startup)
    ncu = tmp_path / "ncu"
    ncu.write_text(NCU.format(python=sys.executable, armed=ARMED))
    ncu.chmod(ncu.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "out"
    env = run_env(PERFD_NCU=str(ncu), FAKE_MEGATRON_STARTUP=str(tmp_path / "startup.txt"), TOTAL_S="330",
                  RUN1_ITERS="100", RUN1_MAX_S="80", ARMED_RESERVE_S="120", POST_STEPS="8",
                  NCU_RULE_FOR_S=RULE_FOR_S, AGG_GPU="NVIDIA H100 80GB HBM3")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "gpu" / "ncu_workflow_live.py"), str(out),
                           "--megatron", str(mega)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=400)
    res = json.loads((out / "ncu_workflow_live.json").read_text())
    assert done.returncode in (0, 1), (done.returncode, done.stdout[-3000:], done.stderr[-3000:])
    assert res["stage"] == "done" and not res.get("error") and not res.get("error_check"), res
    ch = res["checks"]
    # what a CPU can show: the end at once, the runs, the arming against run 1, goodput's runs
    for key in ("run1_ended_at_once", "step_vs_megatron", "run2_figures_equal_unarmed",
                "run3_figures_equal_unarmed", "run2_arming_within_15pct", "run3_arming_within_15pct",
                "run2_no_arming_jitter", "run3_no_arming_jitter", "run2_ended_with_incidents_closed",
                "run3_ended_with_incidents_closed", "run2_goodput_runs", "run3_goodput_runs"):
        # The run the check is of first, in a message of its own (pytest shortened the tuple's string)
        run = key.split("_", 1)[0]
        shown = {k: res.get(k) for k in (run, "run2", "run3", "clock", "run1_digest")}
        ended = res["phases"]["run1"].get("ended_after_s")
        assert ch[key], f"{key}: run 1 ended after {ended} s; " + "\n".join(
            f"{k}: {json.dumps(v, sort_keys=True)}" for k, v in shown.items())
    assert res["run2"]["runs"]["current"] == 2 and res["run3"]["runs"]["current"] == 3
    assert res["run3"]["arming"]["ratio"] == pytest.approx(ARMED, rel=0.15)
    assert (out / "logs.tar.gz").exists() and (out / "ncu_workflow_live.md").exists()
