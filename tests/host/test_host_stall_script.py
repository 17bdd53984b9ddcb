"""tests/gpu/host_stall_live.py runs here with --cpu-smoke (the step-hook loop in place of Megatron-LM,
the same timeline, plumbing and checks), so the lead's one H100 run does not find the script's bugs:
the SIGSTOP seen as a stall (within 10 s is the GPU run's check: its seconds are printed here) with the
stopped state and a py-spy stack, no stall during the announced save; the polls written as they happened
and the summary files at the end. The script's verdict checks (the burners named, the cause afterwards
'stopped' with the stop's cost) are printed, not required: they read the shared machine's load here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import ROOT, load_per_cpu, run_env

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux")]


def test_the_gpu_scripts_cpu_smoke_passes_its_checks(tmp_path: Path) -> None:
    # The burn is short: its verdicts are not required here (below), and six burners on the job's CPU for
    # longer took that CPU from every other test beside this one; the stop as long as the stall needs.
    got = subprocess.run([sys.executable, str(ROOT / "tests" / "gpu" / "host_stall_live.py"), str(tmp_path),
                          "--cpu-smoke", "--burn-at", "15", "--burn-s", "4", "--stop-at", "30",
                          "--stop-s", "15", "--after-s", "12", "--max-s", "200"],
                         cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=280)
    res = json.loads((tmp_path / "host_stall.json").read_text())
    c = res.get("checks") or {}
    assert not res.get("error"), (res.get("error"), res.get("traceback"), got.stderr[-2000:])
    # The script's own doing is required: the stall seen while the rank is stopped (the polls, below), its
    # state read, its stack taken, the announced save left alone. Its verdict checks — the burners named
    # as the cause, the stop as the cause of the incident after it, the stop's cost — are printed, not
    # required: on a machine the suite shares they read its load as much as the script's burners and stop
    # (a CI run at 4.3 per CPU named no burner), and the suite proves each on recorded or steady data
    # instead (test_host_live.py: the burners' recording replayed; the stopped rank's cause and cost).
    # The script's "stalled_within_10_s" is the GPU run's wall-clock check (`perfd bench stall` here).
    must = ["state_stopped_while_stopped", "stack_taken", "no_stall_during_saves"]
    verdicts = ("contention_names_a_burner", "not_data_loading", "cause_after_is_stopped", "cost_vs_stop")
    assert all(k in c for k in verdicts), sorted(c)  # the script made each (its code ran), whatever it read
    print(f"stall seen {c.get('stalled_seen_s_after_sigstop')} s after SIGSTOP; verdicts (not required "
          "here): " + ", ".join(f"{k} {c[k]}" for k in verdicts))
    polls = [json.loads(ln) for ln in (tmp_path / "raw" / "polls.jsonl").read_text().splitlines()]
    failed = [k for k in must if not c[k]]
    # The incident after the stop first: pytest cuts a long message, and the stacks are long.
    shown = ("stall_incident_after", "stalled_seen_s_after_sigstop", "stalled_seen_by_poll_s",
             "state_stopped_read_at_t", "stalled_polls_during_saves", "saves", "loop_ended",
             "stall_incident_read", "stall_incidents_last_poll", "stall_incidents_final", "contention_cause",
             "verdicts_while_burning", "burn_slowdown")
    assert not failed, f"{failed} (load {load_per_cpu():.1f} per CPU): " \
                       f"{json.dumps({k: c.get(k) for k in shown}, default=str)}; the final reads' errors: " \
                       f"{res.get('read_errors')}"
    assert c["saves"] == 1
    assert got.returncode == (0 if c["all"] else 1)  # the script's exit says its checks, whatever they read
    assert len(polls) == res["polls"] and any(p.get("stopped") and p.get("state") == "stalled" for p in polls)
    assert "rank processes" in (tmp_path / "raw" / "top_stop.txt").read_text()
    assert (tmp_path / "host_stall.md").read_text().startswith("# The host and the hang, live (cpu-smoke)")
