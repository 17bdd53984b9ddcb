"""perfd top's tables of a job's GPUs, their processes and its hosts, and the cell formats every
panel of perfd top shares (pure: JSON of the aggregator's API in, rich renderables out)."""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from typing import TypedDict

from rich import box
from rich.box import Box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from perfd.core.typed import obj, objs
from perfd.report.incident_text import cpus_text

NA = "–"
GIB = float(1 << 30)
MAX_RANK_HOST_ROWS = 16  # rank processes listed in the host panel (the rest are counted)


def num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def pct0(v: object) -> str:
    x = num(v)
    return NA if x is None else f"{100 * x:.0f}%"


def pct(v: object) -> str:
    x = num(v)
    return NA if x is None else f"{100 * x:.1f}%"


def ms(v: object) -> str:
    x = num(v)
    return NA if x is None else f"{x:.0f} ms"



class TableForm(TypedDict, total=False):
    """Keywords of rich's Table that set its form."""

    box: Box
    padding: tuple[int, int]
    pad_edge: bool
    show_edge: bool


# The compact tables' form: no vertical rules, one space of padding, a rule under the header only.
COMPACT: TableForm = {"box": box.SIMPLE_HEAD, "padding": (0, 0), "pad_edge": False, "show_edge": False}


def natural_width(r: RenderableType) -> int:
    """Columns ``r`` takes when nothing limits it (every cell on one line, nothing cut)."""
    return Console(width=10_000, file=io.StringIO()).measure(r).maximum


def fit(width: int | None, *forms: Callable[[], RenderableType]) -> RenderableType:
    """The first of ``forms`` (widest first) that fits ``width`` columns whole; the last otherwise.
    ``width`` None: no limit (a file), the first. Rich would otherwise fit a table to the screen by
    cutting its cells ("268…") or wrapping them onto more lines (a GPU row on three)."""
    for make in forms[:-1]:
        r = make()
        if width is None or natural_width(r) <= width:
            return r
    return forms[-1]()


def used_of(used: float | None, total: float | None, scale: float = 1.0, digits: int = 0,
             pct: bool = True) -> str:
    """"used/total pct%" with what is known of the three (the unit is in the column's head)."""
    if used is None and total is None:
        return NA
    u = NA if used is None else f"{used / scale:.{digits}f}"
    tt = NA if total is None else f"{total / scale:.{digits}f}"
    share = f" {100 * used / total:.0f}%" if pct and used is not None and total else ""
    return f"{u}/{tt}{share}"


GPU_RATIOS: tuple[tuple[str, str], ...] = (
    ("util", "perfd_gpu_utilization_ratio"),
    ("SM", "perfd_gpu_sm_util_ratio"),
    ("tensor", "perfd_gpu_tensor_util_ratio"),
    ("DRAM", "perfd_gpu_dram_bw_util_ratio"),
)


def short_model(model: object) -> str:
    return str(model).removeprefix("NVIDIA ") if model else NA


def no_gpu_text(sources: Sequence[Mapping[str, object]] | None) -> Text:
    """Why a job has no GPU row, from what its agents said at start (the aggregator's
    ``gpu_sources``): NVML unavailable on an agent (and why), an agent without the NVML collector,
    or an agent whose NVML works but whose GPUs run none of the job's processes."""
    if sources is None:
        return Text("GPUs: " + NA + " (no GPU series from the agents yet)")
    if not sources:
        return Text("GPUs: " + NA + " (no agent of this job has connected since the aggregator started)")
    why = []
    for src in sources:
        nvml, agent, node = src.get("nvml"), str(src.get("agent")), str(src.get("node") or "")
        who = f"agent {agent}" + ("" if not node or agent.startswith(node + "/") else f" on {node}")
        if nvml is None:
            why.append(f"{who} runs no NVML collector (--nvml off)")
        elif str(nvml).startswith("unavailable"):
            why.append(f"{who}: NVML {nvml}")
        else:
            why.append(f"{who} reads NVML, and none of its GPUs runs this job's processes yet (a process "
                       "declares its job by PERFD_JOB, or runs in the pod of the job's sidecar)")
    return Text("GPUs: " + NA + " (" + "; ".join(why) + ")")


def gpu_table(gpus: Sequence[Mapping[str, object]], ranks: Sequence[object], narrow: bool = False,
              sources: Sequence[Mapping[str, object]] | None = None) -> RenderableType:
    """``narrow``: the model in the title (the one model of the job's GPUs, else a column), memory in
    whole GiB and power without their percentages, the SM clock only. No GPU: why (``sources``)."""
    if not gpus:
        return no_gpu_text(sources)
    models = {short_model(g.get("model")) + (" (replay)" if g.get("replay") else "") for g in gpus}
    model_col = not narrow or len(models) > 1
    title = "GPUs" if model_col or not models else f"GPUs ({models.pop()})"
    t = Table(title=title, title_justify="left", **COMPACT if narrow else {})
    # No cell wraps: a row is one line (render() takes the compact form where the wide one is too wide).
    for col in ("node", "gpu", "rank", *(("model",) if model_col else ())):
        t.add_column(col, no_wrap=True)
    for head, _ in GPU_RATIOS:
        t.add_column(head, justify="right", no_wrap=True)
    for head in (("mem GiB", "power W", "MHz", "temp") if narrow else
                 ("memory GiB", "power W", "SM MHz", "mem MHz", "temp")):
        t.add_column(head, justify="right", no_wrap=True)
    rank_of = {(str(r.get("node")), str(r.get("gpu"))): str(r.get("rank")) for r in ranks
               if isinstance(r, dict)}
    for g in gpus:
        vals = obj(g.get("values"))
        where = (str(g.get("node")), str(g.get("gpu")))
        cells = [*where, rank_of.get(where, NA)]
        if model_col:
            cells.append(short_model(g.get("model")) + (" (replay)" if g.get("replay") else ""))
        for _, name in GPU_RATIOS:
            v = num(vals.get(name))
            cells.append(NA if v is None else f"{100 * v:.0f}%")
        mem = (num(vals.get("perfd_gpu_memory_used_bytes")), num(vals.get("perfd_gpu_memory_total_bytes")))
        power = (num(vals.get("perfd_gpu_power_watts")), num(vals.get("perfd_gpu_power_limit_watts")))
        if narrow:
            cells.append(used_of(*mem, GIB, 0, pct=False))
            cells.append(used_of(*power, pct=False))
        else:
            cells.append(used_of(*mem, GIB, 1))
            cells.append(used_of(*power))
        for name in ("perfd_gpu_sm_clock_hertz",) if narrow else ("perfd_gpu_sm_clock_hertz",
                                                                 "perfd_gpu_mem_clock_hertz"):
            v = num(vals.get(name))
            cells.append(NA if v is None else f"{v / 1e6:.0f}")
        v = num(vals.get("perfd_gpu_temperature_celsius"))
        cells.append(NA if v is None else f"{v:.0f}°C")
        t.add_row(*cells)
    return t


def process_table(gpus: Sequence[Mapping[str, object]], narrow: bool = False) -> RenderableType:
    """Every compute process on the job's GPUs, as the agents last reported them."""
    rows = [(g, p) for g in gpus for p in objs(g.get("processes"))]
    if not rows:
        unknown = any(g.get("processes") is None for g in gpus)
        return Text("processes: " + (NA + " (no process list from the agents yet)" if unknown else "none"))
    t = Table(title="processes", title_justify="left", **COMPACT if narrow else {})
    for col in ("node", "gpu", "pid", "user", "rank", "GPU mem"):
        # never squeezed: the command line gives way (cut with "…") when the screen is narrow
        t.add_column(col, justify="right" if col in ("pid", "rank", "GPU mem") else "left", no_wrap=True,
                     min_width=len(col))
    # The one column rich may shrink (it shrinks wrappable columns first); the cell's own no_wrap and
    # ellipsis keep each command on one line.
    t.add_column("command")
    for g, p in rows:
        cmd = p.get("cmdline") or p.get("name") or NA + " (not visible to the agent)"
        t.add_row(*(proc_cell(g, p, c) for c in ("node", "gpu", "pid", "user", "rank", "GPU mem")),
                  Text(str(cmd), no_wrap=True, overflow="ellipsis"))
    return t


def proc_cell(g: Mapping[str, object], p: Mapping[str, object], col: str) -> str:
    if col in ("node", "gpu"):
        return str(g.get(col))
    if col == "GPU mem":
        mem = num(p.get("used_memory_bytes"))
        return NA if mem is None else f"{mem / GIB:.1f} GiB"
    v = p.get(col)
    return NA if v is None or v == "" else str(v)


def host_table(hosts: Sequence[Mapping[str, object]], ranks: Sequence[Mapping[str, object]] | None = None,
               width: int | None = None) -> RenderableType:
    """The nodes' CPU and memory, then the job's own rank processes on them: each one's state, the
    CPU it used, how long it waited for one, its CPUs and how busy they were, and who else took them
    (collectors/ranks) — the node-wide average alone hides a job pinned to two of its CPUs. Each
    table in the widest form that fits ``width`` whole (:func:`fit`)."""
    parts: list[RenderableType] = []
    if not hosts:
        parts.append(Text("hosts: " + NA + " (no host series from the agents: --host on)"))
    else:
        parts.append(fit(width, lambda: _hosts(hosts, False), lambda: _hosts(hosts, True)))
    if ranks:
        parts.append(fit(width, lambda: rank_host_table(ranks), lambda: rank_host_table(ranks, narrow=True),
                         lambda: rank_host_table(ranks, narrow=True, node=False)))
        others = top_others(ranks)
        if others:
            parts.append(others)
    return Group(*parts) if len(parts) > 1 else parts[0]


def _hosts(hosts: Sequence[Mapping[str, object]], narrow: bool) -> Table:
    t = Table(title="hosts", title_justify="left", **COMPACT if narrow else {})
    for col in ("node", "CPU", "load1", "memory GiB"):
        t.add_column(col, justify="left" if col == "node" else "right", no_wrap=True)
    for h in hosts:
        vals = obj(h.get("values"))
        cpu, load = num(vals.get("perfd_host_cpu_util_ratio")), num(vals.get("perfd_host_load1"))
        t.add_row(str(h.get("node")), NA if cpu is None else f"{100 * cpu:.0f}%",
                  NA if load is None else f"{load:.1f}",
                  used_of(num(vals.get("perfd_host_memory_used_bytes")),
                          num(vals.get("perfd_host_memory_total_bytes")), GIB, 1))
    return t


# (head, narrow head) of the rank processes table: every cell one value, never cut nor wrapped.
# "workers": the CPU the rank's own children used (data-loader workers: the job's, not "others").
RANK_HOST_COLUMNS = (("rank", "rank"), ("node", "node"), ("pid", "pid"), ("state", "state"), ("CPU", "CPU"),
                     ("workers", "wkrs"), ("CPU wait", "wait"), ("CPUs", "CPUs"), ("CPUs busy", "busy"),
                     ("others", "others"), ("throttled", "thr"))


def rank_host_table(ranks: Sequence[Mapping[str, object]], narrow: bool = False, node: bool = True) -> Table:
    """One row per rank process; who else ran on its CPUs goes below the table (:func:`top_others`),
    where a command line may take the lines it needs. ``narrow``: short heads, no rules; ``node``
    False: without the node column (the hosts table above names the nodes)."""
    t = Table(title="rank processes", title_justify="left", **COMPACT if narrow else {})
    for head, short in RANK_HOST_COLUMNS:
        if head == "node" and not node:
            continue
        col = short if narrow else head
        t.add_column(col, justify="left" if head in ("node", "state", "CPUs") else "right", no_wrap=True,
                     min_width=len(col))
    for r in ranks[:MAX_RANK_HOST_ROWS]:
        cores, wait = num(r.get("cpu_cores")), num(r.get("wait_ratio"))
        kids = num(r.get("children_cpu_cores"))
        busy, others, thr = (r.get(k) for k in ("allowed_busy_ratio", "others_ratio", "throttled_ratio"))
        cells = [str(r.get("rank")), str(r.get("node") or NA), str(r.get("pid") or NA),
                 str(r.get("state") or NA), NA if cores is None else f"{cores:.2f}",
                 NA if kids is None else f"{kids:.2f}", pct0(wait),
                 _cpus(r.get("allowed_cpus")), pct0(busy), pct0(others), pct0(thr)]
        t.add_row(*(cells if node else cells[:1] + cells[2:]))
    if len(ranks) > MAX_RANK_HOST_ROWS:
        t.caption = f"… and {len(ranks) - MAX_RANK_HOST_ROWS} more (GET /api/jobs/<job>/gpus: rank_hosts)"
    return t


def _cpus(cpus: object) -> str:
    """The rank's CPUs as the column's value ("0–3, 8"): cpus_text without its word."""
    if not cpus:
        return NA
    return cpus_text(cpus).removeprefix("CPUs ").removeprefix("CPU ")


def top_others(ranks: Sequence[Mapping[str, object]]) -> Text | None:
    """Per rank that shares its CPUs, the other process that took most of them: pid, user, share and
    command (40 characters), one line each (wrapped, never cut, on a narrow screen)."""
    lines = []
    for r in ranks[:MAX_RANK_HOST_ROWS]:
        foreign = [o for o in objs(r.get("others")) if not o.get("own")]
        if foreign:
            o = foreign[0]
            share = num(o.get("cpu_ratio"))
            took = f" took {100 * share:.0f}%" if share is not None else ""
            lines.append(f"  rank {r.get('rank')}: pid {o.get('pid')} ({o.get('user') or NA}){took} of its "
                         f"CPUs: {short_cmd(o)}")
    return Text("top other process on a rank's CPUs:\n" + "\n".join(lines)) if lines else None


def short_cmd(p: Mapping[str, object]) -> str:
    cmd = " ".join(str(p.get("cmdline") or p.get("name") or "").split())
    return cmd if len(cmd) <= 40 else cmd[:39] + "…"
