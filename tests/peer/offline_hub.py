"""The Hub repositories TRL's GRPO tests load, built locally: two tiny Qwen2 models and the zen dataset.

The models follow TRL's generator scripts (``scripts/generate_tiny_models/for_causal_lm/qwen2_for_causal_lm_2_5.py``
and ``for_sequence_classification/qwen2_for_sequence_classification_2_5.py``): the same sizes, bf16 weights, TRL's
``init_weights_tiny_model``, and the reference model's (Qwen2.5-32B-Instruct) config and generation config. They are
written into a Hugging Face cache in the Hub's layout (``models--org--name/refs/main`` -> ``snapshots/<rev>/``), so
the tests' own ``from_pretrained("trl-internal-testing/...")`` resolves them with ``HF_HUB_OFFLINE=1``.

The one stand-in is the tokenizer: Qwen2.5's cannot be downloaded. ``build_tokenizer`` is a byte-level tokenizer
without merges: the 256 byte tokens (in GPT-2's byte order, as Qwen's first 256 ids: 198 is "\\n", 220 is " "), then
Qwen2.5's 22 added tokens in Qwen's order (``<|endoftext|>`` = pad, ``<|im_end|>`` = eos, ``<tool_call>``...) at ids
256-277 instead of 151643-151664, and TRL's copy of the Qwen2.5 chat template. A Qwen-sized vocabulary (151,665)
would keep Qwen's ids, but TRL 1.16's log-prob kernel loops over vocabulary chunks on CPU: one training test then
took minutes instead of seconds. So the causal LM's vocabulary (the script's ``len(tokenizer.vocab)``) is 278, and
the tests that hard-code Qwen token ids or need a Qwen-sized vocabulary are listed in ``expectations.py``.

The zen dataset is made by TRL's ``scripts/generate_zen_dataset.py`` itself, with ``push_to_hub`` writing the
parquet files into a local folder in the Hub repository's layout (``<config>/<split>-00000-of-00001.parquet`` and a
README whose YAML lists the configs), which ``datasets.load_dataset`` reads as it would read the Hub repository.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from unittest import mock

ORG = "trl-internal-testing"
CAUSAL_LM_ID = f"{ORG}/tiny-Qwen2ForCausalLM-2.5"
REWARD_MODEL_ID = f"{ORG}/tiny-Qwen2ForSequenceClassification-2.5"
ZEN_ID = f"{ORG}/zen"
#: Every Hub repository this module builds; a test that names any other one is skipped.
BUILT_REPOS = (CAUSAL_LM_ID, REWARD_MODEL_ID, ZEN_ID)

#: The revision name of every locally built repository (any 40-hex string: the Hub cache maps refs/main to it).
REVISION = "0" * 40

#: Qwen2.5's added tokens, in its id order (151643 on); the first 14 are special.
QWEN2_5_ADDED_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
)  # fmt: skip
QWEN2_5_NUM_SPECIAL = 14

#: config.json of Qwen/Qwen2.5-32B-Instruct, the reference the generator scripts read from the Hub (the reward
#: model's script builds its config from it; the causal LM's takes only the vocabulary size from its tokenizer).
QWEN2_5_32B_INSTRUCT_CONFIG = dict(
    attention_dropout=0.0, bos_token_id=151643, eos_token_id=151645, hidden_act="silu", hidden_size=5120,
    initializer_range=0.02, intermediate_size=27648, max_position_embeddings=32768, max_window_layers=70,
    num_attention_heads=40, num_hidden_layers=64, num_key_value_heads=8, rms_norm_eps=1e-06, rope_theta=1000000.0,
    sliding_window=131072, tie_word_embeddings=False, use_cache=True, use_sliding_window=False, vocab_size=152064,
)  # fmt: skip
#: generation_config.json of Qwen/Qwen2.5-32B-Instruct, with token ids as added-token names (mapped to the stand-in).
QWEN2_5_32B_INSTRUCT_GENERATION = dict(
    bos_token_id="<|endoftext|>", pad_token_id="<|endoftext|>", eos_token_id=["<|im_end|>", "<|endoftext|>"],
    do_sample=True, repetition_penalty=1.05, temperature=0.7, top_p=0.8, top_k=20,
)  # fmt: skip


def _load_file_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def build_tokenizer():
    """The byte-level stand-in for Qwen2.5's tokenizer (see the module docstring)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    from trl.chat_template_utils import qwen2_5_chat_template

    vocab = {symbol: i for i, symbol in enumerate(bytes_to_unicode().values())}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_tokens(
        [AddedToken(t, special=i < QWEN2_5_NUM_SPECIAL, normalized=False) for i, t in enumerate(QWEN2_5_ADDED_TOKENS)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=list(QWEN2_5_ADDED_TOKENS[1:QWEN2_5_NUM_SPECIAL]),
        model_max_length=131072,
    )
    tokenizer.chat_template = qwen2_5_chat_template
    return tokenizer


def _generation_config(tokenizer):
    from transformers import GenerationConfig

    def ids(value):
        return [ids(v) for v in value] if isinstance(value, list) else tokenizer.convert_tokens_to_ids(value)

    token_fields = ("bos_token_id", "pad_token_id", "eos_token_id")
    return GenerationConfig(
        **{k: ids(v) if k in token_fields else v for k, v in QWEN2_5_32B_INSTRUCT_GENERATION.items()}
    )


def build_models(peer_dir: Path):
    """``{repo_id: (model, tokenizer, generation_config)}``: the two tiny Qwen2 models, as TRL's scripts make them."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification

    common = _load_file_module(
        "trl_peer_generate_tiny_models_common", peer_dir / "trl/scripts/generate_tiny_models/_common.py"
    )
    tokenizer = build_tokenizer()
    generation_config = _generation_config(tokenizer)

    torch.manual_seed(0)
    lm_config = Qwen2Config(
        vocab_size=len(tokenizer.vocab),
        hidden_size=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=32,
    )
    lm = Qwen2ForCausalLM(lm_config).to(dtype=torch.bfloat16)
    common.init_weights_tiny_model(lm)

    rm_config = Qwen2Config(
        **{
            **QWEN2_5_32B_INSTRUCT_CONFIG,
            "num_labels": 1,
            "hidden_size": 16,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_hidden_layers": 2,
            "intermediate_size": 32,
        }
    )
    rm = Qwen2ForSequenceClassification(rm_config).to(dtype=torch.bfloat16)
    common.init_weights_tiny_model(rm)
    return {
        CAUSAL_LM_ID: (lm, tokenizer, generation_config),
        REWARD_MODEL_ID: (rm, tokenizer, generation_config),
    }


def _snapshot_dir(hub_cache: Path, repo_id: str, repo_type: str) -> Path:
    """Create a Hub cache entry for ``repo_id`` whose ``main`` is ``REVISION``; return its snapshot folder."""
    repo_dir = hub_cache / f"{repo_type}s--{repo_id.replace('/', '--')}"
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(REVISION)
    snapshot = repo_dir / "snapshots" / REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    return snapshot


def write_models(hub_cache: Path, peer_dir: Path) -> None:
    """Save the tiny models into ``hub_cache`` as the scripts' ``push_to_hub`` uploads them."""
    for repo_id, (model, tokenizer, generation_config) in build_models(peer_dir).items():
        snapshot = _snapshot_dir(hub_cache, repo_id, "model")
        model.save_pretrained(snapshot)
        tokenizer.save_pretrained(snapshot)
        generation_config.save_pretrained(snapshot)


def write_zen(zen_dir: Path, peer_dir: Path) -> None:
    """Run TRL's ``generate_zen_dataset.main`` with ``push_to_hub`` writing the configs under ``zen_dir``."""
    from datasets import DatasetDict

    script = _load_file_module("trl_peer_generate_zen_dataset", peer_dir / "trl/scripts/generate_zen_dataset.py")
    configs = []

    def save(dataset_dict, repo_id, config_name):
        assert repo_id == ZEN_ID, repo_id
        for split, dataset in dataset_dict.items():
            dataset.to_parquet(str(zen_dir / config_name / f"{split}-00000-of-00001.parquet"))
        files = [{"split": split, "path": f"{config_name}/{split}-*"} for split in dataset_dict]
        configs.append({"config_name": config_name, "data_files": files})

    zen_dir.mkdir(parents=True, exist_ok=True)
    with mock.patch.object(DatasetDict, "push_to_hub", save):
        script.main(test_size=0.1, push_to_hub=True, repo_id=ZEN_ID)
    (zen_dir / "README.md").write_text(f"---\n{json.dumps({'configs': configs}, indent=1)}\n---\n")


def build_offline_hub(root: Path, peer_dir: Path) -> tuple[Path, Path]:
    """Build the models into ``root/hub`` (an HF_HUB_CACHE) and the zen dataset into ``root/zen``."""
    hub_cache, zen_dir = root / "hub", root / "zen"
    write_models(hub_cache, peer_dir)
    write_zen(zen_dir, peer_dir)
    return hub_cache, zen_dir
