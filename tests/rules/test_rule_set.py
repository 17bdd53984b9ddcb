"""``perfd rules check`` checks the set the aggregator will load, and a rule named like a shipped one
is handled the same way by both: ``perfd rules check`` and ``perfd aggregator``
on the same files, each through the CLI's own ``main()`` (its output, its return value the exit status),
and the aggregator that loads the set run in the test's process (tests/inproc.py).

The issue's probe: ``perfd rules check user.yaml`` passed a user rule named like a shipped one, and
the aggregator given the shipped pack and the user's refused to start ("duplicate rule names"), with
nothing to say how to override the shipped rule."""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from perfd.app.cli import main
from tests.inproc import pipeline
from tests.procs import ROOT

SHIPPED = ROOT / "rules" / "default.yaml"
USER = """
rules:
  - name: mfu_severe          # a shipped rule's name
    expr: mfu < 0.2
    for: 10m
{extra}
"""


@dataclass
class Ran:
    """What a command run by ``main()`` gave: its exit status and what it printed."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def perfd(capsys: pytest.CaptureFixture[str]) -> Callable[..., Ran]:
    def run(*args: str) -> Ran:
        capsys.readouterr()  # what came before is not this command's
        rc = main(list(args))
        out = capsys.readouterr()
        return Ran(rc, out.out, out.err)

    return run


def test_a_user_rule_named_like_a_shipped_one_fails_the_check_as_it_fails_the_aggregator(
        tmp_path: Path, perfd: Callable[..., Ran]) -> None:
    user = tmp_path / "user.yaml"
    user.write_text(textwrap.dedent(USER.format(extra="")).lstrip("\n"))
    check = perfd("rules", "check", str(SHIPPED), str(user))
    agg = perfd("aggregator", "--grpc-port", "0", "--http-port", "0", "--rules", str(SHIPPED),
                "--rules", str(user))
    print(f"FIGURES rules set: check exit {check.returncode}: {check.stdout.splitlines()[0]!r}; "
          f"aggregator exit {agg.returncode}: {agg.stderr.strip().splitlines()[-1]!r}")
    assert check.returncode == 1 and agg.returncode == 2
    line = f"{user}:2: rule mfu_severe: a rule of this name is already defined at {SHIPPED}:"
    assert line in check.stdout and line in agg.stderr  # the same refusal, word for word
    assert "give this one 'override: true'" in check.stdout
    # Alone, the user's pack loads (what `--rules user.yaml` gives): the check says so, and notes
    # the shipped rule of that name and how to override it should the shipped pack be added.
    alone = perfd("rules", "check", str(user))
    assert alone.returncode == 0 and "a shipped rule has this name" in alone.stdout
    assert f"perfd aggregator --rules {user} loads 1 rule(s)" in alone.stdout
    shipped = perfd("rules", "check")  # no file: the set the aggregator loads without --rules
    assert shipped.returncode == 0 and "perfd aggregator (no --rules) loads" in shipped.stdout


def test_override_true_replaces_the_shipped_rule_in_both(tmp_path: Path, perfd: Callable[..., Ran],
                                                        caplog: pytest.LogCaptureFixture) -> None:
    user = tmp_path / "user.yaml"
    user.write_text(textwrap.dedent(USER.format(extra="    override: true")).lstrip("\n"))
    check = perfd("rules", "check", str(SHIPPED), str(user))
    assert check.returncode == 0, check.stdout
    assert f"{user}:2: rule mfu_severe: overrides the rule of {SHIPPED}:" in check.stdout
    n = int(check.stdout.split(" loads ")[1].split()[0])
    assert ", 1 replaced by override" in check.stdout
    caplog.set_level(logging.INFO, logger="perfd")  # the aggregator's log, as `perfd -v` writes it
    with pipeline(tmp_path, "--rules", SHIPPED, "--rules", user):
        log = caplog.text
    assert f"rule mfu_severe of {user}:2 overrides the one of {SHIPPED}:" in log
    nothing = tmp_path / "nothing.yaml"
    text = textwrap.dedent(USER.format(extra="    override: true")).lstrip("\n")
    nothing.write_text(text.replace("mfu_severe", "mine"))
    warned = perfd("rules", "check", str(nothing))
    assert warned.returncode == 0 and "it overrides nothing" in warned.stdout
    assert n == sum(1 for ln in SHIPPED.read_text().splitlines() if ln.startswith("  - name:"))
