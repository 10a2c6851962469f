"""Tiny causal LMs and a byte-level tokenizer, built locally (no Hub): the tests', the benchmarks' and the quick
demo's models.

``build_tiny_model()`` is a 2-layer Qwen2 with a byte-level tokenizer (256 byte tokens + specials) and a minimal chat
template, so plain-text and conversational prompts both work. ``tiny_llama`` is the same at the Llama architecture
(SmolLM2's); ``TINY_ARCHITECTURES`` names both builders by architecture (``tests/test_recipe_training.py`` runs every
recipe on them).
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SPECIAL_TOKENS = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chat_tokenizer(**source):
    """A ``PreTrainedTokenizerFast`` from ``source`` (``tokenizer_object=`` a ``tokenizers.Tokenizer`` or
    ``tokenizer_file=`` a saved one) with this package's special tokens, minimal chat template and left padding.

    Reload a locally trained tokenizer this way, not with ``AutoTokenizer``, which may re-split it with a
    pre-tokenizer of its own (e.g. Qwen2's digit splitting)."""
    from transformers import PreTrainedTokenizerFast  # deferred: transformers, only making a tokenizer needs it

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
    byte_alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for symbol in sorted(byte_alphabet):
        vocab[symbol] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return chat_tokenizer(tokenizer_object=backend)


def _tiny_causal_lm(config_class, model_class, tokenizer, hidden_size: int, num_layers: int, seed: int,
                    max_position_embeddings: int):
    """A randomly initialised (``seed``) causal LM of ``model_class`` for ``tokenizer``: 4 heads, 2 KV heads, MLP
    2 x hidden, tied embeddings; EOS and padding set from the tokenizer for ``generate``."""
    import torch  # deferred: torch, only building a model needs it

    config = config_class(
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
    model = model_class(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def tiny_qwen2(tokenizer, *, hidden_size: int = 64, num_layers: int = 2, seed: int = 0,
               max_position_embeddings: int = 1024):
    """A tiny Qwen2 causal LM for ``tokenizer`` (:func:`_tiny_causal_lm`)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM  # deferred: transformers' model classes (and torch)

    return _tiny_causal_lm(Qwen2Config, Qwen2ForCausalLM, tokenizer, hidden_size, num_layers, seed,
                           max_position_embeddings)


def tiny_llama(tokenizer, *, hidden_size: int = 64, num_layers: int = 2, seed: int = 0,
               max_position_embeddings: int = 1024):
    """A tiny Llama causal LM for ``tokenizer``, the architecture of SmolLM2 (the offline model, ``offline:smollm2``),
    at ``tiny_qwen2``'s sizes (:func:`_tiny_causal_lm`)."""
    from transformers import LlamaConfig, LlamaForCausalLM  # deferred: transformers' model classes (and torch)

    return _tiny_causal_lm(LlamaConfig, LlamaForCausalLM, tokenizer, hidden_size, num_layers, seed,
                           max_position_embeddings)


#: Tiny stand-ins by architecture (``config.architectures[0]`` of the real model): a recipe's model at toy size.
TINY_ARCHITECTURES = {"Qwen2ForCausalLM": tiny_qwen2, "LlamaForCausalLM": tiny_llama}


def build_tiny_model(seed: int = 0, hidden_size: int = 64, num_layers: int = 2):
    """A tiny Qwen2 causal LM (about 100k parameters) and its byte-level tokenizer, deterministically initialised."""
    tokenizer = build_tokenizer()
    return tiny_qwen2(tokenizer, hidden_size=hidden_size, num_layers=num_layers, seed=seed), tokenizer
