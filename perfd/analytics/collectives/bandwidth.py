"""Bus bandwidth of large collectives per parallel group, against the link the group crosses (pure).
Apart from :mod:`perfd.analytics.collectives.collective_analysis` because it works per op across the
group's members and per link, not per iteration like the communication share.

Only ops of at least ``min_bandwidth_bytes`` (64 MiB by default, where it is meaningful) count. A
Flight Recorder duration includes waiting for peers, so for each (group, sequence number) the rank
with the shortest duration — the last to arrive, whose time is closest to the transfer itself —
gives the op's bandwidth. Only where data moves: a group of one rank moves nothing (its "bandwidth"
is bytes ÷ a kernel launch), and a value above ``CREDIBLE_BUSBW_FACTOR`` × the link's figure is not
credible; both are counted in ``rejected`` and never exported.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from perfd.analytics.collectives.collective_config import FR, INSPECTOR, CollectiveConfig
from perfd.analytics.collectives.groups import CREDIBLE_BUSBW_FACTOR, LinkChoice, LinkHow, link_for_group
from perfd.core.model import CollectiveRecord
from perfd.core.record_json import JsonWritten, written_after


@dataclass
class GroupBandwidth(JsonWritten):
    group: str
    scope: str
    link: str | None
    capability_gbs: float | None
    n_ops: int
    median_busbw_gbs: float
    max_busbw_gbs: float
    median_bytes: float
    ops: dict[str, int]
    link_how: LinkHow  # worded where served (perfd.report.collective_text.link_how_text)
    source: str  # the record sources' names (what they mean, where served: collective_text)

    @property
    @written_after("max_busbw_gbs")
    def ratio(self) -> float | None:
        return self.median_busbw_gbs / self.capability_gbs if self.capability_gbs else None


def _group_size(r: CollectiveRecord) -> int | None:
    return r.group_size if r.group_size is not None else (len(r.pg_ranks) if r.pg_ranks else None)


def group_bandwidth(records: Sequence[CollectiveRecord], cls: Mapping[int, str], nodes: Mapping[int, str],
                    gpu_name: str | None, cfg: CollectiveConfig,
                    rejected: dict[str, int]) -> list[GroupBandwidth]:
    best: dict[tuple[str, str, int], CollectiveRecord] = {}
    for r in records:
        seq = r.collective_seq_id
        if r.is_p2p or seq is None or r.bytes is None or r.bytes < cfg.min_bandwidth_bytes or not r.busbw_gbs:
            continue
        size = _group_size(r)
        if size is not None and size <= 1:
            rejected["single_rank_group"] = rejected.get("single_rank_group", 0) + 1
            continue
        if r.source == FR and r.duration_ms and r.pg_name is not None:
            key = (FR, r.pg_name, seq)
        elif r.source == INSPECTOR and (r.comm_id or r.pg_name):
            # the Inspector numbers each op type on its own (NCCL's seqNumber[func])
            key = (INSPECTOR, f"{r.comm_id or r.pg_name}/{r.op}", seq)
        else:
            continue
        cur = best.get(key)
        if cur is None or (r.busbw_gbs or 0.0) > (cur.busbw_gbs or 0.0):
            best[key] = r  # the highest busbw = the shortest time: the rank that waited least
    agg: dict[tuple[str, str], tuple[LinkChoice, list[CollectiveRecord]]] = {}
    link_cache: dict[tuple[tuple[int, ...] | None, int | None], LinkChoice] = {}
    for r in best.values():
        lk = (tuple(r.pg_ranks) if r.pg_ranks else None, r.nnodes)
        link = link_cache.get(lk)
        if link is None:
            link = link_cache[lk] = link_for_group(
                r.pg_ranks, nodes, gpu_name, r.nnodes, intra_link=cfg.intra_node_link,
                inter_link=cfg.inter_node_link, intra_busbw_gbs=cfg.intra_node_busbw_gbs,
                inter_busbw_gbs=cfg.inter_node_busbw_gbs)
        if link.busbw_gbs and (r.busbw_gbs or 0.0) > CREDIBLE_BUSBW_FACTOR * link.busbw_gbs:
            rejected["not_credible"] = rejected.get("not_credible", 0) + 1
            continue
        agg.setdefault((cls.get(id(r), "other"), link.scope), (link, []))[1].append(r)
    out = []
    for (group, scope), (link, rs) in sorted(agg.items()):
        bws = [r.busbw_gbs or 0.0 for r in rs]
        ops: dict[str, int] = {}
        for r in rs:
            ops[r.op] = ops.get(r.op, 0) + 1
        srcs = sorted({r.source for r in rs})
        out.append(GroupBandwidth(
            group=group, scope=scope, link=link.link, capability_gbs=link.busbw_gbs, n_ops=len(rs),
            median_busbw_gbs=float(statistics.median(bws)), max_busbw_gbs=max(bws),
            median_bytes=float(statistics.median([float(r.bytes or 0) for r in rs])), ops=ops,
            link_how=link.how, source=", ".join(srcs)))
    return out

