"""The predicted-vs-measured table of a plan A/B (tests/gpu/plan_ab_live.py), held to the plan's bar
(COMBINED_WITHIN and INSIDE_SHARE below).

    python3 tests/gpu/plan_ab_table.py DIR [DIR ...] [--json]   # the ab_<config>.json files in them

Per configuration: the job as it ran, measured three times or between every two changes (max − min is the
run-to-run spread; a change
is measured against the mean of the base runs just before and after it, which follows the machine's
drift); each plan item applied alone — its predicted gain (the plan written before any change
ran) against the measured one, whether it falls inside, and whether the range is no wider than the larger
of half its midpoint and twice the spread; the plan's set together — its predicted combined gain (overlaps
counted once) against the measured one, within 20%, beside the sum of the singles' measured gains.

A change run more than once (plan_ab_live ``--repeat N``: the changes run N times in turn, the k-th run of
a change under ``<change>@<k>`` from the second on, the first under its plain name) has, per run, its
saving against the base runs either side of that run; its measured saving is the mean of those
(``saved_each_ms`` lists them, the markdown shows them in brackets) and ``inside`` and the set's 20% are
judged on the mean. Keys without ``@`` (the A/Bs before ``--repeat``) give the table they always gave.

The estimate over a change's runs is the A/B's own, chosen when it starts (plan_ab_live ``--estimate``,
kept in ``ab_<config>.json`` as ``estimate``): ``mean`` (the default, every A/B recorded before it) or
``median``, which one base run far from the others cannot move (the sixteenth A/B: one base of nine
stepped 474 ms among 440-452, and both changes beside it read 12-15 ms more than in the other passes;
docs/evidence/README.md). It is never chosen after the runs: the table reads what the A/B recorded.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

BASES = ("base", "base_mid", "base_end")  # the first A/Bs' three; later ones interleave base_<n>
REPEAT_SEP = "@"  # plan_ab_live --repeat: a change's k-th run (k >= 2) is "<change>@<k>"


def split_repeat(label: str) -> tuple[str, int]:
    """A run key as (change, which run of it): ``"set@2"`` → ``("set", 2)``; a key without a repeat
    suffix is the first run (``"attention_dropout"`` → 1, ``"base_1"`` → ``("base_1", 1)``: ``_<n>``
    numbers the base runs, it is no repeat)."""
    name, sep, k = label.rpartition(REPEAT_SEP)
    if sep and name and k.isdigit() and int(k) >= 2:
        return name, int(k)
    return label, 1


def repeat_key(change: str, k: int) -> str:
    """The run key of a change's k-th run (the first keeps its plain name: older A/Bs stay valid)."""
    return change if k == 1 else f"{change}{REPEAT_SEP}{k}"


def is_base(label: str) -> bool:
    """A base run (the job as it ran): never a change's repeat, though a change may be named base…"""
    return REPEAT_SEP not in label and (label in BASES or label.startswith("base_"))


def repeats_of(runs: dict[str, Any], change: str) -> list[str]:
    """The keys of a change's runs present in ``runs``, first run first."""
    ks = sorted(k for label in runs if not is_base(label) for c, k in [split_repeat(label)] if c == change)
    return [repeat_key(change, k) for k in ks]

ESTIMATES = ("mean", "median")  # how a change's runs' savings become its measured saving (the first: default)
COMBINED_WITHIN = 0.2  # the bar: the combined gain within 20% of the measured one
INSIDE_SHARE = 0.9  # the bar: at least 90% of single changes inside their predicted range


def _median(run: dict[str, Any] | None) -> float | None:
    st = (run or {}).get("steady") or {}
    return float(st["median_ms"]) if st.get("n") else None


def config_rows(name: str, res: dict[str, Any]) -> dict[str, Any]:
    runs = res.get("runs") or {}
    # the plan read at the first base run's step (written after it, before any change) where there is
    # one: a replayed gain moves with the job's step, and the machine moves the step between runs
    plan = res.get("plan_at_base") or res.get("plan") or {}
    bases = [m for k in sorted(runs, key=lambda k: runs[k].get("started_at") or 0.0)
             if is_base(k) and (m := _median(runs.get(k))) is not None]
    out: dict[str, Any] = {
        "config": name,
        "gpu": res.get("gpu"),
        "bases_ms": bases,
        "rows": [],
        "set": None,
        "captured_steady_ms": _median(res.get("capture")),
        "pinned": res.get("pinned"),
        "job_flags": res.get("job_flags") or [],  # plan_ab_live --job-flags: the job as it is, every run
        "repeat": res.get("repeat") or 1,  # plan_ab_live --repeat: how many times each change was to run
        "estimate": estimate_of(res),  # plan_ab_live --estimate: fixed before the runs
        "errors": [],
    }
    if "error" in plan:
        out["errors"].append(plan["error"])
    if not bases:
        return out
    base = sum(bases) / len(bases)
    spread = max(bases) - min(bases) if len(bases) > 1 else None
    out.update(base_mean_ms=base, spread_ms=spread, read_at="base" if "plan_at_base" in res else "capture")
    written = plan.get("written_at")
    changed = [r["started_at"] for k, r in runs.items() if not is_base(k) and r.get("started_at")]
    out["predicted_before_applying"] = bool(written) and bool(changed) and written < min(changed)
    first = res.get("plan") or {}
    out["plan_written_at_utc"] = plan.get("written_at_utc") or first.get("written_at_utc")
    for remedy, item in (plan.get("apply_here") or {}).items():
        out["rows"].append(
            _row(
                remedy,
                item.get("gain_ms"),
                _measured(runs, remedy, base),
                runs.get(remedy),
                spread,
                item.get("flags"),
                item.get("remove"),
                out["estimate"],
            )
        )
    st = plan.get("set") or {}
    if st.get("remedies") and len(st["remedies"]) > 1:
        row = _row("set", st.get("gain_ms"), _measured(runs, "set", base), runs.get("set"), spread,
                   st["remedies"], [], out["estimate"])
        singles = [r["saved_ms"] for r in out["rows"] if r.get("saved_ms") is not None]
        row["sum_of_singles_ms"] = sum(singles) if len(singles) == len(out["rows"]) else None
        saved, pred = row.get("saved_ms"), st.get("gain_ms")
        row["within_20pct"] = (
            saved is not None
            and pred is not None
            and saved > 0
            and abs((pred[0] + pred[1]) / 2 - saved) <= COMBINED_WITHIN * saved
        )
        out["set"] = row
    return out


def estimate_of(res: dict[str, Any]) -> str:
    """The A/B's estimate over a change's runs, as it recorded it (before ``--estimate``: the mean)."""
    e = res.get("estimate") or ESTIMATES[0]
    if e not in ESTIMATES:
        raise ValueError(f"unknown estimate {e!r} in the A/B (known: {', '.join(ESTIMATES)})")
    return str(e)


def _beside(runs: dict[str, Any], label: str, mean: float) -> float:
    """The reference a change is measured against: the mean of the base runs just before and just
    after it (the machine drifts between runs minutes apart), else of them all."""
    at = (runs.get(label) or {}).get("started_at")
    if at is None:
        return mean
    timed = sorted((float(r["started_at"]), m) for k in runs if is_base(k) and (r := runs.get(k))
                   and r.get("started_at") is not None and (m := _median(r)) is not None)
    before = [m for t, m in timed if t < at]
    after = [m for t, m in timed if t > at]
    return (before[-1] + after[0]) / 2 if before and after else mean


def _measured(runs: dict[str, Any], change: str, mean: float) -> list[tuple[float, float]]:
    """Each measured run of a change, first run first: (its median step, its saving against the base
    runs either side of that run)."""
    got = []
    for label in repeats_of(runs, change):
        med = _median(runs.get(label))
        if med is not None:
            got.append((med, _beside(runs, label, mean) - med))
    return got


def _row(
    remedy: str,
    gain: list[float] | None,
    measured: list[tuple[float, float]],
    run: dict[str, Any] | None,
    spread: float | None,
    flags: Any,
    remove: Any,
    estimate: str = ESTIMATES[0],
) -> dict[str, Any]:
    """A change's row: ``measured`` its runs' (median step, saving) (their ``estimate`` judged; one run:
    that run's); ``run`` its first run (the exit code)."""
    row: dict[str, Any] = {
        "remedy": remedy,
        "flags": flags,
        "remove": remove,
        "predicted_ms": gain,
        "measured_ms": sum(m for m, _ in measured) / len(measured) if measured else None,
        "exit": (run or {}).get("exit"),
    }
    if not measured:
        return row
    each = [s for _, s in measured]
    saved = statistics.median(each) if estimate == "median" else sum(each) / len(each)
    row["saved_ms"] = saved
    row["saved_each_ms"] = [s for _, s in measured]
    if gain:
        lo, hi = gain
        row["inside"] = lo <= saved <= hi
        width, mid = hi - lo, (lo + hi) / 2
        allowed = max(mid / 2, 2 * spread) if spread is not None else mid / 2
        row["width_ms"], row["width_allowed_ms"] = width, allowed
        row["width_ok"] = width <= allowed
    return row


def table(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    configs = [config_rows(n, r) for n, r in sorted(results.items())]
    singles = [r for c in configs for r in c["rows"] if "inside" in r]
    sets = [c["set"] for c in configs if c["set"] and c["set"].get("saved_ms") is not None]
    inside = sum(1 for r in singles if r["inside"])
    return {
        "configs": configs,
        "singles": len(singles),
        "inside": inside,
        "inside_share": inside / len(singles) if singles else None,
        "widths_ok": sum(1 for r in singles if r.get("width_ok")),
        "sets_within_20pct": sum(1 for s in sets if s.get("within_20pct")),
        "sets": len(sets),
        "done": bool(singles)
        and inside >= INSIDE_SHARE * len(singles)
        and all(r.get("width_ok") for r in singles)
        and bool(sets)
        and all(s.get("within_20pct") for s in sets)
        and all(c.get("predicted_before_applying") for c in configs if c["rows"]),
    }


def _f(x: Any, fmt: str = "{:.1f}") -> str:
    return "—" if x is None else fmt.format(x)


def _saved(r: dict[str, Any]) -> str:
    """The measured saving; more than one run: the mean, then each run's (``12.3 (10.1, 14.5)``)."""
    each = r.get("saved_each_ms") or []
    return _f(r.get("saved_ms")) + (f" ({', '.join(_f(s) for s in each)})" if len(each) > 1 else "")


def markdown(t: dict[str, Any]) -> str:
    lines = []
    for c in t["configs"]:
        lines += [f"### {c['config']} ({c.get('gpu') or 'GPU ?'})", ""]
        if c["errors"]:
            lines += [f"- error: {e}" for e in c["errors"]] + [""]
        if not c["bases_ms"]:
            lines += ["No base measured.", ""]
            continue
        lines += [
            f"Base (the job as it ran, {len(c['bases_ms'])} times): "
            f"{', '.join(f'{b:.1f}' for b in c['bases_ms'])} ms "
            f"(mean {c['base_mean_ms']:.1f}, spread {_f(c.get('spread_ms'))} ms); the captured run's "
            f"steady {_f(c.get('captured_steady_ms'))} ms. Plan written {c.get('plan_written_at_utc')}"
            + (", read at the first base run's step after it" if c.get("read_at") == "base" else "")
            + f", before any change ran: {'yes' if c.get('predicted_before_applying') else 'NO'}. "
            "A change is measured against the base runs either side of it."
            + (f" The changes ran {c['repeat']} times in turn: a change's saving is the "
               f"{c.get('estimate', 'mean')} of its runs' (each against the base runs either side of "
               "that run, in brackets; the estimate fixed before the runs)."
               if c.get("repeat", 1) > 1 else "")
            + (f" Every run, the captured one too, under `{c['pinned']}`." if c.get("pinned") else "")
            + (f" Every run, the captured one too, with `{' '.join(c['job_flags'])}`."
               if c.get("job_flags") else ""),
            "",
            "| change | options | predicted (ms saved a step) | measured step (ms) | measured saved | "
            "inside | width (allowed) |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in c["rows"] + ([c["set"]] if c["set"] else []):
            p = r.get("predicted_ms")
            opts = " ".join(r.get("flags") or []) + "".join(f" -{x}" for x in r.get("remove") or [])
            lines.append(
                f"| {r['remedy']} | `{opts.strip()}` | {_f(p[0]) + ' to ' + _f(p[1]) if p else '—'} | "
                f"{_f(r.get('measured_ms'))} | {_saved(r)} | "
                + ("yes" if r.get("inside") else "NO" if "inside" in r else "—")
                + (
                    f" (within 20%: {'yes' if r.get('within_20pct') else 'NO'}; singles summed "
                    f"{_f(r.get('sum_of_singles_ms'))})"
                    if r["remedy"] == "set"
                    else ""
                )
                + f" | {_f(r.get('width_ms'))} ({_f(r.get('width_allowed_ms'))}) |"
            )
        lines.append("")
    lines.append(
        f"Singles inside their range: {t['inside']}/{t['singles']}; ranges within the width bar: "
        f"{t['widths_ok']}/{t['singles']}; sets within 20%: {t['sets_within_20pct']}/{t['sets']}; "
        f"the plan's bar met (singles inside, widths, sets, predicted first): {'yes' if t['done'] else 'no'}."
    )
    return "\n".join(lines) + "\n"


def main() -> int:
    dirs = [a for a in sys.argv[1:] if a != "--json"]
    results = {f.stem[3:]: json.loads(f.read_text()) for d in dirs for f in sorted(Path(d).glob("ab_*.json"))}
    t = table(results)
    sys.stdout.write(json.dumps(t, indent=1) + "\n" if "--json" in sys.argv else markdown(t))
    return 0


if __name__ == "__main__":
    sys.exit(main())
