"""``ACPOConfig``: ``GRPOConfig`` plus the choice of policy loss and ACPO's bin-wise clipping parameters."""

from __future__ import annotations

import functools
import logging
from dataclasses import MISSING, dataclass, field, fields
from types import SimpleNamespace

from trl import GRPOConfig

from .losses import IMPORTANCE_SAMPLING_LEVELS, LOSS_TYPES, POLICY_LOSSES, BinClipRule, PolicyLoss
from .losses.acpo import PAPER_BASE
from .utils.number_checks import (AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, UNIT, UNIT_NOT_ONE, UNIT_NOT_ZERO, Range,
                            check_numbers, number_fields)

logger = logging.getLogger(__name__)

TRL_LOSS = "trl"  # policy_loss: TRL's own objective, computed by GRPOTrainer's code
# TRL's loss types that are objectives of their own, not aggregations of a per-token loss.
TRL_OBJECTIVES = ("cispo", "sapo", "vespo")
# The drift guard's measures (acpo_trl/training/drift_guard.py).
DRIFT_MEASURES = ("ratio_std", "kl")
# Names before every clip range became TRL's epsilon / epsilon_high, working for one release with a warning:
# old field -> (new field, the old value as the new field's). The CISPO mask was a ratio range, the new fields ranges.
# old field -> (new field, the old value as the new field's, the methods that read the old field). The CISPO mask was
# a ratio range, the new fields ranges.
_ACPO, _DAPO, _CISPO = ("acpo", "acpo_log"), ("dapo", "high_entropy", "low_entropy"), ("masked_cispo",)
DEPRECATED_FIELDS = {
    "acpo_base_clip": ("epsilon", float, _ACPO),
    "dapo_clip_low": ("epsilon", float, _DAPO), "dapo_clip_high": ("epsilon_high", float, _DAPO),
    "dcpo_clip_low": ("epsilon", float, ("dcpo",)), "dcpo_clip_high": ("epsilon_high", float, ("dcpo",)),
    "ar_lopti_clip_low": ("epsilon", float, ("ar_lopti",)), "ar_lopti_clip_high": ("epsilon_high", float, ("ar_lopti",)),
    "cispo_mask_low": ("epsilon", lambda low: round(1 - low, 12), _CISPO),
    "cispo_mask_high": ("epsilon_high", lambda high: round(high - 1, 12), _CISPO),
    "cispo_mask": ("policy_loss", lambda masked: "masked_cispo" if masked else "trl_cispo", _CISPO),
}
DEPRECATED_METHODS = {"cispo": "masked_cispo"}  # policy_loss / reweight_base_loss names, old -> new
# Read by the diagnostics under any method: they report the ranges ACPO's rule would set (diagnostics_rule).
DIAGNOSTICS_READS = frozenset({"acpo_num_bins", "acpo_alpha", "acpo_clip_min", "acpo_clip_max"})
# The inherited fields (TrainingArguments', GRPOConfig's) whose value outside a range makes no sense. Besides them,
# every float field is checked finite and the float fields ACPOConfig adds >= 0 (a method checks its own tighter
# ranges). max_steps is not here: -1 (or 0) means "train num_train_epochs".
INHERITED_RANGES: dict[str, Range] = {
    # TrainingArguments
    "learning_rate": NON_NEGATIVE, "num_train_epochs": NON_NEGATIVE, "warmup_steps": NON_NEGATIVE,
    "weight_decay": NON_NEGATIVE, "adam_beta1": UNIT_NOT_ONE, "adam_beta2": UNIT_NOT_ONE, "adam_epsilon": NON_NEGATIVE,
    "max_grad_norm": NON_NEGATIVE, "label_smoothing_factor": UNIT, "neftune_noise_alpha": NON_NEGATIVE,
    "logging_steps": POSITIVE, "eval_steps": POSITIVE, "save_steps": POSITIVE, "eval_delay": NON_NEGATIVE,
    "per_device_train_batch_size": AT_LEAST_ONE, "per_device_eval_batch_size": AT_LEAST_ONE,
    "gradient_accumulation_steps": AT_LEAST_ONE, "seed": NON_NEGATIVE, "data_seed": NON_NEGATIVE,
    "eval_accumulation_steps": AT_LEAST_ONE, "dataloader_num_workers": NON_NEGATIVE,
    # GRPOConfig
    "num_generations": AT_LEAST_ONE, "num_generations_eval": AT_LEAST_ONE, "max_completion_length": AT_LEAST_ONE,
    "generation_batch_size": AT_LEAST_ONE, "steps_per_generation": AT_LEAST_ONE, "num_iterations": AT_LEAST_ONE,
    "temperature": POSITIVE, "top_p": UNIT_NOT_ZERO, "top_k": NON_NEGATIVE, "min_p": UNIT,
    "repetition_penalty": POSITIVE, "vllm_gpu_memory_utilization": UNIT_NOT_ZERO, "vllm_server_timeout": POSITIVE,
    "vllm_tensor_parallel_size": AT_LEAST_ONE, "vllm_max_model_length": AT_LEAST_ONE,
    "beta": NON_NEGATIVE, "epsilon": NON_NEGATIVE, "epsilon_high": NON_NEGATIVE, "delta": NON_NEGATIVE,
    "sapo_temperature_neg": POSITIVE, "sapo_temperature_pos": POSITIVE, "ref_model_mixup_alpha": UNIT,
    "ref_model_sync_steps": AT_LEAST_ONE, "top_entropy_quantile": UNIT, "entropy_coef_delta": NON_NEGATIVE,
    "entropy_target": NON_NEGATIVE, "router_aux_loss_coef": NON_NEGATIVE, "off_policy_mask_threshold": NON_NEGATIVE,
    "vllm_importance_sampling_clip_min": NON_NEGATIVE, "vllm_importance_sampling_clip_max": NON_NEGATIVE,
    "vllm_importance_sampling_cap": NON_NEGATIVE,
}  # fmt: skip


@dataclass
class ACPOConfig(GRPOConfig):
    r"""
    Configuration class for [`ACPOTrainer`]: every [`~trl.GRPOConfig`] field, plus the fields below.

    Defaults are the ACPO paper's run (arXiv 2606.22570): K = 5 bins, alpha = 3.0, base = TRL's ``epsilon`` 0.2, clip
    range clamped to [0.0, 3.0], dual-clip c = 3.0, and TRL ``loss_type="grpo"`` (token-mean within a sequence, then
    mean over sequences; GRPOConfig's default is ``"dapo"``). The authors' public YAML defaults (alpha 1, min 0.05,
    max 0.5) are NOT the paper's run.

    Every GRPOConfig field keeps its TRL meaning under every method, or is refused with the reason: every clip
    range is TRL's ``epsilon`` (low side) and ``epsilon_high`` (high side; a method may keep its paper's value
    when it is unset, e.g. DAPO's 0.28). Each registered method declares the fields it reads, and a non-default
    value of a field that some method reads but the chosen one does not is refused at construction (never
    silently ignored). ``policy_loss="trl"`` is TRL's own objective, computed by TRL's code: any GRPOConfig
    (``loss_type`` cispo / sapo / luspo / vespo, GSPO's ``importance_sampling_level="sequence"``, ...) then trains
    exactly as with ``GRPOTrainer``; the registry's ``sapo``, ``trl_cispo``, ``vespo`` and ``ppo_clip`` with
    ``importance_sampling_level="sequence"`` (GSPO) give the same loss and gradients with the diagnostics. The registry's methods are token-level objectives that compose
    with TRL's options: the aggregations (``loss_type`` grpo, bnpo, dr_grpo, dapo, luspo), the entropy bonus
    (``entropy_coef``, ``use_adaptive_entropy``), ``top_entropy_quantile``, ``off_policy_mask_threshold``, ``delta``
    (clipped objectives), KL (``beta``) and vLLM's importance-sampling correction; the README's table says which
    combinations are refused and why.

    Parameters:
        policy_loss (`str`, *optional*, defaults to `"acpo"`):
            `"trl"` (TRL's own objective, as `GRPOTrainer` computes it) or the name of a policy loss in
            `acpo_trl.losses.POLICY_LOSSES`: `"acpo"` (bin-wise adaptive clipping, base range `epsilon`),
            `"acpo_log"` (this package's variant: the same bins, eps_b from the within-bin std of log r, log r clipped
            to [-eps_b, eps_b], so the lower clip never vanishes; it reads the `acpo_*` fields below), `"ppo_clip"`
            (TRL's fixed clip with `epsilon` / `epsilon_high`, GSPO with `importance_sampling_level: sequence`),
            `"unclipped"` (no clip at all), TRL's objectives `"sapo"`, `"trl_cispo"`, `"vespo"`, and the baselines
            registered there (README, "Methods"). `"cispo"` is the deprecated name of `"masked_cispo"`.
        acpo_num_bins (`int`, *optional*, defaults to `5`):
            K, the number of equal-width bins of the CURRENT token probability on [0, 1].
        acpo_alpha (`float`, *optional*, defaults to `3.0`):
            Slope of the clip range in the within-bin std of the importance ratio: eps_b = base + alpha * std_b.
        acpo_clip_min (`float`, *optional*, defaults to `0.0`):
            Lower bound of eps_b.
        acpo_clip_max (`float`, *optional*, defaults to `3.0`):
            Upper bound of eps_b. Above 1 the low clip 1 - eps_b is vacuous and only the dual-clip bounds
            negative-advantage tokens.
        dual_clip_c (`float` or `None`, *optional*, defaults to `3.0`):
            Dual-clip constant c: for A < 0 the per-token loss is capped at -c A. `None` disables it. Applies to
            every clipped objective (`acpo`, `acpo_log`, `bin_clip`, `ppo_clip`, `dapo`, `dcpo`, the entropy methods,
            `ar_lopti`); refused when set to another value under a method without a clipped surrogate (`unclipped`,
            the CISPOs, `sapo`, `vespo`, `trl`). Not TRL's `delta`, which caps the unclipped ratio for both signs (and
            also applies to every clipped objective).
        acpo_stats_scope (`str`, *optional*, defaults to `"local"`):
            `"local"`: bin statistics over the micro-batch on this process (the authors' code; the ranges then
            depend on micro-batch size and GPU count). `"global"`: per-bin count, sum and sum of squared
            deviations are all-reduced over processes, so every rank uses the same ranges whatever the sharding.

        bin_clip_ranges (`list[float]` or `None`, *optional*, defaults to `None`):
            `policy_loss="bin_clip"`: a fixed clip range eps_b per bin of the current token probability (K =
            its length, equal-width bins on [0, 1] as ACPO's): ACPO's bins without its adaptation.

        > Baselines (see `acpo_trl/losses/` and the README's method table)

        dcpo_ratio_cap (`float`, *optional*, defaults to `10.0`):
            `policy_loss="dcpo"`: the largest upper bound on r (the authors' max(clip_ratio_c, 10)); its eps_low /
            eps_high are `epsilon` / `epsilon_high` (0.28 when unset, the authors' run).
        cispo_clip_max (`float`, *optional*, defaults to `1.45`):
            `policy_loss="masked_cispo"`: the detached weight is clamp(r, 0, cispo_clip_max); its mask is [1 - epsilon,
            1 + epsilon_high] (0.3 when unset). TRL's CISPO (`trl_cispo`) caps at `epsilon_high` instead.
        entropy_token_fraction (`float`, *optional*, defaults to `0.2`):
            `high_entropy` trains on the k = max(1, int(f n)) highest-entropy tokens of each sequence of n valid
            tokens, `low_entropy` on its k = max(1, int((1 - f) n)) lowest-entropy ones.
        ar_weight_c (`float`, *optional*, defaults to `0.3`):
            `ar_lopti`: advantage weight c p_old + 1 - c.
        lopti_prob_threshold (`float`, *optional*, defaults to `0.5`):
            `ar_lopti`: tokens with p_old below it are updated in the first pass, the others in the second.
        reweight_c (`float`, *optional*, defaults to `0.2`):
            c of the reweightings `dlogp_reweight` (w = 1 + c (1 - p_old)), `dominate` (w = c p_old + 1 - c)
            and `ppl` (w = 1 - c z).
        reweight_base_loss (`str`, *optional*, defaults to `"dapo"`):
            The objective the reweighted advantages are fed to: any registered one-pass policy loss that is not
            itself a reweighting.
        ppl_clamp (`bool`, *optional*, defaults to `False`):
            `ppl`: clamp the sequence weights to [0.8, 1.2].

        > Deprecated names, kept for one release (a warning names the new field; the value moves there)

        acpo_base_clip, dapo_clip_low, dcpo_clip_low, ar_lopti_clip_low: now `epsilon`.
        dapo_clip_high, dcpo_clip_high, ar_lopti_clip_high: now `epsilon_high`.
        cispo_mask_low, cispo_mask_high: now `epsilon` = 1 - low and `epsilon_high` = high - 1 (`masked_cispo`'s mask).
        cispo_mask: `true` is `policy_loss: masked_cispo`; `false` is `policy_loss: trl_cispo` with `epsilon_high`
            = `cispo_clip_max`.

        > Diagnostics (see `acpo_trl/diagnostics/` and docs/RESULTS.md; cost measured by
        > benchmarks/diagnostics_overhead.py)

        diagnostics (`bool`, *optional*, defaults to `False`):
            Log, per update index k within a rollout and per probability bin, ratio and log-ratio statistics, the
            eps ACPO would give and clip fractions by advantage sign, for any policy loss (about 2% of a step).
        diagnostics_grad_every (`int`, *optional*, defaults to `0`):
            Every N optimizer steps, the angle and norm ratio between the used gradient and the unclipped
            on-policy surrogate's, and per-bin gradient shares (0: off).
        diagnostics_grad_params (`list[str]`, *optional*):
            Regular expressions restricting the gradient diagnostics to some parameters (empty: all).
        diagnostics_num_bins (`int` or `None`, *optional*, defaults to `None`):
            Probability bins of the diagnostics. `None`: the method's own (`acpo_num_bins`, or the length of
            `bin_clip_ranges`). Another K bins the clip fractions at K and reports the ranges ACPO's ratio rule
            would set there (e.g. 5 for a run with `acpo_num_bins: 1`, to compare its clipping per bin).

        > Drift guard (see `acpo_trl/training/drift_guard.py` and docs/RESULTS.md, "A drift guard")

        drift_guard (`str` or `None`, *optional*, defaults to `None`):
            Stop reusing a rollout once its off-policy drift passes `drift_guard_threshold`: before each optimizer
            update, the drift of the mini-batch about to be used is measured on the forward pass the update makes
            (its first micro-batch on every process, summed over processes). `"ratio_std"`: the std of the importance
            ratio r over the tokens whose current probability is below 1 / `acpo_num_bins` (ACPO's bin 0, the drift
            map's measure); `"kl"`: the approximate KL k3 = mean(r - 1 - log r) over all tokens (PPO's `target_kl`).
            Past the threshold that update and the rollout's remaining ones are not applied (no backward pass, no
            optimizer movement) and the next rollout is sampled on schedule. `None`: off.
        drift_guard_threshold (`float` or `None`, *optional*, defaults to `None`):
            The threshold (> 0) of `drift_guard`; e.g. 0.3 for `"ratio_std"`, past which the drift map
            (docs/RESULTS.md) finds off-policy updates harmful, or 0.07 for `"kl"` (k3 where the bin-0 ratio std of
            the committed SmolLM2 runs reached 0.3; `acpo_trl.training.drift_guard.KL_THRESHOLD`).
        drift_guard_min_tokens (`int`, *optional*, defaults to `16`):
            The fewest tokens a decision rests on (bin-0 tokens for `"ratio_std"`, all tokens for `"kl"`), summed over
            processes: a std of a few tokens is noise (at 2 tokens a drift of two thirds of the threshold reads past it
            in ~25% of updates, at 16 in ~0.3%). With fewer, `"ratio_std"` decides on k3 over all the mini-batch's
            tokens against `drift_guard_fallback_threshold`; a measure still short of tokens applies the update.
        drift_guard_fallback_threshold (`float` or `None`, *optional*, defaults to `None`):
            `"ratio_std"` only: the k3 threshold of its fallback. `None`: `acpo_trl.training.drift_guard.KL_THRESHOLD` (0.07,
            the k3 that goes with a bin-0 ratio std of 0.3; set it with another `drift_guard_threshold`).
        num_rollouts (`int` or `None`, *optional*, defaults to `None`):
            Run length in rollouts: sets `max_steps` to `num_rollouts` x the updates per rollout, so that a guarded
            and an unguarded run sample the same completions (a skipped update still counts as a step).

        > Speed

        share_prompt_prefix (`bool`, *optional*, defaults to `False`):
            Run the tokens that every row of a micro-batch begins with (a shared system prompt, solved examples)
            once, and the rest of each row against their key/value cache, instead of every token of every row. The
            same log-probs, entropies and gradients as TRL's forward up to float rounding (`acpo_trl/training/shared_prefix.py`).
            Needs `gradient_checkpointing: false`; not used under DeepSpeed or FSDP.
    """

    policy_loss: str = field(
        default="acpo",
        metadata={"help": "Policy loss from acpo_trl.losses.POLICY_LOSSES, e.g. 'acpo' or 'ppo_clip'."},
    )
    acpo_num_bins: int = field(default=5, metadata={"help": "K: equal-width bins of the current token probability."})
    acpo_alpha: float = field(default=3.0, metadata={"help": "eps_b = base + alpha * std_b: the slope alpha."})
    acpo_clip_min: float = field(default=0.0, metadata={"help": "Lower bound of the bin clip range eps_b."})
    acpo_clip_max: float = field(default=3.0, metadata={"help": "Upper bound of the bin clip range eps_b."})
    dual_clip_c: float | None = field(
        default=3.0, metadata={"help": "Dual-clip constant c for negative advantages (None disables it)."}
    )
    acpo_stats_scope: str = field(
        default="local",
        metadata={"help": "'local' (per micro-batch, as the authors) or 'global' (all-reduced over processes)."},
    )
    bin_clip_ranges: list[float] | None = field(
        default=None, metadata={"help": "bin_clip: a fixed clip range per current-probability bin (K = its length)."}
    )
    dcpo_ratio_cap: float = field(default=10.0, metadata={"help": "dcpo: the largest upper bound on the ratio."})
    cispo_clip_max: float = field(default=1.45, metadata={"help": "masked_cispo: weight = sg(clamp(r, 0, max))."})
    entropy_token_fraction: float = field(
        default=0.2, metadata={"help": "high_entropy / low_entropy: top fraction of each sequence by entropy."}
    )
    ar_weight_c: float = field(default=0.3, metadata={"help": "ar_lopti: A~ = (c p_old + 1 - c) A."})
    lopti_prob_threshold: float = field(default=0.5, metadata={"help": "ar_lopti: low/high probability split."})
    reweight_c: float = field(default=0.2, metadata={"help": "c of dlogp_reweight / dominate / ppl."})
    reweight_base_loss: str = field(
        default="dapo", metadata={"help": "Objective fed with the reweighted advantages (dlogp_reweight, dominate, ppl)."}
    )
    ppl_clamp: bool = field(default=False, metadata={"help": "ppl: clamp sequence weights to [0.8, 1.2]."})
    acpo_base_clip: float | None = field(default=None, metadata={"help": "Deprecated: epsilon."})
    dapo_clip_low: float | None = field(default=None, metadata={"help": "Deprecated: epsilon."})
    dapo_clip_high: float | None = field(default=None, metadata={"help": "Deprecated: epsilon_high."})
    dcpo_clip_low: float | None = field(default=None, metadata={"help": "Deprecated: epsilon."})
    dcpo_clip_high: float | None = field(default=None, metadata={"help": "Deprecated: epsilon_high."})
    ar_lopti_clip_low: float | None = field(default=None, metadata={"help": "Deprecated: epsilon."})
    ar_lopti_clip_high: float | None = field(default=None, metadata={"help": "Deprecated: epsilon_high."})
    cispo_mask_low: float | None = field(default=None, metadata={"help": "Deprecated: epsilon = 1 - cispo_mask_low."})
    cispo_mask_high: float | None = field(default=None, metadata={"help": "Deprecated: epsilon_high = cispo_mask_high - 1."})
    cispo_mask: bool | None = field(
        default=None, metadata={"help": "Deprecated: policy_loss masked_cispo (true) or trl_cispo (false)."}
    )
    diagnostics: bool = field(
        default=False,
        metadata={"help": "Log per update index and probability bin ratio diagnostics (acpo_trl.diagnostics)."},
    )
    diagnostics_grad_every: int = field(
        default=0, metadata={"help": "Gradient-direction diagnostics once per N optimizer steps (0: off)."}
    )
    diagnostics_grad_params: list[str] = field(
        default_factory=list,
        metadata={"help": "Regular expressions of the parameters of the gradient diagnostics (empty: all)."},
    )
    drift_guard: str | None = field(
        default=None, metadata={"help": f"Stop reusing a rollout past a drift: one of {DRIFT_MEASURES} (None: off)."}
    )
    drift_guard_threshold: float | None = field(
        default=None, metadata={"help": "drift_guard: the threshold (> 0), e.g. 0.3 for 'ratio_std'."}
    )
    drift_guard_min_tokens: int = field(
        default=16, metadata={"help": "drift_guard: the fewest tokens a decision rests on (ratio_std: bin-0 tokens)."}
    )
    drift_guard_fallback_threshold: float | None = field(
        default=None, metadata={"help": "drift_guard=ratio_std with too few bin-0 tokens: decide on kl past this "
                                        "(default 0.07)."}
    )
    num_rollouts: int | None = field(
        default=None, metadata={"help": "Run length in rollouts (sets max_steps = num_rollouts x updates per rollout)."}
    )
    diagnostics_num_bins: int | None = field(
        default=None, metadata={"help": "Probability bins of the diagnostics (default: the method's own)."}
    )
    share_prompt_prefix: bool = field(
        default=False,
        metadata={"help": "Compute the prefix every row of a micro-batch shares once (needs gradient_checkpointing: false)."},
    )
    loss_type: str = field(
        default="grpo",
        metadata={"help": f"Aggregation of the per-token loss, one of {LOSS_TYPES} (the ACPO paper: 'grpo')."},
    )

    def __post_init__(self):
        check_numbers(self, number_ranges())  # first: TRL's own checks divide by some of these numbers
        self._rename_deprecated()
        method = self.method
        if method is not None and method.passes_per_rollout > 1 and self.num_iterations == 1:
            # A multi-pass method (Lopti: low-probability tokens, then high) runs its passes as TRL's iterations.
            logger.info("policy_loss=%r: setting num_iterations=%d (one pass per token group).", self.policy_loss,
                        method.passes_per_rollout)
            self.num_iterations = method.passes_per_rollout
        super().__post_init__()
        self._validate(method)
        if self.num_rollouts is not None:
            self.max_steps = self._steps_of_rollouts()
        if self.is_on_policy and self.policy_loss in ("acpo", "acpo_log"):
            logger.warning(
                "ACPOConfig is on-policy: gradient_accumulation_steps (%d) is a multiple of steps_per_generation * "
                "num_iterations (%d * %d), so the importance ratio is identically 1, every bin's std is ~0 and ACPO "
                "equals a fixed clip of epsilon=%.3g. Set steps_per_generation > gradient_accumulation_steps "
                "(or num_iterations > 1) for several optimizer updates per rollout.",
                self.gradient_accumulation_steps,
                self.steps_per_generation,
                self.num_iterations,
                self.epsilon,
            )

    def _rename_deprecated(self) -> None:
        """Move each deprecated field's value to its new field (``DEPRECATED_FIELDS``, ``DEPRECATED_METHODS``), with
        a warning naming the new one. An old field under a method that did not read it, or set with its new field
        to another value, is refused. ``cispo_mask: false`` is TRL's CISPO at the old cap: ``trl_cispo`` with
        ``epsilon_high`` = ``cispo_clip_max``."""
        for name in ("policy_loss", "reweight_base_loss"):
            old = getattr(self, name)
            if old in DEPRECATED_METHODS:
                logger.warning("%s=%r is deprecated: it is now %r (TRL's own CISPO, unmasked, is 'trl_cispo').", name,
                               old, DEPRECATED_METHODS[old])
                setattr(self, name, DEPRECATED_METHODS[old])
        defaults = _defaults()
        method = self.method  # an unknown method is refused first
        chain = {entry.name for entry in method.chain(self)} if method is not None else set()
        for old, (new, convert, readers) in DEPRECATED_FIELDS.items():
            value = getattr(self, old)
            if value is None:
                continue
            if not chain & set(readers):
                raise ValueError(f"ACPOConfig.{old}={value!r}: deprecated (now {new}), and a field of "
                                 f"{', '.join(readers)}; policy_loss={self.policy_loss!r} does not read it. Remove it.")
            value = convert(value)
            if old == "cispo_mask" and value == "trl_cispo":
                self.epsilon_high, self.cispo_clip_max = self.cispo_clip_max, defaults["cispo_clip_max"]
            elif getattr(self, new) not in (defaults[new], value):
                raise ValueError(f"ACPOConfig.{old}={getattr(self, old)!r}: deprecated, and {new}="
                                 f"{getattr(self, new)!r} is set too; set only {new}.")
            logger.warning("%s is deprecated: it is now %s (TRL's clip vocabulary); %s=%r.", old, new, new, value)
            setattr(self, new, value)
            setattr(self, old, None)

    def _steps_of_rollouts(self) -> int:
        """max_steps for ``num_rollouts`` rollouts (a whole number of updates per rollout)."""
        if isinstance(self.num_rollouts, bool) or not isinstance(self.num_rollouts, int) or self.num_rollouts < 1:
            raise ValueError(f"ACPOConfig.num_rollouts={self.num_rollouts!r}: must be an integer >= 1.")
        updates = self.updates_per_rollout
        if updates != int(updates):
            raise ValueError(f"ACPOConfig.num_rollouts={self.num_rollouts!r}: a rollout holds {updates:g} optimizer "
                             "updates (steps_per_generation x num_iterations / gradient_accumulation_steps); make it a "
                             "whole number, or set max_steps instead.")
        steps = self.num_rollouts * int(updates)
        if self.max_steps not in (-1, steps):
            raise ValueError(f"ACPOConfig.num_rollouts={self.num_rollouts!r}: {steps} steps, but max_steps="
                             f"{self.max_steps}; set one of them.")
        return steps

    @property
    def method(self) -> PolicyLoss | None:
        """The registry entry of ``policy_loss``; None for ``"trl"`` (TRL's own objective). Importing
        acpo_trl.losses registered the built-in methods."""
        if self.policy_loss == TRL_LOSS:
            return None
        if self.policy_loss not in POLICY_LOSSES:
            raise ValueError(f"ACPOConfig.policy_loss={self.policy_loss!r}: unknown policy loss; choose 'trl' (TRL's "
                             f"own objective) or one of {sorted(POLICY_LOSSES)}.")
        return POLICY_LOSSES[self.policy_loss]

    @property
    def updates_per_rollout(self) -> float:
        """Optimizer updates per rollout batch: steps_per_generation * num_iterations / gradient_accumulation_steps."""
        return self.steps_per_generation * self.num_iterations / self.gradient_accumulation_steps

    @property
    def is_on_policy(self) -> bool:
        """True when every micro-batch of a rollout falls in one optimizer step (TRL then skips old log-probs)."""
        return self.gradient_accumulation_steps % (self.steps_per_generation * self.num_iterations) == 0

    def _validate(self, method: PolicyLoss | None) -> None:
        """The fields every method shares, then the method's own (its registry entry's ``validate``), then TRL's
        options that a registry method cannot take (each refused with the reason). ``"trl"`` takes them all."""

        def fail(name: str, message: str) -> None:
            raise ValueError(f"ACPOConfig.{name}={getattr(self, name)!r}: {message}")

        if self.drift_guard is not None:
            if self.drift_guard not in DRIFT_MEASURES:
                fail("drift_guard", f"must be one of {DRIFT_MEASURES}, or None to turn the guard off.")
            if self.drift_guard_threshold is None or self.drift_guard_threshold <= 0:
                fail("drift_guard_threshold", f"drift_guard={self.drift_guard!r} needs a threshold > 0 (e.g. 0.3 for "
                     "'ratio_std').")
            if (isinstance(self.drift_guard_min_tokens, bool) or not isinstance(self.drift_guard_min_tokens, int)
                    or self.drift_guard_min_tokens < 1):
                fail("drift_guard_min_tokens", "must be an integer >= 1 (the default 16 says why).")
            if self.drift_guard_fallback_threshold is not None and self.drift_guard != "ratio_std":
                fail("drift_guard_fallback_threshold", "is the k3 threshold of drift_guard='ratio_std' when bin 0 "
                     "has too few tokens; drift_guard='kl' decides on k3 itself: leave it unset.")
            if self.drift_guard_fallback_threshold is not None and self.drift_guard_fallback_threshold <= 0:
                fail("drift_guard_fallback_threshold", "must be > 0 (or None for the default 0.07).")
        else:
            for name in ("drift_guard_threshold", "drift_guard_fallback_threshold"):
                if getattr(self, name) is not None:
                    fail(name, "has no effect without drift_guard: set drift_guard ('ratio_std' or 'kl') or leave "
                         "it unset.")

        if self.dual_clip_c is not None and self.dual_clip_c <= 1:
            fail("dual_clip_c", "must be > 1 (the paper uses 3.0), or None to disable the dual-clip.")
        if self.share_prompt_prefix and self.gradient_checkpointing:
            fail("share_prompt_prefix", "runs the rows against the shared prefix's key/value cache, which gradient "
                 "checkpointing turns off: set gradient_checkpointing: false (or share_prompt_prefix: false).")
        if self.diagnostics_grad_every < 0:
            fail("diagnostics_grad_every", "must be >= 0 (0 turns the gradient diagnostics off).")
        if self.diagnostics_num_bins is not None and (isinstance(self.diagnostics_num_bins, bool)
                                                      or not isinstance(self.diagnostics_num_bins, int)
                                                      or self.diagnostics_num_bins < 1):
            fail("diagnostics_num_bins", "must be an integer >= 1, or None for the method's own bins.")
        self._refuse_unread_fields(method)
        if method is None:
            if self.diagnostics or self.diagnostics_grad_every:
                fail("diagnostics", "the diagnostics read a registry method's tensors; TRL's own objective "
                     "(policy_loss='trl') does not expose them: choose its registry mirror, equal to it in loss and "
                     "gradients (loss_type sapo -> policy_loss 'sapo', cispo -> 'trl_cispo', vespo -> 'vespo', GSPO "
                     "-> 'ppo_clip' with importance_sampling_level 'sequence'; README, 'Methods').")
            return
        passes = method.passes_per_rollout
        if passes > 1:
            if self.num_iterations != passes:
                fail("num_iterations", f"{self.policy_loss} makes exactly {passes} passes per rollout; leave "
                     f"num_iterations at 1 or {passes}.")
            if self.is_on_policy:
                fail("gradient_accumulation_steps", f"{self.policy_loss}'s later passes must come after an optimizer "
                     f"step: gradient_accumulation_steps must not be a multiple of {passes} * steps_per_generation.")
        method.validate_config(self)
        if self.diagnostics or self.diagnostics_grad_every:
            BinClipRule.from_config(self, base=PAPER_BASE)  # the diagnostics report ACPO's ranges whatever the method
        if self.loss_type in TRL_OBJECTIVES:
            mirror = TRL_MIRRORS[self.loss_type]
            fail("loss_type", f"'{self.loss_type}' is TRL's own objective, not an aggregation of policy_loss="
                 f"{self.policy_loss!r}: set policy_loss={mirror[0]!r} with loss_type={mirror[1]!r} (TRL's loss, "
                 f"with the diagnostics) or policy_loss='trl' (TRL's code); or aggregate with one of {LOSS_TYPES}.")
        if self.loss_type not in LOSS_TYPES:
            fail("loss_type", f"ACPOTrainer aggregates a policy loss with one of {LOSS_TYPES} (or use "
                 "policy_loss='trl' for TRL's own loss types).")
        if self.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
            fail("importance_sampling_level", f"must be one of {IMPORTANCE_SAMPLING_LEVELS} (TRL's).")

    def _refuse_unread_fields(self, method: PolicyLoss | None) -> None:
        """A field that some registered method reads is that method's: under a method that does not read it
        (``reads`` of its registry entry and of the methods it feeds; TRL's own objective reads every GRPOConfig
        field), a value other than the default would be silently ignored, so it is refused, naming the readers."""
        if method is None:
            reads = frozenset(spec.name for spec in fields(GRPOConfig))
        else:
            reads = method.reads_for(self)
        if self.diagnostics or self.diagnostics_grad_every:
            reads |= DIAGNOSTICS_READS
        defaults = _defaults()
        for name in sorted(frozenset().union(*(entry.reads for entry in POLICY_LOSSES.values())) - reads):
            if getattr(self, name) != defaults[name]:
                readers = sorted(entry.name for entry in POLICY_LOSSES.values() if name in entry.reads)
                raise ValueError(f"ACPOConfig.{name}={getattr(self, name)!r}: policy_loss={self.policy_loss!r} does "
                                 f"not read it{UNREAD_REASONS.get(name, '')}; it is a field of {', '.join(readers)}. "
                                 f"Leave it unset (default {defaults[name]!r}), or choose one of those methods.")


# loss_type of TRL's objectives -> (the registry method equal to it, the aggregation TRL gives it).
TRL_MIRRORS = {"sapo": ("sapo", "grpo"), "cispo": ("trl_cispo", "dapo"), "vespo": ("vespo", "dapo")}
# Why a field is not read, where the method's name does not say it.
UNREAD_REASONS = {
    "importance_sampling_level": " (it is token-level: ACPO and DCPO bin or bound each token's ratio)",
    "dual_clip_c": " (it has no clipped surrogate to dual-clip)",
    "delta": " (it has no unclipped surrogate ratio to cap)",
}


@functools.cache
def _defaults() -> dict:
    """Each ACPOConfig field's default value."""
    return {spec.name: spec.default_factory() if spec.default_factory is not MISSING else spec.default
            for spec in fields(ACPOConfig)}


def config_defaults(**overrides) -> SimpleNamespace:
    """ACPOConfig's defaults with ``overrides``, as a plain namespace: what a policy loss reads, for calling one on
    tensors without building an ACPOConfig (no validation, no TrainingArguments set-up)."""
    unknown = sorted(set(overrides) - set(_defaults()))
    if unknown:
        raise TypeError(f"config_defaults: {unknown} are not ACPOConfig fields.")
    return SimpleNamespace(**{**_defaults(), **overrides})


@functools.cache
def number_ranges() -> dict[str, Range]:
    """The range of every bounded number field of ACPOConfig: ``INHERITED_RANGES``, and >= 0 for every float field
    that ACPOConfig adds to GRPOConfig (found by walking the dataclass, not from a list)."""
    grpo = {spec.name for spec in fields(GRPOConfig)}
    own = {name: NON_NEGATIVE for name, spec in number_fields(ACPOConfig).items()
           if name not in grpo and spec.kind is float and not spec.is_list}
    return {**INHERITED_RANGES, **own}
