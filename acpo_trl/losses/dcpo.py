"""DCPO's dynamic adaptive clip (Yang et al. 2025, *DCPO: Dynamic Clipping Policy Optimization*, arXiv 2509.02333).

The rule closest to ACPO's idea: rare tokens get wide bounds on the ratio r = pi_theta / pi_old, but from a formula
in each token's OLD probability q rather than from measured dispersion. Bounding the probability-weighted change,
|(r - 1) r q| <= eps, gives

    low(q)  = 1/2 + 1/2 sqrt(max(1 - 4 eps_low / q, 0))
    high(q) = min(1/2 + 1/2 sqrt(1 + 4 eps_high / q), cap)
    l       = max(-A r, -A clamp(r, low(q), high(q)));   if A < 0: l = min(l, -c A)   (dual-clip)

eps_low is TRL's ``epsilon`` and eps_high its ``epsilon_high``, as the authors' verl fork reads ``clip_ratio_low`` /
``clip_ratio_high``; an unset ``epsilon_high`` is 0.28, what their ``run_dcpo.sh`` runs (with ``run_base.sh``'s
``clip_ratio_low`` 0.2, TRL's default ``epsilon``, and dual clip ``clip_ratio_c`` 10: set ``dual_clip_c: 10`` for
their run; the 0.16 / 0.2 of their README is an illustration). At q = 0.9 (0.2 / 0.28) the bounds are [0.667,
1.249]; at q = 0.01, [0.5, 5.82]; q below ~0.0031 reaches the cap 10. Read from the authors' verl fork (lime-RL/DCPO,
``verl/trainer/ppo/core_algos.py``): ``get_clip_low_high`` gives the bounds from ``old_log_prob``, with the high bound
clamped at ``max(clip_ratio_c, 10)`` (``dcpo_ratio_cap``), and ``compute_policy_loss_dcpo`` with
``clip_type="dynamic"`` applies them in PPO's surrogate with the dual clip at ``clip_ratio_c``. Differences: at q = 0 exactly (a float underflow) their lower bound is 1, here the limit 1/2; r is computed
with this package's log-ratio clamp at +-20. The method's other parts, smooth advantage standardization (SAS) and
its OTM aggregation (token sums, no length normalisation), are not ACPO's comparison and are not here: the
aggregation is the run's ``loss_type``, the advantages TRL's.
"""

from __future__ import annotations

import torch

from .common import clip_ratio_metrics, clipped_surrogate, importance_ratio
from .registry import PolicyLossInputs, PolicyLossOutput, epsilon_high, register_policy_loss

DCPO_EPSILON_HIGH = 0.28  # the authors' run_dcpo.sh, when epsilon_high is unset


def dcpo_bounds(old_logps: torch.Tensor, eps_low: float, eps_high: float, cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(low(q), high(q)) of the module docstring, per token, from the rollout policy's log-probs (no gradient)."""
    q = old_logps.detach().exp()
    low = 0.5 + 0.5 * torch.sqrt(torch.clamp(1 - 4 * eps_low / q, min=0.0))
    high = torch.clamp(0.5 + 0.5 * torch.sqrt(1 + 4 * eps_high / q), max=cap)
    return low, high


def validate_dcpo(config) -> None:
    if config.dcpo_ratio_cap <= 1:
        raise ValueError(f"ACPOConfig.dcpo_ratio_cap={config.dcpo_ratio_cap!r}: must be > 1 (the authors' 10), the "
                         "largest ratio DCPO's upper bound allows.")


@register_policy_loss("dcpo", validate=validate_dcpo, unset={"epsilon_high": DCPO_EPSILON_HIGH},
                      reads=("epsilon", "epsilon_high", "dcpo_ratio_cap", "dual_clip_c", "delta"),
                      summary="dynamic adaptive clip: bounds on r from each token's OLD probability q, 1/2 + 1/2 "
                              "sqrt(max(1 - 4 epsilon/q, 0)) <= r <= min(1/2 + 1/2 sqrt(1 + 4 epsilon_high/q), cap): "
                              "rare tokens get wide bounds by formula (ACPO: from measured dispersion); dual clip. "
                              "Its advantage smoothing and aggregation are not included",
                      source="Yang et al. 2025 (2509.02333), the authors' verl `core_algos.py` and `run_dcpo.sh`")
def dcpo_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput:
    """DCPO's dynamic adaptive clip (module docstring): bounds from each token's old probability, eps_low
    ``epsilon``, eps_high ``epsilon_high`` (0.28 when unset), cap ``dcpo_ratio_cap`` (10); dual-clip ``dual_clip_c``
    and TRL's ``delta`` as every clipped method here. Logs the token-mean bounds."""
    ratio = importance_ratio(inputs.logps, inputs.old_logps)
    low, high = dcpo_bounds(inputs.old_logps, config.epsilon, epsilon_high(config, "dcpo"), config.dcpo_ratio_cap)
    out = clipped_surrogate(ratio, inputs.advantages, low, high, config.dual_clip_c, ratio_max=config.delta)
    mask = inputs.mask
    tokens = mask.sum()
    metrics = clip_ratio_metrics((out.clipped_low * mask).sum(), (out.clipped_high * mask).sum(), tokens)
    metrics["dcpo/low_mean"] = ((low * mask).sum(), tokens)
    metrics["dcpo/high_mean"] = ((high * mask).sum(), tokens)
    return PolicyLossOutput(out.loss, metrics, out.clipped_high, out.clipped_low)
