"""English only where it is shown, for the findings made outside the advice package: the
sentences perfd/report declares for the run's findings and recommendations (perfd.report.finding_text,
from perfd.analytics.run.run_facts; a capture's slower-than-steady finding), the serving ones
(perfd.report.serving_text, from perfd.analytics.serving.serving_facts), the collective ones
(perfd.report.collective_text, from perfd.analytics.collectives.collective_facts) and the Nsight Compute
verdicts' and coverage's (perfd.report.ncu_text) are in no analytics source again. The same check as
tests/test_english_where_shown.py (AST, no import): each literal piece of five words or more of those
modules is looked for in every string constant of perfd/analytics. And the facts the findings carry
hold numbers, kinds and names, never a sentence (checked on their annotations)."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

from tests.test_english_where_shown import ROOT, _found, _said, _text_in

# The modules that word the findings.
FINDING_TEXT = ("finding_text.py", "serving_text.py", "collective_text.py", "ncu_text.py")


# Pieces analytics says of something else, in its own words: the docs of thresholds (thresholds.py) and of
# the ncu rows' class (ncu_verdicts.py).
SAID_ELSEWHERE = {"of the step's compute time", "its own steps before it was armed"}


def _fragments() -> dict[str, str]:
    return {frag: name for name in FINDING_TEXT for frag in _said(ROOT / "perfd" / "report" / name)
            if frag not in SAID_ELSEWHERE}


def test_no_analytics_module_words_a_finding_again() -> None:
    fragments = _fragments()
    assert len(fragments) > 80  # the check looks for real sentences
    assert "Stage imbalance dominates the pipeline bubble" in fragments  # a run finding's title
    assert "Look for host-side gaps: garbage collection, logging, checkpointing, other processes on the " \
        "node" in fragments  # a run recommendation's action
    assert "ms of forward+backward compute per steady iteration (timers): the same work ran slower while " \
        "captured — the GPU was shared, throttled, or clocked down." in fragments  # a capture's
    assert ". Start SGLang with --enable-metrics and pass its /metrics URL." in fragments  # a serving one
    assert "a serving SLO or capacity problem needs action" in fragments  # the serving status
    assert "Keep tensor parallelism within the NVLink domain (TP ≤ GPUs per node; use PP or DP across " \
        "nodes" in fragments  # a collective one
    assert "launches profiled could not be matched to the timeline's (another run's shapes, or another " \
        "filter): their ops, passes and layers are unknown" in fragments  # an ncu capture's coverage
    assert "is a persistent straggler" not in fragments  # four words: too short to be a sentence
    # where a finding's figures come from (its source), said where it is worded
    assert "sum of max-across-ranks of the p2p timers (upper bound" in fragments  # a run finding's
    assert "collectors/nccl hang detection (every agent's Flight Recorder dumps, merged" in fragments
    assert "capture timeline vs Megatron timers" in fragments  # a capture's slower-than-steady finding
    assert "too little to class the step" in fragments  # why an ncu capture's rows give no class
    found = _found(fragments, sorted((ROOT / "perfd" / "analytics").rglob("*.py")))
    assert not found, found


def test_the_check_finds_a_finding_worded_in_analytics(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    # the p2p finding's observation, as the run's analyzer used to word it (run_findings.py)
    probe.write_text('def observation(dp, idle):\n'
                     '    return (f"sync {dp}. The p2p timers include waiting for the peer stage, "\n'
                     '            f"the same time as the stage idle ({idle}): a pipeline effect")\n')
    assert [x.split(": ", 1)[1] for x in _found(_fragments(), [probe])] == [
        "finding_text.py '. The p2p timers include waiting for the peer stage, the same time as the stage "
        "idle'"]


def test_the_facts_hold_no_sentences() -> None:
    """Each facts type of the findings moved to the report's words: a field that may hold text is a name
    (a timer's, the job's, the step source's, a schedule policy), never a sentence."""
    from perfd.analytics.advice.capture_findings import SlowerFacts
    from perfd.analytics.breakdown.bottleneck import RowsWhy
    from perfd.analytics.collectives import collective_facts
    from perfd.analytics.ncu.ncu_verdicts import PartVerdict
    from perfd.analytics.run import run_facts
    from perfd.analytics.serving import serving_facts

    allowed = {"DataShareFacts": {"timer", "across_ranks", "source"}, "NextStepFacts": {"job"},
               "PrefixHitFacts": {"policy"},
               "TotalShareFacts": {"by_group", "method"}, "TpNodesFacts": {"group"},  # group classes, names
               # an ncu verdict: names (part, category, capture), and how the capture chose its kernels,
               # as the capture's record says it (perfd.capture.ncu_exec.KernelChoice)
               "PartVerdict": {"part", "category", "capture", "chosen", "of"},
               "RowsWhy": {"bound"}}  # why the ncu rows give their class: the kernel bound's name
    types = [t for m in (run_facts, serving_facts, collective_facts) for t in vars(m).values()
             if isinstance(t, type) and dataclasses.is_dataclass(t) and t.__module__ == m.__name__
             and t.__name__.endswith("Facts")] + [SlowerFacts, PartVerdict, RowsWhy]
    assert len(types) > 20  # the facts were found
    for cls in types:
        hints = typing.get_type_hints(cls)
        texts = {f.name for f in dataclasses.fields(cls) if _text_in(hints[f.name])}
        assert texts <= allowed.get(cls.__name__, set()), (cls.__name__, texts)


def test_a_findings_source_is_said_where_it_is_worded() -> None:
    """The analyzers leave where a finding's figures come from to its words: a run finding's, a capture's,
    the budget's and the collectives' source (and the windows a share is over) are made from its facts
    where it is worded, from typed values (a kind, a flag, a timer's and a step source's names)."""
    from perfd.analytics.advice.capture_findings import diagnose_capture
    from perfd.analytics.collectives.collective_facts import CollectiveFinding, TotalShareFacts
    from perfd.analytics.finding_types import Severity
    from perfd.analytics.run.run_facts import (
        DataShareFacts,
        ImbalanceFacts,
        OutsideFacts,
        PpWaitFacts,
        RunFacts,
        RunFinding,
    )
    from perfd.report.collective_text import FR_SOURCE, worded_collective
    from perfd.report.grade_text import worded
    from tests.trace_cache import analyze_chrome_trace

    def run(facts: RunFacts) -> str:
        return worded(RunFinding("f", Severity.INFO, "", "", {}, facts=facts)).source

    imb = ImbalanceFacts(idle_lighter=0.2, idle_heavier=0.05, bubble=0.1, pp=2, microbatches=8, vpp=None,
                         imbalance=0.15, lighter_ms=100.0, heavier_ms=120.0)
    assert run(imb) == "megatron timers"
    assert run(dataclasses.replace(imb, minmax=True)).endswith("(minmax pairing is an inference)")
    wait = PpWaitFacts(total=0.2, pp_share=0.15, dp_share=0.05, idle_lighter=0.1)
    assert run(wait) == "sum of max-across-ranks of the p2p timers (upper bound)"
    data = DataShareFacts(share=0.3, state=Severity.CRITICAL, timer="data-wait", across_ranks="",
                          source="hook")
    assert run(data) == "hook timer data-wait" and run(OutsideFacts(share=0.2)).startswith("hook timer ")
    total = TotalShareFacts(share=0.2, by_group=(), method="m", of_step=True, windows=12)
    share = CollectiveFinding("comm-total-share", Severity.INFO, "", "", {}, facts=total)
    assert share.source == share.iterations == ""  # as analytics leaves them
    said = worded_collective(share)
    assert (said.source, said.iterations) == (FR_SOURCE, "12 windows per rank")
    # a capture's findings: the budget's (its label; a part's also where its time was read and how its
    # kernels were named) and the slower-than-steady one's
    tiny = ROOT / "tests" / "data" / "captures" / "kineto_h100_megatron" / "tiny_rank0.json.gz"
    d = diagnose_capture([analyze_chrome_trace(tiny).device(0)], label="capture c1 rank 0",
                         iterations=3, steady_compute_ms=0.001)
    assert all(not f.source for f in d.findings if f.id != "budget-minor-remedies-0")  # left to the words
    shown = {f.id: worded(f).source for f in d.findings}
    assert shown["budget-class-0"] == "capture c1 rank 0"
    assert shown["capture-slower-than-steady-0"] == "capture timeline vs Megatron timers"
    assert any(s.startswith("capture c1 rank 0 (capture, ") for s in shown.values())
