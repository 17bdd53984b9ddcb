"""Each remedy sentence's words (perfd.analytics.advice.remedy_said.Say), declared once, here: the remedies
return codes and numbers (their action, cost, notes and the basis of their gain), and the English is made
only where it is shown. A template is ``str.format`` over the code's arguments, positional: a nested
:class:`Said` is its own sentence, None says nothing. The recommendations and the smaller remedies'
finding made of them (perfd.analytics.advice.budget_findings: RemedyRecommendation, SmallerRemedies) and
the plan's items (perfd.analytics.advice.plan.PlanItem) are worded here too. Pure.
"""

from __future__ import annotations

import dataclasses

from perfd.analytics import thresholds as th
from perfd.analytics.advice.budget_findings import (
    BudgetFinding,
    RemedyFacts,
    RemedyRecommendation,
    SmallerRemedies,
    UnmodelledRemedies,
)
from perfd.analytics.advice.plan import PACKAGE_NAMES, Plan, PlanItem
from perfd.analytics.advice.remedies import Advice, Effort, Framework, NoGain, Risk
from perfd.analytics.advice.remedy_said import Arg, Said, Say
from perfd.analytics.finding_types import Finding, Recommendation
from perfd.core.model import PACKAGE_APEX, PACKAGE_FLASH_ATTN
from perfd.report.budget_text import worded_budget
from perfd.report.data_text import DATA_LOADING_ACTION, knobs_text

# The flash-attn note, the Transformer Engine layers' and the timers' words that two sentences share.
_NOT_FLASH = ("not --attention-backend flash: with it Transformer Engine uses only the separate flash-attn "
              "package (and turns off its cuDNN fused attention), which the job's start-up does not show; "
              "auto (or fused) lets TE pick its cuDNN fused attention")
_TE_LAYERS = " (layer norm in the linear's prologue, fused bias-activation-dropout)"
_LEVEL2 = "forward-compute, backward-compute, batch-generator, each started and stopped"
_TE_OR_APEX = "install Transformer Engine or Apex with its CUDA extensions"
# The fused loss's opening, and what torch.compile did to Liger's kernels (measured on an H200:
# docs/evidence/loops_ab_h200), which the compiled model's action, the Trainer's cost and the risk share.
_FUSED_CE = ("A fused linear + cross-entropy: the output layer and the loss in one, a block of rows at a "
             "time, the logits never stored whole")
_INTO_LIGER = ("torch.compile traces into Liger's kernels and fails (measured: torch 2.11, liger-kernel "
               "0.8.5, a compiled nanoGPT: \"unsupported operand type(s) for *: 'torch.dtype' and "
               "'FakeTensor'\")")
# What torch.compile's CUDA graphs do to what a call returned, and where that failed as is (measured on an
# H200: docs/evidence/loops_ab_h200), which each framework's cost of the graphs says.
_OVERWRITTEN = ("the tensors a compiled call returns are overwritten by its next replay, so a loop that "
                "keeps them across calls (several micro-batches a step: micro-batch k's outputs and "
                "autograd graph alive when k + 1 runs; a loss logged later; a module that caches a tensor "
                "it made in forward) needs torch.compiler.cudagraph_mark_step_begin() before each forward, "
                "or the kept tensor cloned")
_FAILED_AS_IS = ("as is, such loops failed (\"accessing tensor output of CUDAGraphs that has been "
                 "overwritten by a subsequent run\": measured on the Hugging Face Trainer with 4 "
                 "micro-batches a step and on Lightning's Transformer demo, whose positional encoding "
                 "caches a tensor made in forward)")

TEMPLATE: dict[Say, str] = {
    # Options the job's release does or does not take.
    Say.NOT_AN_OPTION: "{0} is not an option of Megatron-LM {1}",
    Say.NOT_IN_RELEASE: "{0} does not exist in Megatron-LM {1}",
    Say.VERSION_UNKNOWN: "Megatron-LM version unknown: {0} as in {1}",
    # A gain's basis, widened and combined.
    Say.SPREAD: "± {0:.0f} ms run to run ({1}{2})",
    Say.SPREAD_SHARE: "{0:.1%} of the step",
    Say.NO_STEP: "no step",
    Say.OWN_SPREAD: ": the spread of its own steady steps",
    Say.WITH_SPREAD: "{0}; {1}",
    Say.REPLAYED: "the captured steps replayed launch by launch {0}: the host at {1:.2f}× the profiled one "
                  "({2:.2f}–{3:.2f}) steps at the job's own {4:.0f} ms where the trace stepped at {5:.0f} ms",
    Say.REPLAY_AND_SLICES: "{0}: {1:.0f}–{2:.0f} ms; by the trace's slices, {3}: {4:.0f}–{5:.0f} ms; the "
                           "range spans both",
    # Attention dropout.
    Say.DROPOUT_BASIS: "the attention dropout's kernels, forward and backward: {0:.0f} ms per step by op, "
                       "run no more (× {1:g}–{2:g}: the gaps around them move too)",
    Say.DROPOUT_COST: "regularisation: attention dropout {0} → 0 (large-model pretraining recipes mostly "
                      "use 0; watch the validation loss)",
    Say.THE_DEFAULT: "the default",
    Say.DROPOUT_REPLAYED: "without the attention dropout's kernels ({0:.0f} ms by op; the host time before "
                          "each × {1:g}–{2:g})",
    Say.DROPOUT_FLAG: "Drop attention dropout: {0}",
    Say.DROPOUT_SDPA: "Drop attention dropout: dropout_p=0.0 in scaled_dot_product_attention "
                      "(attention_dropout=0 or attn_pdrop=0 in a Hugging Face config)",
    # Fused attention.
    Say.FUSED_ATTENTION_BASIS: "attention's {0:.0f} ms per step out, its {1:.1f} TFLOP per step back in at "
                               "{2:g}–{3:g} of the {4:g} TFLOP/s matmul ceiling ({5:.0f}–{6:.0f} ms): fused "
                               "attention never writes the s×s scores",
    Say.NOT_FLASH_BACKEND: _NOT_FLASH,
    Say.FUSED_ATTENTION_INSTALL: "Fused attention: install Transformer Engine, then {0}",
    Say.FUSED_ATTENTION_FLAGS: "Fused attention: {0}",
    Say.FUSED_ATTENTION_TORCHTITAN: "Fused attention: SDPA or flex attention in the model (torchtitan's own "
                                    "models use them)",
    Say.FUSED_ATTENTION_SDPA: "Fused attention: torch.nn.functional.scaled_dot_product_attention(q, k, v, "
                              'is_causal=True) in place of softmax(QKᵀ)·V (attn_implementation="sdpa" in '
                              "Hugging Face)",
    Say.FUSED_ATTENTION_HF: 'Fused attention: from_pretrained(..., attn_implementation="sdpa") in place of '
                            '"eager" ("flash_attention_2" with flash-attn installed)',
    # Scale-mask-softmax fusion.
    Say.SOFTMAX_BASIS: "the mask fill and the copies of the score matrix autograd makes for it: {0:.0f} ms "
                       "per step by op (× {1:g}–{2:g}); the fused kernel's softmax costs what the unfused "
                       "one does",
    Say.SOFTMAX_INSTALL: "Fuse scale, mask and softmax: install Apex with its CUDA extensions (the fused "
                         "kernels scaled_masked_softmax_cuda), then remove --no-masked-softmax-fusion",
    Say.SOFTMAX_REMOVE: "Fuse scale, mask and softmax: remove --no-masked-softmax-fusion",
    Say.SOFTMAX_NO_EXTENSIONS: "the start-up does not show Apex's CUDA extensions; without "
                               "scaled_masked_softmax_cuda the job refuses to start (seen on an H100: No "
                               "module named 'scaled_masked_softmax_cuda')",
    # Cross-entropy fusion.
    Say.CE_BASIS: "the loss's {0:.0f} ms per step in {1} fused passes instead of one kernel per op: each "
                  "merged group costs its longest op, {2:.0f} ms saved (× {3:g}–{4:g}: what torch.compile "
                  "fuses varies)",
    Say.CE_FLAGS: "Fuse the cross-entropy: {0}",
    Say.FUSED_CE_BASIS: "the loss's kernels over the logits (log-softmax and NLL, forward and backward) take "
                        "{0:.1f} ms a step; one pass over each block of logits for the loss and its "
                        "gradient saves {1:.0%}–{2:.0%} of them (at most the separate forward pass; its sure "
                        "gain is memory){3}",
    Say.ZERO_GRAD_GOES: ", and the zero gradient autograd fills for the returned logits ({0:.1f} ms) goes "
                        "with them (× {1:g}–{2:g})",
    Say.FUSED_LINEAR_CE: _FUSED_CE + " — Liger Kernel's LigerFusedLinearCrossEntropyLoss (pip install "
                         "liger-kernel; loss = LigerFusedLinearCrossEntropyLoss()(lm_head.weight, "
                         "hidden.view(-1, d), targets.view(-1))) or Apple's Cut Cross-Entropy (pip install "
                         "cut-cross-entropy; loss = linear_cross_entropy(hidden, lm_head.weight, targets))",
    Say.FUSED_LINEAR_CE_HF: "A fused linear + cross-entropy: --use_liger_kernel (pip install liger-kernel; "
                            "Liger patches the model's output layer and loss into one, a block of rows at "
                            "a time, the logits never stored whole, with its RMSNorm, SwiGLU and rotary "
                            "kernels)",
    Say.FUSED_CE_COST_HF: "the model returns no logits in training; Liger's chunks run smaller matmuls; the "
                          "logits' memory (rows × vocabulary) is freed; Liger patches the model itself, "
                          "outside torch.compile unless {0} is given too: with it, " + _INTO_LIGER,
    Say.FUSED_CE_COST: "the model no longer returns logits in training; Cut Cross-Entropy computes them "
                       "again in the backward (about one more output-layer matmul), Liger's chunks run "
                       "smaller matmuls; the logits' memory (rows × vocabulary) is freed",
    Say.LOSS_ONLY_BASIS: "the compiled backward fills a zero gradient for every output the loss does "
                         "not use: {0:.1f} ms a step of fill kernels under CompiledFunctionBackward, which "
                         "run no more (× {1:g}–{2:g})",
    Say.LOSS_ONLY: "Return only the loss from the compiled model in training: compute the loss inside "
                   "forward() and return no logits when targets are given (return None, loss); the logits "
                   "it returns now get a gradient of zeros in every backward",
    # Recomputation.
    Say.FULL_RECOMPUTE_BASIS: "full recomputation runs each layer's forward twice: {0:.0f} ms of layer work "
                              "per step, a third of it forward; selective keeps recomputing core attention "
                              "({1:.0f} ms) and no more: {2:.0f} ms back (× {3:g}–{4:g})",
    Say.RECOMPUTE_LESS: "Recompute less: --recompute-granularity selective (core attention only) instead of "
                        "full",
    Say.RECOMPUTE_LESS_COST: "memory: the layers' activations but attention's are kept{0}",
    Say.PEAK_ROOM: "; the log's peak is {0:.1f} GiB of {1:.0f} GiB",
    Say.FREE_MEMORY: "Free memory: --recompute-granularity selective (core attention's s×s activations "
                     "recomputed, not kept)",
    Say.RECOMPUTE_OFF: "Activation checkpointing off: call the layers without torch.utils.checkpoint, or "
                       "checkpoint fewer of them (the memory allowing)",
    Say.RECOMPUTE_OFF_TORCHTITAN: "Activation checkpointing off: {0} (the memory allowing)",
    Say.RECOMPUTE_OFF_HF: "Gradient checkpointing off: {0} (the memory allowing)",
    Say.RECOMPUTE_OFF_LIGHTNING: "Activation checkpointing off: the network the LightningModule holds called "
                                 "without torch.utils.checkpoint, or fewer of its layers checkpointed (the "
                                 "memory allowing)",
    Say.RECOMPUTE_OFF_COST: "memory: the activations the recompute spared are kept from the forward to the "
                            "backward; read the job's peak (its log, or perfd's GPU memory) against the "
                            "GPU's before turning it off, and keep it where it is the room that lets the job "
                            "run",
    Say.RECOMPUTE_BASIS: "{0:,.0f} forward launches a step run again in the backward ({1:.1f} ms of "
                         "kernels), none without the checkpointing (× {2:g}–{3:g} of that time back)",
    Say.RECOMPUTE_REPLAYED: "without the {0:,.0f} recomputed launches a step ({1:.1f} ms of kernels), and "
                            "× {2:g}–{3:g} of the host's time before each",
    Say.CHECKPOINT_FORWARD: "{0}, and the layers' forward launches, {1:.0f} µs of the profiled host's each "
                            "under the checkpoint, at 1× to the backward's own {2:.0f} µs a launch (the "
                            "checkpoint's hooks and selective checkpointing's per-op policy, which the "
                            "backward's own ops do not pass through, gone)",
    Say.FREE_MEMORY_BASIS: "attention's forward ({0:.0f} ms of its {1:.0f} ms) runs again in the backward",
    Say.FREE_MEMORY_COST: "the step runs longer; the log's peak {0:.1f} GiB of {1:.0f} GiB comes down (room "
                          "for a larger micro-batch)",
    # Fused layers.
    Say.FUSED_LAYERS_BASIS: "normalisation, activation and other pointwise work: {0:.0f} ms per step, each "
                            "activation written once instead of once per op (× {1:g}–{2:g})",
    Say.HOST_SIDE_UNMODELLED: "{0}; of it the host's part is between none and the replay's (a compiled "
                              "program's own host time, its guards and graph breaks, is in no eager trace): "
                              "the low end is the GPU's fused kernels alone, {1:.1f} ms",
    Say.FUSED_REPLAYED: "with the forward-backward phase's {1:,.0f} elementwise launches of its {0:,.0f} a "
                        "step ({2:.0f} ms of kernels) fused into × {3:g}–{4:g} as many, × {5:g}–{6:g} of "
                        "their time, and the host's launching there scaled by the launches left",
    Say.TE_LAYERS_INSTALL: "Transformer Engine layers: install Transformer Engine, then {0}" + _TE_LAYERS,
    Say.TE_LAYERS: "Transformer Engine layers: {0}" + _TE_LAYERS,
    Say.TE_UNSHOWN: "needs Transformer Engine (the log does not say whether it is installed)",
    Say.FUSED_LAYERS_TORCHTITAN: "Fused layers: {0} (torch.compile of each TransformerBlock and of the loss: "
                                 "compile.components)",
    Say.FUSED_LAYERS_COMPILE: "Fused layers: torch.compile(model)",
    Say.FUSED_LAYERS_HF: "Fused layers: {0} (torch.compile), or {1} where Liger patches the model (its fused "
                         "RMSNorm, RoPE, SwiGLU and cross-entropy kernels; needs liger-kernel installed)",
    Say.FUSED_LAYERS_LIGHTNING: "Fused layers: torch.compile the network the LightningModule holds "
                                "(self.model = torch.compile(...) in its __init__ or configure_model), "
                                "not the LightningModule: compiled whole, its training_step's self.log() "
                                "is traced too and recompiles at each switch between training and "
                                "validation (measured: Lightning's Transformer demo 28-39% slower, "
                                "Dynamo's recompile limit reached)",
    # Bigger GEMMs.
    Say.GEMM_BASIS: "the GEMMs run at {0:.0%} of the ceiling: {1:.0f} ms per step where {2:.0f} ms would be "
                    "{3:.0%} of it (× {4:g}–{5:g} of the difference)",
    Say.BIGGER_GEMMS_MEGATRON: "Bigger GEMMs: a larger --micro-batch-size, hidden and FFN sizes multiples "
                               "of 128",
    Say.BIGGER_GEMMS: "Bigger GEMMs: a larger batch per step, dimensions multiples of 128",
    Say.BIGGER_GEMMS_HF: "Bigger GEMMs: a larger {0} and a smaller {1} (the same global batch), dimensions "
                         "multiples of 128",
    Say.BIGGER_GEMMS_LIGHTNING: "Bigger GEMMs: a larger DataLoader batch_size and a smaller "
                                "Trainer(accumulate_grad_batches=...) (the same global batch), dimensions "
                                "multiples of 128",
    Say.BIGGER_GEMMS_TORCHTITAN: "Bigger GEMMs: a larger {0} (the same {1}: fewer gradient-accumulation "
                                 "steps), dimensions multiples of 128",
    # Host synchronisations and Megatron-LM's timers.
    Say.SYNC_BASIS: "{0:.0f} synchronisations a step ({1}), the GPU idle {2:.1f} ms while the host waits "
                    "for them and {3:.1f} ms after, while it refills the queue they drained; without them "
                    "the host runs ahead (× {4:g}–{5:g})",
    Say.REMOVE_SYNCS: "Remove host synchronisations from the step: .item(), .cpu(), "
                      "torch.cuda.synchronize(), printing tensors; log every N steps",
    Say.REMOVE_SYNCS_HF: "Remove host synchronisations from the step: {0} (the Trainer tests every "
                         "micro-batch's loss for NaN or inf on the host, a synchronisation each) and {1} "
                         "as large as the loss curve allows (it reads the loss back at each logging step); "
                         "no .item(), .cpu() or printed tensors in compute_loss or a callback",
    Say.NAN_FILTER_COST: "the logged loss no longer leaves out a NaN or inf micro-batch's (logging only: the "
                         "gradients are the same)",
    Say.REMOVE_SYNCS_LIGHTNING: "Remove host synchronisations from the step: values logged every step with "
                                "self.log(..., on_step=False, on_epoch=True) or prog_bar=False (the progress "
                                "bar reads them back at each refresh), a larger Trainer({0}); no .item(), "
                                ".cpu() or printed tensors in training_step",
    Say.REMOVE_SYNCS_TORCHTITAN: "Remove host synchronisations from the step: a larger {0} (torchtitan reads "
                                 "the loss and the gradient norm back at each logging step)",
    Say.TIMER_BASIS: "the GPU idles {0:.0f} ms a step after the bare device synchronisations of the "
                     f"forward-backward phase: the level-2 timers' ({_LEVEL2} × {{1}} micro-batches), which "
                     "level 1 drops (× {2:g}–{3:g}); the step-level timers stay",
    Say.TIMER_REPLAYED: "without the forward-backward phase's bare synchronisations (the level-2 timers': "
                        f"{_LEVEL2} × {{0}} micro-batches)",
    Say.HOST_JITTER: "{0}; and up to the {1:.0f} ms of host jitter a step its steady steps show (× {2:g} "
                     "their robust deviation), which a host synchronising every micro-batch pays and one "
                     "running ahead absorbs",
    Say.TIMER_LEVEL: "Time the step without per-micro-batch synchronisations: --timing-log-level 1 (0 "
                     "outside diagnosis)",
    Say.TIMER_COST: "the per-micro-batch timers go (batch-generator: the data wait perfd reads from the "
                    "log; forward-compute/backward-compute): the step hook or a capture still gives the "
                    "data wait",
    # The micro-batch.
    Say.MEMORY_UNKNOWN: "memory: activations double (the log's memory report or the GPU's size is unknown: "
                        "check)",
    Say.MEMORY_PEAK: "memory: peak allocated {0:.1f} → ~{1:.1f} GiB of {2:.0f} GiB (activations double)",
    Say.WITH_BUBBLE: "{0}; with {1} pipeline stages the bubble grows from {2:.0%} to {3:.0%} ({4} → {5} "
                     "micro-batches)",
    Say.MICRO_BATCH_BASIS: "{0} → {1} micro-batches a step: of the per-micro-batch gaps, the timers' "
                           "{2:.0f} ms halve (× {3:g}–{4:g}) and the forward-backward gaps between "
                           "kernels' {5:.0f} ms (the host's launches, the GPU's own switches, the refills "
                           "after syncs) mostly go (× {6:g}–{7:g}: half as many kernels for the same work); "
                           "the optimizer phase's {8:.0f} ms of gaps are per step and stay",
    Say.MICRO_BATCH_REPLAYED: "with {0} micro-batches of {1} for {2} of {3} (each kernel of the "
                              "forward-backward phase {4:g}–{5:g}× as long, the gradient accumulation's the "
                              "same)",
    Say.MICRO_BATCH: "Fewer, larger micro-batches: {0} (global batch {1} unchanged)",
    Say.MICRO_BATCH_TORCH_BASIS: "{0} → {1} micro-batches a step (the forward passes between optimizer "
                                 "steps): the GPU's switches between kernels it had queued ({2:.1f} ms, one "
                                 "a "
                                 "kernel) go with the absorbed micro-batches' kernels (× {3:.2f}), the "
                                 "forward-backward gaps where the host launched late ({4:.1f} ms) mostly go "
                                 "(× {5:g}–{6:g}: the host launches half as many kernels for the same "
                                 "work){7}{8}{9}; the other kernels grow with the rows and are not counted",
    Say.ACCUMULATE_GOES: ", and of autograd's AccumulateGrad adds ({0:.1f} ms, a parameter's gradient added "
                         "to the one before each micro-batch after the first) those of the absorbed "
                         "micro-batches go (× {1:.2f}–{2:.2f})",
    Say.WEIGHT_CASTS_GO: ", and autocast's casts of the fp32 weights to the compute dtype and of their "
                         "gradients back ({0:g} kernels a micro-batch, {1:.1f} ms a step, each a weight's "
                         "size whatever the rows) go with the absorbed micro-batches (× {2:.2f})",
    Say.SPLITK_GO: ", and of cuBLAS's split-K reductions of the weights' gradients ({0:g} a micro-batch, "
                   "{1:.1f} ms a step, each a weight's size whatever the rows) none to those of the absorbed "
                   "micro-batches go (× 0–{2:.2f}: none if cuBLAS splits the doubled rows twice as far, "
                   "those if it keeps its split)",
    Say.MICRO_BATCH_TORCH_REPLAYED: "with {0} micro-batches a step for {1} (each kernel of the "
                                    "forward-backward phase {2:g}–{3:g}× as long, the gradient "
                                    "accumulation's the same)",
    Say.MICRO_BATCH_TORCH: "Fewer, larger micro-batches: {1} a step instead of {0}, each {2:g}× the rows "
                           "(the batch size × {2:g}, the gradient-accumulation steps {0} → {1}: the tokens "
                           "per step unchanged)",
    Say.MICRO_BATCH_HF: "Fewer, larger micro-batches: {1} a step instead of {0}: "
                        "--per_device_train_batch_size × {2:g} and --gradient_accumulation_steps {1} "
                        "(the tokens per step unchanged)",
    Say.MICRO_BATCH_LIGHTNING: "Fewer, larger micro-batches: {1} a step instead of {0}: the DataLoader's "
                               "batch_size × {2:g} and Trainer(accumulate_grad_batches={1}) (the tokens per "
                               "step unchanged)",
    Say.ACTIVATION_MEMORY: "memory: needs ~{0:g}× a micro-batch's activation memory (the activations grow "
                           "with the rows; the trace shows no memory use: read "
                           "torch.cuda.max_memory_allocated() at the current size first)",
    Say.ONE_MICRO_BATCH: "or all {0} in one micro-batch where the memory holds {0}× the activations: the "
                         "accumulation loop goes",
    # CUDA graphs.
    Say.GRAPHS_BASIS: "{0:.0%}–{1:.0%} of the {2:.0f} ms of forward-backward launch gaps come back (the "
                      "graphed regions'), less the replay's input copies and the breaks at syncs and "
                      "dynamic shapes (up to {3:.0%} of the step)",
    Say.GRAPHS_REPLAYED: "with the layers' launches from graphs (their host time × {0:g}–{1:g}: one launch "
                         "a layer, its copies)",
    Say.GRAPHS_FLAG: "CUDA graphs: {0}",
    Say.GRAPHS_COST: "memory for the graphs' static buffers",
    Say.GRAPHS_COMPILE: 'CUDA graphs: torch.compile(model, mode="reduce-overhead")',
    Say.GRAPHS_HF: "CUDA graphs: {0} (torch.compile's CUDA graphs; the mode sets {1} too)",
    Say.GRAPHS_LIGHTNING: 'CUDA graphs: torch.compile(..., mode="reduce-overhead") of the network the '
                          "LightningModule holds, not the LightningModule (whose training_step's "
                          "self.log() recompiles when traced)",
    Say.GRAPHS_THIN_BASIS: "the host works {0:.0f} ms a step (as traced, or at the job's own speed where "
                           "the replay reaches its clock) for the GPU's {1:.0f} ms ({2:.0%}): a margin so "
                           "thin that any stall of the host's shows as idle; graphed, each "
                           "compiled region is one launch: {4:.0%}–{5:.0%} of the {3:.1f} ms of "
                           "forward-backward launch gaps come back, less the copies of the batch into the "
                           "graphs' inputs (up to {6:.0%} of the step)",
    Say.GRAPHS_COMPILED: 'CUDA graphs for the compiled model: torch.compile(model, mode="reduce-overhead") '
                         '(or mode="max-autotune", which also tries GEMM kernels of its own: minutes more to '
                         "compile)",
    Say.GRAPHS_COMPILED_COST: "memory for the graphs' pool; the batch's shape must not change (a last short "
                              "batch recompiles); {0}",
    Say.GRAPHS_KEEP: _OVERWRITTEN + "; " + _FAILED_AS_IS,
    Say.GRAPHS_KEEP_HF: _OVERWRITTEN + "; the Trainer's own training_step calls the model, so the mark "
                                       "needs a Trainer subclass whose training_step calls it first (not "
                                       "measured); " + _FAILED_AS_IS,
    Say.GRAPHS_KEEP_LIGHTNING: _OVERWRITTEN + " (in the LightningModule: first thing in training_step); "
                               + _FAILED_AS_IS,
    # The optimizer phase.
    Say.FOREACH_ADAM: "torch's multi-tensor (foreach) Adam",
    Say.PER_TENSOR_ADAM: "per-tensor Adam kernels",
    Say.FOREACH_OF: "{0}'s multi-tensor (foreach) implementation",
    Say.PER_PARAMETER_OF: "{0}'s per-parameter kernels (its for-loop implementation)",
    Say.OPTIMIZER_BASIS: "the optimizer phase of a complete step: {0} {1:.0f} ms (a fused Adam makes one "
                         "pass: × {2:g}–{3:g} of it saved){4}{5}",
    Say.OPTIMIZER_CLASS_BASIS: "the optimizer phase of a complete step, {0:.1f} ms: {1} {2:.2f} ms (a fused "
                               "{3} makes one pass: × {4:g}–{5:g} of it saved){6}",
    Say.OPT_SCALE: ", per-tensor scale and copy kernels {0:.0f} ms (clipping, the master weights; × "
                   "{1:g}–{2:g})",
    Say.OPT_LAUNCH: ", gaps between its kernels {0:.0f} ms (the host's launches and the GPU's own "
                    "switches; × {1:g}–{2:g})",
    Say.FUSED_OPTIMIZER_INSTALL: f"A fused optimizer: {_TE_OR_APEX} (without them Megatron-LM falls back to "
                                 "{0} and a per-tensor multi_tensor_scale)",
    Say.FUSED_OPTIMIZER_TORCHTITAN: "A fused optimizer: --optimizer.implementation fused",
    Say.FUSED_OPTIMIZER_TORCH: "A fused optimizer: torch.optim.AdamW(params, fused=True)",
    Say.FUSED_OPTIMIZER_CLASS: "A fused optimizer: torch.optim.{0}(params, ..., fused=True)",
    Say.FUSED_OPTIMIZER_HF: "A fused optimizer: {0} (the Trainer's default from torch 2.8 on)",
    Say.FUSED_OPTIMIZER_LIGHTNING: "A fused optimizer: torch.optim.{0}(self.parameters(), ..., fused=True) "
                                   "in configure_optimizers()",
    Say.TE_APEX_UNSHOWN: "the start-up does not say whether Transformer Engine or Apex is there",
    Say.GRAD_NORM_BASIS: "{0:.0f} .item() synchronisations a step in the optimizer phase leave the GPU idle "
                         "{1:.0f} ms (× {2:g}–{3:g}), and the per-tensor norm kernels take {4:.1f} ms (× "
                         "{5:g}–{6:g}): a multi-tensor l2 norm is one kernel and no sync",
    Say.GRAD_NORM: f"Gradient norm without a sync per tensor: {_TE_OR_APEX} (amp_C); without them "
                   "Megatron-LM's local_multi_tensor_l2_norm calls .item() on every parameter tensor's norm",
    Say.GRAD_ACCUM_BASIS: "the main_grad += kernels: {0:.0f} ms a step{1}, {2:.0f} ms of it with nothing "
                          "else running (× {3:g}–{4:g}: the GEMM writes fp32 into main_grad instead)",
    Say.SIDE_STREAM: " ({0:.0f} ms on a side stream)",
    Say.GRAD_ACCUM_INSTALL: f"Accumulate weight gradients in the GEMM: {_TE_OR_APEX}, then remove "
                            "--no-gradient-accumulation-fusion",
    Say.GRAD_ACCUM: "Accumulate weight gradients in the GEMM: remove --no-gradient-accumulation-fusion",
    # Communication, data, pipeline.
    Say.OVERLAP_BASIS: "exposed communication {0:.0f} ms per step, run behind the backward pass (× "
                       "{1:g}–{2:g})",
    Say.OVERLAP_FLAGS: "Overlap gradient communication with compute: {0}",
    Say.OVERLAP_COST: "the distributed optimizer shards optimizer state (less memory, a param all-gather)",
    Say.OVERLAP_DDP: "Overlap communication: DDP buckets overlap with backward by default (check no_sync "
                     "and find_unused_parameters); FSDP: backward_prefetch",
    Say.OVERLAP_HF: "Overlap communication: {0} (without gradient checkpointing the Trainer has DDP look "
                    "for unused parameters every step) and {1} sized to the model; DDP overlaps its "
                    "buckets with the backward",
    Say.OVERLAP_LIGHTNING: 'Overlap communication: strategy="ddp" (not "ddp_find_unused_parameters_true"), '
                           "DDPStrategy(bucket_cap_mb=...) sized to the model; DDP overlaps its buckets with "
                           "the backward",
    Say.DATA_BASIS: "the step waits {0:.0f} ms for its batch; a loader that keeps up hides it (× "
                    "{1:g}–{2:g})",
    Say.DATA_REPLAYED: "with the batches made by DataLoader workers: the training thread's own fetches "
                       "({0:.1f} ms a step, the profiler's cost not in them) gone but × {1:g}–{2:g} of them "
                       "(taking a made batch from the workers' queue)",
    Say.DATA_LOADER: DATA_LOADING_ACTION.replace("{", "{{").replace("}", "}}"),
    Say.DATA_KNOBS: "{0}",  # the framework's knobs (data_text.DATA_KNOBS, which the run's data finding names)
    Say.PIPELINE_BASIS: "pipeline waits {0:.0f} ms per step: the 1F1B bubble (p−1)/(m+p−1) nearly halves as "
                        "the micro-batches double (× {1:g}–{2:g}; imbalance between stages stays)",
    Say.PIPELINE_MEGATRON: "Shrink the pipeline wait: more micro-batches per iteration (a larger "
                           "--global-batch-size or a smaller --micro-batch-size), interleaved stages "
                           "(--num-layers-per-virtual-pipeline-stage), or rebalance layers between stages "
                           "(--decoder-last-pipeline-num-layers)",
    Say.PIPELINE: "Shrink the pipeline wait: more micro-batches per step, an interleaved schedule, balanced "
                  "stages",
}


def _arg(code: Say, a: Arg) -> object:
    """An argument as its template takes it: a nested sentence worded, None as nothing, the data loader's
    framework as its knobs (perfd.report.data_text.knobs_text, which the run's data-loading finding names
    too)."""
    if isinstance(a, Said):
        return text(a)
    if a is None:
        return ""
    if code is Say.DATA_KNOBS:
        return knobs_text(Framework(str(a)))
    return a


def text(s: Said | None) -> str:
    """A remedy's sentence (nothing for None)."""
    if s is None:
        return ""
    return TEMPLATE[s.code].format(*(_arg(s.code, a) for a in s.args))


# Why a remedy that fits the job has no modelled gain (perfd.analytics.advice.remedies.NoGain).
NO_GAIN_TEXT = {
    NoGain.ATTENTION_FLOPS: "the model's attention FLOPs are unknown, so what the fused kernel would cost "
                            "is not read; the model's spec gives them: the framework's log, the step hook's "
                            "model=",
    NoGain.NOT_MODELLED: "its gain is not modelled",
}
# Why a modelled gain wholly above zero is not promised (perfd.analytics.advice.remedies.Risk).
RISK_TEXT = {
    Risk.GRAPHS_MICRO_BATCHES: "the trace shows more than one micro-batch a step, and CUDA graphs failed "
                               "as is on such a loop (measured: the Hugging Face Trainer, 4 a step); what "
                               "they give with torch.compiler.cudagraph_mark_step_begin() before each "
                               "forward is not measured",
    Risk.GRAPHS_TRAINER: "the Trainer's own training step calls the model, with no mark before each "
                         "forward: with the flag alone it failed (measured: 4 micro-batches a step); a "
                         "Trainer subclass that adds the mark is not measured",
    Risk.GRAPHS_KEPT_TENSOR: "a module that keeps a tensor it made in forward fails even with the mark "
                             "before each forward (measured: Lightning's Transformer demo, the mark first in "
                             "training_step); read the model for such caches (clone them) before counting on "
                             "it",
    Risk.COMPILE_HOST_SIDE: "the gain is the host's (fewer launches): the GPU's fused kernels give under "
                            "half of it, and the compiled code's own host time (its guards, the graph "
                            "breaks and recompiles the module's Python causes) is in no eager trace "
                            "(measured: Lightning's Transformer demo, 3.3-9.5 ms predicted, -0.9 and +1.9 "
                            "ms with its network compiled)",
}


# --- a remedy as the report shows it ----------------------------------------------------------------
EFFORT_TEXT = {Effort.FLAG: "a flag (minutes)", Effort.INSTALL: "an install", Effort.CODE: "a code change"}


def _share(x: float) -> str:
    return f"{x:.1%}" if abs(x) < 0.1 else f"{x:.0%}"


def gain_text(a: Advice, step_ms: float, mfu: float | None) -> str:
    """The expected change of the step (and of the MFU, where known): a gain, a cost, or one to measure."""
    g = a.gain
    if g is None or step_ms <= 0:
        return "not estimated"
    lo, hi = g.low_ms, g.high_ms
    if hi <= 0:  # a cost, not a gain (a remedy for memory)
        return f"step +{-hi:.0f} to +{-lo:.0f} ms ({_share(-hi / step_ms)}–{_share(-lo / step_ms)} slower)"
    if g.risk is not None:  # modelled, but the remedy as said failed on such a job
        runs = " once it runs" if g.risk.fails_as_said else ""
        span = (f"step −{lo:.0f} to −{hi:.0f} ms ({_share(lo / step_ms)}–{_share(hi / step_ms)}){runs}"
                if lo > 0 else f"between {abs(lo):.0f} ms slower and {hi:.0f} ms faster per step")
        return f"{span}, not promised: {RISK_TEXT[g.risk]}: measure before keeping it"
    if not g.promised:
        return (f"between {abs(lo):.0f} ms slower and {hi:.0f} ms faster per step ({-lo / step_ms:+.0%} to "
                f"{-hi / step_ms:+.0%}): measure before keeping it")
    more = ""
    if mfu is not None and step_ms - hi > 0:
        more = f", MFU {mfu:.1%} → {mfu * step_ms / (step_ms - lo):.1%}–{mfu * step_ms / (step_ms - hi):.1%}"
    return f"step −{lo:.0f} to −{hi:.0f} ms ({_share(lo / step_ms)}–{_share(hi / step_ms)}){more}"


def detail_text(a: Advice, step_ms: float, mfu: float | None) -> str:
    """A remedy's detail: basis, expected change, needs, cost, notes, effort."""
    bits = []
    if a.gain is not None:
        bits.append(f"basis: {text(a.gain.basis)}")
        bits.append(f"expected: {gain_text(a, step_ms, mfu)}")
    if a.needs:
        names = [PACKAGE_NAMES.get(n, n) for n in a.needs]
        said = ("neither is" if a.needs_one and len(names) > 1 else "none is" if len(names) > 1
                else "it is not")
        bits.append(f"needs {(' or ' if a.needs_one else ' and ').join(names)}; the job's start-up says "
                    f"{said} installed")
    if a.cost is not None:
        bits.append(f"cost: {text(a.cost)}")
    bits += [text(n) for n in a.notes]
    bits.append(f"effort: {EFFORT_TEXT[a.effort]}")
    return "; ".join(bits)


def worded_remedy(r: Recommendation) -> Recommendation:
    """A remedy's recommendation with its action and detail; any other as it is."""
    if not isinstance(r, RemedyRecommendation) or r.facts is None or len(r.facts.advice) != 1:
        return r
    f = r.facts
    a = f.advice[0]
    return dataclasses.replace(r, action=text(a.action), detail=detail_text(a, f.step_ms, f.mfu), facts=None)


def _smaller(f: RemedyFacts) -> tuple[str, str, dict[str, object]]:
    small = f.advice
    title = (f"{len(small)} smaller remed{'ies' if len(small) > 1 else 'y'}, each under "
             f"{th.REMEDY_MIN_GAIN.value:.0%} of the step")
    said = "; ".join(f"{text(a.action)} ({gain_text(a, f.step_ms, f.mfu)})" for a in small) + "."
    evidence: dict[str, object] = {"remedies": [
        {"remedy": a.remedy.value, "action": text(a.action),
         "gain_ms": [a.gain.low_ms, a.gain.high_ms] if a.gain else None,
         "flags": [x.text() for x in a.flags], "needs": list(a.needs)} for a in small]}
    return title, said, evidence


def _unmodelled(f: RemedyFacts) -> tuple[str, str, dict[str, object]]:
    got = f.advice
    title = (f"{len(got)} remed{'ies' if len(got) > 1 else 'y'} with no modelled gain (not ordered with the "
             "others)")
    said = "; ".join(f"{text(a.action)} (not modelled: {NO_GAIN_TEXT[a.no_gain or NoGain.NOT_MODELLED]})"
                     for a in got) + "."
    evidence: dict[str, object] = {"remedies": [
        {"remedy": a.remedy.value, "action": text(a.action), "gain_ms": None,
         "why": (a.no_gain or NoGain.NOT_MODELLED).value} for a in got]}
    return title, said, evidence


def worded_remedies(f: Finding) -> Finding:
    """The advice package's findings as shown: the smaller remedies' and the unmodelled ones' with their
    title, observation and evidence, the step budget's with theirs (perfd.report.budget_text); any other
    as it is."""
    if isinstance(f, BudgetFinding):
        return worded_budget(f)
    if isinstance(f, UnmodelledRemedies) and f.facts is not None:
        title, observation, evidence = _unmodelled(f.facts)
        return dataclasses.replace(f, title=title, observation=observation, evidence=evidence, facts=None)
    if not isinstance(f, SmallerRemedies) or f.facts is None:
        return f
    title, observation, evidence = _smaller(f.facts)
    return dataclasses.replace(f, title=title, observation=observation, evidence=evidence, facts=None)


# What a package must bring for the remedies, beyond being importable (a plan item's prerequisite's note).
PACKAGE_NOTES = {
    PACKAGE_APEX: "with its CUDA extensions (amp_C, scaled_masked_softmax_cuda, "
                  "fused_weight_gradient_mlp_cuda): the Python package alone changes nothing",
    PACKAGE_FLASH_ATTN: "the separate flash-attn package: --attention-backend flash uses it alone",
}


def _worded_item(i: PlanItem) -> PlanItem:
    if i.said is None:  # read back from JSON: worded already
        return i
    needs = tuple(dataclasses.replace(p, note=PACKAGE_NOTES.get(p.package, "")) for p in i.prerequisites)
    return dataclasses.replace(i, action=text(i.said), said=None, prerequisites=needs)


def worded_plan(plan: Plan | None) -> Plan | None:
    """The plan with each item's action and its prerequisites' notes worded (an item read back from JSON
    has its words already)."""
    if plan is None:
        return None
    unmodelled = tuple(u if u.said is None else dataclasses.replace(u, action=text(u.said), said=None)
                       for u in plan.unmodelled)
    return dataclasses.replace(plan, items=tuple(_worded_item(i) for i in plan.items), unmodelled=unmodelled)
