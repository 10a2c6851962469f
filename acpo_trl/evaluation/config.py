"""``EvalConfig``: every setting of an evaluation run (``acpo-eval`` flags and the ``evaluate`` Python API)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..utils.number_checks import AT_LEAST_ONE, UNIT_NOT_ZERO, check_numbers
from .generation import SAMPLERS, SAMPLING_RANGES, SamplingSettings, check_dtype, check_sampler

BACKENDS = ("auto", "vllm", "transformers")
# Checked at construction (acpo_trl/utils/number_checks.py), with every float field finite.
EVAL_RANGES = {
    **SAMPLING_RANGES, "limit": AT_LEAST_ONE, "k": AT_LEAST_ONE, "batch_size": AT_LEAST_ONE,
    "tensor_parallel_size": AT_LEAST_ONE, "gpu_memory_utilization": UNIT_NOT_ZERO, "max_model_len": AT_LEAST_ONE,
}


@dataclass
class EvalConfig:
    r"""
    Settings of an evaluation run: which model, which benchmarks, how to sample, where to write.

    Parameters:
        model_name_or_path (`str`):
            Hub id or local path of the model to evaluate.
        adapter_path (`str` or `None`, *optional*):
            Folder of a PEFT LoRA adapter to apply on top of the model.
        benchmarks (`list[str]`, *optional*, defaults to `["math500"]`):
            Benchmarks by name, from the task registry (`acpo_trl.tasks.benchmark_names()`): the math task's
            `math500`, `aime24`, `aime25`, `amc23`, `minerva`, `olympiadbench`, `hitab`, `countdown`, and each task
            that declares none under its own name (`addition`, `multiplication`, ...: its held-out set with the
            default options). Each optionally as `NAME=PATH` to read that benchmark from a local file (for `hitab`:
            the samples jsonl, with its tables beside it or in `hitab_tables_dir`).
        data_dir (`str` or `None`, *optional*):
            Folder laid out like the project's offline data (`math_eval/<set>/test.jsonl`, `hitab/`, `countdown/`):
            benchmarks without `=PATH` are read from it (otherwise: the math sets shipped with the package, Countdown's
            test rows from the Hub; HiTab needs local files).
        hitab_tables_dir (`str` or `None`, *optional*):
            Folder of HiTab `<table_id>.json` tables (default: `tables/raw`, else `tables`, beside the samples file).
        recipe (`str` or `None`, *optional*):
            An `acpo-train` recipe (YAML) whose task `benchmarks` names: that task's held-out set is the recipe's own
            (its task fields, `num_train_tasks`, `num_eval_tasks` and seed), the set its run's report evaluates;
            `template` must be the recipe's `prompt_template`. Without it, a generated task's benchmark is its
            held-out set under the default options.
        limit (`int` or `None`, *optional*):
            Evaluate only the first `limit` problems of each benchmark.
        template (`str`, *optional*, defaults to `"base"`):
            Prompt template: `"base"` (the ACPO paper's plain-text prompt) or `"chat"` (one user turn through the
            model's chat template, the Δlog p paper's protocol).
        k (`int`, *optional*, defaults to `8`):
            Samples per problem in total (avg@k), split evenly over `seeds`.
        seeds (`list[int]`, *optional*, defaults to `[0]`):
            Sampling seeds; each gives `k / len(seeds)` samples per problem (avg@32 = 8 seeds x 4 samples).
        pass_k (`list[int]` or `None`, *optional*):
            The j of the reported pass@j values (default: `[k]`); each must be <= `k`.
        temperature (`float`, *optional*, defaults to `1.0`):
            Sampling temperature; 0 is greedy decoding.
        top_p (`float`, *optional*, defaults to `1.0`):
            Nucleus sampling mass.
        max_tokens (`int`, *optional*, defaults to `4096`):
            Maximum completion length in tokens; longer completions are cut and count as truncated.
        sampler (`str`, *optional*, defaults to `"multinomial"`):
            How samples are drawn at `temperature` > 0: `"multinomial"` (`generate`'s sampling, torch's generator
            seeded per batch) or `"coupled"` (transformers backend only: Gumbel-max with noise keyed by seed,
            problem, sample index and position, arXiv 2502.01754; a problem's samples depend neither on its batch
            nor on the device, and two models share their noise: the sampler for comparing models).
        backend (`str`, *optional*, defaults to `"auto"`):
            `"vllm"`, `"transformers"`, or `"auto"` (vLLM when it is installed and a GPU is present and the sampler
            is `"multinomial"`).
        batch_size (`int` or `None`, *optional*):
            Problems per generation call, and per write to disk (default: 8 with transformers, 256 with vLLM).
            With the `"multinomial"` sampler the transformers backend's samples depend on it (batch composition), so
            resuming requires the same value; with `"coupled"` they do not, and a run may resume with another.
        dtype (`str`, *optional*, defaults to `"auto"`):
            Model weights dtype (`"auto"`, `"bfloat16"`, `"float32"`, ...).
        device (`str` or `None`, *optional*):
            Device of the transformers backend (default: `cuda` when available, else `cpu`).
        tensor_parallel_size (`int`, *optional*, defaults to `1`):
            vLLM tensor parallel degree.
        gpu_memory_utilization (`float`, *optional*, defaults to `0.9`):
            Fraction of GPU memory vLLM may use (GPU only: vLLM's CPU build takes a KV cache of
            `$VLLM_CPU_KVCACHE_SPACE` GiB, 2 by default).
        max_model_len (`int` or `None`, *optional*):
            vLLM context length (default: the model's).
        enforce_eager (`bool` or `None`, *optional*):
            vLLM without torch.compile and CUDA graphs. Default: `True` with vLLM's CPU build (its inductor compile
            takes 100-200 s at every start on 2 cores), vLLM's own default (`False`) on a GPU.
        output_dir (`str`, *optional*, defaults to `"eval_results"`):
            Where `samples.jsonl` (resumable progress), `results.json` (metrics and every sample) and `results.md`
            (the table) go. Rerunning with the same settings resumes.
        overwrite (`bool`, *optional*, defaults to `False`):
            Discard the samples already in `output_dir` instead of resuming.
    """

    model_name_or_path: str = field(metadata={"help": "Hub id or local path of the model to evaluate."})
    adapter_path: str | None = field(default=None, metadata={"help": "Folder of a PEFT LoRA adapter to apply."})
    benchmarks: list[str] = field(
        default_factory=lambda: ["math500"],
        metadata={"help": "Benchmarks by name: every registered task's evaluation sets (acpo_trl.tasks."
                  "benchmark_names(): math500 aime24 ... countdown hitab addition ...), each optionally NAME=PATH."},
    )
    data_dir: str | None = field(
        default=None, metadata={"help": "Folder laid out like the project's offline data (else: shipped math sets, Hub Countdown)."}
    )
    hitab_tables_dir: str | None = field(
        default=None, metadata={"help": "HiTab tables folder (default: tables/raw or tables beside the samples)."}
    )
    recipe: str | None = field(
        default=None, metadata={"help": "An acpo-train recipe: its task's benchmark is the recipe's held-out set."}
    )
    limit: int | None = field(default=None, metadata={"help": "Only the first `limit` problems of each benchmark."})
    template: str = field(default="base", metadata={"help": "Prompt template.", "choices": ["base", "chat"]})
    k: int = field(default=8, metadata={"help": "Samples per problem in total (avg@k), split over seeds."})
    seeds: list[int] = field(default_factory=lambda: [0], metadata={"help": "Sampling seeds (k / len(seeds) each)."})
    pass_k: list[int] | None = field(default=None, metadata={"help": "The j of reported pass@j (default: k)."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature (0 = greedy)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass."})
    max_tokens: int = field(default=4096, metadata={"help": "Maximum completion tokens."})
    sampler: str = field(
        default="multinomial",
        metadata={"help": "multinomial: generate's seeded sampling; coupled: Gumbel-max noise keyed by problem, sample "
                  "and position (transformers backend; for comparing models).", "choices": list(SAMPLERS)},
    )
    backend: str = field(
        default="auto", metadata={"help": "auto: vLLM if installed and a GPU is present.", "choices": list(BACKENDS)}
    )
    batch_size: int | None = field(
        default=None, metadata={"help": "Problems per generation call (default 8 transformers, 256 vLLM)."}
    )
    dtype: str = field(default="auto", metadata={"help": "Model dtype: auto, bfloat16, float32, ..."})
    device: str | None = field(default=None, metadata={"help": "transformers backend device (default cuda/cpu)."})
    tensor_parallel_size: int = field(default=1, metadata={"help": "vLLM tensor parallel degree."})
    gpu_memory_utilization: float = field(default=0.9, metadata={"help": "vLLM GPU memory fraction."})
    max_model_len: int | None = field(default=None, metadata={"help": "vLLM context length."})
    enforce_eager: bool | None = field(
        default=None, metadata={"help": "vLLM without compilation (default: true on CPU, false on GPU)."}
    )
    output_dir: str = field(default="eval_results", metadata={"help": "Folder of samples.jsonl/results.json/.md."})
    overwrite: bool = field(default=False, metadata={"help": "Start afresh instead of resuming."})

    def __post_init__(self):
        check_numbers(self, EVAL_RANGES)
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"`seeds` must be a non-empty list of distinct integers, got {self.seeds}.")
        if self.k % len(self.seeds):
            raise ValueError(
                f"`k` ({self.k}) must be a multiple of the number of `seeds` ({len(self.seeds)}): each seed gives "
                "k / len(seeds) samples per problem."
            )
        if any(not 1 <= j <= self.k for j in self.pass_k or []):
            raise ValueError(f"Every `pass_k` value must be in [1, k={self.k}], got {self.pass_k}.")
        if self.backend not in BACKENDS:
            raise ValueError(f"`backend` must be one of {BACKENDS}, got {self.backend!r}.")
        check_sampler(self.sampler, "EvalConfig.sampler")
        if self.sampler == "coupled" and self.backend == "vllm":
            raise ValueError("EvalConfig.sampler='coupled' needs the transformers backend (vLLM samples inside its "
                             "engine): use --backend transformers, or --sampler multinomial with vLLM.")
        if self.template not in ("base", "chat"):
            raise ValueError(f"`template` must be 'base' or 'chat', got {self.template!r}.")
        if not self.benchmarks:
            raise ValueError("`benchmarks` is empty: name at least one (e.g. --benchmarks math500 aime24).")
        check_dtype(self.dtype)

    @property
    def sampling(self) -> SamplingSettings:
        return SamplingSettings(temperature=self.temperature, top_p=self.top_p, max_tokens=self.max_tokens,
                                sampler=self.sampler)

    @property
    def samples_per_seed(self) -> int:
        return self.k // len(self.seeds)
