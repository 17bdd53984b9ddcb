"""Garbage in, no exception out: random bytes, mutated real lines, very long adversarial lines.

Seeded ``random`` rather than hypothesis (not a dependency): failures reproduce exactly.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import pytest

from perfd.collectors.megatron import MegatronLogParser, ParsedLog, parse_lines
from perfd.collectors.megatron.parser import ISSUE_TEXT_CHARS

DATA = Path(__file__).resolve().parent / "data"
REAL_LINES = (DATA / "h200x2_tp1_pp2_trimmed.log").read_text().split("\n")
for extra in sorted(DATA.glob("*.log")):
    REAL_LINES += extra.read_text().split("\n")


FLOAT_FIELDS = (
    "step_time_ms", "logged_tflops_per_gpu", "learning_rate", "lm_loss", "loss_scale", "grad_norm"
)
INT_FIELDS = ("consumed_samples", "global_batch_size", "skipped_iterations", "nan_iterations", "train_iters")


def check_invariants(log: ParsedLog, n_lines: int | None = None) -> None:
    internal = [i for i in log.issues if i.reason == "internal-error"]
    assert "malformed:internal-error" not in log.counts, internal
    if n_lines is not None:
        assert log.counts.get("lines", 0) == n_lines
    for issue in log.issues:
        assert isinstance(issue.reason, str) and len(issue.text) <= ISSUE_TEXT_CHARS
    for r in log.records:
        assert isinstance(r.iteration, int) and r.iteration >= 0
        for name in FLOAT_FIELDS:
            value = getattr(r, name)
            assert value is None or isinstance(value, float)
        for name in INT_FIELDS:
            value = getattr(r, name)
            assert value is None or isinstance(value, int)
        for t in r.timers.values():
            assert t.max_ms is None or isinstance(t.max_ms, float)
        if r.straggler is not None:
            for lo, hi in r.straggler.quantities.values():
                assert isinstance(lo.value, float) and isinstance(hi.rank, int)


@pytest.mark.parametrize("seed", range(5))
def test_random_bytes_never_raise(seed: int) -> None:
    rng = random.Random(seed)
    lines = [
        bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300))).decode("utf-8", "replace")
        for _ in range(2000)
    ]
    # Embedded newlines make one fed string several lines: count what the parser will see.
    log = parse_lines(lines)
    check_invariants(log, sum(1 + (s[:-1] if s.endswith("\n") else s).count("\n") for s in lines))


def _mutate(rng: random.Random, line: str) -> str:
    choice = rng.randrange(7)
    if not line:
        return line
    i = rng.randrange(len(line))
    j = rng.randrange(i, len(line) + 1)
    if choice == 0:  # cut (a truncated last line)
        return line[:i]
    if choice == 1:  # delete a span
        return line[:i] + line[j:]
    if choice == 2:  # another rank's text glued in
        return line[:i] + rng.choice(REAL_LINES) + line[i:]
    if choice == 3:  # random characters
        noise = "".join(chr(rng.randrange(32, 0x3000)) for _ in range(rng.randrange(1, 20)))
        return line[:i] + noise + line[j:]
    if choice == 4:  # numbers replaced by words or specials
        return line.replace(rng.choice("0123456789"), rng.choice(["nan", "inf", "-", "x", "", "1e999"]))
    if choice == 5:  # separators doubled or dropped
        return line.replace("|", rng.choice(["||", "", "|\r|", " | "]))
    return line


@pytest.mark.parametrize("seed", range(10))
def test_mutated_real_lines_never_raise(seed: int) -> None:
    rng = random.Random(seed)
    lines = [_mutate(rng, line) if rng.random() < 0.3 else line for line in REAL_LINES]
    check_invariants(parse_lines(lines))


def test_shuffled_real_lines_never_raise() -> None:
    rng = random.Random(3)
    lines = list(REAL_LINES)
    rng.shuffle(lines)
    check_invariants(parse_lines(lines), len(lines))


@pytest.mark.parametrize(
    "line",
    [
        " " * 1_000_000 + "x",
        "(" * 1_000_000,
        "|" * 1_000_000,
        "iteration " * 100_000,
        "iteration 1/" + "1" * 500_000,
        " iteration 1/ 2 |" + " a: 1 |" * 100_000,
        " iteration 1/ 2 |" + " " * 500_000 + "elapsed",
        "validation loss at " * 50_000,
        "test." * 200_000 + " loss at ",
        "MnRtt/Rnk: " + "1.0" + "e" * 500_000,
        "    name " + "." * 500_000 + ": (1, 2)",
        "  arg " + "." * 500_000,
        "[Rank 0] (after 1 iterations) memory (MB)" + " | x: 1" * 100_000,
        "time (ms) |" + " t: 1.0 |" * 100_000,
        "using world size: " + "9" * 500_000,
        "> Megatron-Core version " + ". " * 500_000,
        "[" + "2026-11-21 20:58:42" * 50_000,
        "\x00" * 100_000,
        "\ufffd" * 100_000,
    ],
    ids=lambda s: repr(s[:24]),
)
def test_very_long_lines_are_fast_and_safe(line: str) -> None:
    start = time.thread_time()  # this thread's CPU: the parser's own cost, not a loaded machine's
    p = MegatronLogParser()
    p.feed(line)
    p.feed(line + "\n")
    p.flush()
    assert time.thread_time() - start < 2.0
    assert p.counts["long_lines"] == 2
    assert "malformed:internal-error" not in p.counts


def test_odd_whitespace_and_control_characters() -> None:
    lines = [
        "", "\n", "\r", "\r\n", "\x0b\x0c\x1c\u2028", "\t\t",
        " iteration 1/ 2 |\r", "\x00iteration 2/ 2 | a: 1 |",
    ]
    log = parse_lines(lines)
    check_invariants(log)
    assert [r.iteration for r in log.records] == [1, 2]


def test_special_numbers_do_not_become_zero() -> None:
    log = parse_lines([" iteration 1/ 2 | grad norm: nan | lm loss: inf | consumed samples: nan |"])
    r = log.records[0]
    assert r.grad_norm is not None and math.isnan(r.grad_norm)
    assert r.lm_loss == math.inf
    assert r.consumed_samples is None  # not an integer: absent, never 0
