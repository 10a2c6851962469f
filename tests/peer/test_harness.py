"""The peer harness itself: the offline models follow TRL's generator scripts, the stand-ins keep Qwen's ids, and
every listed expectation names an upstream test."""

import ast

import pytest

from .expectations import EXPECTED_FAILURES
from .offline_hub import CAUSAL_LM_ID, QWEN2_5_ADDED_TOKENS, REWARD_MODEL_ID, ZEN_ID
from .upstream import ABSENT, PEER_DIR, TESTS_DIR

if not TESTS_DIR.is_dir():
    pytest.skip(ABSENT, allow_module_level=True)

SCRIPTS = PEER_DIR / "trl" / "scripts" / "generate_tiny_models"


def _script_config_literals(script: str, call: str) -> dict:
    """The literal keyword arguments of the ``call(...)`` that builds the config in a generator script."""
    tree = ast.parse((SCRIPTS / script).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == call:
            return {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if isinstance(kw.value, ast.Constant)}
    raise AssertionError(f"{script}: no {call}(...) call")


@pytest.mark.parametrize(
    "repo_id, script, call",
    [
        (CAUSAL_LM_ID, "for_causal_lm/qwen2_for_causal_lm_2_5.py", "Qwen2Config"),
        (
            REWARD_MODEL_ID,
            "for_sequence_classification/qwen2_for_sequence_classification_2_5.py",
            "AutoConfig.from_pretrained",
        ),
    ],
)
def test_models_follow_the_generator_scripts(repo_id, script, call):
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    literals = _script_config_literals(script, call)
    assert literals, f"{script}: no literal sizes found"
    config = AutoConfig.from_pretrained(repo_id)  # offline, from the hub cache the fixture built
    assert {k: getattr(config, k) for k in literals} == literals
    assert len(config.layer_types) == config.num_hidden_layers
    assert "torch.bfloat16" in (SCRIPTS / script).read_text()
    assert AutoModel.from_pretrained(repo_id, dtype="auto").dtype == torch.bfloat16
    if repo_id == CAUSAL_LM_ID:  # the script's vocab_size=len(tokenizer.vocab)
        assert config.vocab_size == len(AutoTokenizer.from_pretrained(repo_id).vocab) == 256 + 22


def test_tokenizer_stand_in_has_qwen_special_tokens():
    from transformers import AutoTokenizer, GenerationConfig
    from trl.chat_template_utils import qwen2_5_chat_template

    tokenizer = AutoTokenizer.from_pretrained(CAUSAL_LM_ID)
    assert tokenizer.convert_ids_to_tokens(list(range(256, 256 + 22))) == list(QWEN2_5_ADDED_TOKENS)
    assert (tokenizer.pad_token, tokenizer.eos_token) == ("<|endoftext|>", "<|im_end|>")
    assert tokenizer("\n ").input_ids == [198, 220]  # as in Qwen's vocabulary
    assert tokenizer.chat_template == qwen2_5_chat_template
    text = "Beautiful is better than ugly.<|im_end|>"
    assert tokenizer.decode(tokenizer(text).input_ids) == text
    generation = GenerationConfig.from_pretrained(CAUSAL_LM_ID)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    assert (generation.eos_token_id, generation.pad_token_id, generation.top_k) == ([eos, pad], pad, 20)


def test_zen_is_generated_by_the_upstream_script():
    from .upstream import upstream_test_module

    load_dataset = upstream_test_module().load_dataset  # the stand-in bound by the offline_hub fixture
    splits = load_dataset(ZEN_ID, "standard_prompt_only")
    assert {name: len(split) for name, split in splits.items()} == {"train": 17, "test": 2}
    assert splits["train"][0] == {"prompt": "Beautiful is better than"}
    conversational = load_dataset(ZEN_ID, "conversational_prompt_only", split="train")
    assert conversational[0]["prompt"][0]["role"] == "user"
    streamed = load_dataset(ZEN_ID, "standard_prompt_only", split="test", streaming=True)
    assert [row["prompt"] for row in streamed] == splits["test"]["prompt"]


@pytest.mark.parametrize("test_id", sorted(EXPECTED_FAILURES))
def test_expectations_name_upstream_tests(test_id):
    """A listed id must name an upstream test (an entry for a test that no longer exists would be dead)."""
    from .upstream import upstream_test_module

    class_name, function = test_id.split("::")
    assert hasattr(getattr(upstream_test_module(), class_name, None), function.split("[")[0]), test_id
