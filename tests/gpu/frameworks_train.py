"""The training jobs of tests/gpu/frameworks_live.py, one per kind, as their users write them.

    python3 frameworks_train.py PARAMS_JSON

PARAMS_JSON: {"kind": "readme" | "loader" | "incident" | "hf" | "lightning", "own": path of the loop's
own clock (written at the end), "record": path of the hook's datagram stream, "run_s", "sample_s",
"batch", "seq", "cpu": true for CPU torch, and the model's sizes; "slow_at", "slow_s", "slow_x" for
"incident"}.

Every kind reads its batches from a ``torch.utils.data.DataLoader`` with two worker processes whose
samples each take ``sample_s`` (I/O latency: a sleep); "incident" makes them ``slow_x`` times slower
from ``slow_at`` s for ``slow_s`` s (by the wall clock the forked workers share), and each batch says
whether a sample of it was made in the slow phase. The loop's own clock, independent of perfd: per
step, when the fetch began and ended (the loop's ``next()``; the Trainer's ``get_batch_samples``; the
iterable Lightning is given) and when the step ended after a device sync.

Everything the step hook sends is also written, datagram by datagram, to ``record`` (JSON lines: the
wall time and the bytes in base64): the CPU suite replays it through the agent's hook collector.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import threading
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

P: dict[str, Any] = json.loads(sys.argv[1])
T0 = time.time()
CUDA = torch.cuda.is_available() and not P.get("cpu")
DEV = "cuda" if CUDA else "cpu"
DTYPE = "bf16" if CUDA else "fp32"
B, S = int(P["batch"]), int(P["seq"])
V, H, L, HEADS = int(P["vocab"]), int(P["hidden"]), int(P["layers"]), int(P["heads"])
if not CUDA:
    torch.set_num_threads(1)  # the CPU smoke: one thread keeps a shared machine's compute steady


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def tee(hook: Any) -> Any:
    """Write every datagram the hook sends to P["record"] as well (the recording the CPU suite
    replays); the hook's own sending is unchanged."""
    out = open(P["record"], "w", encoding="utf-8")
    lock = threading.Lock()
    send = hook.sender.send

    def recorded(data: bytes, *args: Any, **kwargs: Any) -> bool:
        with lock:
            out.write(json.dumps({"t": time.time(), "d": base64.b64encode(bytes(data)).decode()}) + "\n")
            out.flush()
        return bool(send(data, *args, **kwargs))

    hook.sender.send = recorded
    return hook


class Samples(Dataset):  # type: ignore[type-arg]
    """Samples that take sample_s each to arrive (slow_x times that in the slow phase)."""

    def __init__(self, as_dict: bool = False) -> None:
        self.as_dict = as_dict
        at = float(P.get("slow_at") or 0)
        self.slow_from, self.slow_to = T0 + at, T0 + at + float(P.get("slow_s") or 0)

    def __len__(self) -> int:
        return 10**7

    def __getitem__(self, i: int) -> Any:
        slow = self.slow_from <= time.time() < self.slow_to
        time.sleep(float(P["sample_s"]) * (float(P.get("slow_x") or 1) if slow else 1.0))
        ids = torch.randint(0, V, (S + 1,), generator=torch.Generator().manual_seed(i))
        if self.as_dict:
            return {"input_ids": ids[:S], "labels": ids[:S].clone()}
        return ids, slow


def loader(as_dict: bool = False) -> DataLoader:  # type: ignore[type-arg]
    return DataLoader(Samples(as_dict), batch_size=B, num_workers=2, persistent_workers=True, pin_memory=CUDA)


class GPT(torch.nn.Module):
    """A GPT-like decoder stack: embedding, pre-norm causal layers, LM head."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(V, H)
        layer = torch.nn.TransformerEncoderLayer(H, HEADS, 4 * H, dropout=0.0, batch_first=True,
                                                   norm_first=True)
        self.body = torch.nn.TransformerEncoder(layer, L, enable_nested_tensor=False)
        self.head = torch.nn.Linear(H, V, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        return self.head(self.body(self.emb(x), mask=mask, is_causal=True))  # type: ignore[no-any-return]


def gpt_flops(model: torch.nn.Module) -> float:
    """The loop's own count of a step's model FLOPs: 6 × matmul parameters × tokens, plus attention's
    scores and context (4·s·h per token and layer forward, ×3 with backward, no causal halving)."""
    p = sum(q.numel() for n, q in model.named_parameters() if not n.startswith("emb.") and q.dim() == 2)
    return float(6 * p * B * S + 12 * L * S * H * B * S)


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, toks: torch.Tensor) -> None:
    with torch.autocast(DEV, dtype=torch.bfloat16, enabled=CUDA):
        logits = model(toks[:, :-1])
    loss = F.cross_entropy(logits.float().reshape(-1, V), toks[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def write_own(fetches: list[tuple[float, float]], ends: list[float], slow: list[int] | None = None,
              **extra: Any) -> None:
    """The loop's own clock: every fetch (start, end) and every step's end (after a device sync), in
    perf_counter seconds; for "incident", whether each step's batch was made in the slow phase."""
    with open(P["own"], "w", encoding="utf-8") as f:
        json.dump({"params": P, "pid": os.getpid(), "device": DEV, "fetches": fetches, "ends": ends,
                   "slow": slow, **extra}, f)


def plain(kind: str) -> None:
    """The README's loop: the batch fetched before its step, ``hook.step`` around the step (with
    ``hook.loader`` for "loader")."""
    from perfd.hook import StepHook

    model = GPT().to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=CUDA)
    flops = gpt_flops(model)
    hook = tee(StepHook(tokens_per_step=B * S, flops_per_step=flops, dtype=DTYPE, warmup_steps=5))
    batches = hook.loader(loader()) if kind == "loader" else loader()
    it = iter(batches)  # what `for i, (toks, slow) in enumerate(batches, 1)` does, its next() timed
    fetches: list[tuple[float, float]] = []
    ends: list[float] = []
    flags: list[int] = []
    i = 0
    while time.time() - T0 < float(P["run_s"]):
        i += 1
        tf = time.perf_counter()
        toks, slow = next(it)
        fetches.append((tf, time.perf_counter()))
        with hook.step(step=i):
            train_step(model, opt, toks.to(DEV, non_blocking=True))
        sync()  # the loop's own clock: a step ends when the device is done
        ends.append(time.perf_counter())
        flags.append(int(bool(slow.any())))
    hook.close(timeout_s=2.0)
    write_own(fetches, ends, flags, flops_per_step=flops)


def hf() -> None:
    """A Hugging Face Trainer on a small Llama built from its config (no weights downloaded), the
    perfd callback given the config as it is: ``model={**config.to_dict(), "seq_length": S}``."""
    import transformers

    from perfd.hook.hf import hf_callback

    cfg = transformers.LlamaConfig(hidden_size=H, intermediate_size=int(P["ffn"]), num_hidden_layers=L,
                                   num_attention_heads=HEADS, num_key_value_heads=int(P["kv_heads"]),
                                   vocab_size=V, max_position_embeddings=S)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    fetches: list[tuple[float, float]] = []
    ends: list[float] = []

    class Timed(transformers.Trainer):
        def get_batch_samples(self, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            got = super().get_batch_samples(*args, **kwargs)
            fetches.append((t0, time.perf_counter()))
            return got

    class Clock(transformers.TrainerCallback):
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            sync()
            ends.append(time.perf_counter())

    cb = hf_callback(tokens_per_step=B * S, model={**cfg.to_dict(), "seq_length": S}, dtype=DTYPE,
                     warmup_steps=5)
    tee(cb.hook)
    steps = max(20, int(float(P["run_s"]) / (B * float(P["sample_s"]) / 2)))
    args = transformers.TrainingArguments(
        output_dir=os.path.join(os.path.dirname(P["own"]), "hf_out"), max_steps=steps,
        per_device_train_batch_size=B, bf16=CUDA, use_cpu=not CUDA, dataloader_num_workers=2,
        dataloader_persistent_workers=True, report_to=[], save_strategy="no", logging_strategy="steps",
        logging_steps=25, disable_tqdm=True)
    Timed(model=model, args=args, train_dataset=Samples(as_dict=True), callbacks=[cb, Clock()]).train()
    # The loop's own FLOPs count, independent of perfd's formula: 6 × the model's GEMM weights (its
    # Linear layers, the logit layer included) × tokens, plus the causal attention (6·s·q·L a token).
    gemm = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    q = HEADS * int(getattr(cfg, "head_dim", None) or H // HEADS)
    reference = float(6 * gemm * B * S + 6 * S * q * L * B * S)
    write_own(fetches, ends, hf_config=cfg.to_dict(), reference_flops=reference)


def lightning() -> None:
    """A Lightning module (the GPT stack) fit on the DataLoader; perfd's callback beside the loop's
    own clock (a callback that syncs and stamps each optimizer step's end)."""
    import lightning.pytorch as pl

    from perfd.hook.lightning import lightning_callback

    fetches: list[tuple[float, float]] = []
    ends: list[float] = []

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = GPT()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            toks, _ = batch
            logits = self.model(toks[:, :-1])
            return F.cross_entropy(logits.float().reshape(-1, V), toks[:, 1:].reshape(-1))

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    class Timed:
        """The DataLoader, each fetch timed by the loop's own clock."""

        def __init__(self, dl: Any) -> None:
            self.dl = dl

        def __len__(self) -> int:
            return len(self.dl)

        def __iter__(self) -> Any:
            it = iter(self.dl)
            while True:
                t0 = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    return
                fetches.append((t0, time.perf_counter()))
                yield batch

    class Clock(pl.Callback):
        def __init__(self) -> None:
            self.at = 0

        def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
            if trainer.global_step > self.at:
                self.at = trainer.global_step
                sync()
                ends.append(time.perf_counter())

    module = Module()
    flops = gpt_flops(module.model)
    cb = lightning_callback(tokens_per_step=B * S, flops_per_step=flops, dtype=DTYPE, warmup_steps=5)
    tee(cb.hook)
    steps = max(20, int(float(P["run_s"]) / (B * float(P["sample_s"]) / 2)))
    trainer = pl.Trainer(max_steps=steps, accelerator="gpu" if CUDA else "cpu", devices=1,
                         precision="bf16-mixed" if CUDA else "32-true", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[cb, Clock()])
    trainer.fit(module, train_dataloaders=Timed(loader()))
    write_own(fetches, ends, flops_per_step=flops)


if __name__ == "__main__":
    kind = P["kind"]
    if kind in ("readme", "loader", "incident"):
        plain(kind)
    elif kind == "hf":
        hf()
    elif kind == "lightning":
        lightning()
    else:
        raise SystemExit(f"unknown kind {kind!r}")
