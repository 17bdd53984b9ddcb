"""English only where it is shown, for the sentences analytics built outside the findings: a
capture's checks against the job and the class its timeline supports (perfd.report.capture_text, from
perfd.analytics.breakdown.capture_match and perfd.analytics.advice.capture_findings); why the collective
analysis has no communication share, its method's detail, how a group's link was chosen and where its
bandwidth comes from, a hang's resolution and line (perfd.report.collective_text, from
perfd.analytics.collectives); why the job's figures are not its current run's and the steps a run
finding is over (perfd.report.finding_text.runs_text and span_text, from perfd.analytics.run.runs.Runs
and perfd.analytics.finding_types.StepSpan) and the one action for slow data (perfd.report.data_text,
by perfd.analytics.finding_types.DataLoading) are in no analytics source again. The same check as
tests/analytics/test_finding_words.py (AST, no import): each literal piece of five words or more of
those modules is looked for in every string constant of perfd/analytics; and the typed values that
carry them hold no sentence."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

from tests.test_english_where_shown import ROOT, _found, _said, _text_in

# The modules that word what analytics gives as kinds and numbers here.
MORE_TEXT = ("capture_text.py", "collective_text.py", "finding_text.py", "data_text.py", "bottleneck_text.py")
# Pieces analytics says of something else, in its own words: thresholds' docs (thresholds.py).
SAID_ELSEWHERE = {"a profiler never makes steps faster", "its own steps before it was armed"}


def _fragments() -> dict[str, str]:
    return {frag: name for name in MORE_TEXT for frag in _said(ROOT / "perfd" / "report" / name)
            if frag not in SAID_ELSEWHERE}


def test_no_analytics_module_words_them_again() -> None:
    fragments = _fragments()
    assert len(fragments) > 10  # the check looks for real sentences
    assert "The budget is read from it, but its idle parts are not the profiler's cost alone: a capture " \
        "of another run, or of steps something slowed." in fragments  # a capture's mismatch
    assert "the highest peak of any GPU perfd knows" in fragments  # a check's sentence
    assert "--capture-force to read it anyway" in fragments  # the refusal's line
    assert "no device in the capture" in fragments  # the class's reason without a device
    assert "no step window is covered by the collective records yet" in fragments  # an absent share's
    assert "no link known for GPU" in fragments  # how a group's link was chosen
    assert "NVLink bridge (H100 NVL pair): 600 GB/s bidirectional" in fragments  # what a link is (LINK_TEXT)
    assert "DataLoader(num_workers=N, prefetch_factor=4, persistent_workers=True" in fragments  # knobs
    assert "no completed op at or past it from the stuck ranks yet" in fragments  # a hang's resolution
    assert "Speed up data loading: more data-loader workers, pinned memory, prefetch; check the storage " \
        "the data comes from" in fragments  # the one action for slow data
    assert any("the span they cover (first enqueue to last end)" in f for f in fragments)  # a method's
    assert "ran on a rank armed for a capture (ncu): the job's figures are run" in fragments  # the runs'
    assert "steady; the current run's steps are all armed" in fragments  # a run finding's steps
    # the job's class: a vote's reason, why the winner decides, what is missing, where a number comes from
    assert "GPM) while compute fills the step: the host cannot launch kernels as fast as the GPU runs them" \
        in fragments
    assert "the capture's timeline saw every kernel: the most direct view of what the compute time is" \
        in fragments
    assert "GPM counters while the job steps (agent with NVML on a Hopper or newer GPU" in fragments
    assert "GPM of the job's last steady window (the job is not stepping now" in fragments
    assert "inside compute, are not timed" in fragments  # the collectives the timers do not time
    assert "where the ranks synchronise every step the unarmed ones wait for the armed one, so this reads " \
        "low" in fragments  # what arming ncu costs (arming_text)
    found = _found(fragments, sorted((ROOT / "perfd" / "analytics").rglob("*.py")))
    assert not found, found


def test_the_check_finds_one_worded_in_analytics(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    # the refusal, as the capture's checks used to word it (capture_match.py)
    probe.write_text('def refusal(m, said):\n'
                     '    return f"the capture {m} is not of this job: {said} (--capture-force to read it "'
                     '"anyway)"\n')
    assert [x.split(": ", 1)[1] for x in _found(_fragments(), [probe])] == [
        "capture_text.py 'is not of this job'", "capture_text.py '--capture-force to read it anyway'"]


def test_a_run_findings_steps_as_they_read() -> None:
    """The steps a run finding's figures are over, as its ``iterations`` read where shown."""
    from perfd.analytics.finding_types import StepSpan
    from perfd.report.finding_text import span_text

    assert span_text(StepSpan(first=5, last=40, n=36)) == "iterations 5–40 (36 steady)"
    assert span_text(StepSpan(first=14, last=40, n=27, run=2)) == "run 2: iterations 14–40 (27 steady)"
    assert span_text(StepSpan(run=3)) == "run 3: no steady-state iterations"
    assert span_text(StepSpan(first=1, last=45, n=22, run=1, reference=True)) == \
        "run 1: iterations 1–45 (22 steady; the current run's steps are all armed)"


def test_the_typed_values_hold_no_sentences() -> None:
    """What the moved sentences are made from holds numbers, kinds and names (the capture's), never a
    sentence (checked on the annotations)."""
    from perfd.analytics.advice.capture_findings import CaptureDiagnosis, ClassBasis
    from perfd.analytics.breakdown import bottleneck as bn
    from perfd.analytics.breakdown.capture_match import CaptureMatch, Evidence, MatchFacts
    from perfd.analytics.collectives.bandwidth import GroupBandwidth
    from perfd.analytics.collectives.collective_analysis import CollectiveAnalysis
    from perfd.analytics.collectives.collective_hangs import HangView
    from perfd.analytics.collectives.groups import LinkChoice, LinkHow, LinkSpec

    allowed: dict[type, set[str]] = {
        CaptureMatch: {"capture"},  # the capture's name
        Evidence: {"unit"},  # what the figures count
        MatchFacts: set(),
        ClassBasis: {"where"},  # the capture's label (and device)
        CaptureDiagnosis: set(),
        # names: the job, the method, the sources, the groups' classes, scopes and links
        CollectiveAnalysis: {"job", "method", "sources", "comm_share_by_group",
                             "bandwidth_rejected", "timing"},
        GroupBandwidth: {"group", "scope", "link", "ops", "source"},
        LinkChoice: {"scope", "link"},
        LinkHow: {"link", "gpu"},  # a link's and a GPU's names
        LinkSpec: {"name"},  # its key; what it is: perfd.report.collective_text.LINK_TEXT
        # names, and the agents' own lines as they sent them (collectors/nccl's)
        HangView: {"process_group", "op", "agents", "user_frame", "texts"},
        # the job's class: codes and figures (perfd.report.bottleneck_text words them); names only: the
        # capture's label, what the job calls its data wait, the timer shares checked
        bn.Bottleneck: set(), bn.Vote: {"label"}, bn.GpmWhy: set(), bn.SharesWhy: {"data_timer", "checked"},
        bn.ComputeWhy: set(), bn.GpmVoteWhy: set(), bn.Voted: set(), bn.EarlierRun: set(),
        bn.TooFewSteps: set(),
        bn.Quoted: {"text"},  # a capture's class reason, in the words its record keeps
    }
    for cls, names in allowed.items():
        hints = typing.get_type_hints(cls)
        texts = {f.name for f in dataclasses.fields(cls) if _text_in(hints[f.name])}
        assert texts <= names, (cls.__name__, texts - names)


def test_every_link_is_worded_once() -> None:
    """The link table keeps each link's key and figure; what the link is, the report's LINK_TEXT, has one
    entry per key (a link added to one and not the other fails here)."""
    from perfd.analytics.collectives.groups import INTRA_NODE_LINK, LINKS, LinkHow, Placement
    from perfd.analytics.collectives.groups import Capability as C
    from perfd.report.collective_text import LINK_TEXT, link_how_text

    assert set(LINK_TEXT) == set(LINKS) >= set(INTRA_NODE_LINK.values())
    assert link_how_text(LinkHow(Placement.RANKS, C.TABLE, "nvlink4")).startswith(
        "rank placement; NVLink 4 (H100/H200 SXM): 900 GB/s bidirectional per GPU")
    assert link_how_text(LinkHow(Placement.INSPECTOR, C.DEFAULT, "ib-200g")) == \
        "NCCL Inspector nnodes; 200 Gb/s network per GPU (InfiniBand HDR / RoCE) (configurable)"


def test_the_data_loaders_knobs_are_worded_in_the_report_only() -> None:
    """Each framework's data-loader knobs (what the data-loader remedy's note and the run's data-loading
    recommendation name) are perfd.report.data_text's, however short: none is spelled in analytics."""
    from perfd.analytics.advice.remedies import Framework
    from perfd.analytics.finding_types import Severity
    from perfd.analytics.run.run_facts import DataShareFacts
    from perfd.report.data_text import CPU_DATA_KNOBS, DATA_KNOBS, knobs_text
    from perfd.report.finding_text import recommendation_words

    assert set(DATA_KNOBS) == set(Framework)
    cpu = CPU_DATA_KNOBS[Framework.PYTORCH]
    assert knobs_text(Framework.PYTORCH, cpu_only=True) == cpu
    assert knobs_text(Framework.MEGATRON, cpu_only=True) == DATA_KNOBS[Framework.MEGATRON]
    assert "pin_memory" not in cpu and "pin_memory=True" in DATA_KNOBS[Framework.PYTORCH]
    assert all("pin_memory=True" not in k for k in CPU_DATA_KNOBS.values())
    said = {k: "data_text" for k in (*DATA_KNOBS.values(), *CPU_DATA_KNOBS.values())}
    found = _found(said, sorted((ROOT / "perfd" / "analytics").rglob("*.py")))
    assert not found, found
    # the run's recommendation names them by the job's framework (typed on its facts)
    facts = DataShareFacts(share=0.3, state=Severity.CRITICAL, timer="data wait", across_ranks="rank 0",
                           knobs_of=Framework.PYTORCH, cpu_only=True, jitter_cv=0.2)
    assert recommendation_words(facts)[1] == ("data wait 30.0% of the step; " + cpu
                                              + "; step time also jitters (CV 20.0%, finding step-jitter)")


def test_the_untimed_collectives_as_they_read() -> None:
    """The groups whose collectives the step timers do not time are codes and sizes (perfd.analytics.steps
    .untimed); the report says them wherever exposed communication is."""
    from perfd.analytics.steps import untimed
    from perfd.analytics.steps.untimed import Group, untimed_groups
    from perfd.report.bottleneck_text import UNTIMED_WHAT, untimed_text

    assert not hasattr(untimed, "untimed_text") and set(UNTIMED_WHAT) == set(Group)
    groups = untimed_groups("megatron", 2, None, 4)
    assert groups == ((Group.TP, 2), (Group.EP, 4))
    assert untimed_text(groups) == ("the TP=2 tensor-parallel all-reduces and the EP=4 expert-parallel token "
                                    "all-to-alls, inside compute, are not timed")
    assert untimed_text(()) == ""
