"""HiTab reward: the official HiTab answer matching (``hmt_score`` in microsoft/HiTab ``qa/table/utils.py``).

The model writes its final answer as the LAST ``<answer>...</answer>`` block of its completion, several items
separated by ``|`` in the order asked (``ANSWER_FORMAT``, stated in the prompt by ``acpo_trl.data.hitab``).
Prediction and gold then get the same normalisation and must be structurally equal:

- a number (int/float) becomes a float; a string is stripped and lowercased, then read as a number after dropping
  one leading ``(`` and one trailing ``%`` or ``)`` and all commas (``"52.1%"`` -> 52.1, ``"(5)"`` -> 5.0);
  otherwise it gets WikiTableQuestions' string normalisation (``normalize_string``);
- a one-item list counts as its item; a longer list is the list of its normalised items;
- types must match (a number never equals a string); numbers agree when ``|pred - gold| < 1e-5`` (absolute);
  strings are equal; lists have the same length and match element by element, in order.
"""

from __future__ import annotations

import math
import re
import unicodedata
from functools import lru_cache
from typing import Any

from acpo_trl.rewards.common import completion_text

ANSWER_FORMAT = (
    "Put the final answer inside <answer> </answer> tags. If there are several answers, separate them with "
    '" | " in the order asked, e.g. <answer> 52.1 </answer> or <answer> women | men </answer>.'
)
TOLERANCE = 1e-5
# An answer block longer than this scores 0 without being normalised (gold answers are < 300 characters); it
# bounds the time the string normalisation can take.
MAX_ANSWER_CHARS = 2000

_OPEN, _CLOSE = "<answer>", "</answer>"
_CITATION_MARKS = frozenset("•♦†‡*#+")
_DIGITS = frozenset("0123456789")
_QUOTES = str.maketrans({"‘": "'", "’": "'", "´": "'", "`": "'", "“": '"', "”": '"'})
_DASHES = str.maketrans(dict.fromkeys("‐‑‒–—−", "-"))
_PAREN_DETAILS = re.compile(r"(?<!^)( \([^)]*\))*$")
_QUOTED = re.compile(r'^"([^"]*)"$')
_SPACES = re.compile(r"\s+", flags=re.U)


def _strip_citations(x: str) -> str:
    """WikiTableQuestions' ``re.sub(r"((?<!^)\\[[^\\]]*\\]|\\[\\d+\\]|[•♦†‡*#+])*$", "", x)`` in linear time.

    The regex backtracks exponentially on inputs like ``"a" + "[1]" * 30``; this removes the same suffix: the
    longest one that splits into ``[...]`` groups (not at position 0 unless the group is ``[digits]``) and marks.
    """
    n = len(x)
    ok = [False] * (n + 1)  # ok[j]: x[j:] splits into removable pieces
    ok[n] = True
    next_close = -1
    for j in range(n - 1, -1, -1):
        c = x[j]
        if c == "]":
            next_close = j
        elif c in _CITATION_MARKS:
            ok[j] = ok[j + 1]
        if c == "[" and next_close > j and ok[next_close + 1]:
            ok[j] = j > 0 or (next_close > 1 and all(d in _DIGITS for d in x[1:next_close]))
    return x[: ok.index(True)]


def normalize_string(x: str) -> str:
    """WikiTableQuestions' string normalisation (HiTab ``qa/datadump/utils.py::normalize``).

    Strip diacritics, unify quotes and dashes, repeatedly remove trailing citations (``[1]``, ``•♦†‡*#+``),
    trailing `` (details)`` and surrounding double quotes, drop one final ``.``, collapse whitespace, lowercase.
    """
    x = "".join(c for c in unicodedata.normalize("NFKD", x) if unicodedata.category(c) != "Mn")
    x = x.translate(_QUOTES).translate(_DASHES)
    while True:
        old = x
        x = _strip_citations(x.strip())
        x = _PAREN_DETAILS.sub("", x.strip())
        x = _QUOTED.sub(r"\1", x.strip())
        if x == old:
            break
    if x.endswith("."):
        x = x[:-1]
    return _SPACES.sub(" ", x).lower().strip()


def normalize_item(item: Any) -> float | str:
    """One answer item as HiTab compares it: a float, or a normalised string (``naive_str_to_float``)."""
    if isinstance(item, (int, float)) and not isinstance(item, bool):
        return float(item)
    s = str(item).strip().lower()
    sanitized = s[1:] if s.startswith("(") else s
    if sanitized.endswith(("%", ")")):
        sanitized = sanitized[:-1]
    try:
        return float(sanitized.replace(",", ""))
    except ValueError:
        return normalize_string(s)


def _equal(pred: float | str, gold: float | str) -> bool:
    if isinstance(pred, float) and isinstance(gold, float):
        return math.fabs(pred - gold) < TOLERANCE
    return type(pred) is type(gold) and pred == gold


@lru_cache(maxsize=65536)
def _normalized_gold(gold: tuple) -> tuple:
    return tuple(normalize_item(g) for g in gold)


def hitab_score(prediction: list, gold: list) -> float:
    """1.0 if the answer lists match under the official rule (see module docstring), else 0.0.

    Both are flat lists of items; a one-item list counts as its item, so a scalar never equals a longer list.
    """
    if len(prediction) != len(gold) or not gold:
        return 0.0
    gold_items = _normalized_gold(tuple(gold))
    return float(all(_equal(normalize_item(p), g) for p, g in zip(prediction, gold_items)))


def extract_answer(text: str) -> list[str] | None:
    """The items of the last ``<answer>...</answer>`` block (split on ``|``, stripped), or None if there is none."""
    end = text.rfind(_CLOSE)
    start = text.rfind(_OPEN, 0, end) if end >= 0 else -1
    if start < 0:
        return None
    body = text[start + len(_OPEN) : end]
    if len(body) > MAX_ANSWER_CHARS:
        return None
    return [item.strip() for item in body.split("|")]


def _gold_list(answer: Any) -> list | None:
    if answer is None:
        return None
    if isinstance(answer, (list, tuple)):
        return list(answer)
    return [answer]


def hitab_reward(prompts, completions, answer, **kwargs) -> list[float | None]:
    """TRL reward: 1.0 when the completion's answer (``ANSWER_FORMAT``) matches the gold ``answer`` list under
    HiTab's official rule, else 0.0; None where the gold answer is None (TRL then ignores that reward)."""
    rewards: list[float | None] = []
    for completion, gold in zip(completions, answer, strict=True):
        gold = _gold_list(gold)
        if gold is None:
            rewards.append(None)
            continue
        items = extract_answer(completion_text(completion))
        rewards.append(0.0 if items is None else hitab_score(items, gold))
    return rewards
