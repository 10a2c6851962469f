"""MATH reward: binary correctness of the last ``\\boxed{...}`` of a completion, checked by math-verify.

Rule (tasks spec, "Math"): extract the LAST ``\\boxed{...}`` (balanced braces; ``\\boxed {..}`` and ``\\fbox{..}``
too) and compare it with the gold answer by math-verify (symbolic and numeric equivalence): 1.0 if equivalent,
else 0.0. A completion without a complete box scores 0.0; a missing gold (``None``) gives ``None`` (TRL: "not my
task").

Checks run in four stages, so that a training step is never stalled by one completion:

1. a fast check of normalised strings, only where its decision is certainly math-verify's (``fast_score``): equal
   strings, and integers / decimals / integer fractions compared by value;
2. a screen of the predicted answer (``screen_answer``): input that would keep math-verify busy for seconds (too
   long, too deeply nested, an exponent tower, a huge power) scores 0 without being parsed;
3. an LRU cache ``(gold, pred) -> score``;
4. math-verify (skipping its slow ``simplify`` where the outcome is certain, ``sympy_shortcut``), always in worker
   processes (math-verify's signal-based timeouts fail outside the main thread and cannot stop a sympy call stuck
   in C, so they are disabled): each check has a deadline of ``timeout`` seconds; a check past it scores 0 and its
   worker is killed and replaced by a spare process started in advance, so that the next check does not wait for
   an interpreter to start. Batches with at least ``parallel_threshold`` such checks are spread over
   ``num_workers`` processes, smaller ones use one. The completion is only parsed, never executed.

Screened and timed-out answers are logged as warnings and, under TRL, as the metrics ``math_reward/screened`` and
``math_reward/timed_out`` (fractions of the completions of a call).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
import weakref
from collections import Counter, OrderedDict, deque
from fractions import Fraction
from functools import lru_cache
from multiprocessing.connection import Connection, wait

from .common import completion_text

logger = logging.getLogger(__name__)

_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.S)


def last_boxed(text: str) -> str | None:
    """Content of the last top-level ``\\boxed{...}`` / ``\\fbox{...}`` of ``text``, braces balanced (``\\{``, ``\\}``
    are escaped, not structural); ``None`` when there is none or the last one is unterminated (truncated output)."""
    found, pos = None, 0
    while (match := _BOX_OPEN.search(text, pos)) is not None:
        depth = 1
        for token in _BRACE_TOKEN.finditer(text, match.end()):
            depth += {"{": 1, "}": -1}.get(token.group(), 0)
            if depth == 0:
                found, pos = text[match.end() : token.start()], token.end()
                break
        else:
            return None
    return found


# Scanned left to right so that ``\\\\`` (a line break) is one token: in ``\\\\ x`` no ``\\ `` control space is seen.
_LATEX_NOISE = re.compile(r"\\\\|\\(?:[,;:!]|(?:left|right|displaystyle)(?![A-Za-z])|(?= )|[dt](?=frac(?![A-Za-z])))")
_SPACE_NOT_BETWEEN_LETTERS = re.compile(r"(?<![A-Za-z])\s+|\s+(?![A-Za-z])")
_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)")
_FRACTION = re.compile(r"([+-]?)(?:\\frac\{(\d+)\}\{(\d+)\}|(\d+)/(\d+))")
_MAX_FAST_CHARS = 200  # longer numbers go to math-verify (and int() refuses > 4300 digits)


def _drop_noise(match: re.Match) -> str:
    token = match.group()
    return token if token == "\\\\" else "\\" if token in (r"\d", r"\t") else ""


def _strip_dollars(answer: str) -> str:
    """``answer`` without enclosing ``$...$`` / ``$$...$$`` (an escaped ``\\$`` is kept)."""
    answer = answer.strip()
    while len(answer) >= 2 and answer[0] == answer[-1] == "$" and answer[-2] != "\\":
        answer = answer[1:-1].strip()
    return answer


def normalize_answer(answer: str) -> str:
    """Meaning-preserving LaTeX normalisation for the fast check only (math-verify gets the answer as written):
    drop ``\\left``/``\\right``, ``\\displaystyle`` and thin spaces, ``\\dfrac``/``\\tfrac`` -> ``\\frac``, drop spaces
    not between two letters, enclosing ``$`` and a trailing period."""
    answer = _LATEX_NOISE.sub(_drop_noise, answer)
    return _strip_dollars(_SPACE_NOT_BETWEEN_LETTERS.sub("", re.sub(r"\s+", " ", answer)).rstrip("."))


def gold_answer(gold) -> str | None:
    """The gold answer as a string: a number is formatted, a ``\\boxed{}`` gold (Minerva) is unwrapped, ``$...$``
    (OlympiadBench) is stripped; ``None`` or blank -> ``None``."""
    if gold is None:
        return None
    gold = str(gold)
    boxed = last_boxed(gold)
    return _strip_dollars(boxed if boxed is not None else gold) or None


def _exact_value(answer: str) -> tuple[Fraction, bool] | None:
    """``(value, is_decimal)`` of an integer, a decimal or an integer fraction (``\\frac{a}{b}``, ``a/b``), else
    ``None``."""
    if len(answer) > _MAX_FAST_CHARS:
        return None
    if _DECIMAL.fullmatch(answer):
        return Fraction(answer), "." in answer
    match = _FRACTION.fullmatch(answer)
    if match is None:
        return None
    sign, numerator, denominator = match.group(1), match.group(2) or match.group(4), match.group(3) or match.group(5)
    if int(denominator) == 0:
        return None
    return Fraction(int(sign + numerator), int(denominator)), False


def fast_score(gold: str, pred: str) -> float | None:
    """Score of normalised ``gold``/``pred`` when it is certainly math-verify's, else ``None`` (ask math-verify).

    Equal strings score 1; an empty prediction 0. Integers and integer fractions are exact in math-verify (sympy
    ``Integer``/``Rational``): equal values score 1, others 0. With a decimal, math-verify rounds to 6 decimals at
    15 significant digits: equal values score 1, values further apart than that rounding can join score 0.
    """
    if gold == pred:
        return 1.0
    if not pred:
        return 0.0
    gold_value, pred_value = _exact_value(gold), _exact_value(pred)
    if gold_value is None or pred_value is None:
        return None
    (a, a_decimal), (b, b_decimal) = gold_value, pred_value
    if a == b:
        return 1.0
    if not (a_decimal or b_decimal):
        return 0.0
    diff = abs(a - b)
    if diff > Fraction(1, 10**5) and diff > max(abs(a), abs(b)) / 10**9:
        return 0.0
    return None


# The screen's limits. The gold answers of the six evaluation sets and of ORZ reach at most 210 characters, 4 nested
# groups, exponents 1 level deep and a 3.1-million-digit power (3^{6567340}); tested in tests/test_math_reward.py.
MAX_ANSWER_CHARS = 500
MAX_NESTING = 6
MAX_EXPONENT_LEVEL = 2  # e^{-x^{2}} passes, x^{x^{x^{x}}} does not
MAX_POWER_DIGITS = 10**7
# A command, an escaped character, an integer or any other character (spaces are skipped).
_SCREEN_TOKEN = re.compile(r"\\[A-Za-z]+|\\.|[0-9]+|\S", re.S)
_OPENERS, _CLOSERS = frozenset(["{", "(", "[", r"\{"]), frozenset(["}", ")", "]", r"\}"])


def screen_answer(answer: str) -> str | None:
    """Why math-verify must not see the predicted ``answer`` (it would take seconds or hang sympy), else ``None``.

    Rules (math-verify 0.9 on the loaded 2-core development machine: parsing 6 nested braces takes about 1 s, 100
    nested braces 7 s, 10 nested ``x^{`` 4 s, a 2,000-term sum 1 s; ``10^{10000000}`` takes over 10 s):

    - size: more than ``MAX_ANSWER_CHARS`` characters (a 20,000-term sum);
    - nesting: more than ``MAX_NESTING`` nested groups ``{ ( [ \\{`` (thousands of nested braces);
    - exponent tower: a power more than ``MAX_EXPONENT_LEVEL`` levels up, counting an exponent of an exponent and
      a chained ``a^b^c`` (which latex2sympy reads as ``(a^b)^c``) as one level more (hundreds of nested ``x^{``);
    - huge number: a number raised to a number inside an exponent (``9^{9^{9}}``, ``(1+x)^{10^{6}}``), or to an
      integer with more than ``MAX_POWER_DIGITS`` digits in the result (``10^{100000000}``).

    The limits leave room above every gold answer rather than promise speed: what passes and is still slow (the
    gold ``3^{6567340}`` itself, ``(10^{8})!``) is stopped by the reward's per-check deadline.
    """
    if len(answer) > MAX_ANSWER_CHARS:
        return "size"
    tokens = _SCREEN_TOKEN.findall(answer)

    def at(k: int) -> str:
        return tokens[k] if 0 <= k < len(tokens) else ""

    groups: list[int] = []  # per open group: the level of the power it is the exponent of (0: not an exponent)
    ended: dict[int, int] = {}  # index of a token that ends an exponent -> its power's level (for chains a^b^c)
    for i, token in enumerate(tokens):
        if token in _OPENERS:
            groups.append(ended.pop(i, 0) if token == "{" else 0)
            if len(groups) > MAX_NESTING:
                return "nesting"
        elif token in _CLOSERS and groups:
            if level := groups.pop():
                ended[i] = level
        elif token == "^":
            level = ended[i - 1] + 1 if i - 1 in ended else max(groups, default=0) + 1
            if level > MAX_EXPONENT_LEVEL:
                return "exponent tower"
            braced = at(i + 1) == "{"
            exponent = at(i + 2) if braced else at(i + 1)
            if _is_integer(at(i - 1)) and _is_integer(exponent):
                whole = not braced or at(i + 3) == "}"  # the exponent is this integer
                if level > 1 or (whole and int(exponent) * len(at(i - 1)) > MAX_POWER_DIGITS):
                    return "huge number"
            ended[i + 1] = level  # a single-token exponent ends here; a group "{" takes the level when it opens
    return None


def _is_integer(token: str) -> bool:
    return token.isascii() and token.isdigit()


@lru_cache(maxsize=1024)
def _parse(answer: str):
    from math_verify import LatexExtractionConfig, parse  # deferred: math-verify, only the checkers load it

    return parse(
        "\\boxed{" + answer + "}",
        extraction_config=[LatexExtractionConfig(boxed_match_priority=0)],
        parsing_timeout=None,
    )


# Generic values for free symbols (Euler-Mascheroni, Apery, Catalan, golden ratio, Khinchin constants).
_GENERIC = (0.5772156649015329, 1.2020569031595942, 0.9159655941772190, 1.6180339887498949, 2.6854520010653064)


def _plain(item) -> bool:
    """A parsed answer that math-verify compares only by equality, numbers and ``simplify``: an expression that is no
    bare symbol (``ab`` vs ``a*b``), matrix or percentage (``x% == x``), and has no float next to a symbol."""
    from sympy import Expr, Float, Symbol, UnevaluatedExpr  # deferred: sympy, only the checker processes load it

    return (
        isinstance(item, Expr)
        and not isinstance(item, Symbol)
        and not getattr(item, "is_Matrix", False)
        and not item.has(UnevaluatedExpr)
        and not (item.free_symbols and item.has(Float))
    )


def _value(item, point: dict) -> complex | None:
    try:
        value = complex(item.evalf(30, subs=point))
    except Exception:  # not a number there (undefined function, ...)
        return None
    return value if abs(value) < float("inf") else None


def _structurally_equal(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return False


def _apart(gold, pred, points: list[dict]) -> bool | None:
    """Whether ``gold`` and ``pred`` differ at some point by more than 6-decimal rounding joins (``None``: no value)."""
    values = [(_value(gold, point), _value(pred, point)) for point in points]
    if any(a is None or b is None for a, b in values):
        return None
    return any(abs(a - b) > 1e-5 and abs(a - b) > 1e-9 * max(abs(a), abs(b)) for a, b in values)


def sympy_shortcut(parsed_gold: list, parsed_pred: list) -> float | None:
    """math-verify's decision on two parsed answers where it is certain without its slowest step,
    ``simplify(gold - pred)``, else ``None``. Only plain expressions (``_plain``) that are not structurally equal
    (math-verify's first, cheap test) are decided: 0.0 if every gold/pred pair differs, at two generic points of
    the free symbols, by more than math-verify's 6-decimal float rounding can join; 1.0 if a gold/pred difference
    with free symbols expands to 0 (a polynomial identity, which ``simplify`` finds)."""
    from sympy import expand  # deferred: sympy, only the checker processes load it

    golds = [x for x in parsed_gold if not isinstance(x, str)]
    preds = [x for x in parsed_pred if not isinstance(x, str)]
    if not golds or not preds or not all(_plain(x) for x in golds + preds):
        return None
    if any(_structurally_equal(g, p) for g in parsed_gold for p in parsed_pred):
        return None
    symbols = sorted(set().union(*(x.free_symbols for x in golds + preds)), key=str)
    if len(symbols) > len(_GENERIC):
        return None
    points = [dict(zip(symbols, _GENERIC[shift:] + _GENERIC[:shift])) for shift in (0, 1)] if symbols else [{}]
    if all(_apart(g, p, points) for g in golds for p in preds):
        return 0.0
    if symbols and any(expand(g - p) == 0 for g in golds for p in preds):
        return 1.0
    return None


def verify_answer(gold: str, pred: str) -> float:
    """math-verify's decision (1.0/0.0) on answers ``gold`` and ``pred``, without a time bound: run it in a worker."""
    from math_verify import verify  # deferred: math-verify, only the checker processes load it

    try:
        parsed_gold = _parse(gold)
        if not parsed_gold:
            return 0.0
        parsed_pred = _parse(pred)
        shortcut = sympy_shortcut(parsed_gold, parsed_pred)
        if shortcut is not None:
            return shortcut
        return float(verify(parsed_gold, parsed_pred, timeout_seconds=None))
    except Exception:  # math-verify already swallows most errors; a parser crash on hostile input scores 0
        return 0.0


_WORKER_MEMORY_BYTES = 4 << 30


def _serve(read_fd: int, write_fd: int) -> None:
    """Worker loop: receive ``(gold, pred)``, send back its score; exit when the parent closes the pipe."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    try:  # sympy can grow a number past RAM before the deadline: fail it with MemoryError (scores 0) instead
        import resource  # deferred: POSIX only (the guard lets the worker run elsewhere)

        resource.setrlimit(resource.RLIMIT_AS, (_WORKER_MEMORY_BYTES, resource.getrlimit(resource.RLIMIT_AS)[1]))
    except (ImportError, ValueError, OSError):  # not POSIX, or a lower limit is already set
        pass
    inbox, outbox = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    verify_answer("1", "1")  # warm up the parser before reporting ready
    outbox.send("ready")
    while True:
        try:
            gold, pred = inbox.recv()
        except (EOFError, OSError):
            return
        outbox.send(verify_answer(gold, pred))


# The worker imports this module with the caller's sys.path (a source checkout need not be installed).
_WORKER_CODE = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[3]); "
    "from acpo_trl.rewards.math import _serve; _serve(int(sys.argv[1]), int(sys.argv[2]))"
)


class _Worker:
    """One checker: a fresh interpreter (not a fork or spawn of the caller, which would re-run an unguarded
    training script's ``__main__``) talking over two pipes."""

    def __init__(self):
        to_child, from_parent = os.pipe()
        from_child, to_parent = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, "-c", _WORKER_CODE, str(to_child), str(to_parent), json.dumps(sys.path)],
            pass_fds=(to_child, to_parent),
            stdin=subprocess.DEVNULL,
        )
        os.close(to_child)
        os.close(to_parent)
        self.outbox = Connection(from_parent, readable=False)
        self.conn = Connection(from_child, writable=False)
        self.ready = False

    def send(self, pair: tuple[str, str]) -> None:
        self.outbox.send(pair)

    def kill(self) -> subprocess.Popen:
        """Kill the process and close the pipes; returns the process, to be reaped later (the kernel can take a
        while to free a large address space)."""
        self.process.kill()
        self.outbox.close()
        self.conn.close()
        return self.process


class _Pool:
    """Persistent checker processes, each check under its own deadline, and one spare started in advance that
    replaces a killed or dead worker without making a check wait for an interpreter to start."""

    startup_timeout = 120.0

    def __init__(self):
        self.workers: list[_Worker] = []
        self.spare: _Worker | None = None
        self.killed: list[subprocess.Popen] = []
        _POOLS.add(self)

    def _fresh_worker(self) -> _Worker:
        """The spare (started earlier, ready or nearly), or a new process if it died; a new spare starts now."""
        worker = self.spare if self.spare is not None and self.spare.process.poll() is None else _Worker()
        self.spare = _Worker()
        return worker

    def run(self, pairs: list[tuple[str, str]], num_workers: int, timeout: float) -> list[float | None]:
        """Scores of ``pairs``; ``None`` for a check that timed out or crashed its worker."""
        self.killed = [process for process in self.killed if process.poll() is None]  # reap the killed ones
        while len(self.workers) < num_workers:
            self.workers.append(self._fresh_worker())
        results: list[float | None] = [None] * len(pairs)
        todo = deque(range(len(pairs)))
        idle = [w for w in self.workers[:num_workers] if w.ready]
        starting = {w: time.monotonic() + self.startup_timeout for w in self.workers[:num_workers] if not w.ready}
        busy: dict[_Worker, tuple[int, float]] = {}
        try:
            while todo or busy:
                while idle and todo:
                    worker, index = idle.pop(), todo.popleft()
                    try:
                        worker.send(pairs[index])
                    except OSError:  # it died while idle: the check was not attempted, give it to another
                        logger.warning("math_reward: a checker process had died; starting a new one.")
                        todo.appendleft(index)
                        starting[self._replace(worker)] = time.monotonic() + self.startup_timeout
                        continue
                    busy[worker] = (index, time.monotonic() + timeout)
                waiting = {w.conn: w for w in [*busy, *starting]}
                next_deadline = min([d for _, d in busy.values()] + list(starting.values()))
                for conn in wait(list(waiting), timeout=max(0.0, next_deadline - time.monotonic())):
                    worker = waiting[conn]
                    try:
                        message = conn.recv()
                    except (EOFError, OSError):
                        message = None
                    if worker in starting:
                        if message != "ready":
                            raise RuntimeError("math_reward: a checker process died while starting (see its stderr).")
                        del starting[worker]
                        worker.ready = True
                        idle.append(worker)
                    else:
                        index, _ = busy.pop(worker)
                        if message is None:
                            logger.warning("math_reward: a checker process crashed; the completion scores 0.")
                            starting[self._replace(worker)] = time.monotonic() + self.startup_timeout
                        else:
                            results[index] = message
                            idle.append(worker)
                now = time.monotonic()
                for worker, (index, deadline) in list(busy.items()):
                    if deadline <= now:
                        del busy[worker]
                        logger.warning("math_reward: a check exceeded %.3g s; the completion scores 0.", timeout)
                        starting[self._replace(worker)] = now + self.startup_timeout
                if any(deadline <= now for deadline in starting.values()):
                    raise RuntimeError(
                        f"math_reward: a checker process did not start within {self.startup_timeout:.0f} s."
                    )
        finally:
            for worker in busy:  # interrupted mid-check: its late answer must not reach the next call
                self._replace(worker)
        return results

    def _replace(self, worker: _Worker) -> _Worker:
        self.killed.append(worker.kill())
        new = self._fresh_worker()
        self.workers[self.workers.index(worker)] = new
        return new

    def close(self) -> None:
        """Kill every process of the pool and wait for them."""
        workers = [*self.workers, *([self.spare] if self.spare is not None else [])]
        for process in [*(worker.kill() for worker in workers), *self.killed]:
            process.wait()
        self.workers, self.spare, self.killed = [], None, []


_POOLS: weakref.WeakSet[_Pool] = weakref.WeakSet()
_REWARDS: weakref.WeakSet[MathReward] = weakref.WeakSet()


@atexit.register
def _close_pools() -> None:  # a worker stuck in sympy would not notice the closed pipe
    for pool in list(_POOLS):
        pool.close()


def _forget_after_fork() -> None:
    """In a forked child: the parent's checker processes and locks are not this process's to use or to kill, so
    every reward starts afresh (its processes start on its first call)."""
    _POOLS.clear()
    for reward in list(_REWARDS):
        reward._setup()


os.register_at_fork(after_in_child=_forget_after_fork)


def _default_num_workers() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(8, cores))


class MathReward:
    """Callable MATH reward with TRL's signature (see the module docstring for the rule and the stages).

    Args:
        timeout: seconds allowed to one math-verify check (parse + verify) before it scores 0. With the spare
            process that replaces a killed worker, a completion is decided within 1 s at the default 0.9 s.
        num_workers: checker processes for large batches (default: available cores, at most 8).
        parallel_threshold: batches with at least this many math-verify checks use ``num_workers`` processes,
            smaller ones one process.
        cache_size: entries of the ``(gold, pred) -> score`` LRU cache.
    """

    __name__ = "math_reward"

    def __init__(
        self,
        timeout: float = 0.9,
        num_workers: int | None = None,
        parallel_threshold: int = 32,
        cache_size: int = 4096,
    ):
        if timeout <= 0:
            raise ValueError(f"`timeout` must be > 0 seconds, got {timeout}.")
        if num_workers is not None and num_workers < 1:
            raise ValueError(f"`num_workers` must be >= 1 (or None for the number of cores), got {num_workers}.")
        self.timeout = timeout
        self.num_workers = num_workers or _default_num_workers()
        self.parallel_threshold = parallel_threshold
        self.cache_size = cache_size
        self._setup()

    def _setup(self) -> None:
        self._cache: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._pool: _Pool | None = None
        self._lock = threading.Lock()
        _REWARDS.add(self)

    def __getstate__(self):
        return {k: getattr(self, k) for k in ("timeout", "num_workers", "parallel_threshold", "cache_size")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._setup()

    def __repr__(self) -> str:
        return (
            f"MathReward(timeout={self.timeout}, num_workers={self.num_workers}, "
            f"parallel_threshold={self.parallel_threshold}, cache_size={self.cache_size})"
        )

    def __call__(self, prompts=None, completions=None, answer=None, log_metric=None, **kwargs) -> list[float | None]:
        if completions is None or answer is None:
            raise ValueError(
                "math_reward needs `completions` and the gold column `answer` (one string per completion): "
                "build the dataset with acpo_trl.data.math loaders or add an `answer` column."
            )
        if len(answer) != len(completions):
            raise ValueError(f"math_reward got {len(completions)} completions but {len(answer)} `answer` values.")
        golds = [gold_answer(gold) for gold in answer]
        preds = [last_boxed(completion_text(c)) for c in completions]
        with self._lock:  # one call at a time: the cache and the checker processes are shared
            scores, screened, timed_out = self._score([None if p is None else _strip_dollars(p) for p in preds], golds)
        if screened:
            reasons = ", ".join(f"{reason} {count}" for reason, count in sorted(screened.items()))
            logger.warning("math_reward: %d answer(s) screened out before math-verify (%s); they score 0.",
                           screened.total(), reasons)
        if log_metric is not None:  # TRL's GRPOTrainer passes it: averaged over the logging step
            log_metric("math_reward/screened", screened.total() / max(1, len(scores)))
            log_metric("math_reward/timed_out", timed_out / max(1, len(scores)))
        return scores

    def _score(self, preds: list[str | None], golds: list[str | None]) -> tuple[list[float | None], Counter, int]:
        """Scores, the screen's rejections by reason, and the number of checks that timed out or crashed."""
        scores: list[float | None] = []
        screened: Counter[str] = Counter()
        slow: dict[tuple[str, str], list[int]] = {}
        for i, (pred, gold) in enumerate(zip(preds, golds)):
            if gold is None or pred is None:
                scores.append(None if gold is None else 0.0)
                continue
            score = fast_score(normalize_answer(gold), normalize_answer(pred))
            if score is None and (reason := screen_answer(pred)) is not None:
                screened[reason] += 1
                score = 0.0
            elif score is None and (gold, pred) in self._cache:
                self._cache.move_to_end((gold, pred))
                score = self._cache[(gold, pred)]
            elif score is None:
                slow.setdefault((gold, pred), []).append(i)
            scores.append(score)
        timed_out = 0
        if slow:
            pairs = list(slow)
            if self._pool is None:
                self._pool = _Pool()
            num_workers = self.num_workers if len(pairs) >= self.parallel_threshold else 1
            for pair, score in zip(pairs, self._pool.run(pairs, num_workers, self.timeout)):
                for i in slow[pair]:
                    scores[i] = 0.0 if score is None else score
                if score is None:  # a timeout may be load, not the input: check it again next time
                    timed_out += len(slow[pair])
                else:
                    self._cache[pair] = score
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return scores, screened, timed_out

    def close(self) -> None:
        """Stop the checker processes (they also stop with the interpreter); a later call starts new ones."""
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None


math_reward = MathReward()
"""Default instance: ``GRPOTrainer(reward_funcs=[math_reward], ...)`` with a dataset that has an ``answer`` column."""
