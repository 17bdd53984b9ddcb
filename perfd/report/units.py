"""How a number of TFLOP/s reads, wherever one is shown (the report, the headline, the MFU finding,
the budget, the demo, the command line's refusals). Pure; imports nothing of perfd."""

from __future__ import annotations


def tflops(value: float | None, decimals: int = 1) -> str:
    """A TFLOP/s figure without its unit: ``decimals`` places from 1 TFLOP/s up ("82.8"), two
    significant digits below (a CPU job's "0.048", never "0.0"); "n/a" for none."""
    if value is None:
        return "n/a"
    if value == 0 or abs(value) >= 1:
        return f"{value:.{decimals}f}"
    return f"{value:.2g}"
