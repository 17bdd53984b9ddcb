
import json, os, sys, time
import torch, torch.distributed as dist
from perfd.hook import StepHook

STEPS, SLOW_FIRST, SLOW_LAST = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
OUT = sys.argv[4]
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
L, H, HEADS, B, S = 8, 2048, 16, 8, 1024
layer = torch.nn.TransformerEncoderLayer(H, HEADS, dim_feedforward=4 * H, dropout=0.0, batch_first=True)
model = torch.nn.TransformerEncoder(layer, num_layers=L).cuda().to(torch.bfloat16)
model = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
tokens = B * S * dist.get_world_size()
# Model FLOPs per step (forward 2 per MAC, backward twice the forward): per token and layer the
# QKV and output projections 4h^2 MACs, the MLP 8h^2, attention scores and values 2*s*h.
flops = 3 * 2 * tokens * L * (12 * H * H + 2 * S * H)
hook = StepHook(tokens_per_step=tokens, flops_per_step=flops, warmup_steps=5, dtype="bf16")
x = torch.randn(B, S, H, device="cuda", dtype=torch.bfloat16)

def batch(i):
    # The input pipeline: ~10% of a step normally, ~3 steps' worth in the slow stretch.
    time.sleep(0.300 if SLOW_FIRST <= i <= SLOW_LAST else 0.010)
    return x

own = {}
for i in range(1, STEPS + 1):
    t0 = time.perf_counter()
    hook.step_begin(i)
    b = batch(i)
    t1 = time.perf_counter()
    hook.data_ready()
    loss = model(b).float().square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    hook.step_end()
    torch.cuda.synchronize()  # the job's own clock: the step ends when its GPU work does
    own[i] = {"step_ms": (time.perf_counter() - t0) * 1e3, "wait_ms": (t1 - t0) * 1e3}
hook.close(timeout_s=5.0)
if rank == 0:
    json.dump({"flops_per_step": flops, "tokens_per_step": tokens, "steps": own}, open(OUT, "w"))
dist.destroy_process_group()
