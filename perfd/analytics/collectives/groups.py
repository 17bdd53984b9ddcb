"""Parallel groups and link capabilities for collective analytics (pure).

- :func:`classify_group`: which parallel dimension a process group spans (tp, cp, ep, dp, pp,
  world, other), from its description (Megatron-Core names its groups, e.g.
  ``TENSOR_MODEL_PARALLEL_GROUP``) or from its ranks and the job layout. Megatron's default rank
  order is ``tp-cp-ep-dp-pp`` (tp varies fastest): with tp=2, dp=2, pp=2 the group {0, 1} differs
  only in the tp coordinate, {0, 2} only in dp, {0, 4} only in pp. Expert parallelism is carved out
  of data parallelism (ep × expert-dp = dp). A group of every rank is ``world`` unless exactly one
  dimension of the layout is larger than one (a pure DDP job: its all-ranks group is ``dp``).
- :data:`LINKS`: the bus-bandwidth class of a link (nccl-tests' "busbw", GB/s = 1e9 B/s, per GPU
  and direction), keyed by link type, with the intra-node link picked from the GPU model and the
  inter-node one configurable (default 200 Gb/s InfiniBand = 25 GB/s per GPU).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from perfd.analytics.common import TextEnum
from perfd.analytics.steps.gpus import lookup_gpu
from perfd.core.model import ParallelLayout
from perfd.core.record_json import JsonWritten

GROUP_CLASSES: tuple[str, ...] = ("tp", "cp", "ep", "dp", "pp", "world", "other")
DEFAULT_ORDER = "tp-cp-ep-dp-pp"


@dataclass(frozen=True)
class LinkSpec:
    """A link's name (its key) and its bus bandwidth class. What the link is and where its figure comes
    from (its rated bandwidth, a measurement) are words: perfd.report.collective_text.LINK_TEXT, where a
    group's link is served (one entry per key here, tests/analytics/test_more_words.py)."""

    name: str
    busbw_gbs: float  # what a large collective can reach on it (bus bandwidth, GB/s per GPU)


LINKS: dict[str, LinkSpec] = {spec.name: spec for spec in (
    LinkSpec("nvlink3", 300.0),
    LinkSpec("nvlink4", 450.0),
    LinkSpec("nvlink-bridge", 300.0),
    LinkSpec("nvlink5", 900.0),
    LinkSpec("pcie4", 25.0),
    LinkSpec("pcie5", 50.0),
    LinkSpec("ib-100g", 12.5),
    LinkSpec("ib-200g", 25.0),
    LinkSpec("ib-400g", 50.0),
    LinkSpec("ib-800g", 100.0),
)}

# A measured bus bandwidth above this multiple of the link's figure is not credible: nothing moved
# at that rate (a one-rank group, a clock step, an op timed before it ran). The figures are what a
# large collective reaches; NVLink SHARP all-reduces can beat them by ~10%, hence the margin.
CREDIBLE_BUSBW_FACTOR = 1.5

# GPU model (perfd.analytics.steps.gpus row name) -> link between the GPUs of one node.
INTRA_NODE_LINK: dict[str, str] = {
    "GB200": "nvlink5", "B200": "nvlink5", "H200": "nvlink4", "H200 NVL": "nvlink4", "GH200": "nvlink4",
    "H100 SXM": "nvlink4", "H100 NVL": "nvlink-bridge", "H100 PCIe": "pcie5", "A100": "nvlink3",
    "L40S": "pcie4",
}
DEFAULT_INTER_NODE_LINK = "ib-200g"

# Megatron-Core group descriptions (parallel_state group_desc) -> class. Matched on the upper-cased
# description; the first matching entry wins (longer, more specific names first).
_DESC_RULES: tuple[tuple[str, str], ...] = (
    ("DEFAULT_PG", "world"),
    ("EXPERT_DATA_PARALLEL", "dp"), ("EXPERT_TENSOR_AND_MODEL", "other"),
    ("EXPERT_TENSOR_PARALLEL", "tp"), ("EXPERT_MODEL_PARALLEL", "ep"),
    ("TENSOR_AND_DATA_PARALLEL", "other"), ("TENSOR_AND_CONTEXT", "other"),
    ("TENSOR_AND_EXPERT", "other"), ("POSITION_EMBEDDING", "other"), ("EMBEDDING", "other"),
    ("INTRA_PARTIAL_DATA_PARALLEL", "dp"), ("INTER_PARTIAL_DATA_PARALLEL", "dp"),
    ("DATA_PARALLEL", "dp"), ("CONTEXT_PARALLEL", "cp"), ("TENSOR_MODEL_PARALLEL", "tp"),
    ("PIPELINE_MODEL_PARALLEL", "pp"), ("MODEL_PARALLEL", "other"),
)


def class_from_desc(desc: str | None) -> str | None:
    """Class from a process-group description, or None when it says nothing known."""
    if not desc:
        return None
    d = desc.upper()
    for key, cls in _DESC_RULES:
        if key in d:
            return cls
    return None


def layout_sizes(layout: ParallelLayout | None, world_size: int | None = None) -> dict[str, int] | None:
    """Sizes of the dimensions ``tp, cp, ep, edp (dp / ep), pp``; None when the layout does not
    pin them down (dp may be derived from the world size)."""
    if layout is None:
        return None
    tp, pp, cp, ep = layout.tp, layout.pp, layout.cp or 1, layout.ep or 1
    world = layout.world_size or world_size
    dp = layout.dp
    if tp is None or pp is None:
        return None
    if dp is None and world:
        dp = world // (tp * pp * cp) if world % (tp * pp * cp) == 0 else None
    if dp is None or dp <= 0:
        return None
    if dp % ep != 0:
        ep = 1  # expert parallelism that does not divide dp is laid out differently: ignore it
    return {"tp": tp, "cp": cp, "ep": ep, "edp": dp // ep, "pp": pp}


def _coords(rank: int, sizes: Mapping[str, int], order: Sequence[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for dim in order:
        n = sizes[dim]
        out[dim] = rank % n
        rank //= n
    return out


def _order(order: str) -> list[str]:
    dims = [d.strip() for d in order.lower().split("-") if d.strip()]
    return ["edp" if d == "dp" else d for d in dims]


def classify_group(ranks: Sequence[int] | None, layout: ParallelLayout | None = None,
                   world_size: int | None = None, desc: str | None = None,
                   order: str = DEFAULT_ORDER) -> tuple[str, str]:
    """(class, method): ``method`` says how the class was found ("description", "layout <order>",
    "all ranks", "unknown")."""
    by_desc = class_from_desc(desc)
    sizes = layout_sizes(layout, world_size)
    world = (layout.world_size if layout else None) or world_size
    members = sorted(set(ranks)) if ranks else []
    if by_desc is not None and by_desc != "world":
        return by_desc, "description"
    if sizes is not None and members:
        dims = _order(order)
        if set(dims) == set(sizes):
            total = 1
            for n in sizes.values():
                total *= n
            if max(members) < total:
                cs = [_coords(r, sizes, dims) for r in members]
                varying = {d for d in dims if len({c[d] for c in cs}) > 1}
                expected = 1
                for d in varying:
                    expected *= sizes[d]
                if varying and expected == len(members):
                    return _class_of(varying, sizes), f"layout {order}"
    if members and world and len(members) == world:
        return "world", "all ranks"
    if by_desc == "world":
        return "world", "description"
    return "other", "unknown"


def _class_of(varying: set[str], sizes: Mapping[str, int]) -> str:
    if varying == {"tp"}:
        return "tp"
    if varying == {"cp"}:
        return "cp"
    if varying == {"ep"}:
        return "ep"
    if varying == {"pp"}:
        return "pp"
    if "edp" in varying and varying <= {"cp", "ep", "edp"}:
        return "dp"  # data parallel (with context parallel: Megatron's dp-cp gradient group)
    big = {d for d, n in sizes.items() if n > 1}
    if varying == big:
        return "world"
    return "other"


class Placement(TextEnum):
    """How a group's scope was found."""

    RANKS = "ranks"  # every member's node is known
    INSPECTOR = "inspector"  # the NCCL Inspector's nnodes
    PARTIAL = "partial"  # some members' nodes, more than one
    UNKNOWN = "unknown"


class Capability(TextEnum):
    """Where the link's bus bandwidth comes from."""

    CONFIGURED = "configured"  # a busbw given in the configuration
    TABLE = "table"  # LINKS: the GPU's (or the configured) intra-node link
    DEFAULT = "default"  # LINKS: the inter-node link, configurable
    NO_LINK = "no_link"  # no intra-node link known for the GPU
    UNKNOWN_LINK = "unknown_link"  # an inter-node link LINKS does not hold
    NONE = "none"  # the placement is unknown


@dataclass(frozen=True)
class LinkHow(JsonWritten):
    """How the link and its bandwidth were chosen (worded where served: perfd.report.collective_text):
    the placement, the capability's source, the link (a LINKS key, or the unknown one's name) and the
    GPU's name where no link is known for it."""

    placement: Placement
    capability: Capability = Capability.NONE
    link: str | None = None
    gpu: str | None = None


@dataclass(frozen=True)
class LinkChoice:
    scope: str  # "intra-node" | "inter-node" | "unknown"
    link: str | None
    busbw_gbs: float | None
    how: LinkHow


def link_for_group(ranks: Sequence[int] | None, rank_nodes: Mapping[int, str], gpu_name: str | None,
                   nnodes: int | None = None, *, intra_link: str | None = None,
                   inter_link: str = DEFAULT_INTER_NODE_LINK, intra_busbw_gbs: float | None = None,
                   inter_busbw_gbs: float | None = None) -> LinkChoice:
    """The link a group's collectives cross: intra-node when every member runs on one node (from
    ``rank_nodes``), inter-node when they span nodes; the Inspector's ``nnodes`` decides when the
    placement is unknown. Overrides (``*_busbw_gbs``) win over the table."""
    nodes = {rank_nodes[r] for r in ranks or () if r in rank_nodes}
    known = bool(ranks) and all(r in rank_nodes for r in ranks or ())
    if known:
        scope, how = ("intra-node" if len(nodes) == 1 else "inter-node"), Placement.RANKS
    elif nnodes is not None:
        scope, how = ("intra-node" if nnodes <= 1 else "inter-node"), Placement.INSPECTOR
    elif len(nodes) > 1:
        scope, how = "inter-node", Placement.PARTIAL
    else:
        return LinkChoice("unknown", None, None, LinkHow(Placement.UNKNOWN))
    if scope == "intra-node":
        if intra_busbw_gbs is not None:
            return LinkChoice(scope, intra_link or "configured", intra_busbw_gbs,
                              LinkHow(how, Capability.CONFIGURED))
        name = intra_link
        if name is None:
            row = lookup_gpu(gpu_name)
            name = INTRA_NODE_LINK.get(row.model) if row else None
        spec = LINKS.get(name) if name else None
        if spec is None:
            return LinkChoice(scope, name, None, LinkHow(how, Capability.NO_LINK, name, gpu_name))
        return LinkChoice(scope, spec.name, spec.busbw_gbs, LinkHow(how, Capability.TABLE, spec.name))
    if inter_busbw_gbs is not None:
        return LinkChoice(scope, inter_link, inter_busbw_gbs, LinkHow(how, Capability.CONFIGURED))
    spec = LINKS.get(inter_link)
    if spec is None:
        return LinkChoice(scope, inter_link, None, LinkHow(how, Capability.UNKNOWN_LINK, inter_link))
    return LinkChoice(scope, spec.name, spec.busbw_gbs, LinkHow(how, Capability.DEFAULT, spec.name))
