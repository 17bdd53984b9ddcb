"""What one bad record may cost, with the real agent and aggregator on loopback
(in the test's process, tests/inproc.py) and a short retention window
(--retain-iterations 50), so the window turns over within seconds.

- One far-future iteration among good ones (a Megatron-LM log line "iteration 999999999999/ 200", a
  step-hook datagram naming step 999999999999): before, once it left the window every later iteration
  was dropped as "too old" for good, with a counter as the only trace. Now it is refused and logged,
  and every later iteration is held.
- A restarted run is a new run: its records replace the old run's from the restart on — a rollback
  deeper than the window included, and lines that lack a field the old run's had — never refused as
  duplicates (before: dropped as too old, or 0 of 60 kept as ``worse_duplicate``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import sys
import time
from pathlib import Path

import pytest

from perfd.hook import StepHook, wire
from tests.faults.test_network_faults import _megatron_lines
from tests.inproc import pipeline
from tests.procs import get_json, http_get

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the hook's socket is Linux's")]
JOB = "megatron-job"
WINDOW = "50"


def _held(base: str, job: str = JOB) -> list[int]:
    its = json.loads(http_get(f"{base}/api/jobs/{job}/iterations?sources=0"))["iterations"]
    return sorted(int(it["iteration"]) for it in its)


def _refused(base: str, reason: str) -> float:
    text = http_get(f"{base}/metrics").decode()
    m = re.search(r'^perfd_aggregator_refused_total\{reason="' + reason + r'"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def _renumber(line: str, it: int, total: int) -> str:
    return re.sub(r"iteration\s+\d+/\s*\d+", f"iteration {it:8d}/{total:8d}", line)


def test_a_far_future_log_line_is_refused_and_every_later_iteration_is_held(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    head, lines = _megatron_lines(200)
    log = tmp_path / "train.log"
    bad = _renumber(lines[40], 999_999_999_999, 200)
    log.write_text(head + "".join(lines[:40]) + bad + "".join(lines[40:]))
    caplog.set_level(logging.INFO, logger="perfd")  # the aggregator's log, as `perfd -v` writes it
    with pipeline(tmp_path, "--no-rules", "--retain-iterations", WINDOW) as p:
        base = p.base
        p.agent("--job", JOB, "--megatron-log", log, "--host", "off", "--nvml", "off")
        held = p.wait(lambda: (h := _held(base)) and h[-1] == 200 and h, 60, "iteration 200 held",
                      interval=0.5)
        assert held == list(range(151, 201))  # the newest 50: nothing after the bad line was dropped
        assert _refused(base, "iteration_ahead") == 1.0
        stats = get_json(f"{base}/api/stats")
        assert stats["step_records_implausible"] == 1 and stats["step_records_too_old"] == 0
    out = caplog.text
    assert "refused (iteration_ahead)" in out and "999999999999" in out and "train-iters (200)" in out
    # Every retention drop is a log line with its count (written at the latest when the job is
    # analysed after the window turned over: the first line of each job goes out at once).
    assert re.search(rf"job {JOB}: \d+ iteration\(s\) \(\d+ record\(s\)\) left its retention window", out)


def test_a_far_future_hook_step_is_refused_and_every_later_step_is_held(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sock = str(tmp_path / "hook.sock")
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"batch_interval_s: 0.3\ncollectors:\n  hook: {{socket_path: {sock}}}\n")
    caplog.set_level(logging.WARNING, logger="perfd.refused")  # the aggregator's refusal lines
    with pipeline(tmp_path, "--no-rules", "--retain-iterations", WINDOW) as p:
        base = p.base
        p.agent("--job", "hookjob", "--host", "off", "--nvml", "off", "--config", cfg)
        p.wait(lambda: os.path.exists(sock), 30, "the agent's hook socket")
        hook = StepHook(sock, cuda=False, rank=0, flush_interval_s=0)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            for i in range(1, 201):
                with hook.step(step=i):
                    pass
                if i == 40:  # a datagram of this very process (the sender check passes) naming step 10^12
                    msg = wire.StepMsg(rank=0, pid=os.getpid(), step=999_999_999_999,
                                       end_time_ns=time.time_ns(), step_ns=1_000_000)
                    s.sendto(wire.pack_step(msg), sock)
                time.sleep(0.004)  # under the agent's socket queue: nothing dropped at the hook
            hook.close()
        finally:
            s.close()
        held = p.wait(lambda: (h := _held(base, "hookjob")) and h[-1] == 200 and h, 60, "step 200 held",
                      interval=0.5)
        assert held == list(range(151, 201))
        assert _refused(base, "iteration_ahead") == 1.0
    out = caplog.text
    # past the newest held before its batch, or (in the job's first batch) past the batch's lowest
    assert "refused (iteration_ahead)" in out and re.search(r"iterations past the (newest held|lowest)", out)


def test_a_restarted_run_replaces_the_old_runs_records_never_refused_as_duplicates(tmp_path: Path) -> None:
    head, lines = _megatron_lines(200)
    log = tmp_path / "train.log"
    log.write_text(head + "".join(lines[:120]))
    with pipeline(tmp_path, "--no-rules", "--retain-iterations", WINDOW) as p:
        base = p.base
        p.agent("--job", JOB, "--megatron-log", log, "--host", "off", "--nvml", "off")
        p.wait(lambda: (h := _held(base)) and h[-1] == 120, 60, "the first run's iteration 120", interval=0.5)
        # The job restarts from the checkpoint of iteration 20 — far below the window (71-120) — and its
        # lines lack the throughput field the first run's had (another Megatron-LM option set).
        second = [re.sub(r"throughput per GPU \(TFLOP/s/GPU\): [0-9.]+ \|", "", ln) for ln in lines[20:90]]
        assert all("throughput per GPU" not in ln for ln in second)
        with log.open("a") as f:
            f.write(head + "".join(second))  # iterations 21-90 of the new run
        held = p.wait(lambda: (h := _held(base)) and h[-1] == 90 and h, 60, "the new run's iterations",
                      interval=0.5)
        # The new run's records from its restart on: the old run's 21-120 are gone, nothing refused.
        assert held == list(range(41, 91)), held
        its = json.loads(http_get(f"{base}/api/jobs/{JOB}/iterations?sources=0"))["iterations"]
        assert all(it.get("logged_tflops_per_gpu") is None for it in its)  # none of the old run's left
        assert _refused(base, "worse_duplicate") == 0.0
        stats = get_json(f"{base}/api/stats")
        assert stats["step_records_too_old"] == 0 and stats["new_runs"] == 1
        assert stats["step_records_replaced_by_new_run"] == 50  # the old run's 71-120, held when it began
