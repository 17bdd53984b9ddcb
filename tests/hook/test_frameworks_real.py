"""The Hugging Face Trainer and Lightning callbacks on the real frameworks, CPU, tiny models built
from a config (no weights downloaded): each run's step records go through the agent's hook collector
into the aggregator's job store, whose analysis has the data share (the loader sleeps a known time
per batch) and the MFU (FLOPs counted by perfd's formula from the model's shape and the step's
tokens, peak given: a CPU has no row in the peak table).

Both frameworks fetch a step's batch before the callback opens it: the step time must be the step's
period (the loop's own clock: a callback of the test, beside perfd's, stamping each optimizer step's
end) and the data wait the fetch between the steps (the dataset's own clock of its items), each
within 3 points of the step."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator.jobs import JobStore
from perfd.analytics.breakdown import bottleneck as bn
from perfd.analytics.steps.flops import megatron_flops
from perfd.analytics.steps.provenance import Code
from perfd.collectors.collector import Collected
from perfd.collectors.hook import HookCollector
from perfd.core.model import (
    HOOK_DATA_WAIT_FROM_FIELD,
    HOOK_IN_STEP_FIELD,
    HOOK_OUTSIDE,
    HOOK_STEP_IN_STEP,
    HOOK_STEP_PERIOD,
    HOOK_STEP_TIME_FIELD,
    ModelSpec,
)
from perfd.report import build_report
from tests.torch_tests import needs_torch

STEPS = 12
BATCH, SEQ, VOCAB = 4, 32, 128
ITEM_SLEEP_S = 0.02  # the data wait, per item: 80 ms a step, well above a loaded machine's noise
PEAK = 0.1  # TFLOP/s: the test's "GPU"
# GPT-2 shape (GELU MLP of 4h, MHA, tied embeddings: one logit GEMM) in perfd's ModelSpec fields.
SPEC = {"num_layers": 2, "hidden_size": 32, "ffn_hidden_size": 128, "num_attention_heads": 2,
        "kv_channels": 16, "seq_length": SEQ, "padded_vocab_size": VOCAB}
FLOPS = megatron_flops(ModelSpec(**SPEC), BATCH, framework="pytorch").flops_per_iteration  # type: ignore[arg-type]

pytestmark = [pytest.mark.slow, needs_torch]  # real frameworks: a few seconds each


def _slow_tokens(n: int = BATCH * STEPS * 2, sleep_s: float = ITEM_SLEEP_S) -> Any:
    """A slow dataset that keeps its own clock (``.items``: each item's (start, end), perf_counter
    seconds); its class made here, not at the module's level: collecting the module imports no torch."""
    import torch

    class SlowTokens(torch.utils.data.Dataset[dict[str, Any]]):
        def __init__(self) -> None:
            self.items: list[tuple[float, float]] = []

        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int) -> dict[str, Any]:
            t0 = time.perf_counter()
            time.sleep(sleep_s)
            ids = torch.randint(0, VOCAB, (SEQ,), generator=torch.Generator().manual_seed(i))
            self.items.append((t0, time.perf_counter()))
            return {"input_ids": ids, "labels": ids.clone()}

    return SlowTokens()


EVAL_EVERY = 5  # an evaluation after steps 5 and 10: two batches of slow items
EVAL_SLEEP_S = 0.03  # per evaluation item: an evaluation's 0.24 s stands out of a loaded machine's noise


def truth(ends: list[float], items: list[tuple[float, float]],
          evals: list[tuple[float, float]]) -> dict[int, tuple[float, float, float]]:
    """The loop's own clock: step n's period (ms) from step n-1's end to its own, the time its
    training dataset spent making items in that period (ms), and its evaluation items' (ms)."""
    out = {}
    for n in range(2, len(ends) + 1):
        a, b = ends[n - 2], ends[n - 1]
        out[n] = ((b - a) * 1e3, sum(e - s for s, e in items if a <= s and e <= b) * 1e3,
                  sum(e - s for s, e in evals if a <= s and e <= b) * 1e3)
    return out


def _gpt2_config() -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=SEQ,
                                   n_inner=128)


def _gpt2() -> Any:
    import torch

    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(_gpt2_config())


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[HookCollector]:
    c = HookCollector({"socket_path": str(tmp_path / "hook.sock"), "job": "j"})
    c.start()
    yield c
    c.stop()


def _hook_kwargs(c: HookCollector, model: Any = None) -> dict[str, Any]:
    return {"socket_path": c.config.socket_path, "cuda": False, "warmup_steps": 2, "flush_interval_s": 0.05,
            "tokens_per_step": BATCH * SEQ, "model": SPEC if model is None else model, "dtype": "fp32"}


def _to_aggregator(c: HookCollector) -> Any:
    out = Collected()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(out.steps) < STEPS:
        got = c.collect(time.time())
        out.steps += got.steps
        out.job_info.update(got.job_info)
        time.sleep(0.01)
    assert sorted(r.iteration for r in out.steps) == list(range(1, STEPS + 1))
    for r in out.steps:  # the record says what its step time is, and keeps the time inside the step
        assert r.fields[HOOK_STEP_TIME_FIELD] == (HOOK_STEP_IN_STEP if r.iteration == 1 else HOOK_STEP_PERIOD)
        assert r.fields[HOOK_DATA_WAIT_FROM_FIELD] == "fetch"  # torch's DataLoader, stamped
        if r.iteration > 1:
            assert float(r.fields[HOOK_IN_STEP_FIELD]) < (r.step_time_ms or 0)
            assert HOOK_OUTSIDE in r.timers
    store = JobStore(min_recompute_s=0.0, peak_tflops=PEAK)
    for job, info in out.job_info.items():
        store.ingest_job_info("agent", job, info)
    store.ingest_steps("agent", out.steps)
    a = store.analysis("j", force=True)
    assert a is not None
    return a


def _check(a: Any, own: dict[int, tuple[float, float, float]], trainer: tuple[str, str, str],
           saves: bool = False) -> None:
    """``trainer``: the framework the job's info names (the callback's mark), its version, and what the
    report's data-loading recommendation names of its data loader (in the trainer's terms)."""
    # The evaluations between steps are announced (the callbacks' hook.phase): their time is not the
    # next step's, and goodput counts it as evaluation.
    evaluated = [n for n, (_, _, ev) in own.items() if ev > 0]
    assert evaluated == [EVAL_EVERY + 1, 2 * EVAL_EVERY + 1]
    rows_by = {r.iteration: r for r in a.iterations}
    for n in evaluated:
        period, fetched, ev = own[n]
        assert rows_by[n].step_time_ms < period - 0.9 * ev  # the evaluation left the step's period
        assert rows_by[n].data_share * rows_by[n].step_time_ms < fetched + 0.5 * ev  # and its fetches
    gp = a.summary.to_json()["goodput"]["parts_s"]
    assert gp["evaluation"] >= 0.9 * sum(own[n][2] for n in evaluated) / 1e3
    assert (gp["checkpoint"] > 0) is saves  # the Trainer's checkpoint saves, announced the same way
    rows = [r for r in a.iterations if r.iteration > 2 and r.iteration not in evaluated]  # after warm-up
    assert (a.job.framework, a.job.framework_version) == trainer[:2] and a.job.layout.world_size == 1
    assert a.job.gpu.dtype == "fp32"
    for r in rows:
        # Data share: the fetch of BATCH items sleeping ITEM_SLEEP_S each, the dataset's own clock.
        assert r.data_share is not None and r.sources["data_share"].code is Code.TIMER_SHARE
        assert r.sources["data_share"].args[:2] == ("hook", "data-wait")
        assert r.data_share * r.step_time_ms >= BATCH * ITEM_SLEEP_S * 1e3 * 0.99
        assert r.mfu == pytest.approx(FLOPS / (r.step_time_ms / 1e3 * 1e12) / PEAK, rel=1e-9)
    # Over the run (the steps after warm-up), the step time is the period (the fetch between the steps
    # included) and the data wait the fetch, within 3 points of the loop's clock. (Not step by step:
    # the loop's stamp and the hook's lie two calls apart, and on a loaded 2-core machine a process is
    # put off the CPU between them for up to 20 ms, seen.)
    total = sum(own[r.iteration][0] for r in rows)
    assert sum(r.step_time_ms for r in rows) == pytest.approx(total, rel=0.03)
    share = sum(own[r.iteration][1] for r in rows) / total
    assert sum(r.data_share * r.step_time_ms for r in rows) / total == pytest.approx(share, abs=0.03)
    report = build_report(a)
    assert "None" not in report.summary.headline
    # The data-loading recommendation follows the job's measured data share (checked against the loop's
    # clock above), not the machine's speed: 80 ms of fetch a step is most of a quiet machine's step and
    # under 10% of one that a loaded machine slowed ten times (seen in CI, load 11 on 2 cores).
    recs = [r for r in report.recommendations if r.finding_id == "data-loading"]
    median_share = a.summary.medians.get("data_share")
    assert median_share is not None
    assert len(recs) == (1 if median_share > bn.DATA_HEALTHY_SHARE else 0), median_share
    for data in recs:
        assert trainer[2] in data.detail and "Megatron" not in data.detail



def test_hf_trainer_callback(collector: HookCollector, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from perfd.hook.hf import hf_callback

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=STEPS, per_device_train_batch_size=BATCH,
        report_to=[], use_cpu=True, logging_strategy="no", dataloader_num_workers=0, disable_tqdm=True,
        eval_strategy="steps", eval_steps=EVAL_EVERY, per_device_eval_batch_size=BATCH,
        save_strategy="steps", save_steps=EVAL_EVERY)
    ends: list[float] = []

    class Clock(transformers.TrainerCallback):  # type: ignore[misc,name-defined]
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            ends.append(time.perf_counter())

    data, evals = _slow_tokens(), _slow_tokens(2 * BATCH, EVAL_SLEEP_S)
    # The model's Hugging Face config as it is (its sequence length beside it): the same FLOPs as SPEC.
    model = {**_gpt2_config().to_dict(), "seq_length": SEQ}
    trainer = transformers.Trainer(model=_gpt2(), args=args, train_dataset=data, eval_dataset=evals,
                                   callbacks=[hf_callback(**_hook_kwargs(collector, model)), Clock()])
    trainer.train()
    assert len(ends) == STEPS
    _check(_to_aggregator(collector), truth(ends, data.items, evals.items),
           ("hf_trainer", transformers.__version__, "--dataloader_num_workers N"), saves=True)


def test_lightning_callback(collector: HookCollector) -> None:
    import torch

    pl = pytest.importorskip("lightning.pytorch")
    from perfd.hook.lightning import lightning_callback

    class Module(pl.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.model = _gpt2()

        def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
            return self.model(**batch).loss

        def validation_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
            return self.model(**batch).loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    ends: list[float] = []

    class Clock(pl.Callback):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            self.at = 0

        def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
            if trainer.global_step > self.at:
                self.at = trainer.global_step
                ends.append(time.perf_counter())

    data, evals = _slow_tokens(), _slow_tokens(2 * BATCH, EVAL_SLEEP_S)
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, num_workers=0)
    val = torch.utils.data.DataLoader(evals, batch_size=BATCH, num_workers=0)
    trainer = pl.Trainer(max_steps=STEPS, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         val_check_interval=EVAL_EVERY, num_sanity_val_steps=1,
                         callbacks=[lightning_callback(**_hook_kwargs(collector)), Clock()])
    trainer.fit(Module(), loader, val)
    assert len(ends) == STEPS
    sanity = evals.items[:BATCH]  # the sanity check's batch, before the first step
    _check(_to_aggregator(collector), truth(ends, data.items, evals.items[len(sanity):]),
           ("lightning", pl.__version__, "train_dataloader()"))
