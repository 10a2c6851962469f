"""``share_prompt_prefix``: the prefix every row of a micro-batch shares runs once, and log-probs, entropies,
losses, gradients and generated samples equal TRL's path (up to float rounding for the numbers, exactly for the
samples); the combination it cannot serve is refused."""

from __future__ import annotations

import pytest
import torch

from conftest import trainer_kwargs
from test_trl_equivalence import assert_same_loss_and_grads

from acpo_trl.training import shared_prefix
from acpo_trl.training.shared_prefix import generate_with_shared_prefix, shared_prefix_length


def test_shared_prefix_length_counts_common_columns_and_leaves_the_predicting_token():
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [5, 6, 7, 1, 9, 10], [5, 6, 7, 8, 2, 3]])
    mask = torch.ones_like(ids)
    assert shared_prefix_length(ids, mask, logits_to_keep=2) == 3
    assert shared_prefix_length(ids[[0, 0]], mask[:2], logits_to_keep=2) == 3  # identical rows: T - keep - 1
    assert shared_prefix_length(ids[[0, 0]], mask[:2], logits_to_keep=0) == 5
    padded = mask.clone()
    padded[1, 0] = 0  # left padding in one row only: the rows differ from column 0
    assert shared_prefix_length(ids, padded, logits_to_keep=2) == 0


def shared_prefix_inputs(vocab, batch=6, prefix=10, prompt_len=14, completion_len=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.cat([torch.randint(4, vocab, (1, prefix), generator=g).expand(batch, -1),
                            torch.randint(4, vocab, (batch, prompt_len - prefix), generator=g)], 1)
    completion_ids = torch.randint(4, vocab, (batch, completion_len), generator=g)
    completion_mask = torch.ones(batch, completion_len, dtype=torch.long)
    completion_mask[1, 4:] = 0  # an early EOS
    return prompt_ids, torch.ones_like(prompt_ids), completion_ids, completion_mask


@pytest.fixture(scope="module")
def trainer_pair(tmp_path_factory, tiny_dir):
    """GRPOTrainer, and ACPOTrainer with the fixed clip and share_prompt_prefix (TRL's loss, our forward)."""
    from trl import GRPOConfig, GRPOTrainer

    from acpo_trl import ACPOConfig, ACPOTrainer
    from acpo_trl.utils.tiny_models import build_tokenizer
    from acpo_trl.tasks.toy import toy_dataset, toy_reward

    common = trainer_kwargs(tmp_path_factory.mktemp("shared"), gradient_accumulation_steps=2,
                            steps_per_generation=4, max_completion_length=7, gradient_checkpointing=False,
                            loss_type="grpo")
    data, tokenizer = toy_dataset(16), build_tokenizer()
    trl = GRPOTrainer(tiny_dir, toy_reward, args=GRPOConfig(**common), train_dataset=data, processing_class=tokenizer)
    ours = ACPOTrainer(tiny_dir, toy_reward, train_dataset=data, processing_class=tokenizer,
                       args=ACPOConfig(**common, policy_loss="ppo_clip", dual_clip_c=None, share_prompt_prefix=True))
    for t in (trl, ours):
        t.current_gradient_accumulation_steps = 2
    return trl, ours


@pytest.fixture
def prefix_calls(monkeypatch):
    """The prefixes (their shapes) that the shared path ran."""
    calls = []
    original = shared_prefix.prefix_cache

    def counting(*args, **kwargs):
        calls.append(args[1].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr("acpo_trl.training.shared_prefix.prefix_cache", counting)
    return calls


def test_logps_entropies_and_gradients_equal_trls_forward(trainer_pair, prefix_calls):
    trl, ours = trainer_pair
    prompt_ids, prompt_mask, completion_ids, completion_mask = shared_prefix_inputs(trl.model.config.vocab_size)
    ids = torch.cat([prompt_ids, completion_ids], 1)
    mask = torch.cat([prompt_mask, completion_mask], 1)
    results = []
    for trainer in (trl, ours):
        trainer.model.train()
        trainer.model.zero_grad()
        logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, completion_ids.size(1), batch_size=4, compute_entropy=True)
        ((logps * completion_mask).sum() + (entropies * completion_mask).sum()).backward()
        grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
        results.append((logps.detach(), entropies.detach(), grads))
    assert prefix_calls == [torch.Size([1, 10])]  # the 10 shared tokens ran once for the two chunks
    (trl_logps, trl_entropies, trl_grads), (our_logps, our_entropies, our_grads) = results
    torch.testing.assert_close(our_logps, trl_logps, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(our_entropies, trl_entropies, rtol=1e-5, atol=2e-6)
    assert our_grads.keys() == trl_grads.keys() and trl_grads
    for name in trl_grads:
        torch.testing.assert_close(our_grads[name], trl_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_each_distinct_prompt_runs_once(trainer_pair, monkeypatch):
    """Rows from 3 distinct prompts (2 completions each): the prompts' remainders run at batch 3, and each row only
    its last prompt token and completion; the numbers still equal TRL's."""
    from acpo_trl.training import shared_prefix

    trl, ours = trainer_pair
    prompt_ids, prompt_mask, completion_ids, completion_mask = shared_prefix_inputs(trl.model.config.vocab_size)
    prompt_ids = prompt_ids[[0, 0, 1, 1, 2, 2]]
    ids, mask = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
    built = []
    original = shared_prefix.prompt_cache
    monkeypatch.setattr(shared_prefix, "prompt_cache", lambda *a: built.append(original(*a)) or built[-1])
    results = [t._get_per_token_logps_and_entropies(t.model, ids, mask, completion_ids.size(1), batch_size=4,
                                                    compute_entropy=True) for t in (trl, ours)]
    (prompts,) = built
    rows = prompts.row_prompt.tolist()
    assert rows[0] == rows[1] and rows[2] == rows[3] and rows[4] == rows[5] and len(set(rows)) == 3
    assert prompts.end == prompt_ids.size(1) - 1 and next(iter(prompts.cache))[0].size(0) == 3
    for trl_value, our_value in zip(results[0][:2], results[1][:2]):
        torch.testing.assert_close(our_value, trl_value, rtol=1e-5, atol=2e-6)


def test_loss_and_gradients_equal_grpo_trainer(trainer_pair, prefix_calls):
    trl, ours = trainer_pair
    prompt_ids, prompt_mask, completion_ids, completion_mask = shared_prefix_inputs(trl.model.config.vocab_size)
    inputs = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
              "completion_mask": completion_mask, "advantages": torch.tensor([1.3, -0.7, 0.4, -1.5, 0.9, -0.2]),
              "num_items_in_batch": completion_mask.sum().float() * 2}
    with torch.no_grad():
        logps, _, _ = trl._get_per_token_logps_and_entropies(
            trl.model, torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1),
            completion_ids.size(1))
    inputs["old_per_token_logps"] = logps + 0.6 * torch.randn(logps.shape, generator=torch.Generator().manual_seed(1))
    assert_same_loss_and_grads(trl, ours, inputs, loss_rtol=1e-5, grad_rtol=1e-4)
    assert prefix_calls == [torch.Size([1, 10])]  # the 10 tokens every prompt begins with


@pytest.mark.parametrize("do_sample,num_return_sequences", [(False, 1), (True, 3)])
def test_generation_with_the_prefix_cache_samples_the_same_tokens(tiny_model, do_sample, num_return_sequences):
    from transformers import GenerationConfig

    model, tokenizer = tiny_model
    model.eval()
    prompt_ids, prompt_mask, _, _ = shared_prefix_inputs(model.config.vocab_size, batch=4)
    config = GenerationConfig(max_new_tokens=6, do_sample=do_sample, top_k=0, num_return_sequences=num_return_sequences,
                              pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    outputs = []
    for generate in (type(model).generate, generate_with_shared_prefix):
        torch.manual_seed(0)
        with torch.inference_mode():
            outputs.append(generate(model, input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=config))
    assert outputs[0].shape == (4 * num_return_sequences, 14 + 6)
    assert torch.equal(outputs[0], outputs[1])


@pytest.mark.parametrize("lora", [False, True])
def test_training_run_with_shared_prefix_equals_trls_forward(tmp_path, tiny_dir, prefix_calls, lora):
    """Two optimizer updates per rollout on the toy task: the same losses, step by step, with and without it (and
    through a LoRA adapter: the prefix runs through the PEFT model)."""
    from peft import LoraConfig

    from acpo_trl import ACPOConfig, ACPOTrainer
    from acpo_trl.utils.tiny_models import build_tokenizer
    from acpo_trl.tasks.toy import toy_dataset, toy_reward

    losses = []
    for shared in (False, True):
        args = ACPOConfig(**trainer_kwargs(tmp_path / str(shared), steps_per_generation=2, max_steps=4,
                                           gradient_checkpointing=False, share_prompt_prefix=shared))
        peft = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]) if lora else None
        trainer = ACPOTrainer(tiny_dir, toy_reward, args=args, train_dataset=toy_dataset(32),
                              processing_class=build_tokenizer(), peft_config=peft)
        trainer.train()
        losses.append([e["policy_loss"] for e in trainer.state.log_history if "policy_loss" in e])
    assert len(losses[0]) == 4 and prefix_calls  # the toy prompts share their chat template's opening
    assert losses[1] == pytest.approx(losses[0], rel=1e-4, abs=1e-6)


def test_share_prompt_prefix_is_refused_with_gradient_checkpointing(tmp_path):
    from acpo_trl import ACPOConfig

    with pytest.raises(ValueError, match="share_prompt_prefix.*gradient_checkpointing: false"):
        ACPOConfig(**trainer_kwargs(tmp_path, share_prompt_prefix=True, gradient_checkpointing=True))
