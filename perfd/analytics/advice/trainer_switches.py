"""A remedy's action in the job's own framework's terms, where the framework has a switch for it: the
Hugging Face Trainer's TrainingArguments as its command line spells them (HfArgumentParser; the names
are transformers 5.x's training_args.py), Lightning's Trainer arguments and LightningModule (Lightning
2.6) and torchtitan's config keys as its command line overrides them. A remedy asks :func:`in_terms` for
its sentence, flags and cost; a framework without an entry gets the remedy's own words (a plain PyTorch
loop's). A Trainer's flag is a flag: the advice carries it (Effort.FLAG); a change to the model or its
LightningModule is code. The options are named here only: the sentences (perfd.report.remedy_text) take
them as arguments, and the data loader's knobs (perfd.report.data_text) are built from them. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from perfd.analytics.advice.remedies import Flag, Framework, RemedyId
from perfd.analytics.advice.remedy_said import Said, Say, say

# Hugging Face TrainingArguments (value N: the job's to choose).
HF_TORCH_COMPILE = Flag("--torch_compile")
HF_COMPILE_REDUCE_OVERHEAD = Flag("--torch_compile_mode", "reduce-overhead")  # sets --torch_compile too
HF_FUSED_ADAMW = Flag("--optim", "adamw_torch_fused")  # the Trainer's default from torch 2.8 on
HF_LIGER = "--use_liger_kernel"  # named, never set: it needs the liger-kernel package and a model it patches
HF_WORKERS = Flag("--dataloader_num_workers", "N")
HF_PERSISTENT_WORKERS = Flag("--dataloader_persistent_workers")
HF_PREFETCH = Flag("--dataloader_prefetch_factor", "4")
HF_PIN_MEMORY = "--dataloader_pin_memory"  # on by default: named, not set
HF_DATA_FLAGS = (HF_WORKERS, HF_PERSISTENT_WORKERS, HF_PREFETCH)
HF_BATCH = Flag("--per_device_train_batch_size")
HF_ACCUMULATION = Flag("--gradient_accumulation_steps")
# The Trainer tests every micro-batch's loss for NaN or inf with a Python `or` on two tensors (its
# logging_nan_inf_filter, on by default): a host synchronisation each; and reads the loss back at every
# logging step.
HF_NAN_FILTER_OFF = Flag("--logging_nan_inf_filter", "false")
HF_LOGGING_STEPS = Flag("--logging_steps", "N")
# Without gradient checkpointing the Trainer gives DDP find_unused_parameters=True: a walk of the
# autograd graph every step.
HF_FIND_UNUSED_OFF = Flag("--ddp_find_unused_parameters", "false")
HF_BUCKET_CAP = Flag("--ddp_bucket_cap_mb", "N")
# Lightning's Trainer arguments (what its documentation calls Trainer flags).
LIGHTNING_LOG_EVERY = Flag("log_every_n_steps", "N", "=")
# Hugging Face's gradient checkpointing (off by default: a job with it on passes the flag)
HF_CHECKPOINTING_OFF = Flag("--gradient_checkpointing", "false")
# torchtitan's config keys on its command line (torchtitan 0.2.2's job_config.py; tyro's bool flags).
TITAN_LOG_FREQ = Flag("--metrics.log_freq", "N")
TITAN_LOCAL_BATCH = Flag("--training.local_batch_size")
TITAN_GLOBAL_BATCH = "--training.global_batch_size"
TITAN_COMPILE = Flag("--compile.enable")  # compiles each TransformerBlock and the loss (compile.components)
TITAN_CHECKPOINTING_OFF = Flag("--activation_checkpoint.mode", "none")  # its default is "selective"
TITAN_DATA_FLAGS = (Flag("--training.dataloader.num_workers", "N"),
                    Flag("--training.dataloader.persistent_workers"),
                    Flag("--training.dataloader.prefetch_factor", "4"),
                    Flag("--training.dataloader.pin_memory"))


@dataclass(frozen=True)
class Switch:
    """A remedy's action in one framework's terms: its sentence, the flags it sets, the options it names
    without setting (``named``) and what it costs besides time. The sentence takes the flags' text then
    ``named`` as its arguments, or none (a sentence of no arguments: the flags go with the advice)."""

    said: Say
    flags: tuple[Flag, ...] = ()
    named: tuple[str, ...] = ()
    cost: Say | None = None
    given: int = 0  # arguments the remedy gives after those: what the job runs (its optimizer's class)

    @property
    def action(self) -> Said:
        return self.action_with()

    def action_with(self, *given: str) -> Said:
        """The sentence with the remedy's own arguments after the flags' and the names' (the first
        ``given`` of them: a switch that takes none, a Trainer's flag, names what it sets itself)."""
        args = (*(f.text() for f in self.flags), *self.named, *given[:self.given]) if self.said.arity else ()
        return say(self.said, *args)

    @property
    def cost_said(self) -> Said | None:
        return say(self.cost) if self.cost is not None else None


S = Switch
# Per remedy, per framework with a switch for it. Megatron-LM's options are the remedies' own
# (remedies.flags_for: checked against the job's release); the others are here.
SWITCHES: Mapping[RemedyId, Mapping[Framework, Switch]] = {
    RemedyId.FUSED_ATTENTION: {
        Framework.TORCHTITAN: S(Say.FUSED_ATTENTION_TORCHTITAN),
        Framework.HF_TRAINER: S(Say.FUSED_ATTENTION_HF),
    },
    RemedyId.FUSED_LAYERS: {
        Framework.TORCHTITAN: S(Say.FUSED_LAYERS_TORCHTITAN, (TITAN_COMPILE,)),
        Framework.HF_TRAINER: S(Say.FUSED_LAYERS_HF, (HF_TORCH_COMPILE,), (HF_LIGER,)),
        Framework.LIGHTNING: S(Say.FUSED_LAYERS_LIGHTNING),
    },
    RemedyId.CUDA_GRAPHS: {  # the cost: what the loop needs of torch.compile's graphs (remedy_graphs)
        Framework.HF_TRAINER: S(Say.GRAPHS_HF, (HF_COMPILE_REDUCE_OVERHEAD,), (HF_TORCH_COMPILE.option,),
                                cost=Say.GRAPHS_KEEP_HF),
        Framework.LIGHTNING: S(Say.GRAPHS_LIGHTNING, cost=Say.GRAPHS_KEEP_LIGHTNING),
    },
    RemedyId.FUSED_OPTIMIZER: {
        Framework.TORCHTITAN: S(Say.FUSED_OPTIMIZER_TORCHTITAN),
        Framework.HF_TRAINER: S(Say.FUSED_OPTIMIZER_HF, (HF_FUSED_ADAMW,)),
        Framework.LIGHTNING: S(Say.FUSED_OPTIMIZER_LIGHTNING, given=1),
    },
    RemedyId.TIMER_SYNC: {  # outside Megatron-LM: the loop's own synchronisations
        Framework.HF_TRAINER: S(Say.REMOVE_SYNCS_HF, (HF_NAN_FILTER_OFF, HF_LOGGING_STEPS),
                                cost=Say.NAN_FILTER_COST),
        Framework.LIGHTNING: S(Say.REMOVE_SYNCS_LIGHTNING, (LIGHTNING_LOG_EVERY,)),
        Framework.TORCHTITAN: S(Say.REMOVE_SYNCS_TORCHTITAN, (TITAN_LOG_FREQ,)),
    },
    RemedyId.BIGGER_GEMMS: {
        Framework.MEGATRON: S(Say.BIGGER_GEMMS_MEGATRON),
        Framework.HF_TRAINER: S(Say.BIGGER_GEMMS_HF, (HF_BATCH, HF_ACCUMULATION)),
        Framework.LIGHTNING: S(Say.BIGGER_GEMMS_LIGHTNING),
        Framework.TORCHTITAN: S(Say.BIGGER_GEMMS_TORCHTITAN, (TITAN_LOCAL_BATCH,), (TITAN_GLOBAL_BATCH,)),
    },
    RemedyId.OVERLAP_COMM: {  # outside Megatron-LM: DDP's
        Framework.HF_TRAINER: S(Say.OVERLAP_HF, (HF_FIND_UNUSED_OFF, HF_BUCKET_CAP)),
        Framework.LIGHTNING: S(Say.OVERLAP_LIGHTNING),
    },
    RemedyId.DATA_LOADER: {  # the action is the data-loading one; the knobs are the note's (DATA_KNOBS)
        Framework.HF_TRAINER: S(Say.DATA_LOADER, HF_DATA_FLAGS),
        Framework.TORCHTITAN: S(Say.DATA_LOADER, TITAN_DATA_FLAGS),
    },
    RemedyId.RECOMPUTE: {  # outside Megatron-LM (whose recompute options are the remedies' own)
        Framework.TORCHTITAN: S(Say.RECOMPUTE_OFF_TORCHTITAN, (TITAN_CHECKPOINTING_OFF,),
                                cost=Say.RECOMPUTE_OFF_COST),
        Framework.HF_TRAINER: S(Say.RECOMPUTE_OFF_HF, (HF_CHECKPOINTING_OFF,), cost=Say.RECOMPUTE_OFF_COST),
        Framework.LIGHTNING: S(Say.RECOMPUTE_OFF_LIGHTNING, cost=Say.RECOMPUTE_OFF_COST),
    },
}


def in_terms(remedy: RemedyId, framework: Framework, plain: Say, given: int = 0,
             cost: Say | None = None) -> Switch:
    """The remedy's action in ``framework``'s terms; ``plain``: its sentence where the framework has no
    switch of its own (a plain loop's), taking ``given`` arguments of the remedy's, and ``cost`` its cost."""
    return SWITCHES.get(remedy, {}).get(framework) or Switch(plain, cost=cost, given=given)


def _check(switches: Mapping[RemedyId, Mapping[Framework, Switch]]) -> None:
    """Each sentence takes what its switch gives it (a switch added with a wrong sentence fails at
    import, not in a report)."""
    bad = [f"{r.value}/{f.value}" for r, by in switches.items() for f, s in by.items()
           if s.said.arity not in (0, len(s.flags) + len(s.named) + s.given)
           or (s.cost is not None and s.cost.arity)]
    if bad:
        raise ValueError(f"trainer switches: a sentence's arity does not match for {bad}")


_check(SWITCHES)
