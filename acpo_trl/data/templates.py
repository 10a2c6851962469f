"""Prompt templates.

- ``"base"``: the ACPO paper's template for base models (no chat template), the Open-Reasoner-Zero
  "A conversation between User and Assistant ..." prompt that ends with ``Assistant: <think>``. The prompt
  is a plain string; TRL then treats completions as plain text.
- ``"chat"``: one user turn (conversational format, the model's chat template applies), the Δlog p paper's
  style: the question followed by an instruction line.
"""

from __future__ import annotations

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
