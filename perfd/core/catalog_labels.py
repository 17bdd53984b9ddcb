"""The labels of perfd's metrics: every label a metric of the catalog (perfd/core/catalog.py) may carry,
with what bounds it, and where the values of a closed set are declared.

Apart from the catalog because they are the labels' own words, read where the catalog is checked and
written down (its tests, ``perfd catalog --doc``), while the exporters read the catalog's metrics.
"""

from __future__ import annotations

from perfd.core.model import CAPTURE_TOOLS

# Every label any metric may carry, with what bounds it.
LABELS: dict[str, str] = {
    "job_name": "job name (one per training/serving job)",
    "node": "host name",
    "gpu": "GPU index on the node",
    "rank": "global rank of a training process",
    "reason": "small enum: throttle reason, error reason or refusal reason (perfd.core.limits)",
    "type": "small enum: ECC error type (corrected, uncorrected)",
    "class": "bottleneck class (a closed set)",
    "collector": "collector name",
    "interface": "network interface",
    "device": "block device",
    "uuid": "GPU UUID (one per GPU: bounded like gpu)",
    "model": "GPU model name as NVML reports it (one per GPU)",
    "pci_bus_id": "GPU PCI bus id as NVML reports it, e.g. 00000000:3B:00.0 (one per GPU, as DCGM's)",
    "UUID": "DCGM-exporter's name for the GPU UUID: the value of uuid (one per GPU)",
    "modelName": "DCGM-exporter's name for the GPU model: the value of model (perfd_gpu_info only)",
    "Hostname": "DCGM-exporter's name for the node: the value of node (one per GPU series' node)",
    "cpu": "CPU index (only with the host collector's per_cpu: true)",
    "resource": "pressure stall resource (cpu, memory, io)",
    "process_state": "a rank process's state (a closed set)",
    "replay": "present (\"1\") on samples replayed from a recording",
    "link": "NVLink index",
    "tool": f"capture tool ({', '.join(t for t in CAPTURE_TOOLS if t != 'auto')})",
    "status": "capture outcome (ok, failed, skipped)",
    "group": "parallel group class of a process group (tp, cp, ep, dp, pp, world, other)",
    "scope": "link a process group crosses (intra-node, inter-node, unknown)",
    "state": "job liveness (running, stalled, ended)",
    "cause": "the cause an open incident's verdict names (a closed set)",
    "kind": "where a job's wall time went (a closed set)",
    "part": "a part of the step budget (a closed set)",
    "version": "perfd version (one per build)",
    "python": "Python version the daemon runs on (one per build)",
    "source": "where a GPU series comes from when it is not NVML/GPM (dcgm-exporter)",
    "target": "remote-write URL, scheme, host and path only (one per --remote-write)",
    "stream": "an engine stream (nodes, partials, records, events, summaries)",
    "consumer": "a partition's durable consumer of the node stream, shard-pN (one per engine partition)",
}


# The labels whose values are a closed set declared elsewhere: "module:attribute" of that declaration
# (an enum or a tuple of strings). Named, not imported: the catalog sits below analytics; `perfd catalog
# --doc` resolves them, so the values and their count in docs/metrics.md come from the declaration.
LABEL_SETS: dict[str, str] = {
    "class": "perfd.analytics.breakdown.bottleneck:BottleneckClass",
    "process_state": "perfd.core.events:PROCESS_STATES",
    "kind": "perfd.analytics.steps.goodput:KINDS",
    "part": "perfd.analytics.breakdown.step_parts:Part",
    "cause": "perfd.analytics.incidents.evidence:CAUSE_LABEL_VALUES",
}
