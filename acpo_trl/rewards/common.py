"""Helpers shared by the reward callables."""

from __future__ import annotations

from typing import Any


def completion_text(completion: Any) -> str:
    """The text of one TRL completion: a plain string, or a conversation (list of ``{"role", "content"}``).

    For a conversation the assistant turns are joined; content given as a list of parts keeps its text parts.
    Anything else (None, numbers, malformed messages) yields ``""`` so that a reward scores it 0.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if not isinstance(completion, (list, tuple)):
        return ""
    texts = []
    for message in completion:
        if not isinstance(message, dict) or message.get("role", "assistant") != "assistant":
            continue
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, (list, tuple)):
            texts.extend(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return "\n".join(texts)
