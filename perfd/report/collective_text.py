"""The collective findings and recommendations as they read (issue 57): each one's title and
observation, action and detail, from their kind and numbers (perfd.analytics.collectives
.collective_facts), and the collective analysis as JSON with them worded (what the aggregator serves).
Pure."""

from __future__ import annotations

import dataclasses
from typing import Any

from perfd.analytics.collectives.collective_analysis import CollectiveAnalysis
from perfd.analytics.collectives.collective_facts import (
    BandwidthFacts,
    CollectiveFacts,
    CollectiveFinding,
    CollectiveRecFacts,
    CollectiveRecommendation,
    DpShareFacts,
    HangFacts,
    LastRankFacts,
    ShareAbsentFacts,
    TotalShareFacts,
    TpNodesFacts,
)
from perfd.analytics.finding_types import Finding, Recommendation


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def finding_words(f: CollectiveFacts) -> tuple[str, str]:
    """A collective finding's title and observation."""
    match f:
        case HangFacts():
            h = f.hang
            return (("Collective hang: " if h.active else "Collective stalled, then completed: ")
                    + f"{h.op} #{h.seq} on group {h.process_group}", h.text())
        case TotalShareFacts():
            per = "the step" if f.of_step else "the observed time"
            parts = ", ".join(f"{c} {_pct(v)}" for c, v in f.by_group)
            return (f"Total communication {_pct(f.share)} of {per}",
                    f"Union of collective time ÷ {per}, median over ranks: {_pct(f.share)} (by group: "
                    f"{parts or 'n/a'}). Method: {f.method}. Total, not exposed: overlapped communication is "
                    "included. Flight Recorder durations start when a collective is ready on its NCCL "
                    "stream, so they include any wait of its kernel to start (e.g. for SMs held by "
                    "overlapping compute): an upper bound of the kernels' own time (2×H200 DDP: 7–10 points "
                    "above the timeline).")
        case DpShareFacts():
            return (f"Data-parallel communication {_pct(f.share)} of the step",
                    f"DP collectives take {_pct(f.share)} of each step (total, overlapped or not); "
                    f"> {f.threshold:.0%} is the playbook's threshold.")
        case ShareAbsentFacts():
            return "Total communication share not available", f.reason
        case BandwidthFacts():
            b = f.bandwidth
            return (f"{b.group} collectives at {_pct(f.ratio)} of the {b.scope} link",
                    f"{b.n_ops} ops ≥ {f.min_mib} MiB on {b.group} groups reach a median "
                    f"{b.median_busbw_gbs:.0f} GB/s bus bandwidth (max {b.max_busbw_gbs:.0f}) against "
                    f"~{b.capability_gbs:.0f} GB/s for {b.link} ({b.link_how}).")
        case TpNodesFacts():
            return ("Tensor-parallel group spans nodes",
                    f"TP group {f.group} (ranks {list(f.ranks)}) runs on {f.nodes} nodes: every layer's TP "
                    "collectives cross the network.")
        case LastRankFacts():
            return (f"Rank {f.rank} arrives last at collectives",
                    f"Rank {f.rank} had the shortest collective duration (the others waited for it) in "
                    f"{f.last}/{f.decisive} ({_pct(f.last_share)}) collectives with a clear spread, against "
                    f"{_pct(f.by_chance)} by chance.")


def recommendation_words(f: CollectiveRecFacts) -> tuple[str, str]:
    """A collective recommendation's action and detail."""
    match f:
        case HangFacts():
            h = f.hang
            who = ",".join(map(str, h.ranks_not_joined or h.ranks_unknown)) or "?"
            return (f"Find out what rank(s) {who} are doing instead of joining {h.op} #{h.seq} (their log, "
                    "`py-spy dump`, a slow data loader or a diverging code path); the other ranks wait "
                    "inside NCCL", h.user_frame or "")
        case DpShareFacts():
            return ("Reduce or hide the gradient reduction: more gradient accumulation per optimizer step, "
                    "and overlap grad reduce with backward (DDP buckets / Megatron --overlap-grad-reduce)",
                    "compare with the exposed share (perfd_job_comm_exposed_dp_ratio)")
        case BandwidthFacts():
            b = f.bandwidth
            return (f"Check the {b.scope} path of the {b.group} groups: NCCL topology (NCCL_DEBUG=INFO: "
                    "which transport, P2P/NVLink or a socket fallback), link errors, other traffic on the "
                    "links; run nccl-tests between the same GPUs", "")
        case TpNodesFacts():
            return ("Keep tensor parallelism within the NVLink domain (TP ≤ GPUs per node; use PP or DP "
                    "across nodes)", "")
        case LastRankFacts():
            return (f"Check rank {f.rank}: GPU health (clocks, throttling, XID, another process on its GPU), "
                    "its data loading and uneven work", "")


def worded_collective(f: Finding) -> Finding:
    """A collective finding with its words; any other as it is."""
    if isinstance(f, CollectiveFinding) and f.facts is not None:
        title, observation = finding_words(f.facts)
        return dataclasses.replace(f, title=title, observation=observation, facts=None)
    return f


def worded_collective_recommendation(r: Recommendation) -> Recommendation:
    """A collective recommendation with its words; any other as it is."""
    if isinstance(r, CollectiveRecommendation) and r.facts is not None:
        action, detail = recommendation_words(r.facts)
        return dataclasses.replace(r, action=action, detail=detail, facts=None)
    return r


def collectives_json(a: CollectiveAnalysis) -> dict[str, Any]:
    """The collective analysis as served: its JSON with its findings and recommendations worded."""
    return {**a.to_json(), "findings": [worded_collective(f).to_json() for f in a.findings],
            "recommendations": [worded_collective_recommendation(r).to_json() for r in a.recommendations]}
