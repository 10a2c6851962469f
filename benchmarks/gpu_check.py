#!/usr/bin/env python3
"""GPU check: the suite's CUDA tests, and ACPO's cost against TRL's GRPO at Qwen2.5-1.5B's and Qwen2.5-3B's shapes,
on one CUDA GPU.

One script for a machine with one CUDA GPU, no network, and torch, transformers and accelerate preinstalled
(docs/gpu_check.md). The package's other dependencies travel as a folder of wheels (WHEELS, 3.4 MB); the package
itself is imported from this checkout, not installed (install_wheels says why):

    python benchmarks/gpu_check.py --download-wheels gpu_wheels           # here, with registry access
    python3 benchmarks/gpu_check.py --wheels gpu_wheels --out gpu_results  # there: install offline, then check
    python benchmarks/gpu_check.py --tiny --out /tmp/gpu_check            # the same code on CPU, tiny (CI)

Parts, each in a process of its own (a crash or an out-of-memory loses that part only), under one time budget
(``--budget-s``, 450 s by default: with the offline install the whole check stays under 8 minutes on one H100-class
GPU; the H200 ran the first four parts in 97 s); a part that would overrun is cut short or skipped, with a note:

1. ``cuda_tests``: ``pytest -m cuda`` over CUDA_TEST_FILES (they skip without a GPU); pass/fail counts.
2. ``loss_eager``: ACPO's loss against the fixed clip (``ppo_clip``) on the same ``(8, 2048)`` tensors, forward +
   backward + the per-bin metrics, as the trainer calls them (registry function + ``grpo`` aggregation).
3. ``train_step``: one optimizer step (forward, loss, backward, AdamW) of ACPOTrainer (``policy_loss="acpo"``) and
   GRPOTrainer (TRL's fixed clip), ``loss_type="grpo"`` both, on one randomly initialised model of Qwen2.5-1.5B's
   shape (built from a config: nothing is downloaded) and the same synthetic off-policy batch of 8 completions of
   2,048 tokens; bf16 autocast over fp32 weights where the GPU has bf16 (as the recipes train), activation
   checkpointing (TRL's default). The trainers alternate over rounds in one process: median step time and peak
   CUDA memory side by side, and their ratios to GRPOTrainer's.
4. ``paper_step``: the same at the paper's scale, Qwen2.5-3B's shape and 8 completions of 3,072 tokens, with the
   controls that tell ACPO's code from the width of its clip (STEP_TRAINERS): ``acpo`` with ``acpo_alpha: 0``
   (every bin computed, eps 0.2 everywhere), ``ppo_clip`` at epsilon 0.2 and at WIDE_EPSILON; each trainer's
   fraction of clipped tokens and clip range beside its time.
5. ``loss_compiled``: part 2 under ``torch.compile`` (compile time, then the same timing), checked against eager.

Writes ``results.json``, ``results.md`` (a table with the machine), ``cuda_tests.xml`` and ``log.txt`` to ``--out``.
Exit status: 0 every part ran and no test failed; 1 a part or a test failed; 3 a part was skipped (for time, or a
GPU too small for a step) or cut short for time.

Only the standard library is imported at the top: the script installs the wheels before anything imports TRL.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULT_PREFIX = "GPU_CHECK_RESULT "

# What a machine with torch, transformers and accelerate (and the common scientific stack) lacks of the package's
# requirements for this check, pinned to the versions the test suite runs with. trl imports datasets at import time,
# datasets dill, multiprocess and xxhash; fsspec is pinned because datasets caps it; peft because trl imports an
# installed peft, which then must be new enough. Not here: torch (never replaced), vLLM (not used), and pyarrow and
# pandas, which datasets needs too but which are 67 MB together (docs/gpu_check.md: a machine that lacks them).
WHEELS = (
    "trl==1.16.0",
    "datasets==5.2.0",
    "dill==0.4.1",
    "multiprocess==0.70.19",
    "xxhash==4.1.0",
    "fsspec==2026.9.0",
    "peft==0.21.2",
)
# What the offline install asks for (pip resolves the rest against what is installed, and fails rather than touch it).
INSTALL_REQUIREMENTS = ("trl==1.16.*", "datasets>=4.7", "peft>=0.17")
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# Test files holding tests marked `cuda`; a test checks that every such file is listed here.
CUDA_TEST_FILES = ("tests/test_cuda.py",)

# Qwen2.5-1.5B's shape (its config.json): 1.54 B parameters, 0.23 B of them the tied embedding.
QWEN25_15B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                  num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rms_norm_eps=1e-6)
# Qwen2.5-3B's shape (its config.json): 3.09 B parameters; the paper's Countdown and HiTab model (docs/recipes.md).
QWEN25_3B = dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rms_norm_eps=1e-6)
# vocab_size None: the byte-level tokenizer's (~260 tokens)
TINY_MODEL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=None, tie_word_embeddings=True, rms_norm_eps=1e-6)

# The fixed clip of the wide control: ACPO's cap (acpo_clip_max), the widest range its rule can open, and the epsilon
# of the H200 control (docs/gpu_check.md, "Results"). Fixed before the run, not read from ACPO's own: which tokens'
# gradient a clip passes is what it can cost, and every trainer's clip fraction is reported beside its time.
WIDE_EPSILON = 3.0
# Every trainer a step part can time, against GRPOTrainer in the same process: (label, ACPOConfig fields; None:
# TRL's GRPOTrainer). Each differs from `acpo` in one thing, so that a difference in time has one cause.
STEP_TRAINERS = {
    "grpo": ("GRPOTrainer", None),
    "acpo": ("ACPOTrainer (acpo)", dict(policy_loss="acpo")),
    # every bin computed, as in `acpo`, but eps = base 0.2 everywhere: ACPO's code at a fixed clip's width
    "acpo_alpha0": ("ACPOTrainer (acpo, acpo_alpha 0)", dict(policy_loss="acpo", acpo_alpha=0.0)),
    "ppo_clip": ("ACPOTrainer (ppo_clip, epsilon 0.2)", dict(policy_loss="ppo_clip", epsilon=0.2)),
    "ppo_clip_wide": (f"ACPOTrainer (ppo_clip, epsilon {WIDE_EPSILON:g})",
                      dict(policy_loss="ppo_clip", epsilon=WIDE_EPSILON)),
}

# The step parts: one model shape and batch each, its trainers timed side by side in one process. `min_gpu_gib`:
# skipped (noted) on a smaller GPU; the H200 measured peaks of 25.6 GiB and 50.8 GiB.
STEPS = {
    "full": {
        "train_step": dict(model=QWEN25_15B, model_name="Qwen2.5-1.5B shape, random init", completions=8,
                           completion_len=2048, prompt_len=128, rounds=4, steps_per_round=2,
                           trainers=("grpo", "acpo"), min_gpu_gib=30),
        "paper_step": dict(model=QWEN25_3B, model_name="Qwen2.5-3B shape, random init", completions=8,
                           completion_len=3072, prompt_len=128, rounds=4, steps_per_round=2,
                           trainers=tuple(STEP_TRAINERS), min_gpu_gib=56),
    },
    "tiny": {
        "train_step": dict(model=TINY_MODEL, model_name="tiny Qwen2 (hidden 64, 2 layers), random init",
                           completions=8, completion_len=64, prompt_len=16, rounds=2, steps_per_round=1,
                           trainers=("grpo", "acpo")),
        "paper_step": dict(model=dict(TINY_MODEL, num_hidden_layers=3),
                           model_name="tiny Qwen2 (hidden 64, 3 layers), random init", completions=8,
                           completion_len=96, prompt_len=16, rounds=2, steps_per_round=1,
                           trainers=tuple(STEP_TRAINERS)),
    },
}

MODES = {
    "full": dict(device="cuda", steps=STEPS["full"], loss_shape=(8, 2048), loss_repeats=21, loss_inner=10,
                 compile_backend="inductor", budget_s=450,
                 caps={"cuda_tests": 150, "loss_eager": 60, "train_step": 150, "paper_step": 240,
                       "loss_compiled": 180},
                 reserve={"cuda_tests": 270, "loss_eager": 250, "train_step": 200, "paper_step": 40,
                          "loss_compiled": 0}),
    "tiny": dict(device="cpu", steps=STEPS["tiny"], loss_shape=(8, 256), loss_repeats=5, loss_inner=2,
                 compile_backend="aot_eager", budget_s=150,
                 caps={"cuda_tests": 90, "loss_eager": 60, "train_step": 90, "paper_step": 90, "loss_compiled": 90},
                 reserve={"cuda_tests": 45, "loss_eager": 45, "train_step": 30, "paper_step": 15,
                          "loss_compiled": 0}),
}
PARTS = ("cuda_tests", "loss_eager", "train_step", "paper_step", "loss_compiled")
MIN_PART_S = 15  # a part with less time than this left is skipped



def figures(device: str) -> list[tuple[str, str, str, str]]:
    """(JSON path, part, figure, unit) of every figure results.json and results.md report."""
    if device == "cuda":
        peak, work, mem = "peak CUDA memory (median)", "step memory above resident (median)", "MiB"
    else:
        peak, work, mem = "peak RSS of the process", "RSS growth during the step", "MiB (CPU: not per step)"
    loss = "loss alone, (B, T) = {}"
    rows = [
        ("cuda_tests.passed", "CUDA tests", "passed", "tests"),
        ("cuda_tests.failed", "CUDA tests", "failed (and errors)", "tests"),
        ("cuda_tests.skipped", "CUDA tests", "skipped", "tests"),
        ("cuda_tests.wall_s", "CUDA tests", "wall time", "s"),
    ]
    for part, label in (("train_step", "optimizer step"), ("paper_step", "paper-scale step")):
        for key in STEPS["full"][part]["trainers"]:
            name = STEP_TRAINERS[key][0]
            rows += [(f"{part}.{key}.step_s", label, f"{name} step time (median)", "s"),
                     (f"{part}.{key}.peak_mib", label, f"{name} {peak}", mem),
                     (f"{part}.{key}.step_mib", label, f"{name} {work}", mem)]
            if key != "grpo":
                rows += [(f"{part}.{key}.step_ratio", label, f"{name} step time / GRPOTrainer's", "x"),
                         (f"{part}.{key}.peak_ratio", label, f"{name} peak memory / GRPOTrainer's", "x")]
            rows += [(f"{part}.{key}.clip_frac", label, f"{name} tokens clipped (gradient cut), mean", "fraction"),
                     (f"{part}.{key}.clip_eps", label, f"{name} clip range (ACPO: token-weighted mean)", "eps")]
    for mode in ("eager", "compiled"):
        rows += [(f"loss_{mode}.ppo_clip_ms", loss, f"fixed clip (ppo_clip), {mode}, fwd + bwd (median)", "ms"),
                 (f"loss_{mode}.acpo_ms", loss, f"acpo, {mode}, fwd + bwd (median)", "ms"),
                 (f"loss_{mode}.ratio", loss, f"acpo / fixed clip, {mode}", "x")]
    rows += [("loss_compiled.compile_s", loss, "torch.compile time, both losses (first call, fwd + bwd)", "s")]
    return rows


def lookup(results: dict, path: str):
    value = results
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


# ---------------------------------------------------------------------------------------------------------------
# Wheels: download here, install there.


def wheel_download_command(directory: str, python_version: str) -> list[str]:
    platforms = [arg for p in WHEEL_PLATFORMS for arg in ("--platform", p)]
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
            python_version, "--implementation", "cp", *platforms, "-d", directory, *WHEELS]


def download_wheels(directory: str, python_version: str) -> int:
    command = wheel_download_command(directory, python_version)
    print("$ python", " ".join(command[1:]), flush=True)
    code = subprocess.call(command)
    if code == 0:
        files = sorted(Path(directory).glob("*.whl"))
        total = sum(f.stat().st_size for f in files)
        print(f"{len(files)} wheels, {total / 1e6:.1f} MB in {directory}/ (for CPython {python_version}, x86-64 Linux)")
    return code


def install_commands(directory: str) -> tuple[list[str], list[str]]:
    """The offline install's two pip commands: the requirements resolved against the folder and what is installed,
    and the fallback, the folder's wheels as they are, without dependencies. Neither installs the package itself."""
    pip = [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", directory, "--no-cache-dir",
           "--disable-pip-version-check"]
    return [*pip, *INSTALL_REQUIREMENTS], [*pip, "--no-deps", *WHEELS]


def install_wheels(directory: str, log, run=None) -> dict:
    """Offline: the requirements resolved against the folder and what is installed (never torch: no wheel of it
    travels); if that fails (e.g. an installed package outside a pin), the folder's wheels without dependencies.

    The package itself is not installed: every part imports ``acpo_trl`` from this checkout, first on its
    ``sys.path`` (``run_child``) or ``PYTHONPATH`` (the CUDA tests), which is what the check measures. An editable
    install added nothing to that and failed offline on the H200 image: with setup.py and no pyproject.toml, and
    setuptools and wheel installed, an older pip (23.2 reproduced it) runs setuptools' ``setup.py develop``, which
    from setuptools 80 runs ``pip install -e .`` again without ``--no-index`` or ``--no-build-isolation``, and that
    pip looks for setuptools on an index (docs/gpu_check.md)."""
    run = run or _run_logged
    resolve, as_they_are = install_commands(directory)
    record = {"wheels": directory, "package": "not installed: imported from the checkout (sys.path)"}
    result = run(resolve, log)
    record["mode"] = "resolved"
    if result.returncode != 0:
        record["mode"] = "no-deps fallback"
        record["resolve_error"] = result.stdout[-1500:]
        result = run(as_they_are, log)
        if result.returncode != 0:
            record["mode"] = "failed"
            record["error"] = result.stdout[-1500:]
    return record


def _run_logged(command: list[str], log) -> subprocess.CompletedProcess:
    print("$ python", " ".join(command[1:]), flush=True)
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log.write(f"$ {' '.join(command)}\n{result.stdout}\n")
    print(result.stdout[-2000:], flush=True)
    return result


# ---------------------------------------------------------------------------------------------------------------
# Parts (each runs in a child process: `--child PART`).


def machine_info(device: str) -> dict:
    import importlib.metadata as metadata
    import platform

    import torch

    import acpo_trl

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "acpo_trl": str(Path(acpo_trl.__file__).resolve().parent)}  # this checkout (install_wheels)
    for package in ("transformers", "accelerate", "trl", "datasets", "peft"):
        try:
            info[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            info[package] = None
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    compute_capability=f"{props.major}.{props.minor}", gpu_count=torch.cuda.device_count(),
                    bf16=torch.cuda.is_bf16_supported())
    else:
        info.update(gpu=None, bf16=False)
    return info


def _require_device(device: str) -> None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device (torch.cuda.is_available() is False): run with --tiny for the CPU mode")


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def part_loss(mode: dict, compiled: bool, deadline: float) -> dict:
    """ACPO's loss against the fixed clip: registry function + grpo aggregation, forward + backward, metrics
    returned (so that compilation cannot drop them); median over interleaved repeats of `loss_inner` calls."""
    import torch

    from acpo_trl.config import config_defaults
    from acpo_trl.losses import PolicyLossInputs, aggregate_loss, get_policy_loss

    device = mode["device"]
    _require_device(device)
    config = config_defaults()  # ACPO's defaults (the paper's run) and TRL's fixed clip
    batch, length = mode["loss_shape"]
    g = torch.Generator().manual_seed(0)
    logps = torch.nn.functional.logsigmoid(torch.randn(batch, length, generator=g) * 3)  # p spread over (0, 1)
    old_logps = logps + 0.1 * torch.randn(batch, length, generator=g)
    advantages = torch.randn(batch, 1, generator=g)
    mask = (torch.rand(batch, length, generator=g) > 0.1).float()
    logps, old_logps, advantages, mask = (t.to(device) for t in (logps, old_logps, advantages, mask))
    leaf = logps.clone().requires_grad_(True)

    def make(name):
        fn = get_policy_loss(name)

        def loss(logps, old_logps, advantages, mask):
            out = fn(PolicyLossInputs(logps, old_logps, advantages, mask), config)
            return aggregate_loss(out.per_token_loss, mask, "grpo").loss, out.metrics

        return loss

    eager = {name: make(name) for name in ("ppo_clip", "acpo")}
    fns = eager
    result = {"shape": [batch, length], "device": device}
    if compiled:
        import torch._dynamo

        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 16)
        fns = {name: torch.compile(fn, backend=mode["compile_backend"], dynamic=False) for name, fn in eager.items()}
        result["backend"] = mode["compile_backend"]
        start = time.perf_counter()
        for name, fn in fns.items():  # the first call compiles forward and backward
            leaf.grad = None
            fn(leaf, old_logps, advantages, mask)[0].backward()
        _sync(device)
        result["compile_s"] = time.perf_counter() - start
        # compiled against eager, value and gradient
        agree = []
        for name in fns:
            grads = []
            for fn in (eager[name], fns[name]):
                leaf.grad = None
                value = fn(leaf, old_logps, advantages, mask)[0]
                value.backward()
                grads.append((value.detach(), leaf.grad.clone()))
            # the gradient on all but 0.1% of the tokens: one within rounding of its clip bound may fall either side
            same_grad = torch.isclose(grads[0][1], grads[1][1], rtol=1e-4, atol=1e-7).float().mean() >= 0.999
            agree.append(bool(torch.allclose(grads[0][0], grads[1][0], rtol=1e-4, atol=1e-6) and same_grad))
        result["matches_eager"] = all(agree)

    def call(fn):
        leaf.grad = None
        fn(leaf, old_logps, advantages, mask)[0].backward()

    for fn in fns.values():  # warm-up
        call(fn)
    times = {name: [] for name in fns}
    for repeat in range(mode["loss_repeats"]):
        if time.time() > deadline:
            result["cut_short"] = f"time budget: {repeat} of {mode['loss_repeats']} repeats"
            break
        for name in (list(fns) if repeat % 2 == 0 else list(fns)[::-1]):
            _sync(device)
            start = time.perf_counter()
            for _ in range(mode["loss_inner"]):
                call(fns[name])
            _sync(device)
            times[name].append((time.perf_counter() - start) / mode["loss_inner"])
    result["repeats"] = len(times["acpo"])
    result["ppo_clip_ms"] = statistics.median(times["ppo_clip"]) * 1e3
    result["acpo_ms"] = statistics.median(times["acpo"]) * 1e3
    result["ratio"] = result["acpo_ms"] / result["ppo_clip_ms"]
    return result


def build_model(spec: dict, tokenizer, device: str):
    """A randomly initialised Qwen2 causal LM of the step's shape, built on `device` from a config (no download)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    shape = dict(spec["model"])
    shape["vocab_size"] = shape["vocab_size"] or len(tokenizer)
    config = Qwen2Config(**shape, max_position_embeddings=4096, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    # TRL's default (GRPOConfig.gradient_checkpointing=True), which Trainer applies in train(): done here, as it does.
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


class MemoryMeter:
    """Peak memory of one step: CUDA's allocator statistics on a GPU; on CPU, the process's peak RSS (which cannot
    be reset, so the figures there only show that the code runs)."""

    def __init__(self, device: str):
        self.device = device

    def _rss_mib(self) -> float:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def start(self) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            self.resident = torch.cuda.memory_allocated() / 2**20
        else:
            self.resident = self._rss_mib()

    def stop(self) -> tuple[float, float]:
        """(peak, peak above what was resident at start), MiB."""
        import torch

        peak = torch.cuda.max_memory_allocated() / 2**20 if self.device == "cuda" else self._rss_mib()
        return peak, peak - self.resident


def part_train_step(mode: dict, part: str, deadline: float) -> dict:
    """One optimizer step of each of the part's trainers (STEP_TRAINERS) on one model, one optimizer and one batch,
    alternating over rounds: median step time and peak memory, each as a ratio to GRPOTrainer's, the fraction of
    tokens each one's clip cut off the gradient, and the clip range it used."""
    import tempfile

    import torch
    from trl import GRPOConfig, GRPOTrainer

    from acpo_trl import ACPOConfig, ACPOTrainer
    from acpo_trl.utils.tiny_models import build_tokenizer
    from acpo_trl.tasks.toy import toy_dataset, toy_reward

    spec = mode["steps"][part]
    device = mode["device"]
    _require_device(device)
    if device == "cuda" and spec.get("min_gpu_gib"):
        gib = torch.cuda.get_device_properties(0).total_memory / 2**30
        if gib < spec["min_gpu_gib"]:
            return {"skipped": f"the GPU has {gib:.0f} GiB; this step needs about {spec['min_gpu_gib']} GiB"}
    bf16 = device == "cuda" and torch.cuda.is_bf16_supported()
    tokenizer = build_tokenizer()
    start = time.perf_counter()
    model = build_model(spec, tokenizer, device)
    build_s = time.perf_counter() - start
    batch, completion_len, prompt_len = spec["completions"], spec["completion_len"], spec["prompt_len"]
    common = dict(report_to="none", use_cpu=device == "cpu", bf16=bf16, per_device_train_batch_size=batch,
                  num_generations=batch, steps_per_generation=4, max_completion_length=completion_len,
                  loss_type="grpo", beta=0.0, learning_rate=1e-6, disable_tqdm=True, save_strategy="no", seed=0)
    trainers = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in spec["trainers"]:
            fields = STEP_TRAINERS[name][1]
            args = (GRPOConfig(output_dir=f"{tmp}/{name}", **common) if fields is None
                    else ACPOConfig(output_dir=f"{tmp}/{name}", **fields, **common))
            trainer_class = GRPOTrainer if fields is None else ACPOTrainer
            trainers[name] = trainer_class(model, toy_reward, args=args, train_dataset=toy_dataset(8),
                                           processing_class=tokenizer)
    for trainer in trainers.values():
        trainer.current_gradient_accumulation_steps = 1
    model.train()
    optimizer = trainers["acpo"].create_optimizer()  # the Trainer's default optimizer for these arguments

    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(0, vocab, (batch, prompt_len), generator=g)
    completion_ids = torch.randint(0, vocab, (batch, completion_len), generator=g)
    advantages = torch.randn(batch, generator=g)
    advantages = (advantages - advantages.mean()) / advantages.std()
    inputs = {
        "prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids, "completion_mask": torch.ones_like(completion_ids),
        "advantages": advantages, "num_items_in_batch": torch.tensor(float(batch * completion_len)),
    }
    inputs = {k: v.to(device) for k, v in inputs.items()}
    # Old log-probs: the model's own plus noise, so the batch is off-policy (ratios near 1, as after an update).
    with torch.no_grad():
        logps = trainers["acpo"]._get_per_token_logps_and_entropies(
            model, torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1), completion_len)[0]
    inputs["old_per_token_logps"] = logps.float() + 0.05 * torch.randn(logps.shape, generator=g).to(device)

    meter = MemoryMeter(device)
    losses = []

    def step(trainer) -> tuple[float, float, float]:
        _sync(device)
        meter.start()
        begin = time.perf_counter()
        loss = trainer.compute_loss(model, inputs)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(device)
        elapsed = time.perf_counter() - begin
        losses.append(loss.item())
        return (elapsed, *meter.stop())

    first = {name: step(trainer) for name, trainer in trainers.items()}  # warm-up: kernels, AdamW state
    records = {name: [] for name in trainers}
    rounds_done = 0
    round_s = 0.0
    for r in range(spec["rounds"]):
        if time.time() + round_s > deadline:
            break
        begin = time.time()
        for name in (list(trainers) if r % 2 == 0 else list(trainers)[::-1]):  # ABBA: no order bias
            for _ in range(spec["steps_per_round"]):
                records[name].append(step(trainers[name]))
        round_s = time.time() - begin
        rounds_done += 1
    if not rounds_done:  # not even one round fitted: report the warm-up steps
        records = {name: [first[name]] for name in trainers}
    n_params = sum(p.numel() for p in model.parameters())
    result = {
        "model": {"name": spec["model_name"], **{k: v for k, v in spec["model"].items() if v is not None},
                  "vocab_size": model.config.vocab_size, "parameters": n_params,
                  "attn_implementation": getattr(model.config, "_attn_implementation", None),
                  "activation_checkpointing": True, "build_s": build_s},
        "batch": {"completions": batch, "completion_len": completion_len, "prompt_len": prompt_len},
        "precision": "bf16 autocast, fp32 weights" if bf16 else "fp32",
        "optimizer": type(optimizer).__name__,
        "trainers": list(trainers),
        "rounds": rounds_done, "steps_per_round": spec["steps_per_round"],
        "losses_finite": all(math.isfinite(x) for x in losses),
    }
    if rounds_done < spec["rounds"]:
        result["cut_short"] = f"time budget: {rounds_done} of {spec['rounds']} rounds"
    for name, rows in records.items():
        step_s, peak_mib, step_mib = (statistics.median(column) for column in zip(*rows))
        result[name] = {"step_s": step_s, "peak_mib": peak_mib, "step_mib": step_mib, "steps": len(rows),
                        "warmup_step_s": first[name][0], "clip_frac": _clip_fraction(trainers[name], len(rows)),
                        "clip_eps": _clip_eps(trainers[name], len(rows))}
    for name in trainers:
        if name != "grpo":
            result[name].update(step_ratio=result[name]["step_s"] / result["grpo"]["step_s"],
                                peak_ratio=result[name]["peak_mib"] / result["grpo"]["peak_mib"])
    return result


def _clip_fraction(trainer, steps: int) -> float | None:
    """The fraction of tokens whose gradient the clip cut off (``clip_ratio/region_mean``, as TRL and every clipped
    method here log it), mean over the last `steps` steps."""
    values = trainer._metrics["train"].get("clip_ratio/region_mean", [])[-steps:]
    return statistics.fmean(values) if values else None


def _clip_eps(trainer, steps: int) -> float:
    """The clip range the trainer used: its fixed epsilon, or for ACPO the token-weighted mean of eps_b over its
    bins (``acpo/bin{b}/eps`` x ``token_frac``), mean over the last `steps` steps."""
    args = trainer.args
    if getattr(args, "policy_loss", "trl") != "acpo":
        return args.epsilon
    metrics = trainer._metrics["train"]
    per_step = []
    for i in range(-steps, 0):
        weighted = [(metrics[f"acpo/bin{b}/eps"][i], metrics[f"acpo/bin{b}/token_frac"][i])
                    for b in range(args.acpo_num_bins)]
        per_step.append(sum(eps * frac for eps, frac in weighted if frac > 0))
    return statistics.fmean(per_step)


def part_cuda_tests(mode: dict, deadline: float, out_dir: str) -> dict:
    """`pytest -m cuda` over CUDA_TEST_FILES in a subprocess; counts from its JUnit XML."""
    import xml.etree.ElementTree as ET

    junit = Path(out_dir) / "cuda_tests.xml"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", f"--junitxml={junit}",
               *CUDA_TEST_FILES]
    begin = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=max(1.0, deadline - time.time()))
        output, code = proc.stdout, proc.returncode
    except subprocess.TimeoutExpired as error:
        output, code = _text(error.stdout), None
    result = {"command": " ".join(["python", *command[1:]]), "returncode": code,
              "wall_s": time.perf_counter() - begin, "output_tail": output[-3000:]}
    sys.stderr.write(output)
    if code is None:
        result["error"] = "timed out"
        return result
    if not junit.exists():
        result["error"] = "pytest wrote no report"
        return result
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    failed_names = []
    root = ET.parse(junit).getroot()
    for suite in ([root] if root.tag == "testsuite" else root.iter("testsuite")):
        for key in counts:
            counts[key] += int(suite.get(key, 0))
        for case in suite.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed_names.append(f"{case.get('classname')}::{case.get('name')}")
    result.update(passed=counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
                  failed=counts["failures"] + counts["errors"], skipped=counts["skipped"], collected=counts["tests"],
                  failed_tests=failed_names)
    if code not in (0, 5) and not failed_names:  # 5: nothing collected
        result["error"] = f"pytest exited {code}"
    return result


def run_child(part: str, mode_name: str, deadline: float, out_dir: str) -> dict:
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    mode = MODES[mode_name]
    if part == "loss_eager":
        result = part_loss(mode, compiled=False, deadline=deadline)
    elif part == "loss_compiled":
        result = part_loss(mode, compiled=True, deadline=deadline)
    elif part in mode["steps"]:
        result = part_train_step(mode, part, deadline)
    else:
        raise ValueError(part)
    result["machine"] = machine_info(mode["device"])
    return result


# ---------------------------------------------------------------------------------------------------------------
# The parent: budget, parts, results.


def run_part(part: str, mode_name: str, timeout: float, out_dir: str, log) -> dict:
    if part == "cuda_tests":  # already a subprocess of its own
        result = part_cuda_tests(MODES[mode_name], time.time() + timeout, out_dir)
        log.write(f"== cuda_tests\n{result.get('output_tail', '')}\n")
        return result
    command = [sys.executable, str(Path(__file__).resolve()), "--child", part, "--mode", mode_name,
               "--deadline", str(time.time() + max(timeout - 10, timeout * 0.7)), "--out", out_dir]
    begin = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as error:
        stderr = _text(error.stderr)
        log.write(f"== {part} (timed out)\n{stderr}\n")
        sys.stderr.write(stderr[-3000:])
        return {"error": f"timed out after {timeout:.0f} s", "wall_s": time.perf_counter() - begin}
    log.write(f"== {part}\n{proc.stderr}\n")
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stderr[-3000:])
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
        return {"error": f"exit {proc.returncode}: {last}", "stderr_tail": proc.stderr[-2000:],
                "wall_s": time.perf_counter() - begin}
    result = json.loads(lines[-1][len(RESULT_PREFIX):])
    result["wall_s"] = time.perf_counter() - begin
    return result


def _text(output) -> str:
    """A TimeoutExpired's captured output (bytes even with text=True)."""
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def fmt(value) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if 0 < abs(value) < 0.01:  # a clip fraction: three significant digits
            return f"{value:.3g}"
        return f"{value:.3f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def markdown(results: dict) -> str:
    machine = results.get("machine") or {}
    mode = MODES[results["mode"]]
    if machine.get("gpu"):
        where = (f"{machine['gpu']} ({machine.get('gpu_memory_gib')} GiB, compute capability "
                 f"{machine.get('compute_capability')}), CUDA {machine.get('cuda')}")
    else:
        where = f"CPU only ({machine.get('cpu_count')} cores), no GPU"
    versions = ", ".join(f"{k} {machine.get(k)}" for k in ("torch", "transformers", "accelerate", "trl", "datasets")
                         if machine.get(k))
    batch = mode["loss_shape"]
    lines = [
        "# GPU check results",
        "",
        f"- machine: {where}; {versions}; Python {machine.get('python')}",
        f"- mode: `{results['mode']}`; {results['wall_s']:.0f} s of a {results['budget_s']:.0f} s budget; "
        f"{results['date']}",
    ]
    for part, label in (("train_step", "optimizer step"), ("paper_step", "paper-scale step")):
        spec, step = mode["steps"][part], results.get(part) or {}
        names = ", ".join(STEP_TRAINERS[key][0] for key in spec["trainers"])
        lines.append(
            f"- {label}: {spec['model_name']} ({fmt(lookup(step, 'model.parameters'))} parameters), "
            f"{spec['completions']} completions x {spec['completion_len']:,} tokens + {spec['prompt_len']} prompt "
            f"tokens, {step.get('precision', '?')}, activation checkpointing, {step.get('optimizer', '?')}; "
            f"{names}; median of {step.get('rounds', '?')} alternating rounds x {spec['steps_per_round']} step(s) "
            "per trainer")
    lines += [
        f"- loss alone: median of interleaved repeats of {mode['loss_inner']} calls; torch.compile backend "
        f"`{mode['compile_backend']}`",
        "",
        "| part | figure | value | unit |",
        "|---|---|---|---|",
    ]
    for path, part, figure, unit in figures(mode["device"]):
        lines.append(f"| {part.format(f'{batch[0]} x {batch[1]}')} | {figure} | {fmt(lookup(results, path))} | "
                     f"{unit} |")
    if results["notes"]:
        lines += ["", "Notes:", ""] + [f"- {note}" for note in results["notes"]]
    return "\n".join(lines) + "\n"


def write_results(results: dict, out: Path) -> None:
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(markdown(results))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="folder for results.json, results.md, cuda_tests.xml and log.txt")
    parser.add_argument("--tiny", action="store_true", help="the same code on CPU with a tiny model (CI)")
    parser.add_argument("--budget-s", type=float, help="time budget of the check in seconds (full 450, tiny 150)")
    parser.add_argument("--wheels", help="first install the wheels of this folder offline (docs/gpu_check.md)")
    parser.add_argument("--download-wheels", metavar="DIR", help="download the wheels into DIR and exit")
    parser.add_argument("--python-version", default="3.12",
                        help="CPython version of the GPU machine, for --download-wheels (default 3.12)")
    parser.add_argument("--child", choices=PARTS, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=list(MODES), help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        result = run_child(args.child, args.mode, args.deadline, args.out)
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return 0
    if args.download_wheels:
        return download_wheels(args.download_wheels, args.python_version)
    if not args.out:
        parser.error("--out DIR is required")

    begin = time.time()
    mode_name = "tiny" if args.tiny else "full"
    mode = MODES[mode_name]
    budget = args.budget_s or mode["budget_s"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"mode": mode_name, "budget_s": budget, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
               "machine": None, "parts": {}, "notes": [], "wall_s": 0.0}
    status = 0
    with open(out / "log.txt", "w") as log:
        if args.wheels:
            results["install"] = install_wheels(args.wheels, log)
            if results["install"]["mode"] == "failed":
                results["notes"].append("offline install failed: " + results["install"]["error"][-300:])
            elif results["install"]["mode"] != "resolved":
                results["notes"].append("the offline install could not resolve against the installed packages "
                                        "(results.json: install.resolve_error); installed the wheels without "
                                        "dependencies")
            begin = time.time()  # the budget is the check's; the install is timed by pip's output
        deadline = begin + budget
        for part in PARTS:
            left = deadline - time.time()
            # the parts run in order of priority: one that would cut into the later parts' reserve still runs
            timeout = min(mode["caps"][part], left - mode["reserve"][part])
            if timeout < MIN_PART_S:
                timeout = min(mode["caps"][part], left)
            if timeout < MIN_PART_S:
                results[part] = {"skipped": f"time budget: {left:.0f} s left"}
                results["parts"][part] = "skipped"
                results["notes"].append(f"{part}: skipped, {left:.0f} s of the budget left")
                status = status or 3
                continue
            print(f"== {part} (at most {timeout:.0f} s; {left:.0f} s of the budget left)", flush=True)
            result = run_part(part, mode_name, timeout, str(out), log)
            results[part] = result
            skipped = isinstance(result.get("skipped"), str)  # the CUDA tests' "skipped" is a count
            results["parts"][part] = ("error" if "error" in result else "skipped" if skipped
                                      else "cut short" if "cut_short" in result else "ok")
            if results["machine"] is None and "machine" in result:
                results["machine"] = result.pop("machine")
            result.pop("machine", None)
            if "error" in result:
                results["notes"].append(f"{part}: {result['error']}")
                status = 1
            elif skipped:
                results["notes"].append(f"{part}: skipped ({result['skipped']})")
                status = status or 3
            elif "cut_short" in result:
                results["notes"].append(f"{part}: cut short ({result['cut_short']})")
                status = status or 3
            if part == "cuda_tests" and result.get("failed"):
                results["notes"].append(f"CUDA tests failed: {', '.join(result['failed_tests'])}")
                status = 1
            if part == "cuda_tests" and mode["device"] == "cuda" and result.get("skipped"):
                results["notes"].append(f"{result['skipped']} CUDA test(s) skipped on the GPU machine: "
                                        "is CUDA visible to torch?")
                status = 1
            if part == "loss_compiled" and result.get("matches_eager") is False:
                results["notes"].append("the compiled losses differ from eager (rtol 1e-4; gradients on > 0.1% of "
                                        "the tokens)")
                status = 1
            if part in mode["steps"] and result.get("losses_finite") is False:
                results["notes"].append("a trainer step gave a non-finite loss")
                status = 1
            results["wall_s"] = time.time() - begin
            write_results(results, out)  # after every part: a later crash keeps what ran
        if results["machine"] is None:
            results["machine"] = {"python": sys.version.split()[0]}
        if mode["device"] == "cpu":
            results["notes"].append("--tiny: CPU and a tiny model, so that the script cannot rot; its figures are not "
                                    "measurements of anything (and CPU memory is the process's peak RSS)")
        results["wall_s"] = time.time() - begin
        results["status"] = status
        write_results(results, out)
    print((out / "results.md").read_text())
    print(f"results: {out / 'results.json'}, {out / 'results.md'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
