"""The one action for slow data as it reads: whether an incident's verdict, the run's data
share or the data-loader remedy asks for it, by what the rank's CPUs allow
(perfd.analytics.breakdown.advice_registry.data_loading: a DataLoading). The words carry no numbers (the
numbers go in the detail: perfd.report.incident_text.cpu_use_text). And the data loader's knobs by the
job's framework, which the data-loader remedy's note (perfd.analytics.advice.remedy_said.Say.DATA_KNOBS)
and the run's data-loading recommendation (perfd.analytics.run.run_facts.DataShareFacts) name. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from perfd.analytics.advice.remedies import Framework
from perfd.analytics.advice.trainer_switches import HF_DATA_FLAGS, HF_PIN_MEMORY, TITAN_DATA_FLAGS
from perfd.analytics.finding_types import DataAction, DataLoading

DATA_LOADING_ACTION = ("Speed up data loading: more data-loader workers, pinned memory, prefetch; check "
                       "the storage the data comes from")
DATA_MORE_WORKERS_ACTION = ("Speed up data loading: more data-loader workers (the rank's CPUs have room), "
                            "pinned memory, prefetch; check the storage the data comes from")
DATA_CPU_BOUND_ACTION = ("Make each batch cheaper to load: the rank's CPUs are full, so more data-loader "
                         "workers would only share them; cheaper transforms (decode and augment once, "
                         "offline, or on the GPU) or more CPUs for the job")
# A CPU-only job's (perfd.core.model.JobInfo.device): pinned memory only speeds copies to a GPU, and there
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

# A DataLoader's, where the job builds its own (a plain loop, a LightningModule), and a CPU-only job's (no
# pinned memory: it only speeds copies to a GPU).
_LOADER = "DataLoader(num_workers=N, pin_memory=True, prefetch_factor=4, persistent_workers=True)"
_CPU_LOADER = "DataLoader(num_workers=N, prefetch_factor=4, persistent_workers=True)"
_IN_LIGHTNING = " in the LightningModule's (or LightningDataModule's) train_dataloader()"
# The Hugging Face Trainer's: its TrainingArguments, as the data-loader remedy sets them.
_HF_KNOBS = "Trainer: " + " ".join(f.text() for f in HF_DATA_FLAGS)
# The data loader's knobs per framework.
DATA_KNOBS: Mapping[Framework, str] = {
    Framework.MEGATRON: "Megatron-LM: --num-workers",
    Framework.PYTORCH: _LOADER,
    Framework.TORCHTITAN: "torchtitan: " + " ".join(f.text() for f in TITAN_DATA_FLAGS),
    Framework.HF_TRAINER: f"{_HF_KNOBS} ({HF_PIN_MEMORY} is on by default: keep it)",
    Framework.LIGHTNING: _LOADER + _IN_LIGHTNING,
}
# A CPU-only job's; a framework not here has no pinned memory of its own to leave out.
CPU_DATA_KNOBS: Mapping[Framework, str] = {
    Framework.PYTORCH: _CPU_LOADER,
    Framework.HF_TRAINER: _HF_KNOBS,
    Framework.LIGHTNING: _CPU_LOADER + _IN_LIGHTNING,
}


def knobs_text(framework: Framework, cpu_only: bool = False) -> str:
    """The data loader's knobs of a job of ``framework`` (``cpu_only``: one that computes on its CPUs)."""
    return (CPU_DATA_KNOBS.get(framework) if cpu_only else None) or DATA_KNOBS[framework]
