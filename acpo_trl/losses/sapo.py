"""``sapo``: soft adaptive policy optimisation (arXiv 2511.20347), TRL's ``loss_type="sapo"``.

A soft gate on the ratio in place of a hard clip:

    l = -A * (4 / tau) * sigmoid(tau (r - 1)),     tau = sapo_temperature_pos (1.0) if A > 0 else _neg (1.05)

so dl/dr = -A * g(r) with the gate g(r) = 4 sigmoid(tau (r - 1)) (1 - sigmoid(tau (r - 1))): 1 at r = 1, decaying
smoothly on both sides. r per token, or GSPO's per sequence with ``importance_sampling_level="sequence"``.
Aggregated with ``loss_type="grpo"`` it is TRL's ``loss_type="sapo"`` loss. For the diagnostics its "clip" masks are
the tokens the gate more than halves (g < 1/2) beyond r = 1 in their advantage's direction (A > 0, r > 1 or A < 0,
r < 1), which a hard clip of the same trust region would cut; ``sapo/gate_mean`` logs the mean gate.
"""

from __future__ import annotations

import torch

from .common import policy_ratio
from .registry import PolicyLossInputs, PolicyLossOutput, register_policy_loss

HALF_GATE = 0.5


@register_policy_loss("sapo", reads=("sapo_temperature_pos", "sapo_temperature_neg", "importance_sampling_level"),
                      summary="a soft gate in place of the clip: l = -A (4/tau) sigmoid(tau (r - 1)), tau by "
                              "advantage sign; TRL's `loss_type: sapo` (equal to it with `loss_type: grpo`)",
                      source="SAPO (2511.20347), as TRL computes it")
def sapo_loss(inputs: PolicyLossInputs, config) -> PolicyLossOutput:
    """See the module docstring."""
    advantages, mask = inputs.advantages, inputs.mask
    ratio = policy_ratio(inputs.logps, inputs.old_logps, mask, config.importance_sampling_level)
    tau = torch.where(advantages > 0, config.sapo_temperature_pos, config.sapo_temperature_neg)
    gate_input = torch.sigmoid(tau * (ratio - 1))
    loss = (-advantages * gate_input * 4 / tau).expand(mask.shape)
    with torch.no_grad():
        gate = (4 * gate_input * (1 - gate_input)).expand(mask.shape)
        ratio = ratio.detach().expand(mask.shape)
        gated = gate < HALF_GATE
        gated_high = gated & (advantages > 0) & (ratio > 1)
        gated_low = gated & (advantages < 0) & (ratio < 1)
    tokens = mask.sum()
    metrics = {"sapo/gate_mean": ((gate * mask).sum(), tokens), "sapo/half_gated_frac": ((gated * mask).sum(), tokens)}
    return PolicyLossOutput(loss, metrics, gated_high, gated_low)
