"""A training loop under perfd's step hook that runs anywhere: no GPU, no torch, no data.

The loop is the README's, with sleeps standing in for the work: the loader takes ~5 ms a batch and
the step (forward, backward, optimizer) ~30 ms; every 50th step waits 60 ms more for its batch.
Run it beside an agent (``perfd agent --job J``) or under ``perfd launch --job J -- python3
examples/train_loop.py``; the hook sends each step to the agent on this machine and never blocks or
raises in the loop, with or without an agent listening.

    python3 examples/train_loop.py [--steps N]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator

from perfd.hook import StepHook


def batches(n: int) -> Iterator[int]:
    for i in range(1, n + 1):
        time.sleep(0.065 if i % 50 == 0 else 0.005)  # reading and collating a batch
        yield i


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="steps to run (default: %(default)s)")
    args = ap.parse_args(argv)
    # 8 sequences of 1,024 tokens a step. A real job also gives flops_per_step, or model={...} (the
    # model's shape), and its dtype: perfd's MFU on a GPU. Without CUDA the job is reported as a CPU one.
    hook = StepHook(tokens_per_step=8 * 1024)
    for i, _batch in enumerate(hook.loader(batches(args.steps)), 1):
        with hook.step(step=i):
            time.sleep(0.030)  # forward, backward, optimizer step
    hook.close(timeout_s=2.0)
    print(f"train_loop: {args.steps} steps done")


if __name__ == "__main__":
    main()
