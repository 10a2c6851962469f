"""``vespo``: VESPO (variational sequence-level soft policy optimisation, arXiv 2602.10693), TRL's
``loss_type="vespo"``, with TRL's own weights.

    w   = exp(sum_t log r_t)                               the sequence's importance ratio (log clamped to [log 1e-8, 20])
    phi = exp(lambda + k log w - lambda w) = e^lambda w^k e^(-lambda w),   phi(1) = 1,
          (k, lambda) = (vespo_k_pos, vespo_lambda_pos) = (2, 3) if A >= 0, else (vespo_k_neg, vespo_lambda_neg) = (3, 2)
    l   = -A * sg(phi) * log pi_theta(y_t)

phi is computed by TRL's ``GRPOTrainer.get_gamma_weights`` (no gradient), so the rule cannot drift from TRL's.
Aggregated with ``loss_type="dapo"`` it is TRL's ``loss_type="vespo"`` loss. TRL folds vLLM's importance-sampling
ratio into w; here that correction is refused (``policy_loss: trl`` runs it). For the diagnostics its "clip" masks
are the sequences whose weight phi < 1/2 beyond w = 1 in their advantage's direction; ``vespo/phi_mean`` logs phi.
"""

from __future__ import annotations

import torch

from .cispo import weighted_log_prob_loss
from .registry import PolicyLossInputs, PolicyLossOutput, register_policy_loss

HALF_WEIGHT = 0.5


def validate_vespo(config) -> None:
    if config.use_vllm and config.vllm_importance_sampling_correction:
        raise ValueError("ACPOConfig.vllm_importance_sampling_correction=True: TRL's VESPO folds vLLM's sampling "
                         "ratio into its sequence weight, which policy_loss='vespo' does not; set policy_loss='trl' "
                         "with loss_type='vespo' (TRL's own code), or turn the correction off.")


@register_policy_loss("vespo", validate=validate_vespo,
                      reads=("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"),
                      summary="REINFORCE weighted by a gamma-shaped function of the sequence ratio, phi(w) = e^lambda "
                              "w^k e^(-lambda w); TRL's `loss_type: vespo` (equal to it with `loss_type: dapo`)",
                      source="VESPO (2602.10693), TRL's `GRPOTrainer.get_gamma_weights`")
def vespo_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput:
    """See the module docstring."""
    from trl import GRPOTrainer  # deferred: TRL's trainer module is heavy, and only this method needs it here

    advantages, mask = inputs.advantages, inputs.mask
    log_ratio = inputs.logps.detach() - inputs.old_logps
    phi = GRPOTrainer.get_gamma_weights(advantages, log_ratio, mask, None, k_pos=config.vespo_k_pos,
                                        lambda_pos=config.vespo_lambda_pos, k_neg=config.vespo_k_neg,
                                        lambda_neg=config.vespo_lambda_neg)
    loss = weighted_log_prob_loss(inputs, phi)
    with torch.no_grad():
        log_w = (torch.clamp(log_ratio, -20.0, 20.0) * mask).sum(-1, keepdim=True)
        low = (phi < HALF_WEIGHT).expand(mask.shape)
        gated_high = low & (advantages > 0) & (log_w > 0)
        gated_low = low & (advantages < 0) & (log_w < 0)
    tokens = mask.sum()
    metrics = {"vespo/phi_mean": ((phi.expand(mask.shape) * mask).sum(), tokens)}
    return PolicyLossOutput(loss, metrics, gated_high, gated_low)
