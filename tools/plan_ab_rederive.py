"""Every recorded plan A/B (docs/evidence/plan_<gpu>/, tests/gpu/plan_ab_live.py) read again by the gain
model in this checkout: each configuration's plan re-derived from its kept capture and log
(tests/data/captures/kineto_<gpu>_megatron/) at its first base run's step, as the A/B read it before any
change ran, and held to what each change measured then (its table.json).

    PYTHONPATH=$PWD python tools/plan_ab_rederive.py [OUT.json]

One line a change (the range the model gives now, the one written then, the measured saving, inside or
not, within the plan's width bar or not) and the totals. A model change is judged here on every A/B at
once; the A/B that tests it is still the one whose plan was written before its changes ran.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.gpu.plan_ab_live import captured_of, plan_from  # noqa: E402

EVIDENCE = ROOT / "docs" / "evidence"
CAPTURES = ROOT / "tests" / "data" / "captures"
H100 = "NVIDIA H100 80GB HBM3"


@dataclass(frozen=True)
class Row:
    evidence: str
    config: str
    remedy: str
    now: tuple[float, float]  # the range the model in this checkout gives
    then: tuple[float, float]  # the range the A/B wrote before its changes ran
    saved: float  # what the change measured (ms a step)
    spread: float  # the A/B's bases' spread

    @property
    def inside(self) -> bool:
        return self.now[0] <= self.saved <= self.now[1]

    @property
    def within_20pct(self) -> bool:  # the plan's bar for a set: its combined gain within 20% of the measured
        return abs((self.now[0] + self.now[1]) / 2 - self.saved) <= 0.2 * abs(self.saved)

    @property
    def width_ok(self) -> bool:  # the plan's width bar: half the midpoint or twice the bases' spread
        lo, hi = self.now
        return hi - lo <= max((lo + hi) / 4, 2 * self.spread)


def recorded() -> Iterator[tuple[Path, Path, dict[str, Any]]]:
    """(evidence dir, its captures dir, one configuration of its table.json) for every recorded A/B
    whose table and captures are kept."""
    for d in sorted(EVIDENCE.glob("plan_h*")):
        kineto = CAPTURES / f"kineto_{d.name.removeprefix('plan_')}_megatron"
        if (d / "table.json").exists() and kineto.exists():
            for c in json.loads((d / "table.json").read_text())["configs"]:
                yield d, kineto, c


def rows() -> list[Row]:
    out: list[Row] = []
    for d, kineto, c in recorded():
        name = c["config"]
        ab = d / f"ab_{name}.json"
        trace, log = kineto / f"plan_{name}_rank0.json.xz", kineto / f"plan_{name}_megatron.log.gz"
        if not (ab.exists() and trace.exists() and log.exists()):
            continue
        res = json.loads(ab.read_text())
        first = float(res["runs"]["base"]["steady"]["median_ms"])
        spread = max(c["bases_ms"]) - min(c["bases_ms"])
        plan = plan_from(trace, log, res.get("gpu") or H100, name, captured_of(res), first,
                         res["plan"]["set"]["remedies"])
        for r in [*c["rows"], *([c["set"]] if c.get("set") else [])]:
            saved, remedy = r.get("saved_ms"), r["remedy"]
            got = plan["set"]["gain_ms"] if remedy == "set" else \
                (plan["apply_here"].get(remedy) or {}).get("gain_ms")
            if saved is None or got is None:
                continue
            then = r["predicted_ms"]
            out.append(Row(d.name, name, remedy, (float(got[0]), float(got[1])),
                           (float(then[0]), float(then[1])), float(saved), float(spread)))
    return out


def main() -> int:
    got = rows()
    for x in got:
        print(f"{x.evidence:14s} {x.config:12s} {x.remedy:22s} now {x.now[0]:6.1f} to {x.now[1]:6.1f}  "
              f"then {x.then[0]:6.1f} to {x.then[1]:6.1f}  saved {x.saved:6.1f}  "
              f"{'inside' if x.inside else 'OUT   '} {'' if x.width_ok else 'too wide'}")
    singles = [x for x in got if x.remedy != "set"]
    print(f"singles inside: {sum(x.inside for x in singles)} of {len(singles)}; "
          f"within the width bar: {sum(x.width_ok for x in singles)} of {len(singles)}")
    sets = [x for x in got if x.remedy == "set"]
    print(f"sets inside: {sum(x.inside for x in sets)} of {len(sets)}; "
          f"within 20% of the measured: {sum(x.within_20pct for x in sets)} of {len(sets)}")
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(
            [{**dataclasses.asdict(x), "inside": x.inside, "width_ok": x.width_ok,
              **({"within_20pct": x.within_20pct} if x.remedy == "set" else {})} for x in got], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
