"""Rules engine: a safe condition language, YAML rule packs, and the evaluator that turns
sustained conditions into alerts and capture requests (docs/design.md §2 playbook, §3 Captures).

Pure apart from reading pack files: the aggregator feeds metric values and the current time in.
"""
