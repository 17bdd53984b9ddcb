"""tests/gpu/host_stall_live.py runs here with --cpu-smoke (the step-hook loop in place of Megatron-LM,
the same timeline, plumbing and checks), so the lead's one H100 run does not find the script's bugs:
burners named, the SIGSTOP seen as a stall (within 10 s is the GPU run's check: its seconds are
printed here) with the stopped state and a py-spy stack,
the cause afterwards 'stopped' with the stop's cost, no stall during the announced save; the polls
written as they happened and the summary files at the end."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import BUSY_LOAD_PER_CPU, ROOT, STEADY_WAIT_TOO_HIGH, load_per_cpu, run_env

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux")]


def test_the_gpu_scripts_cpu_smoke_passes_its_checks(tmp_path: Path) -> None:
    load = load_per_cpu()
    got = subprocess.run([sys.executable, str(ROOT / "tests" / "gpu" / "host_stall_live.py"), str(tmp_path),
                          "--cpu-smoke", "--burn-at", "15", "--burn-s", "12", "--stop-at", "40",
                          "--stop-s", "15", "--after-s", "12", "--max-s", "200"],
                         cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=280)
    res = json.loads((tmp_path / "host_stall.json").read_text())
    c = res.get("checks") or {}
    assert not res.get("error"), (res.get("error"), res.get("traceback"), got.stderr[-2000:])
    # Every check but the cost's: on this shared 2-core machine other tests' processes contend with the
    # loop after the stop too, and an incident that grows over them costs more than the stop itself.
    # The script's "stalled_within_10_s" is the GPU run's wall-clock check: here the stall is required
    # while the rank is stopped (the polls, below), its seconds printed (`perfd bench stall` measures them).
    must = ["state_stopped_while_stopped", "stack_taken", "no_stall_during_saves"]
    print(f"stall seen {c.get('stalled_seen_s_after_sigstop')} s after SIGSTOP")
    # The burners named, and the stop as the cause of the incident after it: only where the burners and
    # the stop are what slows the loop (tests.procs.BUSY_LOAD_PER_CPU; tests/host/test_host_live.py
    # asserts the same in the same way). Under other tests' load the incident that follows the stop
    # grows over their contention too, and a full `make test` beside an engine run once read it so.
    # The load over the run, as the script's polls read it each second, not only at its two ends: other
    # tests' processes come and go within the minute this runs.
    polls = [json.loads(ln) for ln in (tmp_path / "raw" / "polls.jsonl").read_text().splitlines()]
    load = max([load, load_per_cpu(), *(p["load_per_cpu"] for p in polls)])
    # Busy, the incident after the stop is not required either: with every step slow around it (a full
    # suite at load 8 per CPU, seen), the stop's stall stays in an incident still open when the script
    # reads it, which its check does not take (closed, or a level shift). What is required then is what
    # the script itself does: the stall seen, the state read, the stack taken, the save left alone.
    busy = load >= BUSY_LOAD_PER_CPU
    # Rank 0's CPU wait before the burners, as the polls read it: where the other tests' processes already
    # kept it waiting most of the time, six more on its CPU cannot raise it by the margin over steady
    # state that names them (test_host_live's gate too). A CI run at load 4.3 per CPU named none.
    waits = [float(h["wait_ratio"]) for p in polls if not p.get("burning") and not p.get("stopped")
             and p["t"] < min([q["t"] for q in polls if q.get("burning")] or [float("inf")])
             for h in p.get("rank_hosts") or [] if h.get("rank") == 0 and h.get("wait_ratio") is not None]
    steady = statistics.median(waits) if waits else None
    contended = steady is not None and steady >= STEADY_WAIT_TOO_HIGH
    if not busy:
        must += ["cause_after_is_stopped"]
    if not busy and not contended:
        must += ["contention_names_a_burner", "not_data_loading"]
    else:
        print(f"load average up to {load:.1f} per CPU, rank 0's CPU wait before the burners {steady}: the "
              f"burners' naming not required here (contention named: {c.get('contention_cause')})")
    if busy:
        print(f"the incident after the stop not required here (the incident after: "
              f"{c['stall_incident_after']})")
    failed = [k for k in must if not c[k]]
    # The incident after the stop first: pytest cuts a long message, and the stacks are long.
    shown = ("stall_incident_after", "stalled_seen_s_after_sigstop", "stalled_seen_by_poll_s",
             "state_stopped_read_at_t", "stalled_polls_during_saves", "saves", "loop_ended",
             "stall_incident_read", "stall_incidents_last_poll", "stall_incidents_final", "contention_cause",
             "verdicts_while_burning", "burn_slowdown")
    assert not failed, f"{failed} (load up to {load:.1f} per CPU, rank 0's CPU wait before the burners " \
                       f"{waits}): " \
                       f"{json.dumps({k: c.get(k) for k in shown}, default=str)}; the final reads' errors: " \
                       f"{res.get('read_errors')}"
    cost = c["cost_vs_stop"]
    assert c["saves"] == 1
    assert busy or (cost["cost_s"] is not None and cost["cost_s"] >= 0.85 * cost["stopped_s"]), \
        (cost, c["stall_incident_after"])
    assert got.returncode == (0 if c["all"] else 1)
    assert len(polls) == res["polls"] and any(p.get("stopped") and p.get("state") == "stalled" for p in polls)
    assert "rank processes" in (tmp_path / "raw" / "top_stop.txt").read_text()
    assert (tmp_path / "host_stall.md").read_text().startswith("# Issue 35 live (cpu-smoke)")
