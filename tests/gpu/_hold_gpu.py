"""A stand-in rank for tests/gpu/verify_rank_attribution.py: holds GPU memory for a while.
Ranks go round-robin over the visible GPUs (both on GPU 0 on a one-GPU machine)."""

import os
import time

import torch

if __name__ == "__main__":
    dev = int(os.environ["RANK"]) % torch.cuda.device_count()
    x = torch.empty(512 * 2**20, dtype=torch.uint8, device=f"cuda:{dev}")
    torch.cuda.synchronize()
    time.sleep(float(os.environ.get("HOLD_S", "25")))
