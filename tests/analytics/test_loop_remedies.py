"""The remedies that pay on the loops people write, fitted to two published loops recorded on one H200
(tests/data/loops): nanoGPT's train.py (compiled GPT-2 124M, 16×1024 tokens a micro-batch, 4 a step,
vocabulary 50304, bf16 autocast; its own clock 133.5 ms a step) and transformers' run_clm.py (an eager
110M Llama, 8×1024 tokens a micro-batch, 4 a step, vocabulary 16000; 293 ms a step unprofiled).

Each gain is held to a reading of the trace's own kernels and gaps made apart from perfd's attribution
(the raw Chrome trace: each kernel's launch on the host placed between the two ``Optimizer.step#``
annotations of the first complete step), written down in each test's docstring. Every range is widened
by the run-to-run spread, 0.5% of the captured step (0.66 ms of nanoGPT's 132.3 ms, 2.1 ms of the Llama's
422.2 ms): perfd.analytics.advice.remedies.run_spread_ms.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from perfd.analytics.advice.remedies import Advice, Effort, FitContext, Framework, JobConfig, RemedyId
from perfd.analytics.advice.remedy_catalog import fit
from perfd.analytics.advice.remedy_said import Say
from perfd.analytics.breakdown.budget import StepBudget, TimerShares
from perfd.analytics.breakdown.capture_budget import from_capture
from perfd.analytics.breakdown.replay_table import Change
from perfd.analytics.breakdown.step_parts import Part
from perfd.capture.ops import Launch
from perfd.capture.step_replay import _MB_START, HostTrace, simulate, timeline
from tests.trace_cache import analyze_chrome_trace

LOOPS = Path(__file__).resolve().parents[1] / "data" / "loops"
SPREAD = 0.005  # remedies.RUN_SPREAD_OF_STEP: what every range carries beside its model


def _budget(name: str) -> StepBudget:
    folder = LOOPS / name
    clock = json.loads((folder / "meta.json").read_text())["own_clock_median_ms"]
    dev = analyze_chrome_trace(folder / "trace.json.xz").devices[0]
    b = from_capture(dev, dev.trace_steps, timers=TimerShares(step_ms=clock))
    assert b is not None
    return b


def _fitted(b: StepBudget) -> dict[RemedyId, Advice]:
    return {a.remedy: a for a in fit(FitContext(b, JobConfig(framework=Framework.PYTORCH)))}


@pytest.fixture(scope="module")
def nanogpt() -> StepBudget:
    return _budget("nanogpt_h200")


@pytest.fixture(scope="module")
def llama() -> StepBudget:
    return _budget("hf_clm_h200")


def _near(got: float, want: float, tol: float) -> bool:
    return abs(got - want) <= tol


def test_compiled_loss_kernels_are_the_loss(nanogpt: StepBudget) -> None:
    """Inductor's kernels that fused the log-softmax are the cross-entropy's, whatever region launched
    them. Reading: triton_red_fused__log_softmax__unsafe_view_prepare_softmax_online_view_15 (4 × 1.17
    ms), triton_red_fused__log_softmax__log_softmax_backward_data_…_nll_loss_backward_…_0 (4 × 1.27 ms)
    and _16, _17 (0.05 ms): 9.80 ms of the complete step, left in "other pointwise" before."""
    assert _near(nanogpt.ms(Part.LOSS), 9.80, 0.05)
    assert all("log_softmax" in k["name"] for k in nanogpt.get(Part.LOSS).detail["kernels"])  # type: ignore[union-attr]


def test_the_micro_batches_are_the_forward_passes_between_optimizer_steps(nanogpt: StepBudget,
                                                                           llama: StepBudget) -> None:
    """nanoGPT fetches its batch with its own get_batch (no DataLoader range) and the trace lost the GPU
    activity of its last micro-batch; the Trainer fetches a step's four batches before the first forward:
    both run 4 micro-batches a step (meta.json), counted as their forward passes on the host."""
    assert nanogpt.replay is not None and nanogpt.replay.microbatches == 4
    assert llama.replay is not None and llama.replay.microbatches == 4


def _host(prefetch: bool, lost: bool = False) -> HostTrace:
    """One step (marks at 0 and 100 ms, the optimizer phase its first ms: one 0.5 ms kernel) of 4
    micro-batches at 10, 30, 50, 70 ms: each a forward of 3 launches (1 ms kernels) then a backward of 3
    (2 ms). The batches are fetched all at 2 ms (``prefetch``, as the Trainer does) or each 1 ms before
    its forward; ``lost``: the last micro-batch's launches have no GPU activity in the trace."""
    ms = 1e6
    launches = [Launch(0, 1, 0.1 * ms, "cudaLaunchKernel")]
    device = {0: (0.2 * ms, 0.7 * ms, 7)}
    backward: set[int] = set()
    corr = 0
    for k, t in enumerate((10.0, 30.0, 50.0, 70.0)):
        for j in range(6):
            corr += 1
            at = (t + j) * ms
            launches.append(Launch(corr, 1, at, "cudaLaunchKernel"))
            if j >= 3:
                backward.add(corr)
            if not (lost and k == 3):
                device[corr] = (at + 0.01 * ms, at + (1.0 if j < 3 else 2.0) * ms, 7)
    fetches = [2.0 * ms] * 4 if prefetch else [(t - 1.0) * ms for t in (10.0, 30.0, 50.0, 70.0)]
    return HostTrace(launches, (), device, (0.0, 100 * ms), {}, {}, {}, ((0.0, 1.0 * ms),), fetches,
                     frozenset(backward))


def test_a_step_whose_batches_are_fetched_first_splits_at_its_forward_passes() -> None:
    """Fetched first, the batches no longer mark the micro-batches (the fetches' count said 1 a step, and
    twice the micro-batch dropped all but the first, the step's work with them): each forward's first
    launch does. Fetched each before its forward, the fetches still mark them (Megatron-LM's loop); a
    micro-batch the trace kept no GPU activity of is counted on the host all the same."""
    for prefetch in (True, False):
        t = timeline(_host(prefetch))
        assert t is not None and t.microbatches == 4
        starts = [i for i, e in enumerate(t.events) if e.flags & _MB_START]
        assert starts == [1, 7, 13, 19], prefetch
        # as traced: the last micro-batch ends at 79 ms (9 ms of kernels from 70 ms); half the micro-batches
        # at twice the rows (the replay's lo end: 2×): the second, of 18 ms, from 30 ms
        assert simulate(t, 1.0) == pytest.approx(79.0 - 0.1, abs=0.1)
        assert simulate(t, 1.0, frozenset({Change.MICROBATCH})) == pytest.approx(48.0 - 0.1, abs=0.2)
    lost = timeline(_host(True, lost=True))
    assert lost is not None and lost.microbatches == 4


def test_fewer_larger_micro_batches_in_nanogpt(nanogpt: StepBudget) -> None:
    """Reading of the complete step: the GPU idles 4.58 ms in 2619 gaps under 1 ms, 3.96 ms of it in gaps
    under 5 µs (one a kernel) and 0.33 ms in the optimizer phase's 35; autograd's AccumulateGrad runs 225
    CUDAFunctor_add<float> kernels (75 parameters × micro-batches 2-4), 1.45 ms. Twice the micro-batch
    absorbs 2 of 4: half the under-5 µs gaps (1.98 ms), 0.7-0.85 of the other forward-backward ones
    (~0.29 ms: 0.20-0.25), half to two thirds of the adds (0.72-0.96): 2.9-3.2 ms, ± 0.66 → 2.25-3.86.
    The memory it needs is said as a factor of the activations (no memory in the trace)."""
    mb = _fitted(nanogpt)[RemedyId.MICRO_BATCH]
    assert mb.gain is not None and mb.replay is None  # the replay cannot reach nanoGPT's clock
    assert _near(mb.gain.low_ms, 2.25, 0.3) and _near(mb.gain.high_ms, 3.86, 0.3)
    assert mb.action.code is Say.MICRO_BATCH_TORCH and mb.action.args[:2] == (4, 2)
    assert mb.cost is not None and mb.cost.code is Say.ACTIVATION_MEMORY and mb.cost.args == (2.0,)
    assert mb.effort is Effort.CODE


def test_fewer_larger_micro_batches_in_the_trainer_loop(llama: StepBudget) -> None:
    """Reading: the host sets the pace. Each traced step (432 and 412 ms) fetches its 4 batches first
    (31 ms), then runs 4 micro-batches of ~97 ms of host work for ~42 ms of kernels each (168 ms of 8089
    kernels a step), and 6-7 ms of optimizer. On the job's own 293 ms (its host ~0.69× the profiled one),
    a micro-batch is ~67 ms of host; twice the rows make ~84 ms of kernels: 2 such micro-batches, the
    fetch and the optimizer, ~194 ms, a gain of ~100 ms (90-110 for the host's share of the fetch and
    the optimizer). It cannot pass 293 − 160 (the kernels at 0.95-1.0× of twice the rows): 133 ms."""
    mb = _fitted(llama)[RemedyId.MICRO_BATCH]
    assert mb.gain is not None and mb.replay is Change.MICROBATCH
    assert mb.gain.low_ms <= 110 and mb.gain.high_ms >= 90
    assert 80 <= mb.gain.low_ms and mb.gain.high_ms <= 133


def test_one_micro_batch_a_step_gets_no_micro_batch_remedy(nanogpt: StepBudget) -> None:
    """The remedy removes what each micro-batch after the first pays: with one a step (or a count the
    trace does not show, or an odd one) there is nothing to absorb."""
    assert nanogpt.replay is not None
    for m in (1, None, 3):
        b = dataclasses.replace(nanogpt, replay=dataclasses.replace(nanogpt.replay, microbatches=m))
        assert RemedyId.MICRO_BATCH not in _fitted(b), m


def test_the_fused_linear_cross_entropy_in_nanogpt(nanogpt: StepBudget) -> None:
    """Reading: the loss's kernels 9.80 ms (above), and 4 FillFunctor<c10::BFloat16> kernels of 0.485 ms
    under CompiledFunctionBackward, 1.94 ms: the zero gradient of the logits the model returns (16×1024×
    50304 bf16, 1.65 GB each). The fused loss saves 0-50% of the first and all of the second (× 0.88-
    1.12): 1.71-7.07 ms, ± 0.66 → 1.05-7.73. An install, either package."""
    ce = _fitted(nanogpt)[RemedyId.CE_FUSION]
    assert ce.gain is not None and _near(ce.gain.low_ms, 1.05, 0.15) and _near(ce.gain.high_ms, 7.73, 0.3)
    assert ce.action.code is Say.FUSED_LINEAR_CE and ce.effort is Effort.INSTALL
    assert ce.needs_one and set(ce.installs) == {"liger_kernel", "cut_cross_entropy"} and not ce.needs
    assert {r.atom for r in ce.removes} == {"loss:passes", "logits:zero_grad"}


def test_returning_only_the_loss_in_nanogpt(nanogpt: StepBudget) -> None:
    """Reading: the 1.94 ms of zero fill above, gone (× 0.88-1.12): 1.71-2.17 ms, ± 0.66 → 1.05-2.83. It
    shares its atom with the fused loss: a plan counts that time once."""
    lo = _fitted(nanogpt)[RemedyId.LOSS_ONLY]
    assert lo.gain is not None and _near(lo.gain.low_ms, 1.05, 0.15) and _near(lo.gain.high_ms, 2.83, 0.15)
    assert [r.atom for r in lo.removes] == ["logits:zero_grad"] and lo.effort is Effort.CODE


def test_no_loss_remedy_where_the_trace_does_not_show_its_cost(llama: StepBudget) -> None:
    """The eager Llama's loss: cunn_SoftMaxForward 4 × 0.37 ms, cunn_SoftMaxBackward 4 × 0.52 ms, NLL's
    fill of its gradient 4 × 0.11 ms and its two reductions 0.12 ms: 4.13 ms, under 1% of the traced
    422 ms (th.BUDGET_PART_NAMED): no fused loss. Eager autograd fills no gradient for the logits the
    model returns (no CompiledFunctionBackward): nothing to return only the loss for."""
    got = _fitted(llama)
    assert _near(llama.ms(Part.LOSS), 4.13, 0.05)
    assert RemedyId.CE_FUSION not in got and RemedyId.LOSS_ONLY not in got


def test_cuda_graphs_for_the_compiled_job_with_a_thin_host_margin(nanogpt: StepBudget) -> None:
    """Reading: each compiled forward holds the host 8.1 ms for ~10.5 ms of its kernels, and the GPU is
    busy 126.0 of the complete step's 132.3 ms: the host keeps ahead by little (the replay's timeline:
    94 ms of host work a step for 108 ms of kernels, 87%). Its forward-backward launch gaps are 4.25 ms
    (4.58 less the optimizer phase's 0.33), under the 15% of the step uncompiled graphs ask; graphed,
    30-80% of them come back, less up to 1% of the step (1.32 ms) for the batch's copies: -0.05-3.40 ms,
    ± 0.66 → -0.71-4.06, not promised (measure it)."""
    g = _fitted(nanogpt)[RemedyId.CUDA_GRAPHS]
    assert g.action.code is Say.GRAPHS_COMPILED and g.gain is not None and not g.gain.promised
    assert _near(g.gain.low_ms, -0.71, 0.2) and _near(g.gain.high_ms, 4.06, 0.2)
    assert g.gain.basis.args[0].code is Say.GRAPHS_THIN_BASIS  # type: ignore[union-attr]
    # a host with room to spare (half the work) gets none: its stalls hide in the GPU's queue
    assert nanogpt.replay is not None
    roomy = dataclasses.replace(nanogpt, replay=dataclasses.replace(nanogpt.replay, host_ms=47.0))
    assert RemedyId.CUDA_GRAPHS not in _fitted(roomy)


def test_the_uncompiled_job_keeps_its_cuda_graphs_words(llama: StepBudget) -> None:
    """The eager Llama's launch gaps (48% of the step) pay for graphs as before: torch.compile with
    mode="reduce-overhead", its gain from those gaps (198 ms × 0.3-0.8, less 5% of the step)."""
    g = _fitted(llama)[RemedyId.CUDA_GRAPHS]
    assert g.action.code is Say.GRAPHS_COMPILE and g.gain is not None
    assert _near(g.gain.low_ms, 198.5 * 0.3 - 0.05 * 422.2 - SPREAD * 422.2, 1.0)
