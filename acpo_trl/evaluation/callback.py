"""``EvalCallback``: periodic avg@k / pass@k on small held-out sets during ``GRPOTrainer`` training (any subclass).

Every ``eval_steps`` optimizer steps the trainer's current model samples ``k`` completions per problem with the
transformers backend (seeded, the same seed at every evaluation, so successive numbers differ by the model only),
scores them with the benchmark's reward and logs ``eval/<benchmark>/<metric>`` (plus ``eval/macro/<metric>`` over
several benchmarks) through the trainer's log, so every ``report_to`` integration receives them. The training
RNG state and the model's train mode are left as they were. With several processes each one evaluates a shard of
the problems and the samples are gathered before the metrics are computed (with ``sampler="coupled"`` the samples
are those of one process: a problem's noise does not depend on its shard or batch).

A periodic evaluation may be cut short: ``abandon`` is asked before it and after each batch, and when it says so the
evaluation ends there and logs nothing (``acpo-train`` asks whether a scheduler's preemption came, so that it saves
the step's checkpoint at once instead of after the evaluation). A run resumed at a step whose periodic evaluation is
not in the checkpoint's log history evaluates it when training begins, so the curves miss no point.

Usage (TRL's pattern for callbacks that need the trainer):

    trainer = ACPOTrainer(...)
    trainer.add_callback(EvalCallback(trainer, ["math500", "aime24"], eval_steps=50, k=4, limit=64,
                                      data_dir="data", template="base"))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from accelerate.utils import gather_object
from transformers import Trainer, TrainerCallback
from trl.models.utils import unwrap_model_for_generation

from .benchmarks import Benchmark, load_benchmark
from .generation import SamplingSettings, TransformersBackend
from .metrics import CORRECT, macro_average, num_correct, summarize
from .runner import sample_benchmark

_LOGGED = ("num_problems", "k")  # bookkeeping, not logged


class EvalCallback(TrainerCallback):
    """Evaluate the trainer's model on held-out benchmarks every ``eval_steps`` steps and log the metrics.

    Args:
        trainer: the ``GRPOTrainer`` (or subclass) it is attached to.
        benchmarks: [`Benchmark`] objects, or benchmark specs (``"math500"``, ``"countdown=path.jsonl"``) loaded with
            ``template``, ``data_dir`` and ``limit``.
        eval_steps: evaluate when ``global_step`` is a multiple of it.
        k: samples per problem.
        temperature: sampling temperature (0: greedy).
        top_p: nucleus mass.
        max_tokens: completion token limit (default: the trainer's ``max_completion_length``).
        seed: sampling seed, the same at every evaluation.
        batch_size: problems per ``generate`` call.
        sampler: ``"multinomial"`` (``generate``'s sampling seeded per batch) or ``"coupled"`` (noise keyed by
            problem, sample and position: successive evaluations, and two runs, share it where their models agree;
            ``acpo_trl/evaluation/coupled.py``).
        eval_on_start: also evaluate before the first step (the starting point of the curves).
        template, data_dir, limit: how benchmark specs given as strings are loaded.
        abandon: asked before a periodic evaluation and after each of its batches (on every process, the same number
            of times: it may be collective); when it returns True the evaluation ends there and logs nothing.
    """

    def __init__(
        self,
        trainer: Trainer,
        benchmarks: Sequence[Benchmark | str],
        eval_steps: int,
        k: int = 1,
        temperature: float = 0.0,
        top_p: float = 1.0,
        max_tokens: int | None = None,
        seed: int = 0,
        batch_size: int = 8,
        sampler: str = "multinomial",
        eval_on_start: bool = False,
        template: str = "base",
        data_dir: str | None = None,
        limit: int | None = None,
        abandon: Callable[[], bool] | None = None,
    ):
        if eval_steps < 1:
            raise ValueError(f"`eval_steps` must be >= 1, got {eval_steps}.")
        if k < 1 or batch_size < 1:
            raise ValueError(f"`k` and `batch_size` must be >= 1, got k={k}, batch_size={batch_size}.")
        self.trainer = trainer
        self.benchmarks = [
            b if isinstance(b, Benchmark) else load_benchmark(b, template, data_dir, limit=limit) for b in benchmarks
        ]
        if not self.benchmarks:
            raise ValueError("`benchmarks` is empty: give at least one held-out set.")
        max_tokens = max_tokens or getattr(trainer.args, "max_completion_length", None) or 256
        self.sampling = SamplingSettings(temperature=temperature, top_p=top_p, max_tokens=max_tokens, sampler=sampler)
        self.eval_steps = eval_steps
        self.k = k
        self.seed = seed
        self.batch_size = batch_size
        self.eval_on_start = eval_on_start
        self.abandon = abandon
        self._last_step = None
        self.last_metrics: dict[str, float] | None = None  # of the last periodic evaluation, at step _last_step
        self.last_correct: dict[str, list[int]] | None = None  # of the last evaluation, periodic or not

    def on_train_begin(self, args, state, control, **kwargs):
        step = state.global_step
        logged = any(entry.get("step") == step and any(key.startswith(self._prefix) for key in entry)
                     for entry in state.log_history)
        if self.eval_on_start or (step > 0 and step % self.eval_steps == 0 and not logged):
            self._evaluate(state, control)  # as asked, or the resumed step's evaluation a stop cut short

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.eval_steps == 0:
            self._evaluate(state, control)

    def metrics_at(self, step: int) -> dict:
        """The metrics of the model at optimizer step ``step`` with its per-problem counts (:meth:`with_counts`):
        the periodic evaluation's when it ran at that step (the model has not changed since), else a new one."""
        if self._last_step == step and self.last_metrics is not None:
            return {**self.last_metrics, CORRECT: self.last_correct}
        return self.with_counts()

    def with_counts(self) -> dict:
        """:meth:`evaluate`'s metrics and, under ``CORRECT``, each benchmark's correct samples per problem (in the
        benchmark's order): what a paired comparison of two runs needs, problem by problem. Not logged."""
        return {**self.evaluate(), CORRECT: self.last_correct}

    @property
    def _prefix(self) -> str:
        return f"eval/{self.benchmarks[0].name}/"

    def evaluate(self, abandon: Callable[[], bool] | None = None) -> dict[str, float]:
        """The metrics of the trainer's current model, as they are logged (``eval/<benchmark>/<metric>``); each
        benchmark's correct samples per problem are kept in ``last_correct``. ``abandon``: asked after each batch
        that every process has (the batches of the smallest shard); True raises :class:`Abandoned`."""
        trainer = self.trainer
        accelerator = trainer.accelerator
        results, correct = {}, {}
        with unwrap_model_for_generation(
            trainer.model_wrapped,
            accelerator,
            gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
        ) as model:
            backend = TransformersBackend(model, trainer.processing_class, self.sampling)
            for benchmark in self.benchmarks:
                shard = Benchmark(
                    benchmark.name,
                    benchmark.dataset.shard(accelerator.num_processes, accelerator.process_index, contiguous=True),
                    benchmark.reward_func,
                )
                common = -(-(len(benchmark.dataset) // accelerator.num_processes) // self.batch_size)
                records = sample_benchmark(shard, backend, self.k, [self.seed], self.batch_size, progress=False,
                                           on_batch=_asking(abandon, common))
                problems = gather_object([r["samples"] for r in records])
                results[benchmark.name] = summarize(problems)
                correct[benchmark.name] = [num_correct(problem) for problem in problems]
        if len(results) > 1:
            results["macro"] = macro_average(results)
        self.last_correct = correct
        return {
            f"eval/{name}/{key}": value for name, metrics in results.items() for key, value in metrics.items()
            if key not in _LOGGED
        }

    def _evaluate(self, state, control) -> None:
        if state.global_step == self._last_step:  # once per step, even if called twice
            return
        self._last_step = state.global_step
        # Trainer.log, not trainer.log: GRPOTrainer.log would flush (and clear) the training metrics it accumulates
        # between logging steps into this entry. Logging resets `should_log`, which would drop this step's
        # regular training log: keep the flag as it was.
        should_log = control.should_log
        try:
            if self.abandon is not None and self.abandon():
                raise Abandoned
            self.last_metrics = self.evaluate(self.abandon)
        except Abandoned:
            self._last_step, self.last_metrics = None, None
            return
        Trainer.log(self.trainer, self.last_metrics)
        control.should_log = should_log


class Abandoned(Exception):
    """A periodic evaluation cut short by ``abandon``."""


def _asking(abandon: Callable[[], bool] | None, batches: int) -> Callable[[list[dict]], None]:
    """An ``on_batch`` that asks ``abandon`` after each of the first ``batches`` batches."""
    done = 0

    def on_batch(records):
        nonlocal done
        done += 1
        if abandon is not None and done <= batches and abandon():
            raise Abandoned

    return on_batch
