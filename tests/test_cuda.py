"""CUDA checks, marker ``cuda``: skipped without a GPU; ``benchmarks/gpu_check.py`` runs them on one
(``pytest -m cuda tests/test_cuda.py``, docs/gpu_check.md).

- ACPO's clip range and loss on CUDA tensors equal the CPU result on the same float32 inputs: eps, per-bin
  statistics, per-token loss, loss and gradient within rtol 1e-5 (atol 1e-6; 1e-7 for the gradient), the clip
  decisions on all but 0.1% of the tokens (a token within float32 rounding of its clip bound may fall either side).
  The per-bin sums are atomic adds on a GPU, in another order than on CPU: equal up to rounding, not bit for bit.
- bf16 autocast against float32: log-probs from an LM head run under ``torch.autocast(bfloat16)`` against the same
  head in float32, then ACPO's clip range and loss on each. Tolerances (bf16 keeps 8 significant bits, so logits
  of size ~3 round by ~0.01): log-probs within 0.1 (0.01 on average), each bin's eps within 0.02, the loss within
  2e-3 (absolute; it is ~0.25), the gradient's cosine to float32 >= 0.999. On CPU the differences seen were at most
  0.05, 0.005, 1.6e-4 and 1 - 1.3e-4.
- A two-update off-policy ACPOTrainer run (one rollout, two optimizer updates) on the tiny model, bf16 autocast where
  the GPU has it (as the recipes train): finite losses, every bin's eps at the base 0.2 in the first update (within
  0.02 under bf16, whose forward passes with and without gradients may round differently), and opened in the second.

The bf16 and trainer checks also run on CPU (unmarked), so that their code cannot rot where CI has no GPU.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from acpo_trl.config import config_defaults

from conftest import trainer_kwargs

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False); "
                                "benchmarks/gpu_check.py runs these on one (docs/gpu_check.md)")
ON_CUDA = [pytest.mark.cuda, needs_cuda]
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=ON_CUDA)]

CONFIG = config_defaults()  # ACPO's defaults (the paper's run)


def spread_inputs(batch: int = 8, length: int = 1024, seed: int = 0):
    """Log-probs spread over every bin, off-policy old log-probs, sequence advantages, a mask with padding."""
    g = torch.Generator().manual_seed(seed)
    logps = torch.nn.functional.logsigmoid(torch.randn(batch, length, generator=g) * 3)
    old_logps = logps + 0.2 * torch.randn(batch, length, generator=g)
    advantages = torch.randn(batch, 1, generator=g)
    mask = (torch.rand(batch, length, generator=g) > 0.1).float()
    return logps, old_logps, advantages, mask


def acpo_on(device: str, logps, old_logps, advantages, mask):
    """ACPO's clip range, its per-token and aggregated loss, and the gradient w.r.t. the log-probs, on ``device``."""
    from acpo_trl.losses import PolicyLossInputs, acpo_clip_range, aggregate_loss, get_policy_loss

    logps, old_logps, advantages, mask = (t.to(device) for t in (logps, old_logps, advantages, mask))
    eps, stats = acpo_clip_range(logps, old_logps, mask)
    leaf = logps.clone().requires_grad_(True)
    out = get_policy_loss("acpo")(PolicyLossInputs(leaf, old_logps, advantages, mask), CONFIG)
    loss = aggregate_loss(out.per_token_loss, mask, "grpo").loss
    loss.backward()
    return SimpleNamespace(eps=eps, stats=stats, per_token=out.per_token_loss.detach(), loss=loss.detach(),
                           grad=leaf.grad, clipped=out.clipped_high | out.clipped_low, metrics=out.metrics)


@pytest.mark.cuda
@needs_cuda
def test_clip_range_and_loss_on_cuda_equal_cpu():
    inputs = spread_inputs()
    cpu, gpu = acpo_on("cpu", *inputs), acpo_on("cuda", *inputs)
    assert gpu.eps.device.type == "cuda" and gpu.loss.device.type == "cuda"
    assert torch.equal(gpu.stats.count.cpu(), cpu.stats.count)
    assert (cpu.stats.count > 0).all(), "every bin should hold tokens"
    for name in ("mean", "std", "eps"):
        torch.testing.assert_close(getattr(gpu.stats, name).cpu(), getattr(cpu.stats, name), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gpu.eps.cpu(), cpu.eps, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gpu.loss.cpu(), cpu.loss, rtol=1e-5, atol=1e-6)
    # A token within rounding of its clip bound may be clipped on one device only; compare the rest exactly.
    same = gpu.clipped.cpu() == cpu.clipped
    assert (~same).sum() <= 1e-3 * same.numel()
    torch.testing.assert_close(gpu.per_token.cpu()[same], cpu.per_token[same], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gpu.grad.cpu()[same], cpu.grad[same], rtol=1e-5, atol=1e-7)
    for name, (num, den) in cpu.metrics.items():
        torch.testing.assert_close(gpu.metrics[name][0].cpu().to(num.dtype), num, rtol=1e-4, atol=1e-5, msg=name)
        torch.testing.assert_close(gpu.metrics[name][1].cpu().to(den.dtype), den, rtol=1e-4, atol=1e-5, msg=name)


def lm_head_logps(device: str, bf16: bool, seed: int = 0):
    """Log-probs of sampled tokens from a random LM head (hidden 64 -> vocab 16, logits of size ~3, so the sampled
    tokens' probabilities fill every bin), in float32 or under bf16 autocast; and the head's weight (a leaf)."""
    g = torch.Generator().manual_seed(seed)
    batch, length, hidden, vocab = 8, 512, 64, 16
    h = torch.randn(batch, length, hidden, generator=g).to(device)
    weight = (torch.randn(vocab, hidden, generator=g) * 3 / hidden**0.5).to(device).requires_grad_(True)
    with torch.no_grad():
        probs = torch.softmax((h @ weight.T).float(), -1).cpu()
    tokens = torch.multinomial(probs.view(-1, vocab), 1, generator=g).view(batch, length, 1).to(device)
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16):
        logits = h @ weight.T
    logps = torch.log_softmax(logits.float(), -1).gather(-1, tokens).squeeze(-1)
    return logps, weight


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_autocast_matches_float32(device):
    from acpo_trl.losses import PolicyLossInputs, acpo_clip_range, aggregate_loss, get_policy_loss

    g = torch.Generator().manual_seed(1)
    results = {}
    for bf16 in (False, True):
        logps, weight = lm_head_logps(device, bf16)
        if not bf16:
            noise = 0.2 * torch.randn(logps.shape, generator=g)
            old_logps = logps.detach() + noise.to(device)
            advantages = torch.randn(logps.size(0), 1, generator=g).to(device)
            mask = (torch.rand(logps.shape, generator=g) > 0.1).float().to(device)
        eps, stats = acpo_clip_range(logps.detach(), old_logps, mask)
        out = get_policy_loss("acpo")(PolicyLossInputs(logps, old_logps, advantages, mask), CONFIG)
        loss = aggregate_loss(out.per_token_loss, mask, "grpo").loss
        loss.backward()
        results[bf16] = SimpleNamespace(logps=logps.detach(), stats=stats, loss=loss.detach(), grad=weight.grad)
    fp32, bf16 = results[False], results[True]
    assert (fp32.stats.count > 0).all(), "every bin should hold tokens"
    difference = (bf16.logps - fp32.logps).abs()
    assert difference.max() <= 0.1 and difference.mean() <= 0.01
    assert (bf16.stats.eps - fp32.stats.eps).abs().max() <= 0.02
    assert (bf16.loss - fp32.loss).abs() <= 2e-3
    cosine = torch.nn.functional.cosine_similarity(bf16.grad.flatten(), fp32.grad.flatten(), dim=0)
    assert cosine >= 0.999


@pytest.mark.parametrize("device", DEVICES)
def test_two_update_off_policy_trainer_step(device, tmp_path):
    from acpo_trl import ACPOConfig, ACPOTrainer
    from acpo_trl.utils.tiny_models import build_tiny_model
    from acpo_trl.tasks.toy import toy_dataset, toy_reward

    model, tokenizer = build_tiny_model(seed=0)
    bf16 = device == "cuda" and torch.cuda.is_bf16_supported()
    args = ACPOConfig(**trainer_kwargs(tmp_path, use_cpu=device == "cpu", bf16=bf16, steps_per_generation=2,
                                       max_steps=2, learning_rate=5e-2))
    trainer = ACPOTrainer(model, toy_reward, args=args, train_dataset=toy_dataset(8), processing_class=tokenizer)
    trainer.train()

    assert next(trainer.model.parameters()).device.type == device
    logs = [entry for entry in trainer.state.log_history if "policy_loss" in entry]
    assert len(logs) == 2
    assert all(math.isfinite(entry["policy_loss"]) for entry in logs)
    eps = [[entry[f"acpo/bin{b}/eps"] for b in range(5) if entry.get(f"acpo/bin{b}/token_frac")] for entry in logs]
    base_tolerance = 0.02 if bf16 else 1e-3
    assert all(abs(e - 0.2) <= base_tolerance for e in eps[0]), eps[0]  # update 1: r == 1, eps at the base
    assert max(eps[1]) > 0.2 + 2 * base_tolerance + 0.01, eps[1]  # update 2: the policy moved, a range opened
