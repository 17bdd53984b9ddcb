"""`perfd top`, the command, against a real aggregator and a real agent (in the test's process: the e2e
conftest's ``live`` pair; the demo's inputs: a real Megatron-LM log that grows while the test runs, a real
NVML recording replayed): `--once` output and exit statuses checked against the aggregator's own API. The
live view in a real terminal is test_top_widths.py's."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

from tests.cli_main import Ran, perfd
from tests.e2e.conftest import JOB, NVML, Live
from tests.procs import free_port, http_get, wait_for

pytestmark = pytest.mark.slow


def _json(url: str) -> dict[str, Any]:
    got: dict[str, Any] = json.loads(http_get(url))
    return got


@pytest.fixture
def top(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., Ran]:
    """``perfd top ARGS`` by the CLI's entry point in this process (tests/cli_main.py), 160 columns wide:
    its output and exit status as a person's shell would have them."""
    monkeypatch.setenv("COLUMNS", "160")
    return partial(perfd, capsys, "top")


def _recorded(metric: str) -> set[float]:
    """Every value of ``metric`` the replayed NVML recording holds."""
    out = set()
    for line in NVML.read_text().splitlines():
        d = json.loads(line)
        out |= {float(x["value"]) for x in d.get("samples", []) if x["name"] == metric}
    return out


def test_top_once_shows_what_the_aggregator_holds(live: Live, top: Callable[..., Ran]) -> None:
    # The per-rank timers reach the analysis after the first iterations (later on a loaded machine).
    wait_for(lambda: (_json(f"{live.base}/api/jobs/{JOB}/summary").get("latest") or {})
             .get("straggler_rank_compute_ratio"), 60, "per-rank compute ratios in the analysis")
    # The agent still sends (the NVML replay, the refresher's analysis): compare with an answer of
    # the aggregator that did not change while `top` ran, else look again.
    for _ in range(5):
        summary = _json(f"{live.base}/api/jobs/{JOB}/summary")
        gpus = _json(f"{live.base}/api/jobs/{JOB}/gpus")["gpus"]
        timed_before = max(i["iteration"] for i in
                           _json(f"{live.base}/api/jobs/{JOB}/iterations?sources=0")["iterations"]
                           if i["straggler_rank_compute_ratio"])
        r = top("--aggregator", live.base, "--once", "--job", JOB)
        after = _json(f"{live.base}/api/jobs/{JOB}/summary")
        gpus_after = _json(f"{live.base}/api/jobs/{JOB}/gpus")["gpus"]
        if after == summary and gpus_after == gpus:
            break
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert JOB in out and "incidents: none open" in out
    # Still changing after five tries (a loaded machine): `top` read the answer before or after.
    seen = [s["summary"] for s in (summary, after)]
    assert any(f"{100 * s['medians']['mfu']:.1f}%" in out for s in seen), out
    assert any(all(f"{s['step_time_distribution_ms'][q]:.0f} ms" in out for q in ("p50", "p90", "max"))
               for s in seen), out
    # The iteration whose per-rank timers `top` showed (the log grows meanwhile, so a newer one may
    # have arrived since): that iteration's slowest rank as the aggregator holds it.
    shown = re.search(r"ranks \(iteration (\d+)\)", out)
    assert shown, out
    its = _json(f"{live.base}/api/jobs/{JOB}/iterations?sources=0")["iterations"]
    it = next(it for it in its if it["iteration"] == int(shown.group(1)))
    assert it["straggler_rank_compute_ratio"], it
    # It is the newest with timers: none that the aggregator held before `top` ran is newer.
    assert it["iteration"] >= timed_before, (it["iteration"], timed_before)
    slowest = max(it["straggler_rank_compute_ratio"].items(), key=lambda kv: kv[1])
    assert f"r{slowest[0]} {slowest[1]:.2f}×" in out
    assert len(gpus) == 1 and gpus[0]["replay"] is True and gpus[0]["node"] == "node-a"
    vals = gpus[0]["values"]
    assert "(replay)" in out and "node-a" in out
    # The replay keeps changing the clock: on a loaded machine `top` may read it between the two
    # answers above, so the row shows a clock of the recording, the one read or a later one.
    row = next(ln for ln in out.splitlines() if "(replay)" in ln)
    clocks = {f"{sm / 1e6:.0f}" for sm in _recorded("perfd_gpu_sm_clock_hertz")}
    assert f"{vals['perfd_gpu_sm_clock_hertz'] / 1e6:.0f}" in clocks
    assert any(f" {c} " in row for c in clocks), row
    assert "perfd_gpu_power_watts" in vals
    # nvitop's columns: memory used/total, power/limit; the recording's processes; the host. The memory
    # used changes with the replay as the clock does (3.3 and 6.0 GiB in the recording): a CI run's
    # `top` showed another sample than the one read before it.
    total = vals["perfd_gpu_memory_total_bytes"]
    recorded = _recorded("perfd_gpu_memory_used_bytes")
    memory = {f"{used / 2**30:.1f}/{total / 2**30:.1f} {100 * used / total:.0f}%" for used in recorded}
    assert vals["perfd_gpu_memory_used_bytes"] in recorded
    assert any(m in row for m in memory), row
    # The processes as the aggregator held them before `top` ran or after (the replay's process list
    # changes with its phases: a loaded run's `top` read the later one, not the one read before it)
    held = [g[0]["processes"] for g in (gpus, gpus_after) if g]
    assert any(procs and all(f" {p['pid']} " in out for p in procs) for procs in held), (held, out)
    (host,) = _json(f"{live.base}/api/jobs/{JOB}/gpus")["hosts"]
    assert host["node"] == "node-a" and "perfd_host_cpu_util_ratio" in host["values"]
    assert "hosts" in out and "load1" in out


def test_top_refuses_unknown_job_and_unreachable_aggregator(live: Live, top: Callable[..., Ran]) -> None:
    r = top("--aggregator", live.base, "--once", "--job", "nope")
    assert r.returncode == 1 and "no job named 'nope'" in r.stdout
    r = top("--aggregator", f"127.0.0.1:{free_port()}", "--once")
    assert r.returncode == 2 and r.stderr.startswith("perfd: cannot reach the aggregator")
