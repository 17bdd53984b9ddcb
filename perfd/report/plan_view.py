"""The remedies' plan (perfd.analytics.advice.plan.Plan) as people read it: stage by stage in the order an
engineer applies them, each with its effort and combined gain, each remedy with its gain alone, what it
replaces or overlaps (counted once) and what it requires that the start-up does or does not show; in
text (the report), one line (`perfd top`) and HTML. Pure: values in, text out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from perfd.analytics.advice.plan import (
    PACKAGE_NAMES,
    Plan,
    PlanItem,
    PlanStage,
    Presence,
    Relation,
    Unmodelled,
)
from perfd.analytics.advice.remedies import Effort
from perfd.analytics.finding_types import Recommendation
from perfd.report.remedy_text import NO_GAIN_TEXT, RISK_TEXT

PlanIn = Plan | Mapping[str, Any] | None


def typed(plan: PlanIn) -> Plan | None:
    return plan if plan is None or isinstance(plan, Plan) else Plan.from_json(plan)


def _pkgs(pkgs: Sequence[str], joiner: str = " or ") -> str:
    return joiner.join(PACKAGE_NAMES.get(p, p) for p in pkgs)


def _ms(lo_hi: tuple[float, float]) -> str:
    lo, hi = lo_hi
    return f"{max(lo, 0.0):.0f}–{hi:.0f} ms" if lo > -0.5 else f"{lo:.0f} to {hi:.0f} ms"


def stage_title(s: PlanStage, n: int, plan: Plan) -> str:
    what = {
        Effort.FLAG: "Options (minutes, a restart)",
        Effort.INSTALL: f"Install {_pkgs(s.install)}" if s.install else "Installs",
        Effort.CODE: "Code changes",
    }[s.effort]
    step = plan.step_ms
    if s.gain_ms[1] <= 0.5:
        return f"{n}. {what}: nothing more once the stages before are in"
    after = (
        f" (the {step:.0f} ms step → ~{step - s.total_ms[1]:.0f}–{step - s.total_ms[0]:.0f} ms)"
        if s.total_ms[0] > 0
        else ""
    )
    more = "" if n == 1 else f", {_ms(s.total_ms)} with the stages before"
    return f"{n}. {what}: {_ms(s.gain_ms)} a step together{more}{after}"


def _ref(remedy: str, ids: Mapping[str, str]) -> str:
    return ids.get(remedy, remedy.replace("_", " "))


def item_text(i: PlanItem, ids: Mapping[str, str]) -> str:
    """One remedy of the plan: its action, its gain alone, and how it stands to the others."""
    head = ids.get(i.remedy)
    return (f"{head} " if head else "") + f"{i.action} — " + item_standing(i, ids)


def item_standing(i: PlanItem, ids: Mapping[str, str]) -> str:
    """An item's gain alone and how it stands to the others, without its action: the text line puts
    the two together, the HTML row in columns of their own (the action is the item's own field)."""
    bits = [f"{_ms(i.gain_ms)} alone" if i.gain_ms else "gain not estimated"]
    if i.risk is not None:
        bits.append(f"not promised: {RISK_TEXT[i.risk]}")
    replaced = [_ref(k.target, ids) for k in i.links if k.relation is Relation.REPLACES]
    if replaced:
        bits.append("replaces " + " and ".join(replaced))
    for k in i.links:
        if k.relation is Relation.REPLACED_BY:
            bits.append(f"moot once {_ref(k.target, ids)} is in")
        elif k.relation is Relation.OVERLAPS and k.shared_ms is not None:
            bits.append(f"overlaps {_ref(k.target, ids)} ({_ms(k.shared_ms)} counted once)")
    if i.prerequisites:
        bits.append(prerequisites_text(i))
    return "; ".join(bits)


_SHOWN = {
    Presence.PRESENT: "shown at start-up",
    Presence.ABSENT: "missing at start-up",
    Presence.UNKNOWN: "not shown at start-up",
}


def prerequisites_text(i: PlanItem) -> str:
    """What the remedy requires and what the job's start-up shows of each ("requires Transformer Engine
    or Apex (both missing at start-up)")."""
    names = [PACKAGE_NAMES.get(p.package, p.package) for p in i.prerequisites]
    states = {p.presence for p in i.prerequisites}
    joiner = " or " if i.any_of else " and "
    if len(states) == 1 and len(names) > 1:
        return (
            f"requires {joiner.join(names)} ({'both ' if len(names) == 2 else 'all '}{_SHOWN[states.pop()]})"
        )
    each = (f"{n} ({_SHOWN[p.presence]})" for n, p in zip(names, i.prerequisites, strict=True))
    return "requires " + joiner.join(each)


def rec_ids(recs: Sequence[Recommendation] | Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """remedy -> its recommendation's id (R1, ...)."""
    out: dict[str, str] = {}
    for r in recs:
        remedy, rid = (r.get("remedy"), r.get("id")) if isinstance(r, Mapping) else (r.remedy, r.id)
        if remedy and rid:
            out.setdefault(str(remedy), str(rid))
    return out


UNMODELLED_HEAD = "Not modelled (they fit the job, but no gain is read for them: not ordered, not added up):"


def unmodelled_text(u: Unmodelled, ids: Mapping[str, str]) -> str:
    head = ids.get(u.remedy)
    return (f"{head} " if head else "") + f"{u.action} — {NO_GAIN_TEXT[u.why]}"


def text_lines(plan_in: PlanIn, ids: Mapping[str, str]) -> list[str]:
    plan = typed(plan_in)
    if plan is None or not (plan.items or plan.unmodelled):
        return []
    out = []
    for n, s in enumerate(plan.stages, start=1):
        out.append(f"  {stage_title(s, n, plan)}")
        out += [f"     {item_text(i, ids)}" for i in plan.items if i.stage == n - 1]
    rest = [i for i in plan.items if i.stage < 0]
    if rest:
        out.append("  Not in the set (not promised: the range reaches below zero, or the remedy as said "
                   "failed on such a job; measure before keeping it):")
        out += [f"     {item_text(i, ids)}" for i in rest]
    if plan.unmodelled:
        out.append(f"  {UNMODELLED_HEAD}")
        out += [f"     {unmodelled_text(u, ids)}" for u in plan.unmodelled]
    return out


def compact(plan_in: PlanIn) -> str:
    """The plan in one line (`perfd top`): each stage's effort, remedies and combined gain."""
    plan = typed(plan_in)
    if plan is None or not plan.stages:
        return ""
    bits = []
    for n, s in enumerate(plan.stages, start=1):
        if s.gain_ms[1] <= 0.5:
            continue
        what = {
            Effort.FLAG: f"{len(s.items)} option(s)",
            Effort.INSTALL: f"install {_pkgs(s.install)}",
            Effort.CODE: f"{len(s.items)} code change(s)",
        }[s.effort]
        bits.append(f"{n}) {what} −{_ms(s.gain_ms)}")
    return "; ".join(bits)


def html_section(plan_in: PlanIn, ids: Mapping[str, str]) -> str:
    plan = typed(plan_in)
    if plan is None or not (plan.items or plan.unmodelled):
        return ""
    rows = []
    for n, s in enumerate(plan.stages, start=1):
        rows.append(f'<tr class="stage"><td colspan="3"><b>{escape(stage_title(s, n, plan))}</b></td></tr>')
        rows += [_row(i, ids) for i in plan.items if i.stage == n - 1]
    rest = [i for i in plan.items if i.stage < 0]
    if rest:
        rows.append(
            '<tr class="stage"><td colspan="3"><b>Not in the set (measure before keeping it)</b></td></tr>'
        )
        rows += [_row(i, ids) for i in rest]
    if plan.unmodelled:
        rows.append(f'<tr class="stage"><td colspan="3"><b>{escape(UNMODELLED_HEAD)}</b></td></tr>')
        rows += [f"<tr><td>{escape((ids.get(u.remedy, '') + ' ' + u.action).strip())}</td>"
                 f"<td>{escape(u.effort.value)}</td><td>{escape(NO_GAIN_TEXT[u.why])}</td></tr>"
                 for u in plan.unmodelled]
    return (
        '<h2 id="plan">Plan</h2><p class="meta">Apply stage by stage, re-capturing after each; a '
        "stage's gain counts once what its remedies share with each other and with the stages "
        'before.</p><table class="plan"><thead><tr><th>remedy</th><th>effort</th><th>gain alone, '
        f"relations, prerequisites</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _row(i: PlanItem, ids: Mapping[str, str]) -> str:
    rest = item_standing(i, {k: v for k, v in ids.items() if k != i.remedy})
    return (
        f"<tr><td>{escape((ids.get(i.remedy, '') + ' ' + i.action).strip())}</td>"
        f"<td>{escape(i.effort.value)}</td>"
        f"<td>{escape(rest)}</td></tr>"
    )
