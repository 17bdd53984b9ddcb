"""`perfd bench root-summaries` runs and reports what docs/evidence/entries/48-scale-history.md quotes: per
iteration, the
partials stream's bytes and the root's CPU for the shards' partials and for their step summaries;
the summaries' bytes do not grow with the ranks (one per partition and flush)."""

from __future__ import annotations

from benchmarks.root_summary_bench import run


def test_summaries_bytes_do_not_grow_with_the_ranks() -> None:
    small = run(nodes=40, iterations=2, flushes=2, shards=2, partitions=4, warmup=0)
    big = run(nodes=160, iterations=2, flushes=2, shards=2, partitions=4, warmup=0)
    for res in (small, big):
        assert set(res["per_iteration"]) == {f"{w}_{k}" for w in ("partials", "summaries")
                                             for k in ("bytes", "root_cpu_s", "shards_cpu_s")}
    assert big["per_iteration"]["partials_bytes"] > 3 * small["per_iteration"]["partials_bytes"]
    assert big["per_iteration"]["summaries_bytes"] < 1.5 * small["per_iteration"]["summaries_bytes"]
    assert big["root_summaries_held"] == small["root_summaries_held"] == 2 * 4
