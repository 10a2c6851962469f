"""Gradient-direction diagnostics on one micro-batch, with ``torch.autograd.grad`` (the training gradient in
``.grad`` is not touched).

For the per-token loss l_t that the run actually uses and the unclipped importance-weighted surrogate
u_t = -A_t r_t on the same tokens (the on-policy policy gradient when r = 1), both aggregated with the run's
``loss_type`` (dapo's token-mean over this micro-batch: direction and norm ratio do not depend on the constant):

    grad/angle_deg          angle between g_used = d L_used / d theta and g_ref = d L_unclipped / d theta
    grad/cos                its cosine
    grad/norm_ratio         |g_used| / |g_ref|
    grad/share/bin{b}/{pos,neg}
                            <g_{b,s}, g_used> / |g_used|^2, with g_{b,s} the gradient of the used loss restricted
                            to the tokens of probability bin b (current probability, ACPO's bins) and advantage
                            sign s. The shares sum to 1 (the loss is additive over tokens): which probability group
                            dominates the update, and whether it pushes along it (> 0) or against it (< 0).
    grad/norm_share/bin{b}/{pos,neg}
                            |g_{b,s}| / sum over groups of |g_{b',s'}|

Cost: 2 + 2K backward passes through the part of the graph that reaches ``params`` (restrict ``params`` to a
named subset, e.g. the last block, to bound it), every N optimizer steps.

Under DeepSpeed (any ZeRO stage) run them inside :func:`outside_engine_backward` (the diagnostics hook does): each
rank then differentiates its own micro-batch loss with respect to the full parameters, as under DDP.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator, Sequence

import torch

from ..losses.acpo import probability_bins
from ..losses.aggregation import aggregate_loss
from ..losses.common import importance_ratio
from ..losses.registry import Metric


def select_parameters(model: torch.nn.Module, patterns: Sequence[str] | None = None) -> list[tuple[str, torch.nn.Parameter]]:
    """The trainable parameters whose name matches one of the regular expressions ``patterns`` (``re.search``),
    or all trainable parameters when ``patterns`` is empty. Raises if nothing matches."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if patterns:
        compiled = [re.compile(p) for p in patterns]
        named = [(n, p) for n, p in named if any(c.search(n) for c in compiled)]
    if not named:
        raise ValueError(f"No trainable parameter matches {list(patterns or [])}.")
    return named


class _FetchNothing:
    """A stand-in for ZeRO-3's parameter coordinator: the module hooks that call it gather and release nothing."""

    def is_record_trace(self) -> bool:
        return False

    def trace_prologue(self, *args, **kwargs) -> None:
        pass

    record_module = fetch_sub_module = release_sub_module = trace_prologue


@contextlib.contextmanager
def _zero3_gathered(model: torch.nn.Module, offload) -> Iterator[None]:
    """The ZeRO-3 part of :func:`outside_engine_backward` (``offload``: the engine's ``DeepSpeedZeRoOffload``)."""
    # deferred: DeepSpeed, an optional package that only a ZeRO-3 run has
    import deepspeed
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    to_gather = [p for p in model.parameters() if getattr(p, "ds_status", None) == ZeroParamStatus.NOT_AVAILABLE]
    counters = ("applied_pre_backward_ref_cnt", "ds_grads_remaining")
    saved = [(m, {c: vars(m)[c] for c in counters if c in vars(m)}) for m in model.modules()]
    offload.get_param_coordinator = _FetchNothing  # an instance attribute: shadows the method the hooks call
    try:
        with deepspeed.zero.GatheredParameters(to_gather, enabled=bool(to_gather)):
            yield
    finally:
        del offload.get_param_coordinator
        for module, values in saved:
            for name, value in values.items():
                setattr(module, name, value)


@contextlib.contextmanager
def outside_engine_backward(engine) -> Iterator[None]:
    """Extra ``torch.autograd.grad`` passes through the current graph of a DeepSpeed engine (``engine``: the
    trainer's ``model_wrapped``) that the engine does not see; a no-op for any other model.

    - Any ZeRO stage: DeepSpeed hooks the outputs of the engine's forward so that the first backward through them
      runs the engine's backward prologue (it enters the engine's backward state and queues the epilogue that
      reduces the gradients: run for an extra pass, that epilogue fails or corrupts the step) and every gradient
      leaving them is divided by the gradient accumulation steps. Here the passes get unscaled gradients (as under
      DDP), and the prologue is held back and run once at the end, as ``engine.backward`` would have run it.
    - ZeRO-3: each parameter is a local shard, gathered around a module's forward and backward by module hooks (a
      parameter coordinator) and by autograd nodes in the graph that gather before a module's backward (once per
      forward: ``applied_pre_backward_ref_cnt``) and release after it (when ``ds_grads_remaining`` reaches 0). An
      extra pass would spend those counts and release weights that the training backward then finds missing (and
      with gradient checkpointing it recomputes forwards, which run the hooks again). Here every parameter not
      gathered now is gathered for the duration (the whole model on each rank, as TRL gathers it to generate), the
      hooks see a coordinator that gathers and releases nothing, and afterwards the counts are restored and the same
      parameters partitioned again.

    ``autograd.grad`` does not run the parameters' gradient-accumulation hooks, so ZeRO's gradient reduction never
    sees the extra gradients, and ``.grad`` is untouched. DeepSpeed's private names used here are those of 0.19.
    """
    if not type(engine).__module__.startswith("deepspeed"):  # not a DeepSpeedEngine
        yield
        return
    if not all(hasattr(engine, name) for name in ("_backward_prologue", "_running_engine_backward")):
        raise RuntimeError(f"diagnostics_grad_every under DeepSpeed {_deepspeed_version()}: this DeepSpeed lacks the "
                           "engine internals the gradient diagnostics work around (written for 0.19); set "
                           "diagnostics_grad_every: 0, or use deepspeed 0.19.")
    held = []
    # Instance attributes: they shadow the engine's methods, which its output hooks look up on each call.
    engine._backward_prologue = lambda: held.append(True)
    engine.gradient_accumulation_steps = lambda: 1
    offload = getattr(getattr(engine, "optimizer", None), "parameter_offload", None)
    try:
        with _zero3_gathered(engine.module, offload) if offload is not None else contextlib.nullcontext():
            yield
    finally:
        del engine._backward_prologue, engine.gradient_accumulation_steps
    if held:
        running, engine._running_engine_backward = engine._running_engine_backward, True
        try:
            engine._backward_prologue()
        finally:
            engine._running_engine_backward = running


def _deepspeed_version() -> str:
    import deepspeed  # deferred: DeepSpeed, an optional package that only a DeepSpeed run has

    return deepspeed.__version__


def _flat_grad(loss: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1).float() for g, p in zip(grads, params)])


def gradient_diagnostics(
    per_token_loss: torch.Tensor,
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    params: Iterable[torch.Tensor],
    *,
    loss_type: str = "grpo",
    num_bins: int = 5,
    max_completion_length: int | None = None,
    per_group: bool = True,
    prefix: str = "grad",
) -> dict[str, Metric]:
    """The metrics of the module docstring. ``per_token_loss`` and ``logps`` must still hold their graph (call
    this before ``backward``); ``params`` are the tensors to differentiate with respect to."""
    params = list(params)
    adv = advantages.expand_as(logps)
    max_len = max_completion_length or logps.size(1)

    def aggregate(values: torch.Tensor) -> torch.Tensor:
        return aggregate_loss(values, mask, loss_type, max_completion_length=max_len).loss

    used = _flat_grad(aggregate(per_token_loss), params).double()
    ref = _flat_grad(aggregate(-adv * importance_ratio(logps, old_logps)), params).double()
    one = torch.ones((), dtype=torch.float64, device=logps.device)
    used_norm, ref_norm = used.norm(), ref.norm()
    # The same names whatever the data (metrics are summed over processes by name position): a value that is
    # undefined here (a zero gradient, e.g. a micro-batch whose advantages are all 0) is the pair (0, 0), missing.
    defined = ((used_norm > 0) & (ref_norm > 0)).double()
    cos = torch.clamp(torch.dot(used, ref) / (used_norm * ref_norm).clamp(min=1e-300), -1.0, 1.0) * defined
    metrics: dict[str, Metric] = {
        f"{prefix}/cos": (cos, defined),
        f"{prefix}/angle_deg": (torch.rad2deg(torch.arccos(cos)) * defined, defined),
        f"{prefix}/norm_ratio": (used_norm / ref_norm.clamp(min=1e-300) * defined, defined),
        f"{prefix}/norm_used": (used_norm, one),
        f"{prefix}/norm_unclipped": (ref_norm, one),
    }
    if not per_group:
        return metrics
    with torch.no_grad():
        bins = probability_bins(logps, num_bins, mask)
        valid = mask.bool()
        signs = {"pos": (adv > 0) & valid, "neg": (adv < 0) & valid}
    has_used = (used_norm > 0).double()
    groups = [(b, sign, selector & (bins == b)) for b in range(num_bins) for sign, selector in signs.items()]
    # An empty group's gradient is 0 (no backward pass needed); with a zero used gradient no share is defined
    # (has_used = 0), so no group is differentiated.
    grads = [_flat_grad(aggregate(per_token_loss * group), params).double() if has_used and bool(group.any())
             else None for _, _, group in groups]
    norms = torch.stack([g.norm() if g is not None else used_norm.new_zeros(()) for g in grads])
    norm_total = norms.sum()
    for (b, sign, _), g, norm in zip(groups, grads, norms):
        share = torch.dot(g, used) / used_norm.clamp(min=1e-300) ** 2 if g is not None else used_norm.new_zeros(())
        metrics[f"{prefix}/share/bin{b}/{sign}"] = (share * has_used, has_used)
        metrics[f"{prefix}/norm_share/bin{b}/{sign}"] = (norm / norm_total.clamp(min=1e-300) * has_used, has_used)
    return metrics
