"""How the command-line redaction's shape scan (perfd.core.secret_shapes.scrub) grows with a word's length,
on words made to make a backtracking pattern rescan from each character: the time at a scale and at
four times it, and their ratio (about 4 where the scan is linear, 16 where it is quadratic). A
command line can be megabytes long and is redacted each time it is shown; the URL rule of an earlier
version took 4.7 s on 40,000 characters of "a.", and 69 s on the first of these words. Compare runs as
ratios on one machine.

    python -m benchmarks.redact_bench [--scale 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

from perfd.core.secret_shapes import scrub


def hostile_words(scale: float = 1.0) -> list[str]:
    """Words each of which made some shape rule of the scan rescan from every character (at scale 1,
    33,000 to 160,000 characters each)."""
    def n(k: int) -> int:
        return max(1, int(k * scale))

    return ["a." * n(50_000), "a:" * n(50_000), "x" * n(100_000), "eyJ" * n(33_000),
            "1" * n(100_000) + ":", "T" * n(100_000) + "/", "a/" * n(50_000) + ":b@c", "a-" * n(50_000) + "=",
            "|a:" * n(33_000) + "@",
            "https://h/p?" + "a=1&" * n(25_000), "a://h:1/," * n(11_000), "a://x:'" * n(15_000),
            "https%3A%2F%2F" * n(7_000), '{"password":[' + "[" * n(100_000), '"p\\u0061' * n(15_000) + ":",
            "<password>" * n(10_000), 'a=\\"' * n(30_000), "x/services/T0/B0" * n(6_000)]


def timed(words: list[str], rounds: int) -> float:
    """The median over ``rounds`` of the seconds one scan of every word takes."""
    got = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for w in words:
            scrub(w)
        got.append(time.perf_counter() - t0)
    return statistics.median(got)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ns = ap.parse_args(argv)
    one = hostile_words(ns.scale)
    four = hostile_words(4 * ns.scale)
    t1, t4 = timed(one, ns.rounds), timed(four, ns.rounds)
    chars = sum(map(len, one))
    print(f"scrub: {chars:,} characters in {t1:.3f} s, 4x ({4 * chars:,}) in {t4:.3f} s: ratio "
          f"{t4 / t1:.2f} (4: linear, 16: quadratic); median of {ns.rounds}; python "
          f"{platform.python_version()} on {platform.processor() or platform.machine()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
