"""Prompt templates.

- ``"base"``: the ACPO paper's template for base models (no chat template), the Open-Reasoner-Zero
  "A conversation between User and Assistant ..." prompt that ends with ``Assistant: <think>``. The prompt
  is a plain string; TRL then treats completions as plain text.
- ``"chat"``: one user turn (conversational format, the model's chat template applies), the Δlog p paper's
  style: the question followed by an instruction line.

``prompt_length`` counts a prompt's tokens as the trainer sees them; ``drop_long_prompts`` applies acpo-train's
``max_prompt_length``.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

BASE_TEMPLATE = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant solves it. "
    "The Assistant first thinks about the reasoning process in the mind and then provides the User with "
    "the answer. The reasoning process is enclosed within <think> </think> and answer is enclosed within "
    "<answer> </answer> tags, respectively, i.e., <think> reasoning process here </think> "
    "<answer> answer here </answer>.\nUser: {question}\n{instruction}\nAssistant: <think>"
)

TEMPLATES = ("base", "chat")


def build_prompt(question: str, instruction: str, template: str = "base"):
    """Wrap ``question`` and a task ``instruction`` in ``template`` ("base" -> str, "chat" -> list of messages)."""
    if template == "base":
        return BASE_TEMPLATE.format(question=question.strip(), instruction=instruction.strip())
    if template == "chat":
        return [{"role": "user", "content": f"{question.strip()}\n{instruction.strip()}"}]
    raise ValueError(f"Unknown prompt template {template!r}: `template` must be one of {TEMPLATES}.")


def prompt_length(tokenizer, prompt) -> int:
    """Tokens of ``prompt`` as the trainer sees it (through the chat template when conversational)."""
    if isinstance(prompt, str):
        return len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    encoded = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
    return len(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def drop_long_prompts(dataset, tokenizer, max_tokens: int):
    """``dataset`` without the rows whose prompt is longer than ``max_tokens`` tokens; logs how many went."""
    kept = dataset.filter(lambda row: prompt_length(tokenizer, row["prompt"]) <= max_tokens)
    if len(kept) < len(dataset):
        logger.warning("max_prompt_length=%d dropped %d of %d training prompts.", max_tokens,
                       len(dataset) - len(kept), len(dataset))
    if len(kept) == 0:
        raise ValueError(f"max_prompt_length={max_tokens} drops every training prompt; raise it.")
    return kept
