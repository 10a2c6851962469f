"""Forward + backward CPU time of the ACPO loss against the fixed-clip (ppo_clip) loss on the same tensors.

Both are timed as the trainer calls them: registry function (per-token loss and its metrics) + grpo
aggregation + backward. CPU time (``time.process_time``, robust to other jobs on the machine), one thread by
default, interleaved repeats, median of each, printed side by side with the ratio.

    python benchmarks/loss_overhead.py [--shapes 8x1024 64x4096] [--repeats 31] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
import torch

from acpo_trl.config import config_defaults
from acpo_trl.losses import PolicyLossInputs, aggregate_loss, get_policy_loss

CONFIG = config_defaults()  # ACPO's defaults (the paper's run) and TRL's fixed clip 0.2


def make_tensors(batch: int, length: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, length, generator=g) * 3
    logps = torch.nn.functional.logsigmoid(logits)  # probabilities spread over (0, 1)
    old_logps = logps + 0.1 * torch.randn(batch, length, generator=g)
    advantages = torch.randn(batch, 1, generator=g)
    mask = (torch.rand(batch, length, generator=g) > 0.1).float()
    return logps, old_logps, advantages, mask


def time_loss(name: str, tensors) -> float:
    logps, old_logps, advantages, mask = tensors
    leaf = logps.clone().requires_grad_(True)
    start = time.process_time()
    out = get_policy_loss(name)(PolicyLossInputs(leaf, old_logps, advantages, mask), CONFIG)
    loss = aggregate_loss(out.per_token_loss, mask, "grpo").loss
    loss.backward()
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["8x1024", "16x3072", "64x4096"])
    parser.add_argument("--repeats", type=int, default=31)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), CPU time, median of {args.repeats} interleaved repeats")
    print(f"{'B x T':>10} {'ppo_clip (ms)':>14} {'acpo (ms)':>10} {'ratio':>7}")
    for shape in args.shapes:
        batch, length = (int(x) for x in shape.split("x"))
        tensors = make_tensors(batch, length)
        for name in ("ppo_clip", "acpo"):  # warm-up
            time_loss(name, tensors)
        times = {"ppo_clip": [], "acpo": []}
        for _ in range(args.repeats):
            for name in times:
                times[name].append(time_loss(name, tensors))
        fixed, acpo = statistics.median(times["ppo_clip"]), statistics.median(times["acpo"])
        print(f"{shape:>10} {fixed * 1e3:14.2f} {acpo * 1e3:10.2f} {acpo / fixed:7.2f}x")


if __name__ == "__main__":
    main()
