"""The parts a step divides into and the phases of a step: enums that the budget, the kernel rows, the
advice and the job's facts share (here, not in budget.py, so that the kernel rows can name parts, and
perfd.analytics.breakdown.job_facts phases, without importing the budget that carries them)."""

from __future__ import annotations

from perfd.analytics.common import TextEnum


class Part(TextEnum):
    """A part of the step. ``str`` so that JSON and a Prometheus ``part`` label carry the value.

    A capture divides the step by the op that launched each kernel (perfd.capture.ops; the rules are
    perfd.analytics.breakdown.op_parts); the timers alone divide it into data, exposed communication,
    pipeline,
    the optimizer and an undivided compute part."""

    ATTENTION = "attention"  # core attention: QKᵀ, mask, softmax, dropout, ·V, their backward and copies
    LINEAR = "linear"  # the linear layers' GEMMs (QKV, projection, MLP, the output layer)
    GEMM = "gemm"  # matmul kernels whose op is unknown (kernel names only: linear and attention together)
    ACTIVATION = "activation"  # the MLP activation (GELU, SwiGLU) forward and backward
    NORM = "norm"  # layer / RMS normalisation
    LOSS = "loss"  # cross-entropy over the logits (the vocabulary-sized pointwise work)
    EMBEDDING = "embedding"
    OPTIMIZER = "optimizer"  # the step, gradient norm and clipping, zeroing
    GRAD_REDUCE = "grad_reduce"  # gradient accumulation and the data-parallel machinery's kernels
    POINTWISE = "pointwise"  # other pointwise work: residual adds, hidden dropout, casts, reshapes
    MEMCPY = "memcpy"  # copies and memsets no op above claims (a batch to the device, ...)
    COMM_EXPOSED = "comm_exposed"  # communication with no compute beside it
    PIPELINE = "pipeline"  # pipeline bubble: SendRecv waits, idle stages
    DATA = "data"  # waiting for the next batch
    IDLE_SYNC = "idle_sync"  # idle after a host synchronisation returned: the host launching again
    IDLE_SHORT = "idle_short"  # other idle in gaps shorter than th.SHORT_GAP_S: the host launching work
    IDLE_SWITCH = "idle_switch"  # short gaps before kernels already launched: the GPU's own switches
    IDLE_LONG = "idle_long"  # other idle in longer gaps: the host elsewhere (Python between steps)
    COMPUTE = "compute"  # the timers' compute, not divided (no capture)


# The parts a layer's own kernels are in (not the loss, the embedding, the optimizer, copies of the batch)
LAYER_PARTS = frozenset({Part.ATTENTION, Part.LINEAR, Part.NORM, Part.ACTIVATION, Part.POINTWISE})


class Phase(TextEnum):
    """Where in the step a kernel or a gap is: its launch's place on the host (perfd.capture.ops tails)."""

    LAYERS = "forward-backward"  # once per micro-batch
    OPTIMIZER = "optimizer"  # once per step: from the last backward work to the next forward
