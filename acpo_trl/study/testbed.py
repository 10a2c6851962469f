"""The CPU testbed (a small RL setting that learns on 2 CPU cores; docs/RESULTS.md, "Testbed"): addition problems, a tiny Qwen2 with a locally trained
byte-level BPE tokenizer, and a noisy-teacher supervised warm-up cached on disk.

Tasks ``add1`` and ``add2`` (``acpo_trl/tasks/testbed.py``; their problems in ``acpo_trl/data/testbed.py``, their
reward in ``acpo_trl/rewards/testbed.py``): one chat turn "What is a + b?"; completion "The answer is \\boxed{N}."
then the end of turn; reward 1 if the completion holds exactly one \\boxed{...} and its content is a + b, else 0.

Noisy teacher (the warm-up's targets): without a (units) carry right 50% of the time, else a + b +- 1; with a carry
right 25%, the carry dropped 60% (a + b - 10), +-1 15%. RL then has a systematic error to fix.

Trap: the tokenizer is reloaded with ``PreTrainedTokenizerFast``; ``AutoTokenizer`` would re-split
digits with the Qwen2 pre-tokenizer. Digits are single tokens here (``Digits(individual_digits=True)``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ..data.testbed import Problem, rl_dataset, task_problems
from ..evaluation.generation import SamplingSettings, TransformersBackend, tokenize_prompt
from ..rewards.testbed import BOXED, addition_reward
from ..utils.tiny_models import SPECIAL_TOKENS, chat_tokenizer, tiny_qwen2
from .cell import DEFAULT_LR, GridCell
from .results import code_version, write_result

ANSWER_FORMAT = "The answer is \\boxed{{{}}}."


# A testbed run is chaotic: one ulp early on changes its trajectory, and the warm-up that every run of a task starts
# from lands elsewhere. ATen picks its vectorised CPU kernels by the machine, so machines disagree: the add2 warm-up
# gave a step-0 held-out accuracy of 0.34 with AVX-512 kernels against 0.43 with AVX2 ones. Pinned to AVX2 (and MKL
# to its reproducible AVX2 path), an AVX-512 machine reproduced a run made on another machine bit for bit
# (docs/RESULTS.md, "Reproducibility"). ATen reads them at its first kernel dispatch: `acpo-study run` sets them for its
# workers, and before any run in its own process.
CPU_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}


def pin_cpu_kernels(env: dict | None = None) -> dict:
    """Set :data:`CPU_KERNELS` in ``env`` (default ``os.environ``) where the user has not set them; returns ``env``."""
    env = os.environ if env is None else env
    for name, value in CPU_KERNELS.items():
        env.setdefault(name, value)
    return env


def cpu_kernels() -> str:
    """The CPU kernels torch dispatches to in this process ("AVX2", "AVX512", ...): a run's result records it."""
    import torch  # deferred: torch, which only a run needs (a grid's specs and plan do not)

    return torch.backends.cpu.get_cpu_capability()


def sft_pool(task: str) -> list[Problem]:
    """The problems the warm-up's teacher answers (every pair of the task's operand range)."""
    lo, hi = (0, 10) if task == "add1" else (10, 100)
    return [Problem(a, b) for a in range(lo, hi) for b in range(lo, hi)]


def noisy_teacher(problem: Problem, rng: random.Random) -> int:
    """A sample of the deliberately wrong teacher's answer (see the module docstring)."""
    s = problem.answer
    u = rng.random()
    if problem.carry:
        if u < 0.25:
            return s
        if u < 0.85:
            return s - 10
        return max(0, s + rng.choice((-1, 1)))
    return s if u < 0.5 else max(0, s + rng.choice((-1, 1)))


@dataclass(frozen=True)
class WarmupSpec:
    """The tiny model and its noisy-teacher warm-up (the testbed's values by default)."""

    task: str = "add1"
    hidden_size: int = 128
    num_layers: int = 2
    vocab_size: int = 512
    steps: int = 1500
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 100
    seed: int = 0

    def key(self) -> str:
        digest = hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:10]
        return f"{self.task}-h{self.hidden_size}-s{self.steps}-{digest}"


def _render_prompt(problem: Problem) -> str:
    return f"<|im_start|>user\n{problem.question}<|im_end|>\n<|im_start|>assistant\n"


def _render_completion(answer: int) -> str:
    return ANSWER_FORMAT.format(answer) + "<|im_end|>"


def train_tokenizer(task: str, vocab_size: int, path: Path):
    """Train a byte-level BPE (digits kept as single tokens) on the task's texts; save and reload it with
    ``PreTrainedTokenizerFast``."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    rng = random.Random(0)
    pool = sft_pool(task)
    texts = []
    for _ in range(2000):
        p = rng.choice(pool)
        texts.append(_render_prompt(p) + _render_completion(noisy_teacher(p, rng)))
    backend.train_from_iterator(texts, trainer)
    path.mkdir(parents=True, exist_ok=True)
    backend.save(str(path / "tokenizer.json"))
    return load_tokenizer(path)


def load_tokenizer(path: Path):
    return chat_tokenizer(tokenizer_file=str(Path(path) / "tokenizer.json"))


def _build_model(spec: WarmupSpec, tokenizer):
    return tiny_qwen2(tokenizer, hidden_size=spec.hidden_size, num_layers=spec.num_layers, seed=spec.seed,
                      max_position_embeddings=128)


def warm_up(spec: WarmupSpec, cache_dir: str | Path, log=print) -> Path:
    """The warmed-up model's folder under ``cache_dir`` (trained once, then reused: a ``done`` marker is written
    last, so an interrupted warm-up is redone; concurrent callers wait on a lock while one trains it). The folder is
    named by the spec and the CPU kernels it is trained with, so a warm-up made with other kernels is never reused
    (:data:`CPU_KERNELS`)."""
    out = Path(cache_dir) / f"{spec.key()}-{cpu_kernels().lower()}"
    if (out / "done").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "done").exists():
            _train_warm_up(spec, out, log)
    return out


def _train_warm_up(spec: WarmupSpec, out: Path, log) -> None:
    import torch  # deferred: torch, which only a run needs (a grid's specs and plan do not)

    start = time.time()
    tokenizer = train_tokenizer(spec.task, spec.vocab_size, out)
    model = _build_model(spec, tokenizer)
    rng = random.Random(spec.seed)
    pool = sft_pool(spec.task)
    prompt_ids = {p: tokenizer(_render_prompt(p), add_special_tokens=False)["input_ids"] for p in pool}
    completion_ids: dict[int, list[int]] = {}
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.01)

    def lr_at(step):
        if step < spec.warmup_steps:
            return (step + 1) / spec.warmup_steps
        progress = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    model.train()
    pad = tokenizer.pad_token_id
    for step in range(spec.steps):
        rows, labels = [], []
        for _ in range(spec.batch_size):
            p = rng.choice(pool)
            answer = noisy_teacher(p, rng)
            if answer not in completion_ids:
                completion_ids[answer] = tokenizer(_render_completion(answer), add_special_tokens=False)["input_ids"]
            ids = prompt_ids[p] + completion_ids[answer]
            rows.append(ids)
            labels.append([-100] * len(prompt_ids[p]) + completion_ids[answer])
        width = max(map(len, rows))
        input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        label_ids = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
        attention = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        loss = model(input_ids=input_ids, attention_mask=attention, labels=label_ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 250 == 0 or step == spec.steps - 1:
            log(f"warm-up {spec.key()} step {step}/{spec.steps} loss {loss.item():.3f}")
    model.save_pretrained(out)
    (out / "warmup.json").write_text(json.dumps({**asdict(spec), "cpu_kernels": cpu_kernels(),
                                                 "seconds": time.time() - start}, indent=1))
    (out / "done").write_text("")


def weights_digest(model) -> str:
    """The first 12 hex digits of the sha256 of a model's parameters (names, then bytes, in name order). A warm-up
    trained on another machine whose kernels round differently has another digest, so a run records the digest of
    the warm-up it started from: its testbed."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()[:12]


def load_warm_model(path: Path):
    """(model, tokenizer) from a :func:`warm_up` folder."""
    from transformers import Qwen2ForCausalLM  # deferred: transformers and torch, which only a run needs

    tokenizer = load_tokenizer(path)
    model = Qwen2ForCausalLM.from_pretrained(path)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model, tokenizer


def evaluate(model, tokenizer, problems: list[Problem], *, k: int = 8, max_new_tokens: int = 16, seed: int = 0) -> dict:
    """Held-out accuracy: ``sampled`` (mean over k samples at T = 1, seeded), ``greedy``, ``greedy_carry``
    (greedy on the carry problems), ``format`` (share of samples with exactly one \\boxed{}). Sampled with the
    evaluation code's transformers backend (the global RNG state and the train mode are left as they were)."""
    prompts = [tokenize_prompt(tokenizer, [{"role": "user", "content": p.question}]) for p in problems]
    answers = [str(p.answer) for p in problems]

    def texts(temperature: float, num_samples: int) -> list[str]:
        backend = TransformersBackend(model, tokenizer, SamplingSettings(temperature, 1.0, max_new_tokens))
        return [g.text for group in backend.generate(prompts, num_samples, seed) for g in group]

    sampled = texts(1.0, k)
    sampled_rewards = addition_reward(None, sampled, [a for a in answers for _ in range(k)])
    greedy_rewards = addition_reward(None, texts(0.0, 1), answers)
    carry = [r for r, p in zip(greedy_rewards, problems) if p.carry]
    return {
        "sampled": sum(sampled_rewards) / len(sampled_rewards),
        "greedy": sum(greedy_rewards) / len(greedy_rewards),
        "greedy_carry": sum(carry) / len(carry) if carry else float("nan"),
        "format": sum(len(BOXED.findall(t)) == 1 for t in sampled) / len(sampled),
    }


@dataclass(frozen=True)
class RunSpec(GridCell):
    """One RL run of the study on the testbed (the testbed's RL settings by default)."""

    task: str = "add1"
    method: str = "acpo"
    upr: int = 2  # optimizer updates per rollout = steps_per_generation (gradient accumulation 1)
    seed: int = 0
    alpha: float | None = None  # ACPO's alpha; None: the ACPOConfig default (3.0)
    clip: tuple[float, float] | None = None  # ACPO's [eps_min, eps_max]; None: the ACPOConfig default [0, 3]
    steps: int = 200
    lr: float = DEFAULT_LR
    batch_size: int = 64  # completions per optimizer step
    num_generations: int = 8
    max_new_tokens: int = 16
    eval_every: int = 40
    eval_k: int = 8
    last_evals: int = 3  # "mean of the last evaluations" averages this many
    grad_every: int = 10  # gradient diagnostics once per N optimizer steps (0: off)
    warmup: WarmupSpec = field(default_factory=WarmupSpec)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "RunSpec":
        data = dict(data)
        data["warmup"] = WarmupSpec(**data["warmup"])
        if data.get("clip") is not None:
            data["clip"] = tuple(data["clip"])
        return cls(**data)

    def run(self, out_dir: str | Path, cache_dir: str | Path) -> dict:
        """Train this run in this process and write ``<out_dir>/runs/<run_id>/``: ``spec.json``, ``metrics.jsonl``
        (every log entry, with the diagnostics) and, last, ``result.json``. Returns the result."""
        # deferred: torch, transformers and TRL's trainer, which only a run needs (a grid's specs and plan do not)
        import torch
        from transformers import PrinterCallback, TrainerCallback

        from ..config import ACPOConfig
        from ..trainer import ACPOTrainer
        from ..training.callbacks import MetricsJSONLCallback

        run_dir = Path(out_dir) / "runs" / self.run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        for stale in ("metrics.jsonl", "result.json", "error.txt"):
            (run_dir / stale).unlink(missing_ok=True)
        (run_dir / "spec.json").write_text(json.dumps(self.to_json(), indent=1))
        start, code = time.time(), code_version()
        model, tokenizer = load_warm_model(warm_up(self.warmup, cache_dir))
        warmup_digest = weights_digest(model)
        train, held = task_problems(self.task)
        args = ACPOConfig(
            output_dir=str(run_dir), report_to="none", use_cpu=True, bf16=False, seed=self.seed, data_seed=self.seed,
            per_device_train_batch_size=self.batch_size, num_generations=self.num_generations,
            steps_per_generation=self.upr, gradient_accumulation_steps=1, max_completion_length=self.max_new_tokens,
            temperature=1.0, top_p=1.0, learning_rate=self.lr, lr_scheduler_type="constant", warmup_steps=0,
            weight_decay=0.01, max_grad_norm=1.0, beta=0.0, loss_type="grpo", max_steps=self.steps, logging_steps=1,
            save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, policy_loss=self.policy_loss,
            gradient_checkpointing=False,  # TRL's GRPO default is True: a recomputed forward, for nothing at this size
            diagnostics=True, diagnostics_grad_every=self.grad_every,
            **self.config_overrides(),
        )
        evals: list[dict] = []
        spec = self

        class Evaluate(TrainerCallback):
            def _run(self, step):
                evals.append({"step": step, **evaluate(model, tokenizer, held, k=spec.eval_k,
                                                       max_new_tokens=spec.max_new_tokens, seed=1000 + spec.seed)})

            def on_train_begin(self, args, state, control, **kwargs):
                self._run(0)

            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step % spec.eval_every == 0 or state.global_step == spec.steps:
                    self._run(state.global_step)

        # A rollout takes batch_size * upr / num_generations prompts (128 at upr 16) and TRL drops an incomplete
        # last batch: with add1's 70 prompts and no repetition, upr 16 would train for 0 steps. Repeat the prompt
        # list, the same number of times in every regime (sized for upr 16), so that all regimes sample alike.
        prompts_per_rollout = self.batch_size * max(self.upr, 16) // self.num_generations
        repeats = max(1, math.ceil(4 * prompts_per_rollout / len(train)))
        trainer = ACPOTrainer(model, addition_reward, args=args, train_dataset=rl_dataset(train * repeats),
                              processing_class=tokenizer,
                              callbacks=[MetricsJSONLCallback(str(run_dir / "metrics.jsonl")), Evaluate()])
        trainer.remove_callback(PrinterCallback)  # the log entries go to metrics.jsonl, not to stdout
        trainer.train()
        if trainer.state.global_step != self.steps:
            raise RuntimeError(f"{self.run_id}: trained {trainer.state.global_step} of {self.steps} steps.")
        return write_result(self, run_dir, evals, start, code, torch_threads=torch.get_num_threads(),
                            cpu_kernels=cpu_kernels(), warmup_digest=warmup_digest)
