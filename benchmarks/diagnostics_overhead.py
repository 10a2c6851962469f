"""Cost of the diagnostics (acpo_trl.diagnostics), printed side by side with what they are added to.

1. Ratio statistics (every micro-batch): ``ratio_diagnostics`` (the clip masks come with the loss) against the ACPO loss
   itself (forward + grpo aggregation + backward) on loss-only tensors of several shapes.
2. On the testbed's model size (tiny Qwen2, hidden 128, 2 layers; 64 completions x 40 tokens): one training
   micro-step (forward, ACPO loss, backward) against (a) the ratio statistics, (b) the gradient diagnostics on
   all parameters, (c) on the last block only (``grad_params=[r"layers\\.1\\."]``), (d) (b) without the per-bin
   shares. The gradient diagnostics run every ``grad_every`` steps: the amortised cost is the ratio / N.

CPU time (``time.process_time``), one thread by default, median of interleaved repeats.

    python benchmarks/diagnostics_overhead.py [--shapes 8x1024 64x4096] [--repeats 9] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch

from acpo_trl.diagnostics import gradient_diagnostics, ratio_diagnostics, select_parameters
from acpo_trl.losses import BinClipRule, PolicyLossInputs, aggregate_loss, get_policy_loss
from loss_overhead import CONFIG as LOSS_CONFIG  # benchmarks/ is on sys.path when run as a script
from loss_overhead import make_tensors as tensors  # the same loss-only tensors as the loss benchmark

CONFIG = SimpleNamespace(**vars(LOSS_CONFIG), policy_loss="acpo", loss_type="grpo")


def timed(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def ratio_stats(inputs, masks):
    """The per-micro-batch ratio diagnostics; ``masks`` are the clip masks the loss returned (no extra work)."""
    return ratio_diagnostics(inputs.logps, inputs.old_logps, inputs.mask, inputs.advantages,
                             rule=BinClipRule.from_config(CONFIG), clipped_high=masks[0], clipped_low=masks[1], k=1)


def loss_step(inputs):
    leaf = inputs.logps.detach().clone().requires_grad_(True)
    out = get_policy_loss("acpo")(PolicyLossInputs(leaf, inputs.old_logps, inputs.advantages, inputs.mask), CONFIG)
    aggregate_loss(out.per_token_loss, inputs.mask, "grpo").loss.backward()


def bench(cases: dict, repeats: int) -> dict:
    for fn in cases.values():
        fn()
    times = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            times[name].append(timed(fn))
    return {name: statistics.median(v) * 1e3 for name, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["64x16", "8x1024", "64x4096"])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), CPU ms, median of {args.repeats} interleaved repeats")
    print("\n1. per micro-batch, loss-only tensors")
    print(f"{'B x T':>10} {'acpo loss fwd+bwd':>18} {'ratio stats':>12} {'ratio':>7}")
    for shape in args.shapes:
        b, t = (int(x) for x in shape.split("x"))
        logps, old, adv, mask = tensors(b, t)
        inputs = PolicyLossInputs(logps, old, adv, mask)
        out = get_policy_loss("acpo")(inputs, CONFIG)
        masks = (out.clipped_high, out.clipped_low)
        ms = bench({"loss": lambda: loss_step(inputs), "diag": lambda: ratio_stats(inputs, masks)}, args.repeats)
        print(f"{shape:>10} {ms['loss']:>18.2f} {ms['diag']:>12.2f} {ms['diag'] / ms['loss']:>6.2f}x")

    from acpo_trl.utils.tiny_models import build_tiny_model

    model, _ = build_tiny_model(hidden_size=128)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 250, (64, 40), generator=g)
    mask = torch.ones(64, 16)
    adv = torch.randn(64, 1, generator=g)

    def forward():
        logits = model(input_ids=ids).logits[:, -17:-1]
        return torch.log_softmax(logits.float(), -1).gather(-1, ids[:, -16:].unsqueeze(-1)).squeeze(-1)

    with torch.no_grad():
        old = forward() + 0.05 * torch.randn(64, 16, generator=g)

    def train_step():
        logps = forward()
        out = get_policy_loss("acpo")(PolicyLossInputs(logps, old, adv, mask), CONFIG)
        aggregate_loss(out.per_token_loss, mask, "grpo").loss.backward()
        model.zero_grad(set_to_none=True)

    def grad_diag(patterns, per_group):
        params = [p for _, p in select_parameters(model, patterns)]

        def run():
            logps = forward()
            out = get_policy_loss("acpo")(PolicyLossInputs(logps, old, adv, mask), CONFIG)
            gradient_diagnostics(out.per_token_loss, logps, old, adv, mask, params, per_group=per_group)
        return run

    def forward_loss():
        logps = forward()
        get_policy_loss("acpo")(PolicyLossInputs(logps, old, adv, mask), CONFIG)

    moved = PolicyLossInputs(old + 0.01, old, adv, mask)
    moved_out = get_policy_loss("acpo")(moved, CONFIG)
    cases = {
        "train micro-step": train_step,
        "forward + loss (shared by the grad diag)": forward_loss,
        "ratio stats": lambda: ratio_stats(moved, (moved_out.clipped_high, moved_out.clipped_low)),
        "grad diag, all params, per-bin shares": grad_diag([], True),
        "grad diag, last block only, shares": grad_diag([r"layers\.1\."], True),
        "grad diag, all params, angle only": grad_diag([], False),
    }
    ms = bench(cases, args.repeats)
    base = ms["train micro-step"]
    shared = ms["forward + loss (shared by the grad diag)"]
    n_params = sum(p.numel() for p in model.parameters())
    print(f"\n2. testbed model ({n_params / 1e3:.0f}k parameters), 64 completions x 16 tokens (+24 prompt)")
    print(f"{'':>42} {'CPU ms':>8} {'x step':>7}")
    for name, value in ms.items():
        extra = value - shared if name.startswith("grad diag") else value
        print(f"{name:>42} {extra:>8.1f} {extra / base:>6.2f}x")
    print("(grad diag rows: their own cost beyond the forward + loss the trainer runs anyway; divide by grad_every)")


if __name__ == "__main__":
    main()
