"""Two-model smoke run: the offline SmolLM2-135M-Instruct against a briefly fine-tuned copy of itself.

A few plain SGD steps teach the copy to answer "... The answer is \\boxed{N}."; Δlog p between the two should then
be concentrated on few tokens, and signed as in Huang et al. 2026 (Fig. 2): positive on average on the fine-tuned
model's own samples, negative on the base model's.
"""

from __future__ import annotations

import copy

import pytest
import torch

from acpo_trl.dlogp import eos_token_ids, score_responses, single_model_generate
from acpo_trl.dlogp.analysis import records_from_scores, summary

pytestmark = pytest.mark.slow

TRAIN = [(3, 4), (5, 2), (6, 1), (2, 7)]
TEST = [(1, 8), (4, 4), (9, 0), (2, 5)]


def _prompt(tokenizer, a, b):
    return tokenizer(f"Question: What is {a} + {b}?\nAnswer:", add_special_tokens=False)["input_ids"]


def fine_tuned_copy(model, tokenizer, steps: int = 3, lr: float = 3e-2, trainable_layers: int = 4):
    """A copy of ``model`` after ``steps`` SGD steps on the answers of ``TRAIN`` (loss on the answer only; only the
    top ``trainable_layers`` decoder layers and the final norm learn, to keep the test fast)."""
    tuned = copy.deepcopy(model).train()
    for p in tuned.parameters():
        p.requires_grad_(False)
    params = [p for layer in tuned.model.layers[-trainable_layers:] for p in layer.parameters()]
    params += list(tuned.model.norm.parameters())
    for p in params:
        p.requires_grad_(True)
    pairs = [
        (_prompt(tokenizer, a, b), tokenizer(f" The answer is \\boxed{{{a + b}}}.", add_special_tokens=False)["input_ids"])
        for a, b in TRAIN
    ]
    width = max(len(p) + len(r) + 1 for p, r in pairs)
    input_ids = torch.full((len(pairs), width), tokenizer.pad_token_id)
    labels = torch.full((len(pairs), width), -100)
    mask = torch.zeros_like(input_ids)
    for i, (p, r) in enumerate(pairs):
        seq = p + r + [tokenizer.eos_token_id]
        input_ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, len(p) : len(seq)] = torch.tensor(seq[len(p) :])
        mask[i, : len(seq)] = 1
    optimizer = torch.optim.SGD(params, lr=lr)
    for _ in range(steps):
        tuned(input_ids=input_ids, attention_mask=mask, labels=labels).loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad()
    return tuned.eval()


def test_dlogp_is_sparse_and_signed_between_smollm2_and_a_fine_tuned_copy():
    from acpo_trl.utils.offline_model import load_offline_model

    torch.manual_seed(0)
    base, tokenizer = load_offline_model()
    base.eval()
    tuned = fine_tuned_copy(base, tokenizer)
    prompts = [_prompt(tokenizer, a, b) for a, b in TEST]
    groups = {}
    for source, model in (("base", base), ("rl", tuned)):
        out = single_model_generate(
            model,
            prompts,
            top_p=0.7,
            max_new_tokens=10,
            eos_ids=eos_token_ids(tokenizer, base),
            pad_token_id=tokenizer.pad_token_id,
            generator=torch.Generator().manual_seed(0),
        )
        groups[source] = out.responses
    responses = groups["base"] + groups["rl"]
    scores = score_responses(base, tuned, prompts * 2, responses, batch_size=8, chunk_tokens=16)
    records = records_from_scores(tokenizer, responses, scores, ["base"] * 4 + ["rl"] * 4)
    stats = summary(records)
    for source in ("base", "rl"):
        dlogp = stats[source]["dlogp"]
        assert dlogp["num_tokens"] >= 4
        assert dlogp["tokens_for_50pct_mass"] <= 0.3  # half of Σ|Δlog p| sits on under a third of the tokens
        assert dlogp["frac_abs_gt_1"] <= 0.25
    assert stats["rl"]["dlogp"]["mean"] > 0 > stats["base"]["dlogp"]["mean"]
