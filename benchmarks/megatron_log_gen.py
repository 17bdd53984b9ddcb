"""A long synthetic Megatron-LM log for the offline-analysis memory benchmark: the real fixture's
start-up block, then its post-warm-up iteration blocks (iteration line, timers, straggler line)
repeated and renumbered until the log holds N iterations. Timestamps advance by each block's own
elapsed time, so the run's clock stays monotonic (incidents read it).

    python -m benchmarks.megatron_log_gen N OUT.log
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"
# The fixture's first iterations are its warm-up (compilation, first-step allocations): repeating
# them would put a slow step in every cycle.
FIRST_REPEATED_ITERATION = 5

_ITERATION = re.compile(r"\] iteration\s+(\d+)/\s*(\d+)")
_ELAPSED = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)")
_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(\.\d+)?\]")
_STAMP_FMT = "%Y-%m-%d %H:%M:%S"


def _blocks(lines: list[str]) -> tuple[list[str], list[list[str]]]:
    """(start-up lines, iteration blocks from FIRST_REPEATED_ITERATION on): a block is an iteration
    line and what follows it up to the next iteration line."""
    starts = [i for i, ln in enumerate(lines) if _ITERATION.search(ln)]
    blocks = [lines[a:b] for a, b in zip(starts, [*starts[1:], len(lines)], strict=True)]
    first = next(k for k, b in enumerate(blocks)
                 if int(_ITERATION.search(b[0]).group(1)) >= FIRST_REPEATED_ITERATION)  # type: ignore[union-attr]
    return lines[:starts[0]], blocks[first:]


def _restamp(line: str, when: datetime) -> str:
    def sub(m: re.Match[str]) -> str:
        frac = f".{when.microsecond:06d}" if m.group(2) else ""
        return f"[{when.strftime(_STAMP_FMT)}{frac}]"
    return _STAMP.sub(sub, line)


def generate(n: int, fixture: Path = FIXTURE) -> Iterator[str]:
    """The log's lines, one at a time (a long log is never held in memory)."""
    head, blocks = _blocks(fixture.read_text().splitlines(keepends=True))
    yield from head
    first = _STAMP.search(blocks[0][0])
    clock = datetime.strptime(first.group(1), _STAMP_FMT) if first else datetime(2026, 1, 1)
    for it in range(1, n + 1):
        block = blocks[(it - 1) % len(blocks)]
        elapsed = _ELAPSED.search(block[0])
        clock += timedelta(milliseconds=float(elapsed.group(1)) if elapsed else 0.0)
        head_line = _ITERATION.sub(f"] iteration {it:8d}/{n:8d}", block[0])
        yield _restamp(head_line, clock)
        for ln in block[1:]:
            yield _restamp(ln, clock)


def write(n: int, out: Path) -> int:
    """Write an ``n``-iteration log to ``out``; its size in bytes."""
    with out.open("w") as f:
        f.writelines(generate(n))
    return out.stat().st_size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("iterations", type=int)
    ap.add_argument("out", type=Path)
    a = ap.parse_args(argv)
    size = write(a.iterations, a.out)
    print(f"{a.out}: {a.iterations} iterations, {size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
