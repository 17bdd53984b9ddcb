"""`perfd top`'s host panel for a job: beside the nodes' CPU, the job's own rank processes (state, CPU
used, run-queue wait, their CPUs and how busy, who else took them), from the rank_hosts that
GET /api/jobs/<job>/gpus answers (here the ranks collector's recorded observations of real processes,
tests/data/host)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from perfd.app.commands import top_screen as top

DATA = Path(__file__).resolve().parents[1] / "data" / "host" / "rank_observations.json"
REC = json.loads(DATA.read_text())


def _api(rank_hosts: list[dict[str, Any]]) -> top.Getter:
    def get(path: str) -> Any:
        if path == "/api/jobs":
            return {"jobs": [{"job": "j", "last_iteration": 9, "last_step_age_s": 0.5}]}
        if path.endswith("/summary"):
            return {"summary": None, "latest": None, "report": None, "incidents": []}
        if path.endswith("/gpus"):
            return {"gpus": [], "hosts": [{"node": "node-a", "values": {"perfd_host_cpu_util_ratio": 0.14}}],
                    "rank_hosts": rank_hosts}
        return {"iterations": []}
    return get


def _screen(snap: top.Snapshot) -> str:
    console = Console(width=250, file=io.StringIO(), color_system=None)
    console.print(top.render(snap))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


def test_the_host_panel_shows_the_jobs_ranks_not_only_the_node() -> None:
    cont = {**REC["contention"]["ranks"][0], "node": "node-a"}
    stopped = {**REC["stopped"]["ranks"][0], "rank": 1, "node": "node-a"}
    snap = top.fetch("http://agg", "j", get=_api([cont, stopped]))
    assert [r["rank"] for r in snap.rank_hosts] == [0, 1]
    out = _screen(snap)
    node = next(ln for ln in out.splitlines() if ln.startswith("│ node-a ") and "14%" in ln)
    assert node  # the node-wide 14%: what the H100 run's panel showed while two CPUs were saturated
    rows = {cells[0]: cells for ln in out.splitlines() if ln.startswith("│") and "node-a" in ln
            and len(cells := [c.strip() for c in ln.split("│")[1:-1]]) == 11}
    cells = rows["0"]
    burner = max((o for o in cont["others"] if not o["own"]), key=lambda o: o["cpu_ratio"])
    assert cells[:4] == ["0", "node-a", str(cont["pid"]), "running"]
    # its workers' CPU: not in this recording (made before collectors/ranks counted a rank's children)
    assert cells[5] == "–"
    assert cells[6] == f"{100 * cont['wait_ratio']:.0f}%"  # CPU wait
    assert cells[7] == f"{cont['allowed_cpus'][0]}" and cells[8] == "100%"
    assert cells[9] == f"{100 * cont['others_ratio']:.0f}%"
    # Who took them: under the table, one line a rank (in the table it was cut at 80 columns).
    took = next(ln for ln in out.splitlines() if ln.startswith("  rank 0: "))
    share = f"{100 * burner['cpu_ratio']:.0f}%"
    assert took.startswith(f"  rank 0: pid {burner['pid']} (root) took {share} of its CPUs: "), took
    stop = rows["1"]
    assert stop[3] == "stopped" and stop[6] == "–"  # no wait measured while stopped: absent, not 0%


def test_without_rank_processes_the_panel_is_the_node_table_alone() -> None:
    out = _screen(top.fetch("http://agg", "j", get=_api([])))
    assert "rank processes" not in out and "hosts" in out


def test_a_ranks_workers_cpu_is_shown_as_the_jobs() -> None:
    """A rank's DataLoader workers are its own children; their CPU has a column of its own,
    never the "others" column."""
    row = {**REC["contention"]["ranks"][0], "node": "node-a", "children": 2, "children_cpu_cores": 1.85,
           "others": [], "others_ratio": 0.0}
    out = _screen(top.fetch("http://agg", "j", get=_api([row])))
    head = next(ln for ln in out.splitlines() if "workers" in ln)
    cells = next([c.strip() for c in ln.split("│")[1:-1]] for ln in out.splitlines()
                 if ln.startswith("│") and "node-a" in ln and "1.85" in ln)
    heads = [c.strip() for c in head.split("┃")[1:-1]]
    assert cells[heads.index("workers")] == "1.85" and cells[heads.index("others")] == "0%"
