"""The plan's HTML row takes an item's action from the item and its standing from the view: no column is
cut out of the line the text view makes, so an action whose own words hold a dash stays whole."""

from __future__ import annotations

from html import escape

from perfd.analytics.advice.plan import Plan, PlanItem, PlanStage
from perfd.analytics.advice.remedies import Effort
from perfd.report.plan_view import html_section, item_standing, item_text

ACTION = "A fused linear + cross-entropy — Liger Kernel's loss (pip install liger-kernel)"


def _plan() -> Plan:
    item = PlanItem("fused_linear_ce", ACTION, Effort.INSTALL, (10.0, 20.0), 0)
    stage = PlanStage(Effort.INSTALL, ("fused_linear_ce",), (10.0, 20.0), (10.0, 20.0), ("liger_kernel",))
    return Plan(100.0, (item,), (stage,), 2.0)


def test_the_row_holds_the_items_action_whole_and_its_standing_apart() -> None:
    plan = _plan()
    item = plan.items[0]
    standing = item_standing(item, {})
    assert standing == "10–20 ms alone"
    assert item_text(item, {"fused_linear_ce": "R1"}) == f"R1 {ACTION} — {standing}"
    html = html_section(plan, {"fused_linear_ce": "R1"})
    assert f"<td>R1 {escape(ACTION)}</td>" in html
    assert f"<td>{standing}</td>" in html
