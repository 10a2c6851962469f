"""acpo_clip_range against a slow per-bin reference written from the equations (the README's "ACPO in one equation")."""

from __future__ import annotations

import math

import pytest
import torch

from acpo_trl.losses import acpo_clip_range


def reference_clip_range(logps, old_logps, mask, num_bins, alpha, base, eps_min, eps_max):
    """Loop over tokens and bins, in float64, exactly as the paper states the rule."""
    per_bin = {b: [] for b in range(num_bins)}
    bin_of = {}
    for i in range(logps.shape[0]):
        for t in range(logps.shape[1]):
            p = math.exp(float(logps[i, t]))
            b = min(int(math.floor(num_bins * p)), num_bins - 1)
            bin_of[i, t] = b
            if mask[i, t] > 0:
                log_ratio = max(-20.0, min(20.0, float(logps[i, t]) - float(old_logps[i, t])))
                per_bin[b].append(math.exp(log_ratio))
    eps_bin, std_bin = [], []
    for b in range(num_bins):
        values = per_bin[b]
        if values:
            mean = sum(values) / len(values)
            var = sum((v - mean) ** 2 for v in values) / len(values)
            std = math.sqrt(var + 1e-8)
        else:
            std = 0.0
        std_bin.append(std)
        eps_bin.append(min(max(base + alpha * std, eps_min), eps_max))
    eps = torch.tensor([[eps_bin[bin_of[i, t]] for t in range(logps.shape[1])] for i in range(logps.shape[0])])
    counts = [len(per_bin[b]) for b in range(num_bins)]
    return eps, torch.tensor(std_bin), torch.tensor(eps_bin), torch.tensor(counts, dtype=torch.float64)


def random_batch(seed, batch=6, length=17, spread=0.3, masked_frac=0.3):
    g = torch.Generator().manual_seed(seed)
    probs = torch.rand(batch, length, generator=g) ** 2  # more low-probability tokens, like real rollouts
    logps = probs.clamp(min=1e-6).log()
    old_logps = logps + spread * torch.randn(batch, length, generator=g)
    mask = (torch.rand(batch, length, generator=g) > masked_frac).float()
    mask[0] = 0  # a fully masked row
    return logps, old_logps, mask


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize(
    "params",
    [
        dict(num_bins=5, alpha=3.0, base=0.2, eps_min=0.0, eps_max=3.0),
        dict(num_bins=7, alpha=1.0, base=0.2, eps_min=0.05, eps_max=0.5),
        dict(num_bins=1, alpha=0.5, base=0.1, eps_min=0.0, eps_max=3.0),
    ],
)
def test_matches_slow_reference(seed, params):
    logps, old_logps, mask = random_batch(seed, spread=0.05 + 0.2 * seed)
    eps, stats = acpo_clip_range(logps, old_logps, mask, **params)
    ref_eps, ref_std, ref_eps_bin, ref_count = reference_clip_range(logps, old_logps, mask, **params)
    assert eps.shape == logps.shape
    torch.testing.assert_close(stats.count, ref_count)
    torch.testing.assert_close(stats.std.float(), ref_std.float(), rtol=1e-5, atol=1e-6)
    nonempty = ref_count > 0
    torch.testing.assert_close(stats.eps.float()[nonempty], ref_eps_bin.float()[nonempty], rtol=1e-5, atol=1e-6)
    # Tokens of empty bins are masked out, so compare the tokens that matter.
    valid = mask.bool()
    torch.testing.assert_close(eps[valid], ref_eps.float()[valid], rtol=1e-5, atol=1e-6)


def test_empty_bins_and_masked_tokens_are_finite_and_excluded():
    logps = torch.log(torch.tensor([[0.95, 0.92, 0.05, 0.99]]))
    old_logps = logps + torch.tensor([[0.1, -0.1, 5.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0]])  # the only low-probability token is masked out
    eps, stats = acpo_clip_range(logps, old_logps, mask)
    assert stats.count.tolist() == [0.0, 0.0, 0.0, 0.0, 3.0]
    assert stats.std[:4].tolist() == [0.0] * 4
    assert torch.all(stats.eps[:4] == 0.2)
    assert torch.isfinite(eps).all()
    # The masked token's huge ratio did not widen the top bin.
    r = torch.exp(torch.tensor([0.1, -0.1, 0.0])).double()
    expected_std = math.sqrt(r.var(unbiased=False).item() + 1e-8)
    assert stats.std[4].item() == pytest.approx(expected_std, rel=1e-6)


def test_on_policy_gives_base_everywhere():
    logps, _, mask = random_batch(0)
    eps, stats = acpo_clip_range(logps, logps, mask)
    valid = mask.bool()
    assert torch.allclose(eps[valid], torch.full_like(eps[valid], 0.2 + 3.0 * 1e-4))
    assert (eps[~valid] == 0).all()  # masked-out tokens have no bin


@pytest.mark.parametrize("log_gap", [1e4, -1e4, math.inf, -math.inf])
def test_extreme_ratios_stay_finite(log_gap):
    logps, old_logps, mask = random_batch(1)
    old_logps = old_logps.clone()
    old_logps[1, 3] = logps[1, 3] - log_gap
    eps, stats = acpo_clip_range(logps, old_logps, mask)
    assert torch.isfinite(eps).all() and torch.isfinite(stats.std).all()
    assert (eps <= 3.0).all() and (eps >= 0.0).all()


def test_no_gradient_flows_through_eps():
    logps, old_logps, mask = random_batch(2)
    logps = logps.clone().requires_grad_(True)
    eps, stats = acpo_clip_range(logps, old_logps, mask)
    assert not eps.requires_grad and not stats.std.requires_grad
    # The ACPO loss's gradient equals that of a clipped surrogate with eps frozen as a constant.
    from acpo_trl.losses import clipped_surrogate, importance_ratio

    adv = torch.randn(logps.shape[0], 1)
    frozen = eps.clone()
    loss = (clipped_surrogate(importance_ratio(logps, old_logps), adv, 1 - eps, 1 + eps).loss * mask).sum()
    (grad,) = torch.autograd.grad(loss, logps)
    logps2 = logps.detach().clone().requires_grad_(True)
    loss2 = (clipped_surrogate(importance_ratio(logps2, old_logps), adv, 1 - frozen, 1 + frozen).loss * mask).sum()
    (grad2,) = torch.autograd.grad(loss2, logps2)
    torch.testing.assert_close(grad, grad2)


def test_all_reduce_hook_sees_per_bin_sums():
    logps, old_logps, mask = random_batch(3)
    seen = []

    def fake_all_reduce(t):
        seen.append(t.clone())
        return 2 * t  # two identical ranks

    eps_global, stats_global = acpo_clip_range(logps, old_logps, mask, all_reduce=fake_all_reduce)
    eps_local, stats_local = acpo_clip_range(logps, old_logps, mask)
    assert [t.shape for t in seen] == [(2, 5), (5,)]  # (count, sum of r - 1), then sum of squared deviations
    # Duplicating the batch changes counts but neither mean nor population std.
    torch.testing.assert_close(stats_global.count, 2 * stats_local.count)
    torch.testing.assert_close(stats_global.std, stats_local.std)
    torch.testing.assert_close(eps_global, eps_local)
