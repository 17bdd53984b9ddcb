"""English only where it is shown (issue 57), for the findings made outside the advice package: the
sentences perfd/report declares for the run's findings and recommendations (perfd.report.finding_text,
from perfd.analytics.run.run_facts) are in no analytics source again. The same check as
tests/test_english_where_shown.py (AST, no import): each literal piece of five words or more of those
modules is looked for in every string constant of perfd/analytics."""

from __future__ import annotations

from pathlib import Path

from tests.test_english_where_shown import ROOT, _found, _said

# The modules that word the findings; and the pieces analytics says of something else in its own words.
FINDING_TEXT = ("finding_text.py",)
SAID_ELSEWHERE: set[str] = set()


def _fragments() -> dict[str, str]:
    return {frag: name for name in FINDING_TEXT for frag in _said(ROOT / "perfd" / "report" / name)
            if frag not in SAID_ELSEWHERE}


def test_no_analytics_module_words_a_finding_again() -> None:
    fragments = _fragments()
    assert len(fragments) > 40  # the check looks for real sentences
    assert "Stage imbalance dominates the pipeline bubble" in fragments  # a title
    assert "Look for host-side gaps: garbage collection, logging, checkpointing, other processes on the " \
        "node" in fragments  # an action
    assert "is a persistent straggler" not in fragments  # four words: too short to be a sentence
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
