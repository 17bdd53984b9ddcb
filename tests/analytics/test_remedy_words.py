"""English only where it is shown, the remedies: a remedy's action, cost, notes and the basis of
its gain are codes with arguments (perfd.analytics.advice.remedy_said), their sentences declared once in
perfd.report.remedy_text (TEMPLATE, and the recommendation's, the smaller remedies' finding's and the plan
item's words made there), the step budget's findings are worded in perfd.report.budget_text, and neither's
sentences are in any analytics source again; the typed values that carry them hold no text; and the report
words them as they read before (a golden recommendation)."""

from __future__ import annotations

import ast
import string
import typing
from pathlib import Path

from perfd.analytics.advice.budget_findings import RemedyRecommendation, SmallerRemedies, UnmodelledRemedies
from perfd.analytics.advice.capture_findings import diagnose_capture
from perfd.analytics.advice.plan import PlanItem
from perfd.analytics.advice.remedies import Advice, Framework, Gain, JobConfig
from perfd.analytics.advice.remedy_said import Said, Say, say
from perfd.report.grade_text import worded_all
from perfd.report.remedy_text import TEMPLATE, text
from tests.test_english_where_shown import ROOT, _found, _fragments, _text_in
from tests.trace_cache import analyze_chrome_trace

REMEDY_TEXT = ROOT / "perfd" / "report" / "remedy_text.py"
BUDGET_TEXT = ROOT / "perfd" / "report" / "budget_text.py"  # the step budget's findings
TINY = ROOT / "tests" / "data" / "captures" / "kineto_h100_megatron" / "tiny_rank0.json.gz"
# The module's own words (the detail's, the gain's, the smaller remedies' finding's) are f-strings cut by
# their fields into short pieces: a piece is a sentence from OWN_WORDS words ("the job's start-up says").
OWN_WORDS = 4
# Pieces analytics says of something else, in its own words: a share "of the step" or "of the ceiling"
# (everywhere), the replay's docstring (replay_gains.py), the run's exposed-communication recommendation
# (run_findings.py), whose action is not a code yet, a threshold's description (thresholds.py) and the
# capture check's docstring quoting the capture's finding (capture_match.py).
SAID_ELSEWHERE = {"of the step", "of the ceiling", "steps at the job's own",
                  "Overlap gradient communication with compute", "of the measured matmul ceiling",
                  "slowed its steps by"}
# A code whose words are declared in analytics for every analyzer that says them (the data-loading action
# of incidents, the run and this remedy: advice_registry.DATA_ACTIONS), not moved here.
DECLARED_ELSEWHERE = {Say.DATA_LOADER}


def _own_words(path: Path) -> list[str]:
    """The literal pieces of a module's functions (their docstrings but), each cut as a template is."""
    out: list[str] = []
    for fn in (n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)):
        doc = fn.body[0].value if isinstance(fn.body[0], ast.Expr) else None
        out += [frag for n in ast.walk(fn) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                and n is not doc
                for frag in _fragments(n.value.replace("{", "{{").replace("}", "}}"), OWN_WORDS)]
    return out


def _remedy_fragments() -> dict[str, str]:
    """Each template's sentences (3 words or more) and the module's own (OWN_WORDS words or more)."""
    fragments = {frag: c.name for c, t in TEMPLATE.items() if c not in DECLARED_ELSEWHERE
                 for frag in _fragments(t)}
    fragments |= {frag: "remedy_text.py" for frag in _own_words(REMEDY_TEXT)}
    fragments |= {frag: "budget_text.py" for frag in _own_words(BUDGET_TEXT)}
    return {k: v for k, v in fragments.items() if k not in SAID_ELSEWHERE}


def _fields(template: str) -> set[int]:
    return {int(f) for _, f, _, _ in string.Formatter().parse(template) if f}


def test_every_code_has_one_sentence_of_its_arity() -> None:
    assert set(TEMPLATE) == set(Say)
    assert len({c.value for c in Say}) == len(Say)  # two codes of one arity stay two codes
    for c in Say:
        assert _fields(TEMPLATE[c]) == set(range(c.arity)), c


def _said_in(s: Said) -> list[Said]:
    return [s, *(x for a in s.args if isinstance(a, Said) for x in _said_in(a))]


def test_the_remedies_say_each_code_with_its_arity() -> None:
    """Every sentence the remedies make of a recorded capture (the tiny job's, the slow loader's and the
    large H100 job's, under each framework, with and without a configuration) takes as many arguments as
    its code says."""
    hook = ROOT / "tests" / "data" / "captures" / "hook_h100_data" / "hook_data_rank0.json.gz"
    seen: set[Say] = set()
    for trace in (TINY, hook, TINY.with_name("big2048_rank0.json.gz")):
        dev = analyze_chrome_trace(trace).device(0)
        for fw in Framework:
            args = {"timing_log_level": "2", "masked_softmax_fusion": "False"}
            for cfg in (None, JobConfig(fw, dp=4, pp=2, micro_batch=2, global_batch=32, arguments=args)):
                d = diagnose_capture([dev], iterations=3, framework=fw, config=cfg)
                fitted = []
                for r in d.recommendations:
                    assert isinstance(r, RemedyRecommendation) and r.facts is not None
                    fitted.append(r.facts.advice[0])
                # the remedies named in a finding of their own (the smaller ones, those with no gain)
                fitted += [a for f in d.findings if isinstance(f, (SmallerRemedies, UnmodelledRemedies))
                           and f.facts is not None for a in f.facts.advice]
                for a in fitted:
                    for top in (a.action, a.cost, *a.notes, a.gain.basis if a.gain else None):
                        for s in _said_in(top) if top is not None else []:
                            assert len(s.args) == s.code.arity, s
                            seen.add(s.code)
    assert len(seen) > 20  # the check saw many sentences


def test_no_analytics_module_words_a_remedy_again() -> None:
    fragments = _remedy_fragments()
    assert len(fragments) > 50  # the check looks for real sentences
    assert "the gaps around them move too" in fragments  # a basis (DROPOUT_BASIS)
    assert "Fused attention: install Transformer Engine, then" in fragments  # an action
    assert "memory for the graphs' static buffers" in fragments  # a cost
    assert "the start-up does not say whether Transformer Engine or Apex is there" in fragments  # a note
    assert fragments.get("the job's start-up says") == "remedy_text.py"  # the detail's own words
    assert "measure before keeping it" in fragments  # the gain's
    assert fragments.get("The captured steps averaged") == "budget_text.py"  # the capture's cost
    found = _found(fragments, sorted((ROOT / "perfd" / "analytics").rglob("*.py")))
    assert not found, found


def test_the_check_finds_a_remedy_sentence_said_in_a_module(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text('def basis(ms, lo, hi):\n'
                     '    return (f"exposed communication {ms:.0f} ms per step, run behind the backward "\n'
                     '            f"pass (× {lo:g}–{hi:g})")\n')
    assert [x.split(": ", 1)[1] for x in _found(_remedy_fragments(), [probe])] == [
        "OVERLAP_BASIS 'ms per step, run behind the backward pass (×'"]
    # and the detail's own words, as budget_findings used to say them
    probe.write_text('def needs(names):\n'
                     '    return f"needs {names}; the job\'s start-up says " + "it is not" + " installed"\n')
    assert [x.split(": ", 1)[1] for x in _found(_remedy_fragments(), [probe])] == [
        "remedy_text.py \"the job's start-up says\""]


def test_a_remedy_holds_codes_not_sentences() -> None:
    """The fields that may hold text are names only: options (remove), packages (needs, requires,
    installs); a plan item's ``action`` is its words once worded or read back from JSON, its code
    (``said``) before."""
    allowed: dict[type, set[str]] = {
        Advice: {"remove", "needs", "requires", "installs"},
        Gain: set(),
        PlanItem: {"remedy", "action", "flags", "remove", "moot_by"},
    }
    for cls, names in allowed.items():
        hints = typing.get_type_hints(cls)
        texts = {n for n, h in hints.items() if _text_in(h)}
        assert texts <= names, (cls.__name__, texts - names)


def test_a_sentence_nests_and_says_nothing_for_none() -> None:
    spread = say(Say.SPREAD, 7.4, say(Say.SPREAD_SHARE, 0.0102), say(Say.OWN_SPREAD))
    assert text(spread) == "± 7 ms run to run (1.0% of the step: the spread of its own steady steps)"
    assert text(say(Say.SPREAD, 1.0, say(Say.NO_STEP), None)) == "± 1 ms run to run (no step)"
    assert text(say(Say.DATA_KNOBS, Framework.MEGATRON.value)) == "Megatron-LM: --num-workers"
    assert text(None) == ""


def test_the_report_words_a_remedy_as_it_read() -> None:
    """A golden recommendation: the tiny job's CUDA graphs remedy, as the report showed it before its words
    moved out of analytics (a capture's diagnosis, worded where it is kept or printed)."""
    d = diagnose_capture([analyze_chrome_trace(TINY).device(0)], iterations=3,
                         framework=Framework.MEGATRON)
    _fs, recs = worded_all(d.findings, d.recommendations)
    r1 = recs[0]
    assert r1.action == "CUDA graphs: --cuda-graph-impl local"
    assert r1.detail == (
        "basis: 30%–80% of the 53 ms of forward-backward launch gaps come back (the graphed regions'), less "
        "the replay's input copies and the breaks at syncs and dynamic shapes (up to 5% of the step); ± 0 ms "
        "run to run (0.5% of the step); expected: step −13 to −43 ms (23%–76%); cost: memory for the graphs' "
        "static buffers; Megatron-LM version unknown: --cuda-graph-impl as in 0.20; effort: a flag (minutes)")


def test_the_budgets_class_is_typed_and_worded_in_the_report() -> None:
    """The class a capture's budget supports is its class and shares wherever analytics hands it on (the
    budget's class finding, the MFU grade explained by it); where the step goes, said by the classes'
    short names, is perfd.report.budget_text's."""
    from perfd.analytics.breakdown.bottleneck import BottleneckClass as B
    from perfd.analytics.breakdown.bottleneck import BudgetClass
    from perfd.analytics.run.run_grade import GradeExplanation
    from perfd.report.budget_text import class_shares_text, class_text

    assert not hasattr(BudgetClass, "reason")  # its words: class_shares_text
    assert not {n for n, h in typing.get_type_hints(GradeExplanation).items() if _text_in(h)}
    c = BudgetClass(B.LAUNCH, {B.COMPUTE: 0.15, B.MEMORY: 0.05, B.LAUNCH: 0.6, B.SYNC: 0.2}, 0.4)
    assert class_shares_text(c) == "launch 60%, sync 20%, compute 15% of the step"  # the three largest
    assert class_text(c) == "launch-overhead (launch 60%, sync 20%, compute 15% of the step)"
