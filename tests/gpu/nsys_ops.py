"""On 1 GPU: one small training loop (a decoder block stack with eager attention: QKᵀ, causal mask fill,
softmax, dropout, ·V; a GELU MLP; layer norms; cross-entropy over a 32k vocabulary; AdamW) whose steps
are captured by nsys and by Kineto, so that perfd's op attribution of the two tools can be compared.

    nsys profile -t cuda,nvtx -c cudaProfilerApi --capture-range-end=stop -o OUT/loop \\
        python3 tests/gpu/nsys_ops.py --nsys            # steps 6-8 in a cudaProfilerApi range, emit_nvtx on
    python3 tests/gpu/nsys_ops.py --kineto OUT/loop_kineto.json   # steps 6-8 under torch.profiler

``--prune SQLITE OUT``: keep only the tables perfd reads (kernels, copies, sets, NVTX, the runtime API,
strings) so the export is small enough to keep as test data.
"""

from __future__ import annotations

import argparse
import math
import sqlite3
import sys

KEEP = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
        "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME", "StringIds")


def prune(src: str, dst: str) -> None:
    con = sqlite3.connect(dst)
    con.execute(f"ATTACH DATABASE '{src}' AS s")
    names = {r[0] for r in con.execute("SELECT name FROM s.sqlite_master WHERE type='table'")}
    for t in KEEP:
        if t in names:
            con.execute(f"CREATE TABLE {t} AS SELECT * FROM s.{t}")
    con.commit()
    con.execute("DETACH DATABASE s")
    con.execute("VACUUM")
    con.close()


def loop(mode: str, out: str | None) -> None:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    d, heads, seq, batch, layers, vocab = 1024, 16, 1024, 8, 4, 32000

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.drop = nn.Dropout(0.1)

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d // heads)
            scores = scores.masked_fill(mask, float("-inf"))
            probs = self.drop(torch.softmax(scores, dim=-1))
            a = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, d)
            x = x + self.proj(a)
            out: torch.Tensor = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
            return out

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.out = nn.Linear(d, vocab, bias=False)

        def forward(self, tok: torch.Tensor) -> torch.Tensor:
            mask = torch.triu(torch.ones(tok.shape[1], tok.shape[1], dtype=torch.bool, device=tok.device), 1)
            x = self.emb(tok)
            for blk in self.blocks:
                x = blk(x, mask)
            logits: torch.Tensor = self.out(x)
            return logits

    torch.manual_seed(0)
    model = Model().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tok = torch.randint(0, vocab, (batch, seq), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tok)
        loss = F.cross_entropy(logits.float().view(-1, vocab), tok.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    if mode == "nsys":
        torch.cuda.profiler.start()
        with torch.autograd.profiler.emit_nvtx():
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    else:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        assert out is not None
        prof.export_chrome_trace(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--nsys", action="store_true")
    g.add_argument("--kineto", metavar="OUT")
    g.add_argument("--prune", nargs=2, metavar=("SQLITE", "OUT"))
    a = ap.parse_args()
    if a.prune:
        prune(*a.prune)
    else:
        loop("nsys" if a.nsys else "kineto", a.kineto)
    return 0


if __name__ == "__main__":
    sys.exit(main())
