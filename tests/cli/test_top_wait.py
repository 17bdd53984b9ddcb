"""`perfd top --once --job J --wait-steps N`: a script that starts a job waits for the aggregator to hold
its step N, not for a sleep to pass (a fixed sleep under load printed a screen without the job)."""

from __future__ import annotations

import argparse

from perfd.app.commands import top_screen
from perfd.app.commands.top_screen import wait_for_step


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, dt: float) -> None:
        self.now += dt


def _getter(answers: list[object]) -> top_screen.Getter:
    def get(path: str) -> object:
        assert path == "/api/jobs"
        return answers.pop(0) if len(answers) > 1 else answers[0]
    return get


def test_it_returns_once_the_job_reports_the_step() -> None:
    clock = Clock()
    answers: list[object] = [{"jobs": []}, {"jobs": [{"job": "j", "last_iteration": 12}]},
                             {"jobs": [{"job": "j", "last_iteration": 40}]}]
    assert wait_for_step(_getter(answers), "j", 40, 10.0, clock, clock.sleep) is None
    assert clock.now == 2 * top_screen.WAIT_POLL_S  # two polls short of it, then there


def test_it_says_what_it_saw_when_the_step_never_comes() -> None:
    clock = Clock()
    late = wait_for_step(_getter([{"jobs": [{"job": "j", "last_iteration": 7}]}]), "j", 40, 1.0, clock,
                         clock.sleep)
    assert late == "job 'j' did not reach step 40 within 1 s: its last step 7"
    never = wait_for_step(_getter([{"jobs": []}]), "j", 40, 1.0, clock, clock.sleep)
    assert never is not None and never.endswith("not listed")

    def down(path: str) -> object:
        raise OSError("connection refused")
    gone = wait_for_step(down, "j", 1, 0.5, clock, clock.sleep)
    assert gone is not None and "unreachable (connection refused)" in gone


def test_the_option_goes_with_once_and_a_job() -> None:
    args = argparse.Namespace(aggregator="http://127.0.0.1:1", job=None, once=True, interval=2.0,
                              wait_steps=3, wait_s=0.1, auth_token_file=None)
    assert top_screen.run(args) == 2
    args.job, args.once = "j", False
    assert top_screen.run(args) == 2
