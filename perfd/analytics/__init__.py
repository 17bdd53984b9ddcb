"""perfd analytics: pure functions over plain data (no I/O), one direction of import.

This package file imports nothing, so that importing any module below it does not load the rest.
The packages, bottom to top (each imports only those before it; tests/test_layering.py checks it):

- ``common``, ``thresholds``, ``finding_types``: shared types, every threshold declared once;
- ``steps``: per-iteration metrics and the iteration type (each step source's vocabulary, flops, GPUs'
  peaks, steady state, stragglers, pipeline, windows, goodput);
- ``collectives``: NCCL collectives over the steps' windows, hangs;
- ``incidents``: slow stretches, their evidence and verdicts;
- ``breakdown``: the step budget by part, kernel classes, ncu kernel rows, the bottleneck class;
- ``ncu``: Nsight Compute's rows joined to a timeline, and their verdicts on the budget's parts;
- ``advice``: remedies, their gains, the plan, the budget's findings;
- ``serving``: an inference server's analysis;
- ``run``: ``analyze_run(...) -> RunAnalysis``, the run-level answer built from all of the above.
"""
