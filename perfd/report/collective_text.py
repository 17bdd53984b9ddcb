"""The collective findings and recommendations as they read: each one's title and
observation, action and detail, from their kind and numbers (perfd.analytics.collectives
.collective_facts), and the collective analysis as JSON with them worded (what the aggregator serves).
Pure."""

from __future__ import annotations

import dataclasses
from typing import Any

from perfd.analytics.collectives.bandwidth import GroupBandwidth
from perfd.analytics.collectives.collective_analysis import CollectiveAnalysis
from perfd.analytics.collectives.collective_config import FR
from perfd.analytics.collectives.collective_facts import (
    BandwidthFacts,
    CollectiveFacts,
    CollectiveFinding,
    CollectiveRecFacts,
    CollectiveRecommendation,
    DpShareFacts,
    HangFacts,
    LastRankFacts,
    ShareAbsent,
    ShareAbsentFacts,
    TotalShareFacts,
    TpNodesFacts,
)
from perfd.analytics.collectives.collective_hangs import HangView
from perfd.analytics.collectives.groups import LINKS, Capability, LinkHow, Placement
from perfd.analytics.finding_types import Finding, Recommendation
from perfd.core.limits import RANK_RATIO_TOP_K
from perfd.core.sketch import SKETCH_ACCURACY

# Why the analysis has no total communication share.
ABSENT_TEXT: dict[ShareAbsent, str] = {
    ShareAbsent.NO_TIMING: "no Flight Recorder durations: the job runs without TORCH_NCCL_ENABLE_TIMING=1 "
    "(`perfd launch --fr-timing`; opt-in, see PyTorch issue 143890 for its cost)",
    ShareAbsent.NO_RECORDS: "no Flight Recorder records",
    ShareAbsent.NO_WINDOW: "no step window is covered by the collective records yet",
}


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


# What each link of perfd.analytics.collectives.groups.LINKS is, and where its bus bandwidth figure comes
# from (one entry per key: tests/analytics/test_more_words.py).
LINK_TEXT: dict[str, str] = {
    "nvlink3": "NVLink 3 (A100 SXM): 600 GB/s bidirectional per GPU",
    "nvlink4": "NVLink 4 (H100/H200 SXM): 900 GB/s bidirectional per GPU; a 256 MB all-reduce on 2 H200s "
               "measured ~290 GB/s bus bandwidth here",
    "nvlink-bridge": "NVLink bridge (H100 NVL pair): 600 GB/s bidirectional",
    "nvlink5": "NVLink 5 (B200/GB200): 1.8 TB/s bidirectional per GPU",
    "pcie4": "PCIe Gen4 x16 (~32 GB/s per direction, ~25 achievable)",
    "pcie5": "PCIe Gen5 x16 (~64 GB/s per direction, ~50 achievable)",
    "ib-100g": "100 Gb/s network per GPU (InfiniBand / RoCE)",
    "ib-200g": "200 Gb/s network per GPU (InfiniBand HDR / RoCE)",
    "ib-400g": "400 Gb/s network per GPU (InfiniBand NDR / RoCE)",
    "ib-800g": "800 Gb/s network per GPU (InfiniBand XDR)",
}

# How a group's scope was found.
PLACEMENT_TEXT: dict[Placement, str] = {
    Placement.RANKS: "rank placement", Placement.INSPECTOR: "NCCL Inspector nnodes",
    Placement.PARTIAL: "rank placement (partial)", Placement.UNKNOWN: "rank placement unknown"}


def link_how_text(h: LinkHow) -> str:
    """How the link and its bandwidth were chosen: "rank placement; NVLink 4 (H100/H200 SXM): ..."."""
    head = PLACEMENT_TEXT[h.placement]
    said = LINK_TEXT.get(h.link) if h.link is not None and h.link in LINKS else None
    match h.capability:
        case Capability.CONFIGURED:
            return f"{head}; configured busbw"
        case Capability.NO_LINK:
            return f"{head}; no link known for GPU {h.gpu!r}"
        case Capability.UNKNOWN_LINK:
            return f"{head}; unknown link {h.link!r}"
        case Capability.TABLE if said is not None:
            return f"{head}; {said}"
        case Capability.DEFAULT if said is not None:
            return f"{head}; {said} (configurable)"
    return head


def bandwidth_source(b: GroupBandwidth) -> str:
    """Where a group class's bandwidth comes from: its record sources, and which op's figure counts."""
    return b.source + (" (per op, the member with the shortest duration: Flight Recorder durations include "
                       "waiting for peers)" if FR in b.source.split(", ") else "")


def bandwidth_json(b: GroupBandwidth) -> dict[str, object]:
    """A group class's bandwidth as served: how its link was chosen and where it comes from in words."""
    return {**b.to_json(), "link_how": link_how_text(b.link_how), "source": bandwidth_source(b)}


def method_text(a: CollectiveAnalysis) -> str:
    """How the total share was computed (its method's detail; "" for none)."""
    if a.method == "step_windows":
        return ("collectives mapped to iterations by enqueue time (Flight Recorder time_created_ns) between "
                "the end times of consecutive step records (the rank's own hook records where present, else "
                "the job's); per window: union of [start, start + duration_ms] with start = enqueue time or "
                "the end of the previous op of the same process group, whichever is later, ÷ window length; "
                "windows the records do not cover are left out; summary = median over each rank's latest "
                f"{a.windows_kept} complete windows (warm-up and capture windows excluded), then median over "
                "ranks" + _summarised_text(a))
    if a.method == "observation_window":
        return ("no step records with end times: per rank, union of its collectives' [start, start + "
                "duration_ms] ÷ the span they cover (first enqueue to last end); one number per rank, not "
                "per iteration; then median over ranks")
    return ""


def _summarised_text(a: CollectiveAnalysis) -> str:
    if a.summarised_ranks is None:
        return ""
    return (f"; each partition's ranks summarised by the shard that holds it ({a.summarised_ranks} ranks in "
            f"all): medians across ranks within {SKETCH_ACCURACY:.0%} (a DDSketch), per-rank shares the "
            f"{RANK_RATIO_TOP_K} highest only")


def resolution_text(h: HangView) -> str:
    """Whether a hang resolved, and how it is known."""
    if h.resolved:
        return (f"rank(s) {','.join(map(str, h.stuck_ranks))} completed #{h.seq} or later (Flight Recorder "
                "records)")
    return "no completed op at or past it from the stuck ranks yet"


def hang_text(h: HangView) -> str:
    """A collective hang in one line: the op, who is stuck, who never reached it, whether it resolved."""
    what = f"{h.op} #{h.seq} on process group {h.process_group}"
    stuck = ",".join(map(str, h.stuck_ranks)) or "-"
    head = f"{what}: rank(s) {stuck} stuck"
    if h.age_at_first_report_s is not None:
        head += f" (reported {h.age_at_first_report_s:.0f}s after it was enqueued)"
    if h.ranks_not_joined:
        head += f"; rank(s) {','.join(map(str, h.ranks_not_joined))} never reached it"
    if h.ranks_unknown:
        head += f"; no data from rank(s) {','.join(map(str, h.ranks_unknown))}"
    head += f"; {'resolved: ' + resolution_text(h) if h.resolved else 'still active'}"
    return head + (f" [{h.user_frame}]" if h.user_frame else "")


def hang_json(h: HangView) -> dict[str, object]:
    """A hang as served: its JSON with its resolution after ``resolved`` and its line (``text``) after
    its user frame."""
    out: dict[str, object] = {}
    for k, v in h.to_json().items():
        out[k] = v
        if k == "resolved":
            out["resolution"] = resolution_text(h)
        if k == "user_frame":
            out["text"] = hang_text(h)
    return out


def finding_words(f: CollectiveFacts) -> tuple[str, str]:
    """A collective finding's title and observation."""
    match f:
        case HangFacts():
            h = f.hang
            return (("Collective hang: " if h.active else "Collective stalled, then completed: ")
                    + f"{h.op} #{h.seq} on group {h.process_group}", hang_text(h))
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
            return "Total communication share not available", ABSENT_TEXT[f.reason]
        case BandwidthFacts():
            b = f.bandwidth
            return (f"{b.group} collectives at {_pct(f.ratio)} of the {b.scope} link",
                    f"{b.n_ops} ops ≥ {f.min_mib} MiB on {b.group} groups reach a median "
                    f"{b.median_busbw_gbs:.0f} GB/s bus bandwidth (max {b.max_busbw_gbs:.0f}) against "
                    f"~{b.capability_gbs:.0f} GB/s for {b.link} ({link_how_text(b.link_how)}).")
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


# Where the collective findings' figures come from: the Flight Recorder's records, merged across agents.
FR_SOURCE = "collectors/nccl (Flight Recorder)"
HANG_SOURCE = "collectors/nccl hang detection (every agent's Flight Recorder dumps, merged)"


def worded_collective(f: Finding) -> Finding:
    """A collective finding with its words (its title, observation, the windows it is over and its
    source); any other as it is."""
    if isinstance(f, CollectiveFinding) and f.facts is not None:
        title, observation = finding_words(f.facts)
        # the evidence of a hang's or a link's finding is its JSON: as served, with its words
        evidence, source, iterations = f.evidence, FR_SOURCE, f.iterations
        if isinstance(f.facts, HangFacts):
            evidence, source = hang_json(f.facts.hang), HANG_SOURCE
        elif isinstance(f.facts, BandwidthFacts):
            evidence, source = bandwidth_json(f.facts.bandwidth), bandwidth_source(f.facts.bandwidth)
        elif isinstance(f.facts, TotalShareFacts) and f.facts.windows:
            iterations = f"{f.facts.windows} windows per rank"
        return dataclasses.replace(f, title=title, observation=observation, evidence=evidence, source=source,
                                   iterations=iterations, facts=None)
    return f


def worded_collective_recommendation(r: Recommendation) -> Recommendation:
    """A collective recommendation with its words; any other as it is."""
    if isinstance(r, CollectiveRecommendation) and r.facts is not None:
        action, detail = recommendation_words(r.facts)
        return dataclasses.replace(r, action=action, detail=detail, facts=None)
    return r


def collectives_json(a: CollectiveAnalysis) -> dict[str, Any]:
    """The collective analysis as served: its JSON with its method's detail, the reason of an absent
    share, how each group's link was chosen and where its bandwidth comes from, each hang's resolution
    and line, and its findings and recommendations worded."""
    out = a.to_json()
    out["method"] = {"name": a.method, "detail": method_text(a), "summarised_ranks": a.summarised_ranks}
    out["summary"]["absent_reason"] = ABSENT_TEXT[a.absent] if a.absent is not None else None
    out["bandwidth"] = [bandwidth_json(b) for b in a.bandwidth]
    out["hangs"] = [hang_json(h) for h in a.hangs]
    return {**out, "findings": [worded_collective(f).to_json() for f in a.findings],
            "recommendations": [worded_collective_recommendation(r).to_json() for r in a.recommendations]}
