"""``ACPOConfig``: ``GRPOConfig`` plus the choice of policy loss and ACPO's bin-wise clipping parameters."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from trl import GRPOConfig

from .losses import LOSS_TYPES, POLICY_LOSSES

logger = logging.getLogger(__name__)


@dataclass
class ACPOConfig(GRPOConfig):
    r"""
    Configuration class for [`ACPOTrainer`]: every [`~trl.GRPOConfig`] field, plus the fields below.

    Defaults are the ACPO paper's run (arXiv 2606.22570): K = 5 bins, alpha = 3.0, base = 0.2, clip range
    clamped to [0.0, 3.0], dual-clip c = 3.0, and TRL ``loss_type="grpo"`` (token-mean within a sequence, then
    mean over sequences). The authors' public YAML defaults (alpha 1, min 0.05, max 0.5) are NOT the paper's run.

    Parameters:
        policy_loss (`str`, *optional*, defaults to `"acpo"`):
            Name of the policy loss in `acpo_trl.losses.POLICY_LOSSES`: `"acpo"` (bin-wise adaptive clipping) or
            `"ppo_clip"` (TRL's fixed clip with `epsilon` / `epsilon_high`), and the baselines registered there.
        acpo_num_bins (`int`, *optional*, defaults to `5`):
            K, the number of equal-width bins of the CURRENT token probability on [0, 1].
        acpo_alpha (`float`, *optional*, defaults to `3.0`):
            Slope of the clip range in the within-bin std of the importance ratio: eps_b = base + alpha * std_b.
        acpo_base_clip (`float`, *optional*, defaults to `0.2`):
            The clip range of a bin with no ratio dispersion (every bin right after a rollout).
        acpo_clip_min (`float`, *optional*, defaults to `0.0`):
            Lower bound of eps_b.
        acpo_clip_max (`float`, *optional*, defaults to `3.0`):
            Upper bound of eps_b. Above 1 the low clip 1 - eps_b is vacuous and only the dual-clip bounds
            negative-advantage tokens.
        dual_clip_c (`float` or `None`, *optional*, defaults to `3.0`):
            Dual-clip constant c: for A < 0 the per-token loss is capped at -c A. `None` disables it. Applies to
            every clipped objective (`acpo`, `ppo_clip`, ...). Not TRL's `delta`, which caps the ratio for both
            signs.
        acpo_stats_scope (`str`, *optional*, defaults to `"local"`):
            `"local"`: bin statistics over the micro-batch on this process (the authors' code; the ranges then
            depend on micro-batch size and GPU count). `"global"`: count, sum and sum of squares per bin are
            all-reduced over processes, so every rank uses the same ranges whatever the sharding.
    """

    policy_loss: str = field(
        default="acpo",
        metadata={"help": "Policy loss from acpo_trl.losses.POLICY_LOSSES, e.g. 'acpo' or 'ppo_clip'."},
    )
    acpo_num_bins: int = field(default=5, metadata={"help": "K: equal-width bins of the current token probability."})
    acpo_alpha: float = field(default=3.0, metadata={"help": "eps_b = base + alpha * std_b: the slope alpha."})
    acpo_base_clip: float = field(default=0.2, metadata={"help": "eps_b = base + alpha * std_b: the base."})
    acpo_clip_min: float = field(default=0.0, metadata={"help": "Lower bound of the bin clip range eps_b."})
    acpo_clip_max: float = field(default=3.0, metadata={"help": "Upper bound of the bin clip range eps_b."})
    dual_clip_c: float | None = field(
        default=3.0, metadata={"help": "Dual-clip constant c for negative advantages (None disables it)."}
    )
    acpo_stats_scope: str = field(
        default="local",
        metadata={"help": "'local' (per micro-batch, as the authors) or 'global' (all-reduced over processes)."},
    )
    loss_type: str = field(
        default="grpo",
        metadata={"help": f"Aggregation of the per-token loss, one of {LOSS_TYPES} (the ACPO paper: 'grpo')."},
    )

    def __post_init__(self):
        super().__post_init__()
        self._validate()
        if self.is_on_policy and self.policy_loss == "acpo":
            logger.warning(
                "ACPOConfig is on-policy: gradient_accumulation_steps (%d) is a multiple of steps_per_generation * "
                "num_iterations (%d * %d), so the importance ratio is identically 1, every bin's std is ~0 and ACPO "
                "equals a fixed clip of acpo_base_clip=%.3g. Set steps_per_generation > gradient_accumulation_steps "
                "(or num_iterations > 1) for several optimizer updates per rollout.",
                self.gradient_accumulation_steps,
                self.steps_per_generation,
                self.num_iterations,
                self.acpo_base_clip,
            )

    @property
    def updates_per_rollout(self) -> float:
        """Optimizer updates per rollout batch: steps_per_generation * num_iterations / gradient_accumulation_steps."""
        return self.steps_per_generation * self.num_iterations / self.gradient_accumulation_steps

    @property
    def is_on_policy(self) -> bool:
        """True when every micro-batch of a rollout falls in one optimizer step (TRL then skips old log-probs)."""
        return self.gradient_accumulation_steps % (self.steps_per_generation * self.num_iterations) == 0

    def _validate(self) -> None:
        def fail(name: str, message: str) -> None:
            raise ValueError(f"ACPOConfig.{name}={getattr(self, name)!r}: {message}")

        # Importing acpo_trl.losses registered the built-in methods.
        if self.policy_loss not in POLICY_LOSSES:
            fail("policy_loss", f"unknown policy loss; choose one of {sorted(POLICY_LOSSES)}.")
        if not isinstance(self.acpo_num_bins, int) or self.acpo_num_bins < 1:
            fail("acpo_num_bins", "must be an integer >= 1 (the paper uses 5).")
        if self.acpo_alpha < 0:
            fail("acpo_alpha", "must be >= 0 (the paper uses 3.0).")
        if self.acpo_base_clip < 0:
            fail("acpo_base_clip", "must be >= 0 (the paper uses 0.2).")
        if self.acpo_clip_min < 0:
            fail("acpo_clip_min", "must be >= 0 (the paper uses 0.0).")
        if self.acpo_clip_max < self.acpo_clip_min:
            fail("acpo_clip_max", f"must be >= acpo_clip_min={self.acpo_clip_min} (the paper uses 3.0).")
        if self.dual_clip_c is not None and self.dual_clip_c <= 1:
            fail("dual_clip_c", "must be > 1 (the paper uses 3.0), or None to disable the dual-clip.")
        if self.acpo_stats_scope not in ("local", "global"):
            fail("acpo_stats_scope", "must be 'local' (per micro-batch, as the authors) or 'global'.")
        if self.loss_type not in LOSS_TYPES:
            fail("loss_type", f"ACPOTrainer aggregates with one of {LOSS_TYPES}; the policy loss is `policy_loss`.")
        if self.importance_sampling_level != "token":
            fail("importance_sampling_level", "ACPOTrainer's policy losses are token-level; use 'token'.")
        if self.delta is not None and self.policy_loss != "ppo_clip":
            fail("delta", "TRL's ratio cap is only applied by policy_loss='ppo_clip'; use dual_clip_c instead.")
        unsupported = {
            "top_entropy_quantile": (self.top_entropy_quantile, 1.0, "use policy_loss='high_entropy'"),
            "entropy_coef": (self.entropy_coef, 0.0, "the entropy bonus is not part of these objectives"),
            "use_adaptive_entropy": (self.use_adaptive_entropy, False, "the entropy bonus is not supported"),
            "off_policy_mask_threshold": (self.off_policy_mask_threshold, None, "not supported by ACPOTrainer"),
        }
        for name, (value, allowed, fix) in unsupported.items():
            if value != allowed:
                fail(name, f"must stay {allowed!r} with ACPOTrainer ({fix}).")
