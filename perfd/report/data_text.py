"""The one action for slow data as it reads (issue 57): whether an incident's verdict, the run's data
share or the data-loader remedy asks for it, by what the rank's CPUs allow
(perfd.analytics.breakdown.advice_registry.data_loading: a DataLoading). The words carry no numbers (the
numbers go in the detail: perfd.report.incident_text.cpu_use_text). And the data loader's knobs by the
job's framework, which the data-loader remedy's note (perfd.analytics.advice.remedy_said.Say.DATA_KNOBS)
and the run's data-loading recommendation (perfd.analytics.run.run_facts.DataShareFacts) name. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from perfd.analytics.advice.remedies import Framework
from perfd.analytics.finding_types import DataAction, DataLoading

DATA_LOADING_ACTION = ("Speed up data loading: more data-loader workers, pinned memory, prefetch; check "
                       "the storage the data comes from")
DATA_MORE_WORKERS_ACTION = ("Speed up data loading: more data-loader workers (the rank's CPUs have room), "
                            "pinned memory, prefetch; check the storage the data comes from")
DATA_CPU_BOUND_ACTION = ("Make each batch cheaper to load: the rank's CPUs are full, so more data-loader "
                         "workers would only share them; cheaper transforms (decode and augment once, "
                         "offline, or on the GPU) or more CPUs for the job")
# A CPU-only job's (perfd.model.JobInfo.device): pinned memory only speeds copies to a GPU, and there
# is no GPU to move transforms to.
DATA_LOADING_ACTION_CPU = ("Speed up data loading: more data-loader workers, prefetch; check the storage the "
                           "data comes from")
DATA_MORE_WORKERS_ACTION_CPU = ("Speed up data loading: more data-loader workers (the rank's CPUs have "
                                "room), prefetch; check the storage the data comes from")
DATA_CPU_BOUND_ACTION_CPU = ("Make each batch cheaper to load: the rank's CPUs are full (the training "
                             "computes on them too), so more data-loader workers would only share them; "
                             "cheaper transforms (decode and augment once, offline) or more CPUs for the job")

DATA_ACTIONS: Mapping[DataLoading, str] = {
    DataLoading(DataAction.LOAD_FASTER): DATA_LOADING_ACTION,
    DataLoading(DataAction.MORE_WORKERS): DATA_MORE_WORKERS_ACTION,
    DataLoading(DataAction.CHEAPER_BATCHES): DATA_CPU_BOUND_ACTION,
    DataLoading(DataAction.LOAD_FASTER, cpu_only=True): DATA_LOADING_ACTION_CPU,
    DataLoading(DataAction.MORE_WORKERS, cpu_only=True): DATA_MORE_WORKERS_ACTION_CPU,
    DataLoading(DataAction.CHEAPER_BATCHES, cpu_only=True): DATA_CPU_BOUND_ACTION_CPU,
}

# The data loader's knobs per framework.
DATA_KNOBS: Mapping[Framework, str] = {
    Framework.MEGATRON: "Megatron-LM: --num-workers",
    Framework.PYTORCH: "DataLoader(num_workers=N, pin_memory=True, prefetch_factor=4, "
                       "persistent_workers=True)",
    Framework.TORCHTITAN: "torchtitan: more data-loader workers",
}
# A CPU-only job's DataLoader knobs (no pin_memory: it only speeds copies to a GPU).
CPU_DATA_KNOBS = "DataLoader(num_workers=N, prefetch_factor=4, persistent_workers=True)"


def knobs_text(framework: Framework, cpu_only: bool = False) -> str:
    """The data loader's knobs of a job of ``framework`` (``cpu_only``: one that computes on its CPUs)."""
    return CPU_DATA_KNOBS if cpu_only and framework is Framework.PYTORCH else DATA_KNOBS[framework]
