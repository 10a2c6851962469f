"""The ACPO and ppo_clip policy losses on small hand-built tensors, expected values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from acpo_trl.losses import POLICY_LOSSES, PolicyLossInputs, aggregate_loss, flatten_metrics, get_policy_loss


def acpo_args(**overrides):
    from acpo_trl.config import config_defaults

    return config_defaults(**overrides)


def scalar_metrics(metrics):
    names, rows = flatten_metrics(metrics)
    return {name: (float(num), float(den)) for name, (num, den) in zip(names, rows)}


def hand_batch():
    """Three sequences; (current probability, ratio) per token, a padded slot in the last row.

    bin 4 (p = 0.9): ratios {1.0, 1.5}  -> std 0.25      -> eps 0.2 + 3 * 0.25 = 0.95
    bin 0 (p = 0.1): ratios {4.5, 0.5}  -> std 2.0      -> eps 6.2, clamped to 3.0
    bin 2 (p = 0.5): ratio  {5.0}       -> std 1e-4     -> eps 0.2003
    The padded slot (p = 0.9, r = 100) must not enter bin 4.
    """
    p = torch.tensor([[0.9, 0.1], [0.9, 0.1], [0.5, 0.9]])
    r = torch.tensor([[1.0, 4.5], [1.5, 0.5], [5.0, 100.0]])
    logps = p.log().requires_grad_(True)
    old_logps = (p.log() - r.log()).detach()
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    advantages = torch.tensor([[1.0], [-2.0], [-1.0]])
    return logps, old_logps, advantages, mask


def test_registry_has_core_methods_and_rejects_unknown():
    assert {"acpo", "ppo_clip"} <= set(POLICY_LOSSES)
    with pytest.raises(ValueError, match="Unknown policy_loss 'nope'.*acpo"):
        get_policy_loss("nope")


def test_acpo_loss_by_hand():
    logps, old_logps, adv, mask = hand_batch()
    out = get_policy_loss("acpo")(PolicyLossInputs(logps, old_logps, adv, mask), acpo_args())
    # Row 0 (A=+1): r=1 unclipped -> -1; r=4.5 clipped at 1+3 -> -4.
    # Row 1 (A=-2): r=1.5 inside [0.05, 1.95] -> 3; r=0.5 inside [-2, 4] -> 1.
    # Row 2 (A=-1): r=5 -> max(5, 1.2003) = 5, dual-clipped to -c A = 3.
    loss = out.per_token_loss
    assert loss[0].tolist() == pytest.approx([-1.0, -4.0])
    assert loss[1].tolist() == pytest.approx([3.0, 1.0])
    assert loss[2, 0].item() == pytest.approx(3.0)
    # d(-A r)/dlogp = -A r where unclipped, 0 where clipped or dual-clipped.
    (grad,) = torch.autograd.grad((loss * mask).sum(), logps)
    assert grad[0].tolist() == pytest.approx([-1.0, 0.0])
    assert grad[1].tolist() == pytest.approx([3.0, 1.0])
    assert grad[2, 0].item() == pytest.approx(0.0)
    # grpo aggregation: mean over rows of the token means = (-2.5 + 2 + 3) / 3.
    assert aggregate_loss(loss, mask, "grpo").loss.item() == pytest.approx(2.5 / 3)
    m = scalar_metrics(out.metrics)
    assert m["acpo/bin4/eps"][0] == pytest.approx(0.2 + 3 * math.sqrt(0.0625 + 1e-8), rel=1e-6)
    assert m["acpo/bin0/eps"][0] == pytest.approx(3.0)
    assert m["acpo/bin2/eps"][0] == pytest.approx(0.2 + 3e-4, rel=1e-4)
    assert m["acpo/bin0/std"][0] == pytest.approx(2.0, rel=1e-6)
    assert m["acpo/bin4/token_frac"] == (2.0, 5.0)
    assert m["acpo/bin0/clip_frac_pos"] == (1.0, 1.0)  # r = 4.5 > 1 + 3
    assert m["acpo/bin0/clip_frac_neg"] == (0.0, 1.0)  # r = 0.5 is not below 1 - 3
    assert m["acpo/bin2/clip_frac_neg"] == (0.0, 1.0)  # r = 5 > 1 + eps is the high side, not a low clip
    assert m["acpo/bin4/ratio_mean"] == pytest.approx((1.25, 1.0))
    assert m["acpo/bin1/eps"] == (0.0, 0.0)  # an empty bin logs nothing (0/0 is dropped by TRL's averaging)
    assert m["acpo/bin1/token_frac"][0] == 0.0


def test_dual_clip_off_and_on():
    logps, old_logps, adv, mask = hand_batch()
    out = get_policy_loss("acpo")(PolicyLossInputs(logps, old_logps, adv, mask), acpo_args(dual_clip_c=None))
    assert out.per_token_loss[2, 0].item() == pytest.approx(5.0)  # unbounded without the dual-clip
    out = get_policy_loss("acpo")(PolicyLossInputs(logps, old_logps, adv, mask), acpo_args(dual_clip_c=4.0))
    assert out.per_token_loss[2, 0].item() == pytest.approx(4.0)


def test_ppo_clip_by_hand_and_differs_from_acpo():
    logps, old_logps, adv, mask = hand_batch()
    out = get_policy_loss("ppo_clip")(PolicyLossInputs(logps, old_logps, adv, mask), acpo_args(epsilon_high=0.3))
    loss = out.per_token_loss
    # Row 0 (A=+1): r=1 -> -1; r=4.5 clipped at 1.3 -> -1.3.  Row 1 (A=-2): r=1.5 -> max(3, 2.6)=3;
    # r=0.5 -> max(1, 1.6) = 1.6 (clipped low).  Row 2 (A=-1): r=5 -> 5, dual-clipped to 3.
    assert loss[0].tolist() == pytest.approx([-1.0, -1.3])
    assert loss[1].tolist() == pytest.approx([3.0, 1.6])
    assert loss[2, 0].item() == pytest.approx(3.0)
    m = scalar_metrics(out.metrics)
    assert m["clip_ratio/low_mean"] == (1.0, 5.0)
    assert m["clip_ratio/high_mean"] == (1.0, 5.0)


def test_delta_caps_the_unclipped_ratio_like_trl():
    logps, old_logps, adv, mask = hand_batch()
    out = get_policy_loss("ppo_clip")(
        PolicyLossInputs(logps, old_logps, adv, mask), acpo_args(delta=2.0, dual_clip_c=None)
    )
    assert out.per_token_loss[2, 0].item() == pytest.approx(2.0)  # -A min(r, delta) = 2


def test_global_scope_uses_the_all_reduce():
    logps, old_logps, adv, mask = hand_batch()
    calls = []

    def all_reduce(t):
        calls.append(t)
        return t

    get_policy_loss("acpo")(PolicyLossInputs(logps, old_logps, adv, mask, all_reduce=all_reduce), acpo_args())
    assert not calls
    get_policy_loss("acpo")(
        PolicyLossInputs(logps, old_logps, adv, mask, all_reduce=all_reduce), acpo_args(acpo_stats_scope="global")
    )
    assert len(calls) == 2  # (count, sum) per bin, then the sum of squared deviations per bin


def test_acpo_log_loss_by_hand():
    """acpo_log on the hand batch: eps_b from the within-bin std of log r, r clipped to [e^-eps_b, e^eps_b].

    bin 4: log r {0, log 1.5}    -> std log(1.5) / 2 = 0.20273   -> eps 0.2 + 3 * 0.20273 = 0.80820
    bin 0: log r {log 4.5, log 0.5} -> std log(9) / 2 = 1.09861  -> eps 3.4958, clamped to 3.0: r in [0.0498, 20.09]
    bin 2: log r {log 5}         -> std 1e-4                     -> eps 0.2003: r in [0.8185, 1.2218]
    """
    logps, old_logps, adv, mask = hand_batch()
    out = get_policy_loss("acpo_log")(PolicyLossInputs(logps, old_logps, adv, mask), acpo_args())
    loss = out.per_token_loss
    # Row 0 (A=+1): r=1 inside -> -1; r=4.5 inside [0.0498, 20.09] -> -4.5 (ACPO's [-2, 4] clipped it at 4).
    # Row 1 (A=-2): r=1.5 and r=0.5 inside their ranges -> 3, 1. Row 2 (A=-1): r=5 -> 5, dual-clipped to 3.
    assert loss[0].tolist() == pytest.approx([-1.0, -4.5])
    assert loss[1].tolist() == pytest.approx([3.0, 1.0])
    assert loss[2, 0].item() == pytest.approx(3.0)
    m = scalar_metrics(out.metrics)
    assert m["acpo/bin4/std"][0] == pytest.approx(math.sqrt((math.log(1.5) / 2) ** 2 + 1e-8), rel=1e-6)
    assert m["acpo/bin4/eps"][0] == pytest.approx(0.2 + 3 * math.sqrt((math.log(1.5) / 2) ** 2 + 1e-8), rel=1e-6)
    assert m["acpo/bin0/eps"][0] == pytest.approx(3.0)
    assert m["acpo/bin2/eps"][0] == pytest.approx(0.2 + 3e-4, rel=1e-4)
    assert m["acpo/bin4/logratio_mean"] == pytest.approx((math.log(1.5) / 2, 1.0))
    assert not out.clipped_high.any() and not out.clipped_low.any()


def test_acpo_log_keeps_a_lower_clip_where_acpos_vanishes():
    """One bin (p = 0.1) with ratios {0.02, 3.0}: ACPO's eps = 0.2 + 3 std(r) = 4.67 -> 3, so 1 - eps = -2 and the
    A < 0 token at r = 0.02 is never clipped; acpo_log's eps = 0.2 + 3 std(log r) = 7.7 -> 3 keeps r >= e^-3 = 0.0498,
    so that token is clipped (constant loss 0.0498, no gradient)."""
    p = torch.tensor([[0.1, 0.1]])
    r = torch.tensor([[0.02, 3.0]])
    logps = p.log().requires_grad_(True)
    old_logps = (p.log() - r.log()).detach()
    adv, mask = torch.tensor([[-1.0]]), torch.ones(1, 2)
    acpo = get_policy_loss("acpo")(PolicyLossInputs(logps, old_logps, adv, mask), acpo_args())
    log = get_policy_loss("acpo_log")(PolicyLossInputs(logps, old_logps, adv, mask), acpo_args())
    assert acpo.per_token_loss[0, 0].item() == pytest.approx(0.02) and not acpo.clipped_low.any()
    assert log.per_token_loss[0, 0].item() == pytest.approx(math.exp(-3.0), rel=1e-5)
    assert log.clipped_low.tolist() == [[True, False]]
    (g_acpo,) = torch.autograd.grad(acpo.per_token_loss[0, 0], logps)
    (g_log,) = torch.autograd.grad(log.per_token_loss[0, 0], logps)
    assert g_acpo[0, 0].item() == pytest.approx(0.02) and g_log[0, 0].item() == 0.0


def test_bin_clip_is_acpo_with_its_ranges_frozen():
    """bin_clip with each bin's range set to what ACPO computed on a batch gives ACPO's loss, gradient and clip
    masks on that batch; its ranges do not follow the ratio (another batch keeps them); bad ranges fail naming the
    field."""
    from acpo_trl.losses import acpo_clip_range

    logps, old_logps, advantages, mask = hand_batch()
    eps, stats = acpo_clip_range(logps, old_logps, mask)
    args = acpo_args(bin_clip_ranges=[float(e) for e in stats.eps])
    outputs = []
    for name in ("acpo", "bin_clip"):
        logps.grad = None
        out = get_policy_loss(name)(PolicyLossInputs(logps, old_logps, advantages, mask), args)
        (out.per_token_loss * mask).sum().backward()
        outputs.append((out, logps.grad.clone()))
    (acpo, acpo_grad), (frozen, frozen_grad) = outputs
    assert torch.equal(acpo.per_token_loss, frozen.per_token_loss) and torch.equal(acpo_grad, frozen_grad)
    assert torch.equal(acpo.clipped_low, frozen.clipped_low) and torch.equal(acpo.clipped_high, frozen.clipped_high)
    on_policy = get_policy_loss("bin_clip")(PolicyLossInputs(logps, logps.detach(), advantages, mask), args)
    assert scalar_metrics(on_policy.metrics)["acpo/bin0/eps"][0] == pytest.approx(float(stats.eps[0]))  # not 0.2
    for bad in (None, [], [0.2, math.nan], [0.2, -0.1], ["wide"]):
        with pytest.raises(ValueError, match=r"ACPOConfig.bin_clip_ranges="):
            get_policy_loss("bin_clip").validate_config(acpo_args(bin_clip_ranges=bad))


def test_dcpo_bounds_and_loss_by_hand():
    """DCPO's bounds from the OLD probability q (eps_low 0.16, eps_high 0.2, cap 10), as read from the authors'
    get_clip_low_high: low(q) = 1/2 + 1/2 sqrt(max(1 - 0.64 / q, 0)), high(q) = min(1/2 + 1/2 sqrt(1 + 0.8 / q), 10).
    q = 0.9: [0.76874, 1.18718]; q = 0.01: [0.5, 5]; q = 1e-4: high 45.2 capped at 10."""
    from acpo_trl.losses import dcpo_bounds

    q = torch.tensor([[0.9, 0.01], [0.9, 0.01], [1e-4, 0.01], [0.01, 0.9]])
    r = torch.tensor([[1.3, 4.0], [0.7, 0.6], [20.0, 1.0], [8.0, 1.0]])
    advantages = torch.tensor([[1.0], [-2.0], [1.0], [-1.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    old_logps = q.log()
    logps = (q * r).log().requires_grad_(True)
    low, high = dcpo_bounds(old_logps, 0.16, 0.2, 10.0)
    assert low[0].tolist() == pytest.approx([0.5 + 0.5 * math.sqrt(1 - 0.64 / 0.9), 0.5], rel=1e-5)
    assert high[0].tolist() == pytest.approx([0.5 + 0.5 * math.sqrt(1 + 0.8 / 0.9), 5.0], rel=1e-5)
    assert high[2, 0].item() == pytest.approx(10.0) and low[2, 0].item() == 0.5
    args = acpo_args(epsilon=0.16, epsilon_high=0.2, dcpo_ratio_cap=10.0)
    out = get_policy_loss("dcpo")(PolicyLossInputs(logps, old_logps, advantages, mask), args)
    loss = out.per_token_loss
    # Row 0 (A = +1): r = 1.3 above 1.18718 at q = 0.9 -> clipped; r = 4 inside [0.5, 5] at q = 0.01 -> -4 (a fixed
    # clip of 0.2 would stop it at 1.2). Row 1 (A = -2): r = 0.7 below 0.76874 -> clipped at 2 x 0.76874; r = 0.6
    # inside -> 1.2. Row 2 (A = +1): r = 20 clipped at the cap 10. Row 3 (A = -1): r = 8 -> max(8, 5) = 8,
    # dual-clipped to 3.
    assert loss[0].tolist() == pytest.approx([-(0.5 + 0.5 * math.sqrt(1 + 0.8 / 0.9)), -4.0], rel=1e-5)
    assert loss[1].tolist() == pytest.approx([2 * (0.5 + 0.5 * math.sqrt(1 - 0.64 / 0.9)), 1.2], rel=1e-5)
    assert loss[2].tolist() == pytest.approx([-10.0, -1.0], rel=1e-5)
    assert loss[3, 0].item() == pytest.approx(3.0)
    (grad,) = torch.autograd.grad((loss * mask).sum(), logps)  # -A r where unclipped, 0 where clipped
    torch.testing.assert_close(grad, torch.tensor([[0.0, -4.0], [0.0, 1.2], [0.0, -1.0], [0.0, 0.0]]))
    m = scalar_metrics(out.metrics)
    assert m["clip_ratio/high_mean"] == (2.0, 7.0) and m["clip_ratio/low_mean"] == (1.0, 7.0)
    with pytest.raises(ValueError, match="ACPOConfig.dcpo_ratio_cap=1.0"):
        get_policy_loss("dcpo").validate_config(acpo_args(dcpo_ratio_cap=1.0))
