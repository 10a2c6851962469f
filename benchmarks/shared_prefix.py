"""``share_prompt_prefix`` against TRL's path on the offline demo's shapes: time of the three places it changes.

    OMP_NUM_THREADS=1 python benchmarks/shared_prefix.py [--threads 1] [--rounds 5] [--cap-mmap-threshold]

One ``ACPOTrainer`` on SmolLM2-135M-Instruct (``acpo_trl.utils.offline_model``) with the demo's settings
(``configs/demo.yaml``: single-digit addition, two solved examples as earlier chat turns, 8 prompts x 8 completions
per rollout, micro-batch 16, completions up to 16 tokens, CPU, float32); ``share_prompt_prefix`` is switched on the
trainer's args between measurements. The prompts are tokenized by TRL (``_tokenize_prompts``: the chat template,
left padding) and the completions are sampled once from the model, masked after their first EOS and right-padded to
the rollout's longest, as TRL's rollout leaves them. Measured, side by side:

1. train fwd+bwd: ``compute_loss`` (ACPO, DAPO aggregation) + backward of one micro-batch of 16 rows drawn from the
   shuffled rollout as TRL's ``shuffle_sequence_dict`` / ``split_tensor_dict`` draw it;
2. old log-probs: the no-grad forward of the 64-row rollout in chunks of 16, as TRL's rollout computes it;
3. generation: 64 completions (the 8 prompts x 8, TRL's generation config: sampling at T = 1, 16 new tokens,
   seeded) by ``model.generate`` against ``acpo_trl.training.shared_prefix.generate_with_shared_prefix``; the samples must be
   identical.

Each round runs every part once per variant, the variants' order alternating between rounds, after an untimed
warm-up of each on a quarter of its rows. glibc's allocator is left as it is: ``--cap-mmap-threshold`` fixes its
mmap threshold as ``acpo-train`` does on CPU (``acpo_trl.training.host_memory``), which here adds about a third to a
forward's time in system time (page faults), on both paths. Printed: the medians, the ratio shared / TRL, and for
1-2 the largest absolute difference of the log-probs (and entropies) between the two paths over the completion
tokens. A round takes about 50 s at 1 thread on a 2-core Xeon (TRL's path is most of it): the default 5 rounds take
about 5 minutes, ``--rounds 3`` about 3.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

PARTS = {
    "train": "1. train fwd+bwd (16 rows)",
    "old_logps": "2. old log-probs (64 rows / 16)",
    "generate": "3. generate (64 x 16 tokens)",
}
VARIANTS = ("trl", "shared")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def build_trainer():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from acpo_trl import ACPOConfig, ACPOTrainer
    from acpo_trl.utils.offline_model import offline_model_path
    from acpo_trl.data.arithmetic import arithmetic_dataset

    path = offline_model_path()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    dataset = arithmetic_dataset(64, digits=1, seed=0, template="chat", shots=2)
    args = ACPOConfig(
        output_dir=tempfile.mkdtemp(prefix="shared_prefix_bench."), report_to="none", disable_tqdm=True, seed=0,
        use_cpu=True, bf16=False, gradient_checkpointing=False, share_prompt_prefix=True,
        policy_loss="acpo", loss_type="dapo", per_device_train_batch_size=16, num_generations=8,
        steps_per_generation=4, gradient_accumulation_steps=1, max_completion_length=16, temperature=1.0,
        learning_rate=2e-5, beta=0.0,
    )
    trainer = ACPOTrainer(model, lambda completions, **kw: [0.0] * len(completions), args=args,
                          train_dataset=dataset, processing_class=tokenizer)
    trainer.current_gradient_accumulation_steps = 1
    return trainer, dataset


def left_pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + list(r) for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def completion_tensors(trainer, completion_ids: torch.Tensor, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's rollout on the generated columns: everything after the first EOS masked, then right-padded to the
    longest completion."""
    is_eos = torch.isin(completion_ids, torch.tensor(trainer.eos_token_ids))
    eos_idx = torch.full((is_eos.size(0),), is_eos.size(1), dtype=torch.long)
    eos_idx[is_eos.any(1)] = is_eos.int().argmax(1)[is_eos.any(1)]
    mask = (torch.arange(is_eos.size(1)).expand(is_eos.size(0), -1) <= eos_idx.unsqueeze(1)).long()
    width = int(mask.sum(1).max())
    return completion_ids[:, :width].masked_fill(mask[:, :width] == 0, pad), mask[:, :width]


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--rounds", type=int, default=5, help="timed runs per part and variant, interleaved")
    parser.add_argument("--cap-mmap-threshold", action="store_true",
                        help="fix glibc's mmap threshold as acpo-train does on CPU")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from acpo_trl.training.host_memory import cap_mmap_threshold
    from acpo_trl.training.shared_prefix import generate_with_shared_prefix, shared_prefix_length

    if args.cap_mmap_threshold:
        cap_mmap_threshold()
    trainer, dataset = build_trainer()
    model, tokenizer = trainer.model, trainer.processing_class
    model.train()
    pad = tokenizer.pad_token_id
    num_generations, micro_batch = trainer.args.num_generations, trainer.args.per_device_train_batch_size

    # The rollout: 8 prompts, each repeated 8 times (TRL's RepeatSampler), tokenized by TRL, left-padded.
    prompts = [p for p in dataset["prompt"][:8] for _ in range(num_generations)]
    prompt_ids, prompt_mask = left_pad(trainer._tokenize_prompts(prompts)[0], pad)
    generation_config = trainer.generation_config

    def generate(variant: str, seed: int, rows: int | None = None) -> torch.Tensor:
        torch.manual_seed(seed)
        ids, mask = prompt_ids[:rows], prompt_mask[:rows]
        with torch.no_grad():
            if variant == "shared":
                return generate_with_shared_prefix(model, ids, mask, generation_config)
            return type(model).generate(model, input_ids=ids, attention_mask=mask, generation_config=generation_config)

    sampled = generate("shared", seed=1234)  # the completions scored in parts 1-2 (the same samples as TRL's path)
    completion_ids, completion_mask = completion_tensors(trainer, sampled[:, prompt_ids.size(1):], pad)
    input_ids = torch.cat([prompt_ids, completion_ids], 1)
    attention_mask = torch.cat([prompt_mask, completion_mask], 1)
    keep = completion_ids.size(1)

    # A micro-batch as TRL's _prepare_inputs draws it: the rollout shuffled, then split in steps_per_generation.
    rows = torch.randperm(input_ids.size(0), generator=torch.Generator().manual_seed(0))[:micro_batch]
    with torch.no_grad():
        trainer.args.share_prompt_prefix = False
        old_logps, _, _ = trainer._get_per_token_logps_and_entropies(model, input_ids, attention_mask, keep,
                                                                     batch_size=micro_batch)
    advantages = torch.randn(input_ids.size(0), generator=torch.Generator().manual_seed(1))
    micro_inputs = {
        "prompt_ids": prompt_ids[rows], "prompt_mask": prompt_mask[rows],
        "completion_ids": completion_ids[rows], "completion_mask": completion_mask[rows],
        "advantages": advantages[rows],
        # an off-policy micro-batch: the current policy has moved a little since the rollout
        "old_per_token_logps": old_logps[rows] + 0.05 * torch.randn(rows.size(0), keep,
                                                                    generator=torch.Generator().manual_seed(2)),
        "num_items_in_batch": completion_mask[rows].sum().float(),
    }

    captured = {}
    original = trainer._get_per_token_logps_and_entropies

    def capturing(*a, **kw):
        out = original(*a, **kw)
        captured["logps"], captured["entropies"] = (None if t is None else t.detach() for t in out[:2])
        return out

    def train_step(rows: int | None = None):
        trainer._get_per_token_logps_and_entropies = capturing
        try:
            inputs = micro_inputs if rows is None else {k: v if k == "num_items_in_batch" else v[:rows]
                                                        for k, v in micro_inputs.items()}
            loss = trainer.compute_loss(model, inputs)
            loss.backward()
        finally:
            del trainer._get_per_token_logps_and_entropies
        model.zero_grad(set_to_none=True)
        return captured["logps"], captured["entropies"]

    def old_logps_forward(rows: int | None = None):
        with torch.no_grad():
            logps, _, _ = trainer._get_per_token_logps_and_entropies(model, input_ids[:rows], attention_mask[:rows],
                                                                     keep, batch_size=micro_batch)
        return logps, None

    for variant in VARIANTS:  # warm-up: allocator and kernels, on a quarter of each part's rows
        trainer.args.share_prompt_prefix = variant == "shared"
        train_step(micro_batch // 4)
        old_logps_forward(input_ids.size(0) // 4)
        generate(variant, seed=0, rows=input_ids.size(0) // 4)

    times = {part: {v: [] for v in VARIANTS} for part in PARTS}
    outputs = {part: {} for part in PARTS}
    samples_equal = True
    for round_ in range(args.rounds):
        order = VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]
        generated = {}
        for part in PARTS:
            for variant in order:
                trainer.args.share_prompt_prefix = variant == "shared"
                if part == "train":
                    seconds, out = timed(train_step)
                elif part == "old_logps":
                    seconds, out = timed(old_logps_forward)
                else:
                    seconds, out = timed(lambda: generate(variant, seed=round_))
                    generated[variant] = out
                times[part][variant].append(seconds)
                outputs[part][variant] = out
        samples_equal &= torch.equal(generated["trl"], generated["shared"])
        trainer._release_host_memory()

    def max_diff(part: str, index: int, mask: torch.Tensor) -> float:
        a, b = outputs[part]["trl"][index], outputs[part]["shared"][index]
        return float(((a - b).abs() * mask).max()) if a is not None else float("nan")

    shared = shared_prefix_length(input_ids[rows], attention_mask[rows], keep)
    distinct = len({tuple(r) for r in prompt_ids[rows].tolist()})
    print(f"CPU: {cpu_model()}; torch threads {torch.get_num_threads()}; torch {torch.__version__}; "
          f"glibc mmap threshold {'capped as acpo-train' if args.cap_mmap_threshold else 'default'}")
    print(f"SmolLM2-135M-Instruct, float32; rollout 8 prompts x {num_generations} = {input_ids.size(0)} rows; "
          f"prompt {prompt_ids.size(1)} tokens ({shared} shared by every row), completions {keep} columns "
          f"(mean {completion_mask.sum(1).float().mean():.1f} tokens); micro-batch {micro_batch} rows "
          f"({distinct} distinct prompts); median of {args.rounds} rounds")
    print("| part | TRL (s) | shared (s) | shared / TRL | max abs diff log-probs | max abs diff entropies |")
    print("|---|---:|---:|---:|---:|---:|")
    masks = {"train": completion_mask[rows], "old_logps": completion_mask}
    for part, label in PARTS.items():
        trl_s, shared_s = (statistics.median(times[part][v]) for v in VARIANTS)
        if part in masks:
            diffs = f"{max_diff(part, 0, masks[part]):.2e} | "
            diffs += f"{max_diff(part, 1, masks[part]):.2e} |" if part == "train" else "- |"
        else:
            diffs = f"samples identical: {'yes' if samples_equal else 'NO'} | - |"
        print(f"| {label} | {trl_s:.3f} | {shared_s:.3f} | {shared_s / trl_s:.3f} | {diffs}")


if __name__ == "__main__":
    main()
