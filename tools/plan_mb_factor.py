"""The micro-batch change's kernel factor each recorded plan A/B implies (docs/evidence/plan_h100_v8): the
factor by which the forward-backward kernels of a micro-batch twice the size would have to run
longer for the replay of the kept capture (perfd.capture.step_replay), at the job's own clock (the first
base run's median, as tools/plan_ab_rederive reads it), to save what the change measured; with the band
the bases' spread allows (the measured saving ± half of it). Beside it, the share of the forward-backward
kernel time that is GEMMs (perfd.analytics.breakdown.kernels), and what a GEMM-only factor would be.

    PYTHONPATH=$PWD python tools/plan_mb_factor.py [OUT.json]

The replay's constant (replay_table.MICROBATCH_DEVICE, 1.9-2.0) spans what every A/B implies; a factor
the A/B cannot tell (a host-bound job: the replayed saving moves by under 5 ms over the factor's
0.1) is printed as such.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perfd.analytics.advice.replay_gains import calibrate, host_scale  # noqa: E402
from perfd.analytics.breakdown import kernels as km  # noqa: E402
from perfd.analytics.breakdown.op_parts import is_data_annotation  # noqa: E402
from perfd.analytics.breakdown.replay_table import SCALES, Change, ReplayTable  # noqa: E402
from perfd.analytics.breakdown.step_parts import Part  # noqa: E402
from perfd.capture import step_replay as sr  # noqa: E402
from perfd.capture.analysis import step_marks  # noqa: E402
from perfd.capture.chrome_trace import read_chrome_trace  # noqa: E402
from perfd.capture.ops import attribute  # noqa: E402
from perfd.capture.timeline_events import KernelEvent, MemEvent  # noqa: E402
from tools.plan_ab_rederive import recorded  # noqa: E402

FACTORS = (1.7, 1.8, 1.9, 2.0, 2.1, 2.2)  # the grid the measured saving is read on (linear between)
TELLS_MS = 5.0  # a replayed saving that moves less than this over 0.1 of the factor: the A/B cannot tell it


@dataclass(frozen=True)
class Implied:
    evidence: str
    config: str
    microbatches: int
    scale: float  # the host scale at the job's clock
    saved_ms: float
    spread_ms: float
    ms_per_tenth: float  # the replayed saving's change over 0.1 of the factor
    factor: float | None  # the factor that gives the measured saving (None: outside the grid)
    band: tuple[float | None, float | None]  # at the saving + and - half the bases' spread
    gemm_share: float  # GEMMs' share of the forward-backward kernel time that scales with the rows
    host_share: float | None  # the replayed step's elasticity to the host's time (ReplayGains.host_share)
    gemm_ms: float  # those GEMMs' kernel time a step (over the budget's ceiling_ms: their achieved rate)

    @property
    def gemm_factor(self) -> float | None:
        """The GEMMs' own factor were every other kernel exactly 2x."""
        return None if self.factor is None or not self.gemm_share else 2 - (2 - self.factor) / self.gemm_share


def _solve(g: dict[float, float], target: float) -> float | None:
    xs = sorted(g)
    for a, b in itertools.pairwise(xs):
        if (g[a] - target) * (g[b] - target) <= 0 and g[a] != g[b]:
            return a + (b - a) * (g[a] - target) / (g[a] - g[b])
    return None


def _timeline(trace: Path) -> tuple[sr.Timeline, float, float, float]:
    """The kept capture's timeline as the replay reads it (perfd.capture.analysis.analyze_trace), and the
    GEMMs' share of its forward-backward kernel time outside the per-micro-batch weight-sized work, and
    the trace's own step and the GEMMs' time a step (ms: the host span over the complete steps)."""
    data = read_chrome_trace(trace)
    ops = attribute(data.ranges, data.launches, data.flows, True, data.syncs)
    assert ops is not None
    marks = step_marks(data.ranges)
    dev = min(k.device for k in data.kernels)
    acts: list[KernelEvent | MemEvent] = [*(k for k in data.kernels if k.device == dev),
                                          *(m for m in data.memcpys if m.device == dev)]
    mine = {x.corr: (x.start_ns, x.end_ns, x.stream if x.stream is not None else 0)
            for x in acts if x.corr is not None}
    h = sr.HostTrace(data.launches, data.syncs, mine, marks, ops.parts, ops.op_names, ops.sync_owner,
                     ops.tails, [r.start_ns for r in data.ranges if is_data_annotation(r.name)])
    t = sr.timeline(h)
    assert t is not None
    tails = sorted(ops.tails)
    starts = [a for a, _ in tails]
    names = {k.corr: k.name for k in data.kernels if k.device == dev}
    gemm = other = 0.0
    for x in data.launches:
        j = bisect.bisect_right(starts, x.ns) - 1
        if x.corr not in names or not marks[0] <= x.ns < marks[-1] or (j >= 0 and tails[j][1] >= x.ns) \
                or ops.parts.get(x.corr) is Part.GRAD_REDUCE:
            continue
        a, b, _ = mine[x.corr]
        if km.category(names[x.corr]) == km.GEMM:
            gemm += b - a
        else:
            other += b - a
    traced = (marks[-1] - marks[0]) / (len(marks) - 1) / 1e6
    return t, gemm / (gemm + other) if gemm + other else 0.0, traced, gemm / (len(marks) - 1) / 1e6


def implied() -> list[Implied]:
    out: list[Implied] = []
    mb = frozenset({Change.MICROBATCH})
    for d, kineto, c in recorded():
        name = c["config"]
        saved = next((r.get("saved_ms") for r in c["rows"] if r["remedy"] == "micro_batch"), None)
        ab, trace = d / f"ab_{name}.json", kineto / f"plan_{name}_rank0.json.xz"
        if saved is None or not (ab.exists() and trace.exists()):
            continue
        t, share, traced, gemm_ms = _timeline(trace)
        if not t.has(Change.MICROBATCH):
            continue
        clock = float(json.loads(ab.read_text())["runs"]["base"]["steady"]["median_ms"])
        spread = max(c["bases_ms"]) - min(c["bases_ms"])
        table = ReplayTable(SCALES, tuple(sr.simulate(t, s) for s in SCALES), {}, traced,
                            t.microbatches)
        mid = host_scale(table, clock - table.unmodelled_ms)
        fit = calibrate(table, clock, 0.0)
        if mid is None or fit is None:
            continue
        base = sr.simulate(t, mid)
        g = {f: base - _with_factor(t, mid, mb, f) for f in FACTORS}
        tenth = g[1.9] - g[2.0]
        tells = abs(tenth) >= TELLS_MS
        out.append(Implied(d.name, name, t.microbatches or 0, mid, float(saved), spread, tenth,
                           _solve(g, saved) if tells else None,
                           (_solve(g, saved + spread / 2), _solve(g, saved - spread / 2)) if tells
                           else (None, None), share, fit.host_share, gemm_ms))
    return out


def _with_factor(t: sr.Timeline, scale: float, changes: frozenset[Change], f: float) -> float:
    """The replayed step with the micro-batch kernel factor at ``f`` (both ends of the model's range)."""
    saved = sr._PARAMS
    try:
        sr._PARAMS = {**saved, Change.MICROBATCH: (f, f)}
        return sr.simulate(t, scale, changes)
    finally:
        sr._PARAMS = saved


PRECISE = 0.1  # an A/B whose band (the bases' spread) spans under this much of the factor fits a model


def _job_factor(kind: str, p: float, x: Implied) -> float:
    """The job's factor from a model's parameter: "constant" (the factor itself) or "gemm" (the GEMMs'
    own factor, every other kernel 2x)."""
    return p if kind == "constant" else 2 - (2 - p) * x.gemm_share


def _param(kind: str, x: Implied) -> float | None:
    return x.factor if kind == "constant" else x.gemm_factor


def leave_one_config_out(got: list[Implied], kind: str) -> list[tuple[Implied, float, float, bool]]:
    """Each A/B whose factor the measurement tells, held to the model's range fitted (min to max of the
    parameter) on the precise A/Bs of the other configurations: (A/B, range low, range high, whether
    the range meets the A/B's band)."""
    out = []
    for x in got:
        if x.factor is None:
            continue
        train = [p for y in got if y.config != x.config and y.factor is not None and None not in y.band
                 and (y.band[1] or 0) - (y.band[0] or 0) <= PRECISE and (p := _param(kind, y)) is not None]
        if not train:
            continue
        a, b = sorted((_job_factor(kind, min(train), x), _job_factor(kind, max(train), x)))
        lo, hi = x.band
        out.append((x, a, b, (lo is None or lo <= b) and (hi is None or hi >= a)))
    return out


def main() -> int:
    got = implied()
    for x in got:
        band = "-".join("open" if b is None else f"{b:.3f}" for b in x.band)
        said = "cannot tell" if x.factor is None else f"{x.factor:.3f} ({band})"
        print(f"{x.evidence:14s} {x.config:12s} scale {x.scale:4.2f} saved {x.saved_ms:6.1f} "
              f"spread {x.spread_ms:5.1f} {x.ms_per_tenth:5.1f} ms per 0.1  factor {said:22s} "
              f"host share {x.host_share or 0:.2f} GEMM share {x.gemm_share:.2f} ({x.gemm_ms:.0f} ms)"
              + (f" GEMM-only factor {x.gemm_factor:.2f}" if x.gemm_factor is not None else ""))
    for kind in ("constant", "gemm"):
        held = leave_one_config_out(got, kind)
        width = sum((b - a) * x.ms_per_tenth * 10 for x, a, b, _ in held) / len(held) if held else 0.0
        met = sum(ok for *_, ok in held)
        print(f"leave one config out, {kind}: {met} of {len(held)} held-out factors met; the factor's span "
              f"{width:.1f} ms of saving on average")
        for x, a, b, ok in held:
            print(f"  {x.evidence:14s} {x.config:12s} {a:.3f}-{b:.3f} {'met' if ok else 'MISSED'}")
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps([{**dataclasses.asdict(x), "gemm_factor": x.gemm_factor}
                                                 for x in got], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
