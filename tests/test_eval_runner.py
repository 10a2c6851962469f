"""Evaluation runs: scores and metrics against hand-computed values, determinism, resume, the CLI, benchmarks."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from acpo_trl.evaluation.benchmarks import load_benchmark
from acpo_trl.tasks import benchmark_names
from acpo_trl.evaluation.config import EvalConfig
from acpo_trl.evaluation.generation import Generation, SamplingSettings, TransformersBackend
from acpo_trl.evaluation.runner import evaluate
from acpo_trl.evaluation.store import SAMPLES_FILE
from acpo_trl.rewards.countdown import countdown_reward, solve_countdown
from acpo_trl.utils.tiny_models import build_tokenizer

FIXTURES = Path(__file__).parent / "fixtures"
COUNTDOWN = FIXTURES / "countdown" / "test_nums_target.jsonl"
COUNTDOWN_SPEC = f"countdown={COUNTDOWN}"


class ScriptedBackend:
    """Answers Countdown prompts with known correctness: in each call, the first ``target % 3`` samples of a
    problem carry a correct equation, the others a wrong one."""

    name = "scripted"

    def __init__(self):
        self.tokenizer = build_tokenizer()

    def generate(self, prompt_ids, num_samples, seed):
        out = []
        for ids in prompt_ids:
            text = self.tokenizer.decode(ids)
            nums = json.loads(re.search(r"Using the numbers (\[[\d, ]+\])", text).group(1))
            target = int(re.search(r"equals (\d+)", text).group(1))
            good, bad = solve_countdown(nums, target), "+".join(map(str, nums))
            out.append(
                [
                    Generation(f"<think>ok</think> <answer>{good if j < target % 3 else bad}</answer>", 7, False)
                    for j in range(num_samples)
                ]
            )
        return out


class CountingBackend:
    """Wraps a backend, counts calls, and raises ``KeyboardInterrupt`` after ``fail_after`` calls."""

    def __init__(self, backend, fail_after=None):
        self.backend, self.fail_after, self.calls = backend, fail_after, 0
        self.name, self.tokenizer = backend.name, backend.tokenizer

    def generate(self, prompt_ids, num_samples, seed):
        if self.fail_after is not None and self.calls == self.fail_after:
            raise KeyboardInterrupt
        self.calls += 1
        return self.backend.generate(prompt_ids, num_samples, seed)


def _config(tmp_path, name="run", **overrides):
    kwargs = dict(
        model_name_or_path="tiny",
        benchmarks=[COUNTDOWN_SPEC],
        limit=5,
        k=4,
        seeds=[0, 1],
        temperature=1.0,
        max_tokens=8,
        batch_size=2,
        backend="transformers",
        output_dir=str(tmp_path / name),
    )
    kwargs.update(overrides)
    return EvalConfig(**kwargs)


@pytest.fixture
def tiny_backend(tiny_model):
    model, tokenizer = tiny_model
    return TransformersBackend(model, tokenizer, SamplingSettings(temperature=1.0, max_tokens=8))


def test_scores_and_metrics_match_hand_computed_values(tmp_path):
    result = evaluate(_config(tmp_path, model_name_or_path="scripted"), backend=ScriptedBackend(), progress=False)
    targets = [json.loads(line)["target"] for line in COUNTDOWN.read_text().splitlines()[:5]]
    correct = [2 * (t % 3) for t in targets]  # 2 seeds, each with t % 3 correct samples of 2
    assert any(correct) and not all(c == 4 for c in correct)  # the fixture exercises mixed counts
    metrics = result["metrics"]["countdown"]
    assert metrics["avg@4"] == pytest.approx(sum(c / 4 for c in correct) / 5)
    assert metrics["pass@4"] == pytest.approx(sum(c > 0 for c in correct) / 5)
    assert metrics["mean_length"] == 7 and metrics["truncation_rate"] == 0 and metrics["num_problems"] == 5

    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    for problem, c in zip(saved["problems"], correct):
        scores = [s["score"] for s in problem["samples"]]
        assert sum(scores) == c and [s["seed"] for s in problem["samples"]] == [0, 0, 1, 1]
    result = evaluate(_config(tmp_path, "run2", model_name_or_path="scripted", pass_k=[1, 2]), ScriptedBackend(), False)
    closed_form = sum(1 - math.comb(4 - c, 2) / math.comb(4, 2) for c in correct) / 5
    assert result["metrics"]["countdown"]["pass@2"] == pytest.approx(closed_form)
    assert result["metrics"]["countdown"]["pass@1"] == pytest.approx(metrics["avg@4"])
    assert "| countdown |" in (tmp_path / "run2" / "results.md").read_text()


def test_tiny_model_samples_rescore_and_are_deterministic(tmp_path, tiny_backend):
    first = evaluate(_config(tmp_path, "a"), backend=tiny_backend, progress=False)
    second = evaluate(_config(tmp_path, "b"), backend=tiny_backend, progress=False)
    saved_a = json.loads((tmp_path / "a" / "results.json").read_text())
    saved_b = json.loads((tmp_path / "b" / "results.json").read_text())
    assert saved_a["problems"] == saved_b["problems"] and first["metrics"] == second["metrics"]
    # Every saved score is the reward of the saved completion; the metrics follow from the saved scores.
    problems = saved_a["problems"]
    assert len(problems) == 5 and all(len(p["samples"]) == 4 for p in problems)
    for p in problems:
        completions = [s["completion"] for s in p["samples"]]
        cols = p["columns"]
        rescored = countdown_reward([p["prompt"]] * 4, completions, target=[cols["target"]] * 4, nums=[cols["nums"]] * 4)
        assert rescored == [s["score"] for s in p["samples"]]
        assert all(s["num_tokens"] <= 8 and s["truncated"] == (s["num_tokens"] == 8) for s in p["samples"])
    samples = [s for p in problems for s in p["samples"]]
    metrics = first["metrics"]["countdown"]
    assert metrics["mean_length"] == pytest.approx(sum(s["num_tokens"] for s in samples) / 20)
    assert metrics["truncation_rate"] == pytest.approx(sum(s["truncated"] for s in samples) / 20)
    assert len({s["completion"] for s in samples}) > 10  # sampled, and seeds/batches differ


def test_interrupted_run_resumes_without_loss(tmp_path, tiny_backend):
    evaluate(_config(tmp_path, "full"), backend=tiny_backend, progress=False)
    interrupted = CountingBackend(tiny_backend, fail_after=2)
    with pytest.raises(KeyboardInterrupt):
        evaluate(_config(tmp_path, "resumed"), backend=interrupted, progress=False)
    samples_file = tmp_path / "resumed" / SAMPLES_FILE
    assert len(samples_file.read_text().splitlines()) == 2 * 2  # 2 batches of 2 problems were saved
    with open(samples_file, "a") as f:
        f.write('{"benchmark": "countdown", "index": 4, "se')  # a torn write from a killed process
    resumed = CountingBackend(tiny_backend)
    evaluate(_config(tmp_path, "resumed"), backend=resumed, progress=False)
    assert resumed.calls == 3 * 2 - 2  # 3 batches x 2 seeds, 2 done before the interruption
    full = json.loads((tmp_path / "full" / "results.json").read_text())
    again = json.loads((tmp_path / "resumed" / "results.json").read_text())
    assert again["problems"] == full["problems"] and again["metrics"] == full["metrics"]

    rerun = CountingBackend(tiny_backend)
    evaluate(_config(tmp_path, "resumed"), backend=rerun, progress=False)
    assert rerun.calls == 0
    with pytest.raises(ValueError, match=r"other settings \(temperature: 1.0 -> 0.5\)"):
        evaluate(_config(tmp_path, "resumed", temperature=0.5), backend=tiny_backend, progress=False)
    evaluate(_config(tmp_path, "resumed", overwrite=True), backend=rerun, progress=False)
    assert rerun.calls == 6


def test_cli_on_a_saved_tiny_model(tmp_path, tiny_model, capsys):
    from acpo_trl.evaluation.cli import main

    model, tokenizer = tiny_model
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    main(
        ["--model_name_or_path", str(tmp_path / "model"), "--benchmarks", COUNTDOWN_SPEC, "--limit", "2",
         "--k", "2", "--max_tokens", "4", "--backend", "transformers", "--device", "cpu", "--template", "chat",
         "--output_dir", str(tmp_path / "out")]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert "| countdown | 0.00 | 0.00 |" in out
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["problems"][0]["prompt"].startswith("<|im_start|>user\nUsing the numbers")  # chat template applied
    assert (tmp_path / "out" / "results.md").read_text().startswith(f"# Evaluation of `{tmp_path / 'model'}`")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"k": 3}, "multiple of the number of `seeds`"),
        ({"pass_k": [8]}, "pass_k"),
        ({"backend": "tgi"}, "`backend` must be one of"),
        ({"template": "raw"}, "`template` must be"),
        ({"top_p": 0.0}, "EvalConfig.top_p=0.0: must be a finite number in (0, 1]"),
        ({"temperature": float("nan")}, "EvalConfig.temperature=nan: must be a finite number >= 0"),
        ({"benchmarks": []}, "`benchmarks` is empty"),
    ],
)
def test_config_errors_name_the_field(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _config(tmp_path, **overrides)


def test_benchmark_specs():
    with pytest.raises(ValueError, match="Unknown benchmark 'gsm8k'"):
        load_benchmark("gsm8k")
    with pytest.raises(FileNotFoundError, match="no file at"):
        load_benchmark("math500=/nonexistent.jsonl")
    with pytest.raises(ValueError, match="HiTab needs local files"):
        load_benchmark("hitab")


@pytest.mark.parametrize("name", benchmark_names())
def test_every_benchmark_loads_and_scores(name):
    """Each registered task's benchmarks (a generated task's held-out set among them) load and feed their reward:
    a wrong and a right completion."""
    files = {"hitab": FIXTURES / "hitab" / "test_samples.jsonl", "countdown": COUNTDOWN}
    benchmark = load_benchmark(f"{name}={files[name]}" if name in files else name, limit=2)
    assert len(benchmark.dataset) == 2 and benchmark.dataset[0]["prompt"]
    row = benchmark.dataset[0]
    columns = {key: [value] * 2 for key, value in row.items() if key != "prompt"}
    wrong = "no answer"
    if name == "toy":
        wrong, right = "~~~", row["letter"] * 3
    elif name == "countdown":
        right = f"<answer>{solve_countdown(row['nums'], row['target'])}</answer>"
    elif name == "hitab":
        right = "<answer>" + " | ".join(row["answer"]) + "</answer>"
    else:
        right = f"\\boxed{{{row['answer']}}}"
    scores = benchmark.reward_func(prompts=[row["prompt"]] * 2, completions=[wrong, right], **columns)
    assert scores == [0.0, 1.0]


def test_lora_adapter_is_applied_by_the_transformers_backend(tmp_path, tiny_model):
    from peft import LoraConfig, get_peft_model

    from acpo_trl.evaluation.generation import tokenize_prompt
    from acpo_trl.evaluation.runner import build_backend

    model, tokenizer = tiny_model
    model.save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    settings = SamplingSettings(temperature=0.0, max_tokens=8)
    ids = [tokenize_prompt(tokenizer, "Write the letter a:"), tokenize_prompt(tokenizer, "Hi")]
    base_out = TransformersBackend(model, tokenizer, settings).generate(ids, 1, 0)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    peft_model.save_pretrained(tmp_path / "adapter")
    expected = TransformersBackend(peft_model, tokenizer, settings).generate(ids, 1, 0)
    assert expected != base_out  # the adapter matters

    config = _config(tmp_path, model_name_or_path=str(tmp_path / "base"), adapter_path=str(tmp_path / "adapter"),
                     temperature=0.0, device="cpu")  # fmt: skip
    backend = build_backend(config)
    assert backend.name == "transformers" and backend.generate(ids, 1, 0) == expected


def test_vllm_lora_rank_rounds_up_to_an_allowed_value(tmp_path):
    from acpo_trl.evaluation.generation import _vllm_max_lora_rank

    for rank, expected in ((1, 1), (4, 8), (16, 16), (100, 128)):
        (tmp_path / "adapter_config.json").write_text(json.dumps({"r": rank}))
        assert _vllm_max_lora_rank(str(tmp_path)) == expected
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 1024}))
    with pytest.raises(ValueError, match="exceeds vLLM's maximum 512"):
        _vllm_max_lora_rank(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        _vllm_max_lora_rank(str(tmp_path / "missing"))


def test_countdown_without_a_file_offline_says_how_to_pass_one():
    from acpo_trl.evaluation.benchmarks import load_benchmark

    with pytest.raises(ValueError, match=r"cannot be reached .*countdown=<tasks.jsonl>"):
        load_benchmark("countdown")
