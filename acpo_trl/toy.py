"""A tiny causal LM, a byte-level tokenizer and a toy task, all built locally (no Hub).

Used by the tests, the benchmarks and the quick demo: ``build_tiny_model()`` is a 2-layer Qwen2 with a
byte-level tokenizer (256 byte tokens + specials) and a minimal chat template, so plain-text and
conversational prompts both work.

``tiny_llama`` is the same at the Llama architecture (SmolLM2's); ``TINY_ARCHITECTURES`` names both builders by
architecture (``tests/test_recipe_training.py`` runs every recipe on them).

The toy task (``toy_dataset`` / ``toy_reward``): the prompt names a letter, the reward is the mean closeness of
the completion's characters to that letter (1 for the letter itself, falling to 0 sixteen code points away).
A random byte-level policy earns partial credit on about one character in eight, so every group has reward
variance for GRPO advantages, and the tiny model learns the task in a few dozen steps.
"""

from __future__ import annotations

import random
from typing import Any

from .rewards.common import completion_text

SPECIAL_TOKENS = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOY_LETTERS = "abcdefgh"


def chat_tokenizer(**source):
    """A ``PreTrainedTokenizerFast`` from ``source`` (``tokenizer_object=`` a ``tokenizers.Tokenizer`` or
    ``tokenizer_file=`` a saved one) with this package's special tokens, minimal chat template and left padding.

    Reload a locally trained tokenizer this way, not with ``AutoTokenizer``, which may re-split it with a
    pre-tokenizer of its own (e.g. Qwen2's digit splitting)."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        **source,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        bos_token=None,
        additional_special_tokens=["<|endoftext|>", "<|im_start|>"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


def build_tokenizer():
    """A byte-level BPE tokenizer with no merges: every UTF-8 byte is one token, so any text round-trips."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    byte_alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for symbol in sorted(byte_alphabet):
        vocab[symbol] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return chat_tokenizer(tokenizer_object=backend)


def tiny_qwen2(tokenizer, *, hidden_size: int = 64, num_layers: int = 2, seed: int = 0,
               max_position_embeddings: int = 1024):
    """A randomly initialised (``seed``) Qwen2 causal LM for ``tokenizer``: 4 heads, 2 KV heads, MLP 2 x hidden,
    tied embeddings; EOS and padding set from the tokenizer for ``generate``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def tiny_llama(tokenizer, *, hidden_size: int = 64, num_layers: int = 2, seed: int = 0,
               max_position_embeddings: int = 1024):
    """A randomly initialised (``seed``) Llama causal LM for ``tokenizer``, the architecture of SmolLM2 (the offline
    model, ``offline:smollm2``): the sizes of ``tiny_qwen2`` (4 heads, 2 KV heads, MLP 2 x hidden, tied embeddings),
    EOS and padding from the tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


#: Tiny stand-ins by architecture (``config.architectures[0]`` of the real model): a recipe's model at toy size.
TINY_ARCHITECTURES = {"Qwen2ForCausalLM": tiny_qwen2, "LlamaForCausalLM": tiny_llama}


def build_tiny_model(seed: int = 0, hidden_size: int = 64, num_layers: int = 2):
    """A tiny Qwen2 causal LM (about 100k parameters) and its byte-level tokenizer, deterministically initialised."""
    tokenizer = build_tokenizer()
    return tiny_qwen2(tokenizer, hidden_size=hidden_size, num_layers=num_layers, seed=seed), tokenizer


def toy_dataset(num_prompts: int = 64, seed: int = 0):
    """Prompts ``"Write the letter x:"`` with the letter in a ``letter`` column, as a ``datasets.Dataset``."""
    from datasets import Dataset

    rng = random.Random(seed)
    letters = [rng.choice(TOY_LETTERS) for _ in range(num_prompts)]
    return Dataset.from_dict({"prompt": [f"Write the letter {c}:" for c in letters], "letter": letters})


TOY_REWARD_WIDTH = 16


def toy_reward(prompts: list, completions: list, letter: list[str], **kwargs: Any) -> list[float]:
    """Mean over the completion's characters of max(0, 1 - |ord(c) - ord(letter)| / 16); 0 when empty."""
    rewards = []
    for completion, target in zip(completions, letter):
        text = completion_text(completion)
        closeness = [max(0.0, 1 - abs(ord(c) - ord(target)) / TOY_REWARD_WIDTH) for c in text]
        rewards.append(sum(closeness) / len(closeness) if closeness else 0.0)
    return rewards
