"""The predicted-vs-measured table of a remedies run (tests/gpu/remedies_live.py verify + measure).

    python3 tests/gpu/remedies_table.py VERIFY.json [MEASURE.json ...] > table.md

Each remedy perfd recommended on the live job and applied here is a row: its predicted change of the
step (the recommendation's ``gain_ms`` range, as perfd gave it before the change ran), the measured
change of the steady median against the job as it ran, measured before the changes and again after
them ("base", "base_again"; the change is read against their mean, and against each to show the
spread), and whether it falls inside. Remedies perfd did not recommend but that were measured (CUDA
graphs) and those that cannot run on the GPU machine (missing packages) are listed below the table.
Also ``--json``: the rows as JSON (the test data of tests/analytics/test_remedies.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def rows(verify: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    plan = verify.get("plan") or {}
    bases = [
        measured[k]["steady"]["median_ms"]
        for k in ("base", "base_again")
        if k in measured and measured[k]["steady"].get("n")
    ]
    base = sum(bases) / len(bases)
    out: dict[str, Any] = {
        "base_ms": bases,
        "base_mean_ms": base,
        "rows": [],
        "not_recommended": [],
        "cannot_run_here": verify.get("cannot_run_here") or {},
    }
    for name, m in measured.items():
        if name in ("base", "base_again"):
            continue
        med = m["steady"].get("median_ms")
        row = {
            "remedy": name,
            "flags": plan.get(name, {}).get("flags"),
            "exit": m.get("exit"),
            "measured_ms": med,
            "saved_ms": base - med if med is not None else None,
            "saved_vs_each_base_ms": [b - med for b in bases] if med is not None else None,
        }
        gain = plan.get(name, {}).get("gain_ms")
        if gain is None:
            out["not_recommended"].append(row)
            continue
        row["predicted_ms"] = gain
        row["inside"] = med is not None and gain[0] <= base - med <= gain[1]
        row["promised_but_slower"] = gain[0] > 0 and med is not None and base - med < 0
        out["rows"].append(row)
    return out


def markdown(t: dict[str, Any]) -> str:
    lines = [
        f"Base (the job as it ran): {', '.join(f'{b:.1f}' for b in t['base_ms'])} ms "
        f"(mean {t['base_mean_ms']:.1f} ms)",
        "",
        "| remedy | flags | predicted change (ms saved a step) | measured step (ms) | measured saved "
        "(vs mean; vs each base) | inside |",
        "|---|---|---|---|---|---|",
    ]
    for r in t["rows"]:
        lo, hi = r["predicted_ms"]
        each = ", ".join(f"{x:.1f}" for x in r["saved_vs_each_base_ms"] or [])
        lines.append(
            f"| {r['remedy']} | `{' '.join(r['flags'] or [])}` | {lo:.1f} to {hi:.1f} | "
            f"{r['measured_ms']:.1f} | {r['saved_ms']:.1f} ({each}) | {'yes' if r['inside'] else 'NO'} |"
        )
    for r in t["not_recommended"]:
        lines.append(
            f"| {r['remedy']} (not recommended) | `{' '.join(r['flags'] or [])}` | — | "
            f"{r['measured_ms']:.1f} | {r['saved_ms']:.1f} | — |"
        )
    if t["cannot_run_here"]:
        lines += ["", "Recommended, not runnable on the GPU machine (needs what it lacks):"]
        for k, v in t["cannot_run_here"].items():
            lo_hi = v.get("gain_ms")
            lines.append(
                f"- {k}: {v.get('action')} (needs {', '.join(v.get('needs') or [])}; predicted "
                + (f"{lo_hi[0]:.0f} to {lo_hi[1]:.0f} ms" if lo_hi else "n/a")
                + ")"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--json"]
    verify = json.loads(Path(args[0]).read_text())
    measured = dict(verify.get("measured") or {})
    for m in args[1:]:
        measured.update(json.loads(Path(m).read_text()).get("measured") or json.loads(Path(m).read_text()))
    t = rows(verify, measured)
    sys.stdout.write(json.dumps(t, indent=1) + "\n" if "--json" in sys.argv else markdown(t))
    return 0


if __name__ == "__main__":
    sys.exit(main())
